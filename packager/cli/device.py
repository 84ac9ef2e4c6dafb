"""The device commands: verify, deploy, report, ansible-role."""

import signal
import sys
from pathlib import Path

import click

from ..errors import CheckFailed, PackagerError
from ..progress import OFF
from .base import emit, log, main, step_line


@main.command("verify")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--runs", type=int, default=100, show_default=True)
@click.option("--warmup", type=int, default=10, show_default=True)
@click.option("--threads", type=int, default=None, help="override the session's threads")
@click.option("--tune", is_flag=True,
              help="first time thread counts, optimisation levels and the execution mode "
                   "here (run.py bench --tune) and keep the fastest for this machine")
@click.option("--latency-budget-ms", type=float, default=None, help="p90 ceiling")
@click.option("--python", default=sys.executable, show_default="this Python",
              help="interpreter that runs run.py")
@click.option("--expect-digest", metavar="SHA256",
              help="refuse unless the bundle's digest (printed by build) is this one")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def verify_cmd(bundle: Path, runs: int, warmup: int, threads: int | None, tune: bool,
               latency_budget_ms: float | None, python: str, expect_digest: str | None,
               as_json: bool) -> None:
    """Run BUNDLE's own run.py as the device would: integrity, accuracy, latency, memory.

    Writes BUNDLE/reports/report.json and report.md. Exit 0 pass, 1 a check failed, 2 bad input.

    \b
    Example:
        edgepack verify out/mynet --runs 200
    """
    from ..device.verify import verify

    report = verify(bundle, python=python, runs=runs, warmup=warmup, threads=threads,
                    latency_budget_ms=latency_budget_ms, expect_digest=expect_digest, tune=tune)
    if as_json:
        emit(report, True, "")
    else:
        from ..device.verify import render_markdown

        click.echo(render_markdown(report).rstrip())
    if not report["passed"]:
        raise CheckFailed(f"{bundle}: verification failed",
                          f"see {bundle}/reports/report.md")


@main.command("report")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print the page's data (its JSON twin)")
def report_cmd(bundle: Path, as_json: bool) -> None:
    """Write BUNDLE's page: reports/index.html (open it in a browser) and reports/index.json.

    What shipped and why, speed against the original, OpenVINO and eager PyTorch, the
    candidates as a chart, where the time goes, accuracy (against your labels when the
    calibration images sit in class folders), size by file kind, and each device's latest
    report. build writes it; verify and deploy refresh it. Nothing is measured again.

    \b
    Example:
        edgepack report out/mynet && xdg-open out/mynet/reports/index.html
    """
    from ..device.page import write_page

    page = write_page(bundle)
    if as_json:
        click.echo((page.parent / "index.json").read_text().rstrip())
    else:
        click.echo(f"page: {page}")


@main.command("deploy")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("hosts", nargs=-1)
@click.option("--hosts", "inventory", type=click.Path(path_type=Path),
              help="inventory: one host per line, or Ansible INI")
@click.option("--port", type=int, help="ssh port (default: ssh's, or ~/.ssh/config)")
@click.option("--identity", type=click.Path(path_type=Path), help="private key for ssh -i")
@click.option("--ssh-config", type=click.Path(path_type=Path), help="ssh -F config file")
@click.option("--remote-dir", help="where the bundle goes (default ~/edgepack/NAME; ~ is the "
              "login's home)")
@click.option("--python", "remote_python", default="python3", show_default=True,
              help="the device's Python")
@click.option("--transfer", type=click.Choice(["auto", "rsync", "scp"]), default="auto",
              show_default=True, help="rsync when both ends have it, else scp")
@click.option("--checksum", is_flag=True, help="compare contents, not size and time (rsync)")
@click.option("--bwlimit", type=int, default=None, metavar="KB/S",
              help="limit the copy's bandwidth (slow or metered links)")
