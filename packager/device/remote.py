"""Talk to a device with the user's OpenSSH client: ssh, rsync (over ssh) or scp.

The user's ~/.ssh/config, agent, ProxyJump and known_hosts apply as in their own shell. Host keys
are checked strictly (OpenSSH's default with BatchMode: an unknown or changed key is refused) and
BatchMode means no password prompt, ever: keys or the agent only.
"""

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import PackagerError
from .inventory import Host


class DeviceError(PackagerError):
    """The device cannot be reached, refuses us, or fails a preflight check (exit 2)."""


@dataclass(frozen=True)
class Copied:
    method: str        # "rsync" or "scp"
    files: int         # files transferred
    bytes_sent: int    # bytes that went over the wire (rsync); file bytes for scp


class Connection:
    def __init__(self, host: Host, *, ssh_config: Path | None = None,
                 connect_timeout: int = 10):
        self.host = host
        self.ssh_config = ssh_config
        self.connect_timeout = connect_timeout

    def ssh_args(self) -> list[str]:
        """The ssh command up to the destination (used for rsync's -e too)."""
        args = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}"]
        if self.ssh_config:
            args += ["-F", str(self.ssh_config)]
        if self.host.port:
            args += ["-p", str(self.host.port)]
        if self.host.identity:
            args += ["-i", str(self.host.identity), "-o", "IdentitiesOnly=yes"]
        return args + list(self.host.ssh_options)

    def run(self, command: str, *, stdin: str | None = None,
            timeout: float = 900.0) -> subprocess.CompletedProcess:
        """Run a shell *command* on the device; ssh's own failures become DeviceError."""
        try:
            proc = subprocess.run([*self.ssh_args(), self.host.destination, command],
                                  input=stdin, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DeviceError(f"{self.host.name}: no answer in {timeout:.0f} s",
                              "check the device, or raise --timeout") from None
        if proc.returncode == 255:
            raise ssh_failure(self.host, proc.stderr)
        return proc

    def copy(self, local: Path, remote_dir: str, *, method: str, checksum: bool = False,
             exclude: tuple[str, ...] = (), bwlimit_kbps: int | None = None,
             copy_dest: str | None = None) -> Copied:
        """Copy the folder *local* into *remote_dir* on the device. *copy_dest* (rsync): a
        folder on the device, relative to *remote_dir*, whose unchanged files are copied there
        instead of sent (a new release takes what it shares with the one in use)."""
        if method == "rsync":
            return self._rsync(local, remote_dir, checksum, exclude, bwlimit_kbps, copy_dest)
        return self._scp(local, remote_dir, exclude, bwlimit_kbps)

    def _rsync(self, local: Path, remote_dir: str, checksum: bool, exclude: tuple[str, ...],
               bwlimit_kbps: int | None, copy_dest: str | None) -> Copied:
        # --partial keeps what arrived when a copy is cut off; the next run sends only the rest
        cmd = ["rsync", "-rt", "--partial", "--stats", "-e", shlex.join(self.ssh_args())]
        cmd += [f"--copy-dest={copy_dest}"] if copy_dest else []
        cmd += ["--checksum"] if checksum else []
        cmd += [f"--bwlimit={bwlimit_kbps}"] if bwlimit_kbps else []
        for pattern in exclude:
            cmd += ["--exclude", pattern]
        cmd += [f"{local}/", f"{self.host.destination}:{remote_dir}/"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            if "Host key verification failed" in proc.stderr or proc.returncode == 255:
                raise ssh_failure(self.host, proc.stderr)
            raise DeviceError(f"{self.host.name}: rsync failed (exit {proc.returncode}): "
                              f"{_last(proc.stderr)}", "deploy again: the copy resumes")
        return Copied("rsync", _stat(proc.stdout, "Number of regular files transferred"),
                      _stat(proc.stdout, "Total bytes sent"))

    def _scp(self, local: Path, remote_dir: str, exclude: tuple[str, ...],
             bwlimit_kbps: int | None) -> Copied:
        entries = [p for p in sorted(local.iterdir()) if p.name not in
                   {e.strip("/") for e in exclude}]
        args = ["-P" if a == "-p" else a for a in self.ssh_args()[1:]]
        args += ["-l", str(8 * bwlimit_kbps)] if bwlimit_kbps else []   # scp counts Kbit/s
        cmd = ["scp", "-r", "-p", "-q", *args, *map(str, entries),
               f"{self.host.destination}:{remote_dir}/"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            if "Host key verification failed" in proc.stderr:
                raise ssh_failure(self.host, proc.stderr)
            raise DeviceError(f"{self.host.name}: scp failed (exit {proc.returncode}): "
                              f"{_last(proc.stderr)}", "deploy again")
        files = [p for e in entries for p in ([e] if e.is_file() else e.rglob("*")) if p.is_file()]
        return Copied("scp", len(files), sum(p.stat().st_size for p in files))


def have_local(tool: str) -> bool:
    return shutil.which(tool) is not None


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
    return DeviceError(f"{host.name}: unreachable ({_last(text) or 'ssh exit 255'})",
                       "check that the device is on, on the network, and runs sshd")


def _last(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:200] if lines else ""


def _stat(text: str, label: str) -> int:
    match = re.search(re.escape(label) + r":\s*([\d,]+)", text)
    return int(match.group(1).replace(",", "")) if match else 0
