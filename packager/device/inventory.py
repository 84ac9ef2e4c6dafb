"""Devices to deploy to: hosts from the command line or an inventory file."""

import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import PackagerError
from ..textfile import read_text


class InventoryError(PackagerError):
    """A host or inventory file cannot be read."""


@dataclass(frozen=True)
class Host:
    name: str                      # label in reports: the alias or user@host as given
    destination: str               # what ssh connects to: an ~/.ssh/config alias or user@host
    port: int | None = None
    identity: Path | None = None
    python: str | None = None      # the device's interpreter (default: python3)
    remote_dir: str | None = None
    ssh_options: tuple[str, ...] = ()   # ansible_ssh_common_args / _extra_args: ssh's own options

    @property
    def label(self) -> str:
        """The host as a folder name for reports/HOST/."""
        return re.sub(r"[^A-Za-z0-9_.@-]", "_", self.name)


# an inventory is a few KB; a bound keeps --hosts /dev/zero or a huge file from filling memory
MAX_INVENTORY_BYTES = 4 << 20


def read_inventory_text(path: Path) -> str | None:
    """The text of an inventory file, or None for a folder (an Ansible inventory folder).
    Refuses FIFOs, devices and sockets without blocking on them, and files over
    MAX_INVENTORY_BYTES, reading no more than that (textfile.read_text)."""
    if Path(path).is_dir():
        return None
    return read_text(path, cap=MAX_INVENTORY_BYTES, where="--hosts", error=InventoryError,
                     fix="give an Ansible inventory file (INI or YAML) or folder")


def check_destination(where: str, user: str | None, address: str) -> None:
    """Refuse a login or address that ssh would read as one of its options (`-oProxyCommand=`)
    or that holds spaces or control characters."""
    for key, value in (("ansible_user", user), ("ansible_host", address)):
        if value is None:
            continue
        if not value or value.startswith("-") or any(c.isspace() or ord(c) < 32 or c == "\x7f"
                                                     for c in value):
            raise InventoryError(f"{where}: {key}={value!r} is not a "
                                 + ("login name" if key == "ansible_user" else "host address"),
                                 "ssh would read a value starting with '-' as an option; fix "
                                 "the inventory")


ANSIBLE_KEYS = {"ansible_host", "ansible_user", "ansible_port", "ansible_ssh_private_key_file",
                "ansible_python_interpreter", "edgepack_python", "edgepack_remote_dir",
                "ansible_ssh_common_args", "ansible_ssh_extra_args"}


def parse_host(text: str) -> Host:
    """`alias`, `user@host` or `ssh://user@host:2222`."""
    text = text.strip()
    match = re.fullmatch(r"ssh://(?:([^@/]+)@)?([^:/]+)(?::(\d+))?/?", text)
    if match:
        user, host, port = match.groups()
        if (user or "").startswith("-") or host.startswith("-") or \
                any(c.isspace() for c in user or "") or any(c.isspace() for c in host):
            raise InventoryError(f"{text!r} is not a host (ssh would read '-...' as an option)",
                                 "give an ssh alias, user@host, or ssh://user@host:port")
        if port and not 1 <= int(port) <= 65535:
            raise InventoryError(f"{text!r}: port {port} is not 1-65535", "fix the port")
        destination = f"{user}@{host}" if user else host
        return Host(text, destination, int(port) if port else None)
    if not text or any(c.isspace() for c in text) or text.startswith("-"):
        raise InventoryError(f"{text!r} is not a host", "give an ssh alias, user@host, or "
                             "ssh://user@host:port")
    return Host(text, text)


