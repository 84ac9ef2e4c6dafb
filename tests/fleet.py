"""A fleet of real OpenSSH servers on 127.0.0.1, one per "device", for fleet deploy tests.

    with Fleet(tmp_path, [Device("pi-01"), Device("pi-02", python=old), Device("pi-03", down=True)]) as f:
        subprocess.run(["ssh", "-F", f.ssh_config, "pi-01", "python3 -V"])
        f.write_inventory(tmp_path / "hosts.ini", groups={"cams": ["pi-01", "pi-02"]})

Every device that is not down has its own sshd (own port, own ed25519 host key, all pinned in one
known_hosts) that accepts one shared client key. All devices are this machine and this user, so
each one gets its own folder, root/devices/NAME/, with:
  bin/python3   a wrapper that runs the device's Python (Device.python; default: this test
                process's interpreter, the venv with numpy and onnxruntime)
  edgepack/     remote_dir(NAME): where that device's bundles go

How `python3` on a device finds its own interpreter: each sshd_config has
`SetEnv PATH=root/devices/NAME/bin:<the standard PATH> SHLVL=1` (OpenSSH >= 8.7; SetEnv wins
over sshd's default environment). No forced command= in authorized_keys, so sftp (which Ansible
and scp use) keeps working. SHLVL=1 is there because bash, when sshd runs it, sources ~/.bashrc
(and /etc/bash.bashrc) even for `ssh host command` when it is a top-level shell, and a .bashrc
that puts e.g. pyenv's shims first on PATH would hide the device's python3; bash skips those
files when the inherited SHLVL makes it a nested shell. This holds for commands (ssh HOST CMD,
Ansible, rsync); an interactive login shell still reads /etc/profile, which resets PATH.
"""

import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import sshd_server
from sshd_server import SSHD, free_port, keygen, quote, sshd_config

STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OLD_ORT = "1.16.3"      # older than the 1.17 the x86 bundles need
OLD_NUMPY = "1.26.4"


def problem() -> str | None:
    """Why a fleet cannot be started here, or None."""
    return sshd_server.problem() or (None if shutil.which("sftp") else
                                     "sftp is missing: apt-get install openssh-client")


@dataclass
class Device:
    name: str                          # inventory host name, e.g. "pi-01"
    python: list[str] | None = None    # command that runs its python3 (None: sys.executable)
    down: bool = False                 # no sshd listens on its port (unreachable)


def require(reason: str | None, variable: str) -> None:
    """Skip a test with *reason*, or fail it where *variable* (EDGEPACK_REQUIRE_...) is 1."""
    if reason:
        import pytest

        if os.environ.get(variable) == "1":
            pytest.fail(f"required here ({variable}=1): {reason}")
        pytest.skip(reason)