@click.option("--runs", type=int, default=100, show_default=True)
@click.option("--warmup", type=int, default=10, show_default=True)
@click.option("--threads", type=int, default=None, help="override the session's threads")
@click.option("--tune", is_flag=True,
              help="first time thread counts, optimisation levels and the execution mode on "
                   "each device (run.py bench --tune) and keep the fastest there")
@click.option("--latency-budget-ms", type=float, default=None, help="p90 ceiling")
@click.option("--require-provider", default=None, help="fail unless this provider runs")
@click.option("--allow-fallback", is_flag=True,
              help="run even when the device lacks the target's providers")
@click.option("--force", "any_arch", is_flag=True,
              help="deploy even when the bundle's arch (its target's) is not the device's "
                   "uname -m")
@click.option("--parallel", type=int, default=4, show_default=True,
              help="devices deployed at once (Ansible's forks)")
@click.option("--timeout", type=float, default=900.0, show_default=True,
              help="seconds per remote step, the copy included")
@click.option("--expect-digest", metavar="SHA256",
              help="refuse unless the bundle's digest (printed by build) is this one")
@click.option("--engine", type=click.Choice(["ssh", "ansible"]), default="ssh", show_default=True,
              help="ssh: edgepack's own fan-out; ansible: ansible-playbook with the "
                   "edgepack_bundle role (pip install -e '.[fleet]' in the edgepack checkout)")
@click.option("--limit", metavar="PATTERN", help="Ansible host pattern within --hosts")
@click.option("--canary", type=int, default=0, metavar="N",
              help="deploy and verify N hosts first; stop if any fails")
