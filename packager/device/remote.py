"""Talk to a device with the user's OpenSSH client: ssh, rsync (over ssh) or scp.

The user's ~/.ssh/config, agent, ProxyJump and known_hosts apply as in their own shell. Host keys
are checked strictly (OpenSSH's default with BatchMode: an unknown or changed key is refused) and
BatchMode means no password prompt, ever: keys or the agent only.

Every step has a deadline. Each ssh, rsync and scp runs in its own process group; when its
deadline passes, or edgepack is interrupted, the whole group is ended (rsync's own ssh
included), and the step is named in the error. ssh sends keep-alives (ServerAliveInterval), so a
device that stops answering is noticed even while a copy waits on it.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import PackagerError
from .inventory import Host

ALIVE_INTERVAL = 15     # seconds between ssh keep-alives
ALIVE_COUNT = 4         # unanswered keep-alives before ssh gives up (60 s)


class DeviceError(PackagerError):
    """The device cannot be reached, refuses us, or fails a preflight check (exit 2)."""


@dataclass(frozen=True)
class Copied:
    method: str        # "rsync" or "scp"
    files: int         # files transferred
    bytes_sent: int    # bytes that went over the wire (rsync); file bytes for scp


_RUNNING: set[subprocess.Popen] = set()     # every child started here that has not ended yet
_RUNNING_LOCK = threading.Lock()


def end_group(proc: subprocess.Popen) -> None:
    """End *proc* and everything it started (its process group): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue


def end_all() -> None:
    """End every child process group still running (on Ctrl-C or SIGTERM in edgepack)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        end_group(proc)


def start(cmd: list[str], *, stdin: bool = False) -> subprocess.Popen:
    """Start *cmd* in a process group of its own, remembered until it ends."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            process_group=0)
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    return proc


def remember(proc: subprocess.Popen) -> None:
    """Remember *proc* (started in a process group of its own) until `finished`: end_all ends
    it on Ctrl-C or SIGTERM."""
    with _RUNNING_LOCK:
        _RUNNING.add(proc)


def finished(proc: subprocess.Popen) -> None:
    with _RUNNING_LOCK:
        _RUNNING.discard(proc)


