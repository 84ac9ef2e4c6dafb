"""A real OpenSSH server on 127.0.0.1 for the deploy tests, with pinned host keys and key auth.

Client aliases (in the generated ssh config):
  device1, device2  the server, as root (or this user), with the host key pinned
  arm               the same server, but a key whose sessions find an aarch64 python3 first on
                    PATH (the qemu userland): an "ARM device over SSH"
  badkey            the server, with a different host key pinned: must be refused
  down              a port where nothing listens: unreachable
"""

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def problem() -> str | None:
    for tool in (SSHD, "ssh", "ssh-keygen", "rsync", "scp"):
        if not shutil.which(tool):
            return f"{tool} is missing: apt-get install openssh-server openssh-client rsync"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def quote(value: str) -> str:
    """A value for sshd_config / ssh_config: double-quoted when it has blanks."""
    return f'"{value}"' if any(c.isspace() for c in value) or not value else value


def sshd_config(port: int, host_key: Path, authorized_keys: Path, pid_file: Path,
                extra: str = "") -> str:
    """An sshd on 127.0.0.1:PORT with its own host key, key auth only, sftp, quiet logs."""
    return f"""Port {port}
ListenAddress 127.0.0.1
HostKey {quote(str(host_key))}
AuthorizedKeysFile {quote(str(authorized_keys))}
PidFile {quote(str(pid_file))}
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
Subsystem sftp internal-sftp
LogLevel ERROR
{extra}"""


class Server:
    def __init__(self, root: Path, arm_python: list[str] | None = None):
        self.root = root
        self.port = free_port()
        self.user = getpass.getuser()
        host_pub = keygen(root / "host_key")
        other_pub = keygen(root / "other_host_key")
        client_pub = keygen(root / "client_key")
        arm_pub = keygen(root / "arm_key")
        armbin = root / "armbin"
        armbin.mkdir()
        if arm_python:
            wrapper = armbin / "python3"
            wrapper.write_text("#!/bin/sh\nexec " + " ".join(arm_python) + ' "$@"\n')
            wrapper.chmod(0o755)
        (root / "authorized_keys").write_text(
            f"{client_pub}\n"
            f'command="export PATH={armbin}:$PATH; eval \\"$SSH_ORIGINAL_COMMAND\\"" {arm_pub}\n')
        host = f"[127.0.0.1]:{self.port}"
        (root / "known_hosts").write_text(f"{host} {' '.join(host_pub.split()[:2])}\n")
        (root / "wrong_known_hosts").write_text(f"{host} {' '.join(other_pub.split()[:2])}\n")
        (root / "sshd_config").write_text(sshd_config(self.port, root / "host_key",
                                                      root / "authorized_keys",
                                                      root / "sshd.pid"))
        common = f"""  HostName 127.0.0.1
  Port {self.port}
  User {self.user}
  IdentitiesOnly yes
  StrictHostKeyChecking yes
"""
        (root / "ssh_config").write_text(f"""Host arm
  IdentityFile {root / 'arm_key'}
Host badkey
  UserKnownHostsFile {root / 'wrong_known_hosts'}
Host down
  HostName 127.0.0.1
  Port {free_port()}
  User {self.user}
  UserKnownHostsFile {root / 'known_hosts'}
Host device1 device2 arm badkey
{common}  IdentityFile {root / 'client_key'}
  UserKnownHostsFile {root / 'known_hosts'}
""")
        self.config = root / "ssh_config"
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")],
                                     stderr=open(root / "sshd.log", "w"))
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    log = (root / "sshd.log").read_text()[-500:]
                    raise RuntimeError("sshd exited: " + log) from None
                time.sleep(0.1)
        raise RuntimeError("sshd did not start listening")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def env_without_agent() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SSH_AUTH_SOCK", None)
    return env