def _ppids() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    result = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            result[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return result


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _alive(pid: int) -> bool:
    """Whether *pid* runs (a zombie, waiting for its parent to reap it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


class Fleet:
    """One sshd per device that is not down; see the module's docstring."""

    def __init__(self, root: Path, devices: list[Device], *, timeout: float = 20.0):
        self.root = Path(root)
        self.devices = list(devices)
        self.user = getpass.getuser()
        names = [d.name for d in self.devices]
        if len(set(names)) != len(names):
            raise ValueError(f"device names must be unique: {names}")
        for name in names:
            if not name or any(c.isspace() or c in "/*?!,#'\"\\" for c in name):
                raise ValueError(f"{name!r} is not a usable host name")
        self._procs: dict[str, subprocess.Popen] = {}
        self._ports: dict[str, int] = {}
        keys = self.root / "keys"
        keys.mkdir(parents=True, exist_ok=True)
        self.client_key = keys / "client_key"
        self.known_hosts = self.root / "known_hosts"
        self.ssh_config = self.root / "ssh_config"
        self.authorized_keys = keys / "authorized_keys"
        for device in self.devices:
            folder = self.device_dir(device.name)
            (folder / "bin").mkdir(parents=True, exist_ok=True)
            self.remote_dir(device.name).mkdir(parents=True, exist_ok=True)
            wrapper = folder / "bin" / "python3"
            wrapper.write_text("#!/bin/sh\nexec " + shlex.join(device.python or [sys.executable])
                               + ' "$@"\n')
            wrapper.chmod(0o755)
        # ssh-keygen once per device and once for the client, in parallel (~10 ms each).
        paths = [self.client_key] + [self.device_dir(n) / "host_key" for n in names]
        for path in paths:
            for old in (path, path.with_suffix(".pub")):
                old.unlink(missing_ok=True)
        with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
            pubs = list(pool.map(keygen, paths))
        self.authorized_keys.write_text(pubs[0] + "\n")
        self._host_keys = {n: " ".join(pub.split()[:2]) for n, pub in zip(names, pubs[1:],
                                                                             strict=True)}
        taken: set[int] = set()
        for name in names:
            self._ports[name] = self._new_port(taken)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)   # sshd's privilege separation dir
        try:
            self._start_all(timeout)
        except BaseException:
            self.stop()
            raise
        self.known_hosts.write_text("".join(f"[127.0.0.1]:{self._ports[n]} {self._host_keys[n]}\n"
                                            for n in names))
        self.ssh_config.write_text("".join(f"""Host {n}
  HostName 127.0.0.1
  Port {self._ports[n]}
  User {self.user}
  IdentityFile {quote(str(self.client_key))}
  IdentitiesOnly yes
  StrictHostKeyChecking yes
  UserKnownHostsFile {quote(str(self.known_hosts))}
  BatchMode yes
""" for n in names))

    # -- queries ------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    @property
    def up(self) -> list[str]:
        """Names of the devices whose sshd runs."""
        return [d.name for d in self.devices if not d.down]

    def port(self, name: str) -> int:
        return self._ports[name]

    def device_dir(self, name: str) -> Path:
        return self.root / "devices" / name

    def remote_dir(self, name: str) -> Path:
        """Where that device's bundles go (distinct per device: they share machine and user)."""
        return self.device_dir(name) / "edgepack"

    def ssh(self, name: str, command: str, **kw) -> subprocess.CompletedProcess:
        """`ssh -F ssh_config NAME COMMAND`, text output captured, no ssh agent."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run(["ssh", "-F", str(self.ssh_config), name, command],
                              env=sshd_server.env_without_agent(), **kw)

    # -- inventory ----------------------------------------------------------------------------

    def host_vars(self, name: str) -> dict[str, str | int]:
        return {"ansible_host": "127.0.0.1", "ansible_port": self._ports[name],
                "ansible_user": self.user, "ansible_ssh_private_key_file": str(self.client_key),
                "ansible_python_interpreter": "python3",
                "edgepack_remote_dir": str(self.remote_dir(name))}

    def write_inventory(self, path: Path, fmt: str = "ini",
                        groups: dict[str, list[str]] | None = None,
                        extra: dict[str, str] | None = None, *, pin_host_keys: bool = True) -> Path:
        """An Ansible inventory of the fleet, INI ("ini") or YAML ("yaml"); see host_vars for
        what each host gets. groups: group -> host names (default: "devices" with all of them);
        hosts in no group are ungrouped. extra: variables for all. pin_host_keys: put
        ansible_ssh_common_args (this fleet's known_hosts, StrictHostKeyChecking=yes) into the
        all vars, so ssh and ansible need no ssh_config to check the host keys."""
        path = Path(path)
        groups = {"devices": self.names} if groups is None else groups
        for group, members in groups.items():
            unknown = sorted(set(members) - set(self.names))
            if unknown:
                raise ValueError(f"group {group}: no device named {unknown[0]}")
        grouped = {n for members in groups.values() for n in members}
        ungrouped = [n for n in self.names if n not in grouped]
        all_vars: dict[str, str] = dict(extra or {})
        if pin_host_keys:
            all_vars["ansible_ssh_common_args"] = (f"-o UserKnownHostsFile={self.known_hosts} "
                                                   "-o StrictHostKeyChecking=yes")
        if fmt == "ini":
            def host_line(n: str) -> str:
                return " ".join([n] + [f"{k}={shlex.quote(str(v))}"
                                       for k, v in self.host_vars(n).items()]) + "\n"

            def var_line(k: str, v: str) -> str:
                text = str(v)
                return f"{k}={repr(text) if text != text.strip() or ' ' in text else text}\n"

            text = "".join(host_line(n) for n in ungrouped)
            for group, members in groups.items():
                text += f"\n[{group}]\n" + "".join(host_line(n) for n in members)
            if all_vars:
                text += "\n[all:vars]\n" + "".join(var_line(k, v) for k, v in all_vars.items())
        elif fmt in ("yaml", "yml"):
            tree: dict = {"all": {}}
            if all_vars:
                tree["all"]["vars"] = all_vars
            if ungrouped:
                tree["all"]["hosts"] = {n: self.host_vars(n) for n in ungrouped}
            if groups:
                tree["all"]["children"] = {g: {"hosts": {n: self.host_vars(n) for n in members}}
                                           for g, members in groups.items()}
            try:
                import yaml
                text = yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)
            except ImportError:   # JSON is YAML too
                import json
                text = json.dumps(tree, indent=2) + "\n"
        else:
            raise ValueError(f"inventory format {fmt!r}: use 'ini' or 'yaml'")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"))
        return path

    # -- sshd processes -----------------------------------------------------------------------

    def _new_port(self, taken: set[int]) -> int:
        while True:
            port = free_port()
            if port not in taken:
                taken.add(port)
                return port

    def _write_sshd_config(self, name: str) -> Path:
        folder = self.device_dir(name)
        config = folder / "sshd_config"
        # Ansible opens several sessions at once; SetEnv: see the module's docstring
        config.write_text(sshd_config(self._ports[name], folder / "host_key",
                                      self.authorized_keys, folder / "sshd.pid", f"""\
MaxStartups 100:30:200
MaxSessions 50
SetEnv "PATH={folder / 'bin'}:{STANDARD_PATH}" SHLVL=1
"""))
        return config

    def _spawn(self, name: str) -> None:
        config = self._write_sshd_config(name)
        with open(self.device_dir(name) / "sshd.log", "w") as log:
            self._procs[name] = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                                 stdin=subprocess.DEVNULL, stderr=log)

    def _start_all(self, timeout: float) -> None:
        pending = set(self.up)
        for name in pending:
            self._spawn(name)
        taken = set(self._ports.values())
        retries = 3
        deadline = time.monotonic() + timeout
        while pending:
            for name in sorted(pending):
                try:
                    with socket.create_connection(("127.0.0.1", self._ports[name]), timeout=0.5):
                        pending.discard(name)
                        continue
                except OSError:
                    pass
                proc = self._procs[name]
                if proc.poll() is None:
                    continue
                log = (self.device_dir(name) / "sshd.log").read_text()
                if "Address already in use" in log and retries:   # free_port raced another user
                    retries -= 1
                    self._ports[name] = self._new_port(taken)
                    self._spawn(name)
                    continue
                raise RuntimeError(f"sshd for {name} exited ({proc.returncode}): {log[-800:]}")
            if not pending:
                break
            if time.monotonic() > deadline:
                tails = {n: (self.device_dir(n) / "sshd.log").read_text()[-300:] for n in pending}
                raise RuntimeError(f"sshd did not start listening within {timeout:.0f} s for "
                                   f"{sorted(pending)}: {tails}")
            time.sleep(0.01)

    def stop(self) -> None:
        """Terminate every sshd and the sessions it started (so that no ControlPersist master,
        e.g. Ansible's, keeps talking to a session of a stopped device), and wait."""
        procs = [p for p in self._procs.values() if p.poll() is None]
        self._procs = {}
        if not procs:
            return
        ppids = _ppids()
        children: dict[int, list[int]] = {}
        for pid, ppid in ppids.items():
            children.setdefault(ppid, []).append(pid)
        sessions, todo = [], [p.pid for p in procs]
        while todo:
            for child in children.get(todo.pop(), []):
                sessions.append(child)
                todo.append(child)
        for pid in sessions:
            _signal(pid, signal.SIGTERM)
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + 10
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # The sessions are not our children (sshd forked them): wait until they are gone.
        deadline = time.monotonic() + 5
        while sessions and time.monotonic() < deadline:
            sessions = [pid for pid in sessions if _alive(pid)]
            time.sleep(0.01)
        for pid in sessions:
            _signal(pid, signal.SIGKILL)

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _base_python() -> str | None:
    """A python3 of the venv's version that is not the venv (its base interpreter)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (Path(sys.base_prefix) / "bin" / version, Path(sys.base_prefix) / "bin" /
                      "python3", Path("/usr/bin") / version):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(version)
    return found if found and not found.startswith(sys.prefix) else None


def old_onnxruntime_python() -> list[str] | str:
    """A python3 command whose onnxruntime is 1.16.3 (older than the 1.17 the x86 bundles need),
    or a string saying why not. The wheels are installed once into EDGEPACK_OLD_ORT_CACHE
    (default ~/.cache/edgepack/old-ort) and put first on the base interpreter's path."""
    cache = Path(os.environ.get("EDGEPACK_OLD_ORT_CACHE",
                                Path.home() / ".cache" / "edgepack" / "old-ort"))
    base = _base_python()
    if not base:
        return f"no python{sys.version_info.major}.{sys.version_info.minor} outside the venv"
    site = cache / "site"
    if not (cache / ".complete").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".site.", dir=cache))   # atomic: xdist workers race
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--disable-pip-version-check", "--target", str(tmp),
                            f"onnxruntime=={OLD_ORT}", f"numpy=={OLD_NUMPY}"],
                           check=True, capture_output=True, text=True, timeout=900)
            if not (cache / ".complete").is_file():
                shutil.rmtree(site, ignore_errors=True)
                os.replace(tmp, site)
                (cache / ".complete").write_text(f"onnxruntime=={OLD_ORT} numpy=={OLD_NUMPY}\n")
        except subprocess.CalledProcessError as exc:
            tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-2:]
            return f"pip could not install onnxruntime=={OLD_ORT} numpy=={OLD_NUMPY}: " + \
                " | ".join(tail)
        except subprocess.TimeoutExpired:
            return f"pip took over 15 minutes to install onnxruntime=={OLD_ORT}"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    command = [shutil.which("env") or "/usr/bin/env", f"PYTHONPATH={site}", "PYTHONNOUSERSITE=1",
               base, "-s"]
    check = subprocess.run([*command, "-c", "import onnxruntime, numpy; "
                            "print(onnxruntime.__version__, numpy.__version__)"],
                           capture_output=True, text=True, timeout=120)
    if check.returncode or check.stdout.split() != [OLD_ORT, OLD_NUMPY]:
        return (f"{base} with {site} does not import onnxruntime {OLD_ORT} and numpy "
                f"{OLD_NUMPY}: {(check.stdout + check.stderr).strip()[-300:]}")
    return command


def ours_running(marker: str) -> list[str]:
    """Command lines of live processes (not zombies) that mention *marker*."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state not in "ZX":
            found.append(cmd)
    return found


def wait_until_gone(marker: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while ours_running(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return ours_running(marker)