def bounded(cmd: list[str], *, stdin: str | None, timeout: float, step: str,
            host: str) -> subprocess.CompletedProcess:
    """Run *cmd* to its end within *timeout* seconds, or end its process group and say which
    step on which host gave no answer."""
    proc = start(cmd, stdin=stdin is not None)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        end_group(proc)
        raise DeviceError(f"{host}: {step}: no answer in {timeout:g} s; ended it",
                          "check the device (is it overloaded or its disk stalled?), or raise "
                          "--timeout") from None
    except BaseException:
        end_group(proc)
        raise
    finally:
        finished(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def check_destination(host: Host) -> None:
    """Refuse a destination ssh would read as an option (a user or host starting with '-')."""
    user, _, address = host.destination.rpartition("@")
    for part, what in ((user, "user"), (address, "host")):
        if part.startswith("-") or (what == "host" and not address) or \
                any(c.isspace() or ord(c) < 32 for c in part):
            raise DeviceError(f"{host.name}: {what} {part!r} is not a {what} name ssh can take "
                              "(it would be read as an option or is empty)",
                              "give an ssh alias, user@host, or ssh://user@host:port")
    if host.port is not None and not 1 <= host.port <= 65535:
        raise DeviceError(f"{host.name}: port {host.port} is not a TCP port",
                          "give a port from 1 to 65535")


class Connection:
    def __init__(self, host: Host, *, ssh_config: Path | None = None,
                 connect_timeout: int = 10):
        check_destination(host)
        self.host = host
        self.ssh_config = ssh_config
        self.connect_timeout = connect_timeout

    def ssh_args(self) -> list[str]:
        """The ssh command up to the destination (used for rsync's -e too)."""
        args = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}",
                "-o", f"ServerAliveInterval={ALIVE_INTERVAL}",
                "-o", f"ServerAliveCountMax={ALIVE_COUNT}"]
        if self.ssh_config:
            args += ["-F", str(self.ssh_config)]
        if self.host.port:
            args += ["-p", str(self.host.port)]
        if self.host.identity:
            args += ["-i", str(self.host.identity), "-o", "IdentitiesOnly=yes"]
        return args + list(self.host.ssh_options)

    def run(self, command: str, *, stdin: str | None = None, timeout: float = 900.0,
            step: str = "a remote step") -> subprocess.CompletedProcess:
        """Run a shell *command* on the device; ssh's own failures become DeviceError."""
        proc = bounded([*self.ssh_args(), "--", self.host.destination, command], stdin=stdin,
                       timeout=timeout, step=step, host=self.host.name)
        if proc.returncode == 255:
            raise ssh_failure(self.host, proc.stderr)
        return proc

    def hold(self, command: str, script: str, *, timeout: float, step: str) -> "Held":
        """Start *command* (which reads *script* from stdin and then waits for stdin to close),
        and wait for its first line: a lock held on the device for as long as this lives."""
        proc = start([*self.ssh_args(), "--", self.host.destination, command], stdin=True)
        held = Held(proc)
        try:
            line = held.first_line(script, timeout)
        except subprocess.TimeoutExpired:
            held.end()
            raise DeviceError(f"{self.host.name}: {step}: no answer in {timeout:g} s; ended it",
                              "check the device, or raise --timeout") from None
        except BaseException:
            held.end()
            raise
        if not line:
            err = held.close()
            if proc.returncode == 255:
                raise ssh_failure(self.host, err)
            held.stderr = err
        held.line = line
        return held

    def copy(self, local: Path, remote_dir: str, *, method: str, checksum: bool = False,
             exclude: tuple[str, ...] = (), bwlimit_kbps: int | None = None,
             copy_dest: str | None = None, timeout: float = 900.0,
             resumes: bool = True) -> Copied:
        """Copy the folder *local* into *remote_dir* (absolute) on the device, within *timeout*
        seconds. *copy_dest* (rsync): a folder on the device, relative to *remote_dir*, whose
        unchanged files are copied there instead of sent (a new release takes what it shares
        with the one in use)."""
        if method == "rsync":
            return self._rsync(local, remote_dir, checksum, exclude, bwlimit_kbps, copy_dest,
                               timeout, resumes)
        return self._scp(local, remote_dir, exclude, bwlimit_kbps, timeout)

    def _rsync(self, local: Path, remote_dir: str, checksum: bool, exclude: tuple[str, ...],
               bwlimit_kbps: int | None, copy_dest: str | None, timeout: float,
               resumes: bool) -> Copied:
        # --partial keeps what arrived when a copy is cut off; the next run sends only the rest.
        # --timeout: rsync's own I/O deadline (a stall late in a long copy ends it from the
        # inside, and the copy resumes); a little after ours, so a short --timeout is ours.
        io_timeout = int(min(timeout + 10, 300))
        # --delete: the folder holds the bundle and nothing else (what a refused or older copy
        # left there, a planted module, goes); what *exclude* names (the device's own reports,
        # caches, tuning) is protected from it
        cmd = ["rsync", "-rt", "--partial", "--delete", "--stats", f"--timeout={io_timeout}",
               "-e", shlex.join(self.ssh_args())]
        cmd += [f"--copy-dest={copy_dest}"] if copy_dest else []
        cmd += ["--checksum"] if checksum else []
        cmd += [f"--bwlimit={bwlimit_kbps}"] if bwlimit_kbps else []
        for pattern in exclude:
            cmd += ["--exclude", pattern]
        cmd += ["--", f"{local}/", f"{self.host.destination}:{remote_dir}/"]
        proc = bounded(cmd, stdin=None, timeout=timeout, step="copy (rsync)",
                       host=self.host.name)
        if proc.returncode != 0:
            if "Host key verification failed" in proc.stderr or proc.returncode == 255:
                raise ssh_failure(self.host, proc.stderr)
            full = no_space(proc.stderr)
            if full:
                raise DeviceError(f"{self.host.name}: copy (rsync): no space left on the device "
                                  f"under {remote_dir} ({full})", "free some space (blocks and "
                                  "inodes) there, or pass --remote-dir on another file system; "
                                  "what arrived is kept and the next deploy sends only the rest")
            raise DeviceError(f"{self.host.name}: copy (rsync) failed (exit {proc.returncode}): "
                              f"{_last(proc.stderr)}",
                              "deploy again: the copy resumes" if resumes else
                              "check the device and the folder, then deploy again")
        return Copied("rsync", _stat(proc.stdout, "Number of regular files transferred"),
                      _stat(proc.stdout, "Total bytes sent"))

    def _scp(self, local: Path, remote_dir: str, exclude: tuple[str, ...],
             bwlimit_kbps: int | None, timeout: float) -> Copied:
        entries = [p for p in sorted(local.iterdir()) if p.name not in
                   {e.strip("/") for e in exclude}]
        args = ["-P" if a == "-p" else a for a in self.ssh_args()[1:]]
        args += ["-l", str(8 * bwlimit_kbps)] if bwlimit_kbps else []   # scp counts Kbit/s
        cmd = ["scp", "-r", "-p", "-q", *args, "--", *map(str, entries),
               f"{self.host.destination}:{remote_dir}/"]
        proc = bounded(cmd, stdin=None, timeout=timeout, step="copy (scp)", host=self.host.name)
        if proc.returncode != 0:
            if "Host key verification failed" in proc.stderr:
                raise ssh_failure(self.host, proc.stderr)
            full = no_space(proc.stderr)
            raise DeviceError(f"{self.host.name}: copy (scp) failed (exit {proc.returncode}): "
                              f"{full or _last(proc.stderr)}",
                              "free some space on the device, then deploy again" if full else
                              "deploy again")
        files = [p for e in entries for p in ([e] if e.is_file() else e.rglob("*")) if p.is_file()]
        return Copied("scp", len(files), sum(p.stat().st_size for p in files))


