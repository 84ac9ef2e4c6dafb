"""The fleet commands: status, rollback (devices as `deploy` names them)."""

from pathlib import Path

import click

from ..errors import PackagerError
from .base import emit, log, main


def fleet_options(command):
    """The options status and rollback share with deploy: hosts, ssh settings, the engine."""
    for option in reversed([
        click.argument("hosts", nargs=-1),
        click.option("--hosts", "inventory", type=click.Path(path_type=Path),
                     help="inventory: one host per line, or Ansible INI/YAML"),
        click.option("--limit", metavar="PATTERN", help="Ansible host pattern within --hosts"),
        click.option("--name", help="the bundle's name: ~/edgepack/NAME on the device (default: "
                     "every bundle there)"),
        click.option("--remote-dir", help="the folder deploy used (--remote-dir of deploy)"),
        click.option("--port", type=int, help="ssh port (default: ssh's, or ~/.ssh/config)"),
        click.option("--identity", type=click.Path(path_type=Path), help="private key for ssh -i"),
        click.option("--ssh-config", type=click.Path(path_type=Path), help="ssh -F config file"),
        click.option("--python", "remote_python", default="python3", show_default=True,
                     help="the device's Python"),
        click.option("--engine", type=click.Choice(["ssh", "ansible"]), default="ssh",
                     show_default=True, help="ssh: edgepack's own fan-out; ansible: "
                     "ansible-playbook with your inventory and ansible.cfg"),
        click.option("--parallel", type=int, default=4, show_default=True,
                     help="devices at once (Ansible's forks)"),
        click.option("--timeout", type=float, default=900.0, show_default=True,
                     help="seconds per remote step"),
        click.option("--json", "as_json", is_flag=True, help="print JSON"),
    ]):
        command = option(command)
    return command


def _hosts(hosts, inventory, limit, engine):
    from ..device.inventory import parse_host
    from .device import resolve_inventory

    if limit and not inventory:
        raise PackagerError("--limit selects hosts of an inventory", "add --hosts INVENTORY")
    return [parse_host(h) for h in hosts] + (
        resolve_inventory(inventory, limit, engine) if inventory else [])


@main.command("status")
@fleet_options
def status_cmd(hosts, inventory, limit, name, remote_dir, port, identity, ssh_config,
               remote_python, engine, parallel, timeout, as_json) -> None:
    """Say which release each device runs, the previous one, and their last check there.

    One line per host (and per bundle folder under ~/edgepack/ when neither --name nor
    --remote-dir is given): current and previous release (id, name, precision, target), when
    deploy or rollback last checked each on that device and the verdict. Changes nothing.
    Exit 0, or 2 when a host could not be read.

    \b
    Example:
        edgepack status pi@raspberrypi.local
        edgepack status --hosts fleet.yml --engine ansible --name net --json
    """
    from ..device.deploy import DeployOptions
    from ..device.releases import status, status_lines

    options = DeployOptions(remote_dir=remote_dir, python=remote_python, ssh_config=ssh_config,
                            port=port, identity=identity, timeout=timeout)
    states = status(_hosts(hosts, inventory, limit, engine), options=options, name=name,
                    engine=engine, parallel=parallel,
                    inventories=[inventory] if inventory else [], log=log)
    code = max(s.exit_code for s in states)
    emit({"engine": engine, "hosts": [s.to_dict() for s in states]}, as_json,
         "\n".join(status_lines(states)))
    if code:
        click.get_current_context().exit(code)


@main.command("rollback")
@fleet_options
@click.option("--runs", type=int, default=100, show_default=True)
@click.option("--warmup", type=int, default=10, show_default=True)
@click.option("--threads", type=int, default=None, help="override the session's threads")
@click.option("--latency-budget-ms", type=float, default=None, help="p90 ceiling")
@click.option("--require-provider", default=None, help="fail unless this provider runs")
@click.option("--reports", type=click.Path(path_type=Path), default=None,
              help="write each host's report to REPORTS/HOST/")
def rollback_cmd(hosts, inventory, limit, name, remote_dir, port, identity, ssh_config,
                 remote_python, engine, parallel, timeout, as_json, runs, warmup, threads,
                 latency_budget_ms, require_provider, reports) -> None:
    """Put each device's previous release back in use (no archive needed: it is still there).

    The previous release is checked on the device first, as deploy checks a new one (every
    file's hash, run.py check and bench, the bundle's budgets); only when it passes does
    DIR/current point at it, and DIR/previous at the release it replaces (a second rollback
    undoes the first). A host with no previous release, or whose previous release fails,
    keeps the one it runs. Exit 0 all rolled back, 1 a check failed, 2 nothing to roll back
    to, a device unreachable or bad input.

    \b
    Example:
        edgepack rollback pi@raspberrypi.local
        edgepack rollback --hosts fleet.yml --engine ansible --name net
    """
    from ..device.deploy import DeployOptions
    from ..device.releases import rollback, rollback_lines

    options = DeployOptions(remote_dir=remote_dir, python=remote_python, ssh_config=ssh_config,
                            port=port, identity=identity, timeout=timeout, runs=runs,
                            warmup=warmup, threads=threads, latency_budget_ms=latency_budget_ms,
                            require_provider=require_provider)
    results = rollback(_hosts(hosts, inventory, limit, engine), options=options, name=name,
                       engine=engine, parallel=parallel,
                       inventories=[inventory] if inventory else [], reports=reports, log=log)
    code = max(r.exit_code for r in results)
    emit({"passed": code == 0, "engine": engine, "hosts": [r.to_dict() for r in results]},
         as_json, "\n".join(rollback_lines(results)))
    if code:
        click.get_current_context().exit(code)


__all__ = ["rollback_cmd", "status_cmd"]
