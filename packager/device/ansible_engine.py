"""`deploy --engine ansible`: the same deploy through ansible-playbook and the edgepack_bundle role.

Ansible reads the user's inventory (INI or YAML, groups, host_vars/group_vars, vaulted values)
and its own ansible.cfg from the current folder; edgepack writes a playbook and the role into a
scratch folder, runs one `ansible-playbook --limit` per rollout batch, and reads back each host's
outcome (the role writes it on the controller) to produce the same reports as the SSH engine.
"""

import functools
import gzip
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._runtimes.runner.manifest import SAFE_NAME
from ..errors import BundleError, PackagerError, VerifyError
from .inventory import Host, InventoryError, check_destination, read_inventory_text
from .remote import end_group, finished, remember
from .role.edgepack_bundle.files.bundle_needs import fallback_notes
from .rollout import HostResult
from .verify import TUNE_RUNS, TUNE_WARMUP, bundle_digest, report_folder, run_checks, write_reports

INSTALL = "pip install -e '.[fleet]' in the edgepack checkout (ansible-core from PyPI)"
EXCLUDE = {"reports", "cache", "session.tuned.json"}
PLAYBOOK = """# written by edgepack deploy --engine ansible
- name: Deploy an edgepack bundle
  hosts: all
  gather_facts: false
  roles:
    - edgepack_bundle
"""

# run when a signal (or a failed ansible-playbook) cut a play off before a host's `always:`
# ended the hold on its release: the role's own end_hold.yml, for each HOST.hold record left
UNHOLD = """# written by edgepack deploy --engine ansible: end the holds a cut-off play left
- name: End the holds on the releases
  hosts: all
  gather_facts: false
  tasks:
    - name: End this host's hold
      ansible.builtin.include_role:
        name: edgepack_bundle
        tasks_from: end_hold
      vars:
        edgepack_hold_file: "{{ edgepack_holds[inventory_hostname].file }}"
        edgepack_hold_jid: "{{ edgepack_holds[inventory_hostname].jid }}"
"""
UNHOLD_SECONDS = 30   # the clean-up's bound, on top of the signal that asked for it