def _apply(host: Host, variables: dict[str, str], where: str) -> Host:
    unknown = sorted(set(variables) - ANSIBLE_KEYS)
    if unknown:
        raise InventoryError(f"{where}: unknown variable '{unknown[0]}'",
                             f"edgepack reads {', '.join(sorted(ANSIBLE_KEYS))}")
    changes: dict = {}
    if "ansible_host" in variables or "ansible_user" in variables:
        address = variables.get("ansible_host", host.destination.split("@")[-1])
        user = variables.get("ansible_user")
        check_destination(where, user, address)
        changes["destination"] = f"{user}@{address}" if user else address
    if "ansible_port" in variables:
        if not variables["ansible_port"].isdigit() or \
                not 1 <= int(variables["ansible_port"]) <= 65535:
            raise InventoryError(f"{where}: ansible_port={variables['ansible_port']} is not a "
                                 "number from 1 to 65535", "fix the port")
        changes["port"] = int(variables["ansible_port"])
    if "ansible_ssh_private_key_file" in variables:
        changes["identity"] = Path(variables["ansible_ssh_private_key_file"]).expanduser()
    # run.py's Python: edgepack_python, else the host's interpreter (as the Ansible role reads
    # them: both engines agree)
    python = variables.get("edgepack_python") or variables.get("ansible_python_interpreter")
    if python:
        changes["python"] = python
    if "edgepack_remote_dir" in variables:
        changes["remote_dir"] = variables["edgepack_remote_dir"]
    for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if key in variables:
            try:
                changes["ssh_options"] = (*changes.get("ssh_options", host.ssh_options),
                                          *shlex.split(variables[key]))
            except ValueError as exc:
                raise InventoryError(f"{where}: {key}: {exc}", "fix the quoting") from None
    return replace(host, **changes)


def read_inventory(path: Path) -> list[Host]:
    """One host per line, or Ansible's INI inventory (groups, host variables, [group:vars])."""
    path = Path(path)
    text = read_inventory_text(path)
    if text is None:
        raise InventoryError(f"--hosts {path}: a folder", "a folder inventory needs ansible-core "
                             "to read it; give an INI file")
    hosts: dict[str, Host] = {}
    groups: dict[str, list[str]] = {}
    group_vars: dict[str, dict[str, str]] = {}
    section, kind = "ungrouped", "hosts"
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith(";"):
            continue
        where = f"{path}:{number}"
        header = re.fullmatch(r"\[([^\]:]+)(?::(vars|children))?\]", line)
        if header:
            section, kind = header.group(1), header.group(2) or "hosts"
            continue
        if kind == "children":
            groups.setdefault(section, []).extend(groups.get(line, []))
            continue
        try:
            tokens = shlex.split(line)
        except ValueError as exc:
            raise InventoryError(f"{where}: {exc}", "fix the quoting") from None
        if kind == "vars":
            key, sep, value = line.partition("=")
            if not sep:
                raise InventoryError(f"{where}: expected key=value in [{section}:vars]",
                                     "fix the line")
            group_vars.setdefault(section, {})[key.strip()] = value.strip().strip("\"'")
            continue
        name, pairs = tokens[0], tokens[1:]
        if re.search(r"\[\w+:\w+\]", name):
            raise InventoryError(f"{where}: host ranges like {name} are not supported",
                                 "list the hosts one per line")
        variables = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                raise InventoryError(f"{where}: '{pair}' is not key=value", "fix the line")
            variables[key] = value
        host = hosts.get(name) or parse_host(name)
        hosts[name] = _apply(host, variables, where)
        groups.setdefault(section, []).append(name)
    for group, variables in group_vars.items():
        for name in groups.get(group, []) if group != "all" else list(hosts):
            hosts[name] = _apply(hosts[name], {k: v for k, v in variables.items()
                                               if not _set_on_host(hosts[name], k)},
                                 f"{path}: [{group}:vars]")
    if not hosts:
        raise InventoryError(f"--hosts {path}: no hosts in the file",
                             "one host per line, or an Ansible INI inventory")
    return list(hosts.values())


def _set_on_host(host: Host, key: str) -> bool:
    """Host variables win over group variables (as in Ansible)."""
    return {"ansible_port": host.port is not None, "ansible_python_interpreter":
            host.python is not None, "edgepack_remote_dir": host.remote_dir is not None,
            "ansible_ssh_private_key_file": host.identity is not None}.get(key, False)
