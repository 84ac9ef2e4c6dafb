"""Run a few commands on each host, with either engine: what `status` and `rollback` do there.

A plan maps each host to its steps (argv, stdin, folder). The SSH engine runs them over the
user's OpenSSH client, hosts in parallel; the Ansible engine runs one ansible-playbook for the
whole plan (the `command` module, the user's inventory and ansible.cfg). Both answer, per host,
every step's (exit code, stdout, stderr), or one line saying why the host gave no answer.
"""

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import PackagerError
from ..progress import Log
from .inventory import Host
from .remote import Connection, DeviceError, end_all

Answer = list[tuple[int, str, str]]


@dataclass(frozen=True)
class Step:
    name: str                      # says which step failed: "state", "run.py check"
    argv: tuple[str, ...]
    stdin: str | None = None
    chdir: str | None = None


def with_defaults(host: Host, options) -> Host:
    """The host with the command line's --port and --identity where it sets none (as deploy)."""
    return Host(host.name, host.destination, host.port or options.port,
                host.identity or options.identity, host.python, host.remote_dir,
                host.ssh_options)


def python_of(host: Host, options) -> str:
    return host.python or options.python


def run_ssh(plan: dict[Host, list[Step]], options, parallel: int) -> dict[str, Answer | str]:
    """Every host's steps over SSH, in order; a host whose step cannot run answers one line."""
    def one(host: Host) -> Answer | str:
        conn = Connection(with_defaults(host, options), ssh_config=options.ssh_config)
        out: Answer = []
        try:
            for step in plan[host]:
                command = shlex.join(step.argv)
                if step.chdir:
                    command = f"cd -- {shlex.quote(step.chdir)} && {command}"
                proc = conn.run(command, stdin=step.stdin, timeout=options.timeout,
                                step=step.name)
                out.append((proc.returncode, proc.stdout, proc.stderr))
        except PackagerError as exc:
            return str(exc)
        return out

    hosts = list(plan)
    if not hosts:
        return {}
    pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts))))
    try:
        answers = dict(zip([h.name for h in hosts], pool.map(one, hosts), strict=True))
    except BaseException:   # Ctrl-C: end every ssh still running
        end_all()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)   # every host answered: its thread is done
    return answers


PLAYBOOK = """# written by edgepack (status, rollback): each host's steps, answers kept on the controller
- name: edgepack steps
  hosts: all
  gather_facts: false
  tasks:
    - name: Run the steps
      ansible.builtin.command:
        argv: "{{ item.argv }}"
        chdir: "{{ item.chdir | default(omit, true) }}"
        stdin: "{{ item.stdin | default(omit, true) }}"
        stdin_add_newline: false
        strip_empty_ends: false
      loop: "{{ edgepack_steps[inventory_hostname] }}"
      loop_control:
        label: "{{ item.name }}"
      timeout: "{{ edgepack_timeout | int }}"
      register: edgepack_steps_out
      changed_when: false
      failed_when: false
      check_mode: false
      ignore_unreachable: true

    - name: Keep the answers on the controller
      ansible.builtin.copy:
        content: >-
          {{ {'results': edgepack_steps_out.results | default([]),
              'unreachable': edgepack_steps_out.unreachable | default(false),
              'msg': edgepack_steps_out.msg | default('')} | to_json }}
        dest: "{{ edgepack_outcomes }}/{{ edgepack_names[inventory_hostname] }}.json"
        mode: "0600"
      delegate_to: localhost
      vars:
        ansible_python_interpreter: "{{ ansible_playbook_python }}"
      changed_when: false
"""


def run_ansible(plan: dict[Host, list[Step]], options, parallel: int,
                inventories: Sequence[Path], log: Log) -> dict[str, Answer | str]:
    """Every host's steps through one ansible-playbook run (hosts as Ansible resolves them)."""
    from .ansible_engine import (
        ansible_env,
        ansible_tool,
        inventory_args,
        inventory_hosts,
        outcome_name,
        ssh_env,
    )

    if not plan:
        return {}
    playbook_bin = ansible_tool("ansible-playbook")
    inventories = [Path(p).resolve() for p in inventories]
    listed = {h.name for h in inventory_hosts(inventories)} if inventories else set()
    work = Path(tempfile.mkdtemp(prefix="edgepack-ansible-"))
    try:
        outcomes = work / "outcomes"
        outcomes.mkdir()
        (work / "steps.yml").write_text(PLAYBOOK)
        names = {h.name: outcome_name(h.name) for h in plan}
        variables = {"edgepack_steps": {h.name: [
            {"name": s.name, "argv": list(s.argv), "stdin": s.stdin or "",
             "chdir": s.chdir or ""} for s in steps] for h, steps in plan.items()},
            "edgepack_names": names, "edgepack_outcomes": str(outcomes),
            "edgepack_timeout": max(1, int(options.timeout + 0.999))}
        (work / "vars.json").write_text(json.dumps(variables))
        (work / "limit").write_text("".join(f"{h.name}\n" for h in plan))
        cmd = [playbook_bin, str(work / "steps.yml"), *inventory_args(work, inventories, listed,
                                                                      list(plan)),
               "--limit", f"@{work / 'limit'}", "--forks", str(max(1, parallel)),
               "-e", f"@{work / 'vars.json'}"]
        log(f"ansible-playbook: {len(plan)} host(s), {parallel} fork(s)")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=ansible_env(ssh_env(options)),
                              stdin=subprocess.DEVNULL, cwd=os.getcwd(),
                              timeout=options.timeout * (1 + max(len(s) for s in plan.values()))
                              + 120)
        if proc.returncode not in (0, 2, 4):
            last = next((ln for ln in reversed(proc.stdout.splitlines())
                         if ln.startswith(("ERROR", "[ERROR]"))),
                        (proc.stderr.strip().splitlines() or ["no output"])[-1])
            raise PackagerError(f"ansible-playbook failed (exit {proc.returncode}): {last[:300]}",
                                "run it again with -v to see more; check the inventory")
        return {h.name: _answer(h, outcomes / f"{names[h.name]}.json", len(plan[h]))
                for h in plan}
    except subprocess.TimeoutExpired:
        raise PackagerError("ansible-playbook gave no answer in time",
                            "check the devices, or raise --timeout") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _answer(host: Host, path: Path, steps: int) -> Answer | str:
    if not path.is_file():
        return f"{host.name}: no answer from ansible-playbook (the host was not in the play)"
    data = json.loads(path.read_text())
    results = data.get("results") or []
    out: Answer = []
    for item in results:
        if item.get("unreachable"):
            return f"{host.name}: unreachable ({' '.join(str(item.get('msg', '')).split())[:200]})"
        if not isinstance(item.get("rc"), int):   # a timeout, a module that could not run
            what = (item.get("item") or {}).get("name", "a step")
            return f"{host.name}: {what}: {' '.join(str(item.get('msg', 'failed')).split())[:200]}"
        out.append((item["rc"], item.get("stdout", ""), item.get("stderr", "")))
    if data.get("unreachable") or len(out) < steps:
        return f"{host.name}: unreachable ({' '.join(str(data.get('msg', '')).split())[:200]})"
    return out


def run(plan: dict[Host, list[Step]], *, engine: str, options, parallel: int,
        inventories: Sequence[Path], log: Log) -> dict[str, Answer | str]:
    """The plan run with *engine* (ssh or ansible)."""
    if engine == "ansible":
        return run_ansible(plan, options, parallel, inventories, log)
    return run_ssh(plan, options, parallel)


__all__ = ["Answer", "DeviceError", "Step", "python_of", "run"]