@click.option("--batch", metavar="N|P%", help="rolling batches of N hosts or P% of them")
@click.option("--max-fail", metavar="P%",
              help="stop the rollout once more than P% of the hosts done so far failed")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def deploy_cmd(bundle: Path, hosts: tuple[str, ...], inventory: Path | None, port: int | None,
               identity: Path | None, ssh_config: Path | None, remote_dir: str | None,
               remote_python: str, transfer: str, checksum: bool, bwlimit: int | None,
               runs: int, warmup: int,
               threads: int | None, tune: bool, latency_budget_ms: float | None,
               require_provider: str | None, allow_fallback: bool, any_arch: bool,
               parallel: int,
               timeout: float, expect_digest: str | None, engine: str, limit: str | None,
               canary: int, batch: str | None, max_fail: str | None, as_json: bool) -> None:
    """Copy BUNDLE to devices, check them, verify there, bring the reports back.

    Each version goes to DIR/releases/ID on the device and DIR/current points at it only once
    it passed its check there; DIR/previous keeps the one before (a host that fails keeps the
    release it had). Deploys to one DIR at once take turns to switch (DIR/.edgepack.lock); the
    last switch wins, and no release another deploy still uses is removed. Only releases
    edgepack made are ever removed from DIR/releases/. Uses your OpenSSH client and
    ~/.ssh/config, or with --engine ansible your inventory and ansible.cfg; host keys are
    checked strictly and no password is ever used. Reports land in BUNDLE/reports/HOST/.
    Exit 0 all passed, 1 a check failed, 2 bad input, or a device was unreachable, failed
    preflight or gave no answer within --timeout; 130 on Ctrl-C (every ssh, rsync and scp
    started is ended).

    \b
    Example:
        edgepack deploy out/net.tar.gz pi@raspberrypi.local
        edgepack deploy out/net --hosts devices.ini --parallel 8 --json > fleet.json
        edgepack deploy out/net.tar.gz --hosts fleet.yml --engine ansible \\
            --canary 2 --batch 25% --max-fail 10%
    """
    from ..device.deploy import DeployOptions, deploy, summary_table
    from ..device.inventory import parse_host
    from ..device.rollout import Rollout, parse_batch, parse_percent

    plan = Rollout(canary=canary, batch=parse_batch(batch),
                   max_fail=parse_percent(max_fail, "--max-fail"))
    if limit and not inventory:
        raise PackagerError("--limit selects hosts of an inventory", "add --hosts INVENTORY")
    if engine == "ansible" and (transfer != "auto" or bwlimit):
        raise PackagerError(f"--{'transfer' if transfer != 'auto' else 'bwlimit'} is for "
                            "--engine ssh; Ansible copies the archive with its own settings",
                            "drop the option, or set it in ansible.cfg")
    options = DeployOptions(remote_dir=remote_dir, python=remote_python, ssh_config=ssh_config,
                            port=port, identity=identity, transfer=transfer, checksum=checksum,
                            bwlimit_kbps=bwlimit,
                            runs=runs, warmup=warmup, threads=threads, tune=tune,
                            latency_budget_ms=latency_budget_ms,
                            require_provider=require_provider, allow_fallback=allow_fallback,
                            timeout=timeout, expect_digest=expect_digest, any_arch=any_arch)
    targets = [parse_host(h) for h in hosts] + (
        resolve_inventory(inventory, limit, engine) if inventory else [])
    # SIGTERM ends the deploy as Ctrl-C does: every ssh, rsync and scp it started is ended too
    before = signal.signal(signal.SIGTERM, _terminated)
    try:
        results = deploy(bundle, targets, options=options, parallel=parallel, log=log,
                         engine=engine, rollout=plan, inventories=[inventory] if inventory else [],
                         steps=step_line("deploy", as_json) or OFF)
    finally:
        signal.signal(signal.SIGTERM, before)
    code = max(r.exit_code for r in results)
    stopped = next((r.skipped for r in results if r.skipped), "")
    if as_json:
        emit({"passed": code == 0, "engine": engine, "stopped": stopped,
              "hosts": [r.to_dict() for r in results]}, True, "")
    else:
        if len(results) == 1 and results[0].report:
            from ..device.verify import render_markdown

            click.echo(render_markdown(results[0].report).rstrip())
        click.echo(summary_table(results))
    if code:
        click.get_current_context().exit(code)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def resolve_inventory(path: Path, limit: str | None, engine: str) -> list:
    """Hosts of an inventory as Ansible sees them when ansible-core is installed (YAML, groups,
    host_vars, --limit: both engines get the same hosts), else edgepack's INI reader."""
    from ..device.ansible_engine import INSTALL, ansible_tool, inventory_hosts
    from ..device.inventory import read_inventory

    try:
        ansible_tool("ansible-inventory")
    except PackagerError:
        if engine == "ansible":
            raise
        if limit or path.suffix in (".yml", ".yaml") or path.is_dir():
            raise PackagerError(f"--hosts {path}: "
                                + ("--limit" if limit else "a YAML inventory or folder")
                                + " needs ansible-core to read it", INSTALL) from None
        return read_inventory(path)
    return inventory_hosts([path], limit)


@main.command("ansible-role")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("roles"),
              show_default=True, help="the roles/ folder of your playbooks")
@click.option("--force", is_flag=True, help="replace an edgepack_bundle role that differs")
def ansible_role_cmd(output: Path, force: bool) -> None:
    """Write the edgepack_bundle Ansible role into OUTPUT/edgepack_bundle.

    The role deploys a bundle's .tar.gz and verifies it on each device before putting it in
    use, with ansible-core's built-in modules only; a second run with the same bundle changes
    nothing. Its variables are in OUTPUT/edgepack_bundle/defaults/main.yml, its README says
    how to use it.

    \b
    Example:
        edgepack ansible-role -o roles/
        ansible-playbook -i fleet.yml site.yml -e edgepack_bundle=out/net.tar.gz
    """
    from ..device.ansible_role import write_role

    dest, changed = write_role(output, force=force)
    click.echo(f"wrote {dest}/" if changed else f"{dest}/ is already this edgepack's role; "
               "nothing changed")