def ansible_tool(name: str) -> str:
    """ansible-playbook / ansible-inventory: beside this Python first (a venv), then on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if not found:
        raise PackagerError(f"--engine ansible needs ansible-core: {name} is not installed",
                            INSTALL)
    return found


def inventory_hosts(inventories: Sequence[Path], limit: str | None = None) -> list[Host]:
    """Hosts as Ansible resolves them (INI or YAML, groups, host and group vars, --limit), in
    inventory order, with the connection variables edgepack's SSH engine uses. Read once per
    version of the files (the CLI and the Ansible engine both ask)."""
    for path in inventories:
        read_inventory_text(Path(path))   # no FIFO, device or huge file reaches ansible-inventory
    stamp = tuple((str(Path(p).resolve()), Path(p).stat().st_mtime_ns) for p in inventories)
    return list(_inventory_hosts(stamp, limit))


INVENTORY_TIMEOUT = 120   # seconds for ansible-inventory (a FIFO inside an inventory folder)


@functools.lru_cache(maxsize=8)
def _inventory_hosts(stamp: tuple[tuple[str, int], ...], limit: str | None) -> tuple[Host, ...]:
    inventories = [path for path, _ in stamp]
    cmd = [ansible_tool("ansible-inventory"), "--list"]
    for path in inventories:
        cmd += ["-i", str(path)]
    cmd += ["--limit", limit] if limit else []
    where = ", ".join(map(str, inventories))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=ansible_env({}),
                              stdin=subprocess.DEVNULL, timeout=INVENTORY_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise InventoryError(f"--hosts {where}: ansible-inventory gave no answer in "
                             f"{INVENTORY_TIMEOUT} s", "check that the inventory holds only "
                             "regular files (no FIFO) and that its plugins answer") from None
    if proc.returncode != 0:
        raise InventoryError(f"--hosts {where}: ansible-inventory failed: {_last(proc.stderr)}",
                             "fix the inventory (ansible-inventory -i FILE --list shows it)")
    if "Unable to parse" in proc.stderr or "Skipping due to errors" in proc.stderr:
        raise InventoryError(f"--hosts {where}: Ansible cannot parse it: {_last(proc.stderr)}",
                             "fix the inventory (ansible-inventory -i FILE --list shows it)")
    try:
        data = json.loads(proc.stdout or "{}")
    except ValueError:
        raise InventoryError(f"--hosts {where}: ansible-inventory printed no JSON",
                             "run ansible-inventory -i FILE --list to see why") from None
    names: list[str] = []

    def walk(group: str, seen: set[str]) -> None:
        if group in seen:
            return
        seen.add(group)
        for name in data.get(group, {}).get("hosts", []):
            if name not in names:
                names.append(name)
        for child in data.get(group, {}).get("children", []):
            walk(child, seen)

    walk("all", set())
    if not names:
        raise InventoryError(f"--hosts {where}: no hosts"
                             + (f" match --limit {limit}" if limit else ""),
                             "check the inventory and the --limit pattern")
    hostvars = data.get("_meta", {}).get("hostvars", {})
    return tuple(_host(name, hostvars.get(name, {}), f"--hosts {where}: host {name}")
                 for name in names)


def _text(hv: dict[str, Any], where: str, *keys: str) -> str | None:
    """The first of *keys* that is set, as a string; a list, mapping or number is refused."""
    for key in keys:
        value = hv.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise InventoryError(f"{where}: {key} is {type(value).__name__} {value!r}, not text",
                                 f"give {key} a string value")
        return value
    return None


def _host(name: str, hv: dict[str, Any], where: str) -> Host:
    """A Host from Ansible's host variables; a value ssh would misread is a host error here."""
    address = _text(hv, where, "ansible_host") or name
    user = _text(hv, where, "ansible_user", "ansible_ssh_user")
    check_destination(where, user, address)
    port = None
    for key in ("ansible_port", "ansible_ssh_port"):
        value = hv.get(key)
        if value is None or value == "":
            continue
        text = str(value)
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not text.isdigit() \
                or not 1 <= int(text) <= 65535:
            raise InventoryError(f"{where}: {key}={value!r} is not a port number",
                                 "set a port from 1 to 65535")
        port = int(text)
        break
    key = _text(hv, where, "ansible_ssh_private_key_file", "ansible_private_key_file")
    # run.py's Python: edgepack_python over the host's interpreter, as the role reads them
    python = _text(hv, where, "edgepack_python") or _text(hv, where, "ansible_python_interpreter")
    remote_dir = _text(hv, where, "edgepack_remote_dir")
    options: list[str] = []
    for arg in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        value = _text(hv, where, arg)
        try:
            options += shlex.split(value or "")
        except ValueError as exc:
            raise InventoryError(f"{where}: {arg}: {exc}", "fix the quoting") from None
    return Host(name, f"{user}@{address}" if user else address, port,
                Path(key).expanduser() if key else None,
                None if not python or python.startswith("auto") else python,
                remote_dir, tuple(options))


def safe_name(name: Any, bundle: Path) -> str:
    """The bundle's name when it is one plain path component (it becomes a file and folder
    name: <scratch>/<name>.tar.gz, ~/edgepack/<name>); BundleError otherwise."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        raise BundleError(f"{bundle}: manifest.json: name {name!r} is not a plain name (letters, "
                          "digits, '.', '_', '-', at most 100, starting with a letter or digit)",
                          "build the bundle again with a plain name; nothing was written")
    return name


def outcome_name(host: str) -> str:
    """The role's file name for a host's outcome (the same rule as in tasks/main.yml): the
    inventory name when it is a plain file name, else a cleaned name plus a hash of it."""
    clean = re.sub(r"[^A-Za-z0-9_.@-]", "_", host)
    if clean == host and host not in (".", "..") and len(host) <= 100:
        return host
    return f"{clean[:80]}-{hashlib.sha1(host.encode()).hexdigest()[:12]}"


def pack(folder: Path, name: str, archive: Path) -> None:
    """folder as archive/NAME/..., byte for byte the same for the same files (no gzip time, no
    owner): the role's copy then changes nothing on a second deploy. Only regular files and
    folders, each written once (no hard links), with normal modes (0644 files, 0755 folders:
    run.py runs as `python3 run.py`, nothing needs an execute bit), owner 0: a setuid or
    world-writable file in the folder or its archive never reaches a device."""
    safe_name(name, folder)
    entries: list[tuple[str, Path | None]] = [(name, None)]
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if rel.parts[0] in EXCLUDE:
            continue
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode):
            entries.append((f"{name}/{rel.as_posix()}", None))
        elif stat.S_ISREG(mode):
            entries.append((f"{name}/{rel.as_posix()}", path))
        else:
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "a special file"
            raise BundleError(f"{folder}: {rel.as_posix()} is {kind}; a bundle holds only files "
                              "and folders", "build the bundle again; nothing was copied")
    partial = archive.with_name(f".{archive.name}.partial")
    try:
        with open(partial, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for member, path in entries:
                info = tarfile.TarInfo(member)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if path is None:
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
                    continue
                with open(path, "rb") as f:
                    st = os.fstat(f.fileno())
                    info.type, info.mode = tarfile.REGTYPE, 0o644
                    info.size, info.mtime = st.st_size, int(st.st_mtime)
                    tar.addfile(info, f)
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)


def ansible_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_RETRY_FILES_ENABLED="0",
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
               ANSIBLE_DEPRECATION_WARNINGS="0", ANSIBLE_SYSTEM_WARNINGS="0")
    env.setdefault("ANSIBLE_PIPELINING", "1")
    env.setdefault("ANSIBLE_TIMEOUT", "10")
    env.update(extra)
    return env


def ssh_env(o) -> dict[str, str]:
    """ansible-playbook's settings for DeployOptions *o* (ssh config, port, key, Python)."""
    ssh_args = ["-C", "-o", "ControlMaster=auto", "-o", "ControlPersist=60s",
                "-o", "BatchMode=yes"]
    if o.ssh_config:
        ssh_args += ["-F", str(Path(o.ssh_config).resolve())]
    # hosts without ansible_python_interpreter run modules with --python, as run.py
    extra = {"ANSIBLE_SSH_ARGS": shlex.join(ssh_args), "ANSIBLE_PYTHON_INTERPRETER": o.python}
    if o.port:
        extra["ANSIBLE_REMOTE_PORT"] = str(o.port)
    if o.identity:
        extra["ANSIBLE_PRIVATE_KEY_FILE"] = str(Path(o.identity).expanduser().resolve())
    return extra