class Held:
    """A remote command that holds a lock until its stdin closes (device_probe hold)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.line = ""
        self.stderr = ""

    def first_line(self, script: str, timeout: float) -> str:
        assert self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write(script)
            self.proc.stdin.flush()
        except BrokenPipeError:   # ssh ended already: its exit status and stderr say why
            return ""
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive():
            raise subprocess.TimeoutExpired(self.proc.args, timeout)
        return got[0] if got else ""

    def as_completed(self) -> subprocess.CompletedProcess:
        """The first line as a finished command's output (for device_answers.answer)."""
        code = 0 if self.line else (self.proc.returncode if self.proc.returncode is not None
                                    else 1)
        return subprocess.CompletedProcess(self.proc.args, code, self.line, self.stderr)

    def end(self) -> None:
        """End the remote command now (its process group here)."""
        end_group(self.proc)
        finished(self.proc)

    def close(self) -> str:
        """Let the remote command end (its stdin closes), or end it; its stderr."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        err = ""
        try:
            self.proc.wait(timeout=10)
            err = self.proc.stderr.read() if self.proc.stderr else ""
        except subprocess.TimeoutExpired:
            end_group(self.proc)
        finally:
            finished(self.proc)
        return err


@contextmanager
def device_scratch(conn: Connection, local: Path, what: str, prefix: str, *, timeout: float,
                   copy_timeout: float) -> Iterator[str]:
    """Copy the folder *local* into a new scratch folder on the device (~/edgepack/.PREFIX-ID,
    rsync where both ends have it, else scp) and yield its path there; it is removed whatever
    happens (a clean-up of at most 120 s). *what* names the steps in errors ("tune",
    "time-on")."""
    import uuid

    remote = f"edgepack/.{prefix}-{uuid.uuid4().hex[:8]}"
    quoted = shlex.quote(remote)
    made = conn.run(f"mkdir -p -- {quoted} && echo MADE; "
                    "command -v rsync >/dev/null 2>&1 && echo RSYNC",
                    timeout=copy_timeout, step=f"{what}: scratch folder")
    if "MADE" not in made.stdout:
        raise DeviceError(f"{conn.host.name}: {what}: cannot make ~/{remote} on the device "
                          f"({_last(made.stderr) or 'no output'})",
                          "check the login's home there (free space, permissions)")
    try:
        rsync = "RSYNC" in made.stdout and have_local("rsync")
        conn.copy(local, remote, method="rsync" if rsync else "scp", timeout=copy_timeout,
                  resumes=False)
        yield remote
    finally:
        try:
            conn.run(f"rm -rf -- {quoted}", timeout=min(timeout, 120.0),
                     step=f"{what}: clean-up")
        except DeviceError:
            pass


def have_local(tool: str) -> bool:
    return shutil.which(tool) is not None


def no_space(stderr: str) -> str:
    """The line where the device said it is full, or ''."""
    for line in stderr.splitlines():
        if "No space left on device" in line or "Disk quota exceeded" in line:
            return line.strip()[:200]
    return ""


def ssh_failure(host: Host, stderr: str) -> DeviceError:
    text = stderr.strip()
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        return DeviceError(f"{host.name}: refused: the host key changed since it was recorded in "
                           "known_hosts", "if the device was reinstalled, check its new key, "
                           "then remove the old one: ssh-keygen -R HOST")
    if "Host key verification failed" in text:
        return DeviceError(f"{host.name}: refused: the host key is not in known_hosts or does "
                           "not match it", f"check the key, then connect once with "
                           f"ssh {host.destination} to record it")
    if "Permission denied" in text:
        return DeviceError(f"{host.name}: authentication failed (keys and agent only; edgepack "
                           "never sends passwords)", "ssh-copy-id to the device, or pass "
                           "--identity KEY")
    if "Could not resolve hostname" in text:
        return DeviceError(f"{host.name}: unreachable: the name does not resolve",
                           "check the host name or your ~/.ssh/config alias")
    if "Timeout, server" in text and "not responding" in text:
        return DeviceError(f"{host.name}: the device stopped answering (no reply to ssh "
                           f"keep-alives for {ALIVE_INTERVAL * ALIVE_COUNT} s)",
                           "check that the device is on and on the network, then deploy again")
    return DeviceError(f"{host.name}: unreachable ({_last(text) or 'ssh exit 255'})",
                       "check that the device is on, on the network, and runs sshd")


def _last(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:200] if lines else ""


def _stat(text: str, label: str) -> int:
    match = re.search(re.escape(label) + r":\s*([\d,]+)", text)
    return int(match.group(1).replace(",", "")) if match else 0