def inventory_args(work: Path, inventories: Sequence[Path], listed: set[str],
                   hosts: Sequence[Host]) -> list[str]:
    """-i for the user's inventories, plus one written into *work* for the hosts given on the
    command line (those not in *listed*)."""
    args = [a for p in inventories for a in ("-i", str(p))]
    extra = [h for h in hosts if h.name not in listed]
    if extra:
        path = work / f"cli-{len(list(work.glob('cli-*')))}.ini"
        lines = []
        for h in extra:
            user, _, address = h.destination.rpartition("@")
            values = {"ansible_host": address, "ansible_user": user,
                      "ansible_port": h.port, "ansible_ssh_private_key_file": h.identity,
                      "ansible_python_interpreter": h.python,
                      "edgepack_remote_dir": h.remote_dir,
                      "ansible_ssh_common_args": shlex.join(h.ssh_options)}
            lines.append(" ".join([shlex.quote(h.name)] + [
                f"{k}={shlex.quote(str(v))}" for k, v in values.items() if v]))
        path.write_text("\n".join(lines) + "\n")
        args += ["-i", str(path)]
    return args


class AnsibleEngine:
    """One scratch folder (playbook, role, archive) for a deploy; `deploy(hosts)` runs a batch."""

    def __init__(self, bundle: Path, folder: Path, manifest: dict[str, Any], reports: Path,
                 options, parallel: int, log: Callable[[str], None],
                 inventories: Sequence[Path]):
        self.playbook_bin = ansible_tool("ansible-playbook")
        self.folder, self.manifest, self.reports = folder, manifest, reports
        self.options, self.parallel, self.log = options, parallel, log
        self.inventories = [Path(p).resolve() for p in inventories]
        self.digest = bundle_digest(folder)
        self.bundle = bundle
        self.listed: set[str] | None = None

    def __enter__(self) -> "AnsibleEngine":
        from .ansible_role import write_role

        # checked before anything is written: the name becomes <scratch>/<name>.tar.gz
        name = safe_name(self.manifest.get("name") or self.folder.name, self.bundle)
        self.work = Path(tempfile.mkdtemp(prefix="edgepack-ansible-"))
        try:
            write_role(self.work / "roles")
            (self.work / "site.yml").write_text(PLAYBOOK)
            # always the folder that was checked (a .tar.gz was unpacked with tarfile's data
            # filter), packed again: the user's archive, with its modes and owners, is never sent
            self.archive = self.work / f"{name}.tar.gz"
            pack(self.folder, name, self.archive)
        except BaseException:
            shutil.rmtree(self.work, ignore_errors=True)
            raise
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def variables(self, outcomes: Path) -> dict[str, Any]:
        o = self.options
        variables = {"edgepack_bundle": str(self.archive), "edgepack_reports_dir": str(outcomes),
                     "edgepack_expect_digest": self.digest, "edgepack_runs": o.runs,
                     "edgepack_warmup": o.warmup, "edgepack_threads": o.threads,
                     "edgepack_tune": o.tune, "edgepack_latency_budget_ms": o.latency_budget_ms,
                     "edgepack_require_provider": o.require_provider or "",
                     "edgepack_allow_fallback": o.allow_fallback,
                     "edgepack_any_arch": o.any_arch,
                     # at least 1: Ansible reads a task timeout of 0 as "no timeout"
                     "edgepack_timeout": max(1, math.ceil(o.timeout)),
                     # --timeout bounds every remote step, the copy included (as --engine ssh)
                     "edgepack_copy_timeout": max(1, math.ceil(o.timeout)),
                     "edgepack_reunpack": o.checksum,
                     "edgepack_default_python": o.python,
                     # run_checks' own --tune figures, so its replay asks for what the role ran
                     "edgepack_tune_runs": TUNE_RUNS, "edgepack_tune_warmup": TUNE_WARMUP}
        if o.remote_dir:   # the inventory's edgepack_remote_dir still wins, as with --engine ssh
            variables["edgepack_default_remote_dir"] = o.remote_dir
        return variables

    def inventory_args(self, hosts: Sequence[Host]) -> list[str]:
        """The user's inventories, plus one for hosts given on the command line."""
        if self.listed is None:
            self.listed = {h.name for h in inventory_hosts(self.inventories)} \
                if self.inventories else set()
        return inventory_args(self.work, self.inventories, self.listed, hosts)

    def deploy(self, hosts: list[Host]) -> list[HostResult]:
        o = self.options
        outcomes = Path(tempfile.mkdtemp(prefix="outcomes-", dir=self.work))
        variables = outcomes.with_suffix(".vars.json")
        variables.write_text(json.dumps(self.variables(outcomes)))
        limit = outcomes.with_suffix(".limit")
        limit.write_text("".join(f"{h.name}\n" for h in hosts))
        cmd = [self.playbook_bin, str(self.work / "site.yml"), *self.inventory_args(hosts),
               "--limit", f"@{limit}", "--forks", str(max(1, self.parallel)),
               "-e", f"@{variables}"]
        self.log(f"ansible-playbook: {len(hosts)} host(s), {self.parallel} fork(s)")
        start = time.monotonic()
        env = ansible_env(ssh_env(o))
        try:
            output = self._run(cmd, env)
        except BaseException:
            self._end_holds(hosts, outcomes, env)
            raise
        results = [self._result(h, outcomes, output) for h in hosts]
        for r in results:   # ansible-playbook runs the batch as a whole
            r.seconds = time.monotonic() - start
        return results

    def _run(self, cmd: list[str], env: dict[str, str]) -> list[str]:
        """Run ansible-playbook, logging each host's task results as they come."""
        lines: list[str] = []
        task = ""
        # its own process group, remembered: Ctrl-C and SIGTERM end ansible-playbook, its
        # workers and their ssh (whose end closes the device's command), not wait for them
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, cwd=os.getcwd(), stdin=subprocess.DEVNULL,
                                process_group=0)
        remember(proc)
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                lines.append(line)
                if os.environ.get("EDGEPACK_ANSIBLE_OUTPUT") == "1":   # the whole output
                    self.log(line)
                heading = re.match(r"TASK \[(?:edgepack_bundle : )?(.*)\]", line)
                if heading:
                    task = heading.group(1)
                    continue
                status = re.match(r"(ok|changed|fatal|failed|skipping|unreachable): \[([^\]]+?)"
                                  r"(?: -> [^\]]+)?\]", line)
                if status and status.group(1) in ("changed", "fatal", "failed"):
                    self.log(f"[{status.group(2)}] {task}: {status.group(1)}")
            proc.wait()
        except BaseException:   # Ctrl-C, SIGTERM: the play ends with edgepack
            end_group(proc)
            raise
        finally:
            finished(proc)
            proc.stdout.close()
        if proc.returncode not in (0, 2, 4):
            last = next((ln for ln in reversed(lines) if ln.startswith(("ERROR", "[ERROR]"))),
                        _last("\n".join(lines)))
            raise PackagerError(f"ansible-playbook failed (exit {proc.returncode}): {last}",
                                "run it again with -v to see more; check the inventory")
        return lines

    def _end_holds(self, hosts: list[Host], outcomes: Path, env: dict[str, str]) -> None:
        """End the device-side hold of every host whose play was cut off between starting its
        hold and ending it (its HOST.hold record is still in *outcomes*), within UNHOLD_SECONDS;
        a second signal ends this clean-up at once."""
        holds = {}
        for h in hosts:
            record = outcomes / f"{outcome_name(h.name)}.hold"
            try:
                holds[h.name] = json.loads(record.read_text())
            except (OSError, ValueError):
                continue
        if not holds:
            return
        self.log(f"ending the hold on the release of {len(holds)} host(s) the deploy cut off")
        (self.work / "unhold.yml").write_text(UNHOLD)
        extra = outcomes.with_suffix(".holds.json")
        extra.write_text(json.dumps({"edgepack_holds": holds, "edgepack_timeout": 10}))
        limit = outcomes.with_suffix(".holds")
        limit.write_text("".join(f"{name}\n" for name in holds))
        cmd = [self.playbook_bin, str(self.work / "unhold.yml"), *self.inventory_args(hosts),
               "--limit", f"@{limit}", "--forks", str(max(1, self.parallel)), "-e", f"@{extra}"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env, cwd=os.getcwd(), stdin=subprocess.DEVNULL,
                                process_group=0)
        remember(proc)
        try:
            proc.wait(timeout=UNHOLD_SECONDS)
        except subprocess.TimeoutExpired:
            self.log(f"the holds did not end in {UNHOLD_SECONDS} s; each ends by itself "
                     "after the deploy's longest time")
        finally:
            end_group(proc)
            finished(proc)

    def _result(self, host: Host, outcomes: Path, output: list[str]) -> HostResult:
        path = outcomes / f"{outcome_name(host.name)}.json"
        if not path.is_file():
            refused = next((ln for ln in output if "edgepack_bundle: " in ln), "")
            if refused:
                message = refused.split("edgepack_bundle: ", 1)[1].split("\\n")[0]
                raise BundleError(f"{self.bundle}: refused by the role: {message}",
                                  "build the bundle again")
            said = next((ln for ln in output if f"[{host.name}]" in ln and
                         ("fatal" in ln or "UNREACHABLE" in ln)), "")
            return HostResult(host.name, 2, error=f"{host.name}: no outcome from ansible-playbook"
                              f" ({said[:200] or 'the host was not in the play'})",
                              engine="ansible")
        data = json.loads(path.read_text())
        answer = data.get("device")   # what the device said; it may be anything
        device = {k: v for k, v in answer.items() if k != "problems"} \
            if isinstance(answer, dict) else {}
        result = HostResult(host.name, data["exit_code"], device=device, engine="ansible",
                            release={k: data[k] for k in ("dir", "release", "current",
                                                          "previous", "switched")})
        result.release["rolled_back"] = data.get("rolled_back") is True
        result.copied = {"method": "ansible", "archive": self.archive.name}
        # past the role's preflight (bundle_needs.py's rule, as --engine ssh), a provider listed
        # for speed that the device lacks is a note, the same as --engine ssh's
        have = device.get("providers")
        if isinstance(answer, dict) and answer.get("problems") == [] \
                and isinstance(have, list) and all(isinstance(p, str) for p in have):
            result.notes = fallback_notes(self.manifest, have)
        for note in result.notes:
            self.log(f"[{host.name}] note: {note}")
        if data["error"]:
            result.error = f"{host.name}: {data['error']}"
            self.log(f"[{host.name}] error: {data['error']}")
            return result
        runs = data.get("runs") or {}

        def execute(args: list[str]) -> tuple[int, str, str]:
            got = runs.get("tune" if "--tune" in args else args[0])
            if not got:
                return 2, "", f"run.py {args[0]} was not run by the role"
            return got["rc"], got["stdout"], got["stderr"]

        o = self.options
        where = f"{host.name}:{data['dir']}/releases/{data['release']}"
        try:
            report = run_checks(self.manifest, execute, where, runs=o.runs, warmup=o.warmup,
                                threads=o.threads, latency_budget_ms=o.latency_budget_ms,
                                require_provider=o.require_provider, tune=o.tune)
        except VerifyError as exc:
            result.exit_code, result.error = 2, f"{host.name}: {exc}"
            return result
        report["host"], report["digest"] = host.name, self.digest
        try:
            out = write_reports(self.reports, report, host=report_folder(host.name))
        except PackagerError as exc:   # a planted link in reports/HOST fails this host only
            result.exit_code, result.error = 2, f"{host.name}: {exc}"
            return result
        result.report, result.reports_dir = report, str(out)
        if report["passed"] != (data["exit_code"] == 0):   # the role and edgepack judge alike
            result.exit_code = 1
            result.error = (f"{host.name}: the role and edgepack disagree on the verdict "
                            f"(role exit {data['exit_code']})")
        self.log(f"[{host.name}] {'passed' if report['passed'] else 'FAILED'}; current -> "
                 f"{data['current'] or 'nothing'}; report in {out}/")
        return result


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"
