"""`edgepack ansible-role`: write the edgepack_bundle Ansible role for users' own playbooks.

The role lives in packager/device/role/edgepack_bundle; device_probe.py (the same probe `deploy` pipes
over SSH) is added to its files/ when it is written out.
"""

import os
import shutil
import tempfile
from pathlib import Path

from ..errors import PackagerError

ROLE = Path(__file__).parent / "role" / "edgepack_bundle"
NAME = ROLE.name


def role_files() -> dict[str, bytes]:
    """Every file of the role, by its path inside the role folder."""
    from .._runtimes import device_probe

    files = {p.relative_to(ROLE).as_posix(): p.read_bytes()
             for p in sorted(ROLE.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}
    files["files/device_probe.py"] = Path(device_probe.__file__).read_bytes()
    files["files/release_probe.py"] = (Path(__file__).parent / "release_probe.py").read_bytes()
    return files


def write_role(roles_dir: Path, *, force: bool = False) -> tuple[Path, bool]:
    """Write roles_dir/edgepack_bundle: (its path, whether anything changed). A role folder that
    differs from this edgepack's is replaced only with *force* (it may hold local edits)."""
    roles_dir = Path(roles_dir)
    dest = roles_dir / NAME
    files = role_files()
    if dest.is_symlink():   # replaced by a folder with --force; what it points to is kept
        if not force:
            raise PackagerError(f"{dest} is a symbolic link (to {os.readlink(dest)})",
                                "pass --force to replace the link with the role (what it points "
                                "to is left alone), or remove the link")
    elif dest.exists():
        have = {p.relative_to(dest).as_posix(): p.read_bytes()
                for p in dest.rglob("*") if p.is_file()} if dest.is_dir() else {}
        if have == files:
            return dest, False
        if not force:
            raise PackagerError(f"{dest} exists and differs from this edgepack's role",
                                "pass --force to replace it (local edits there are lost)")
    if roles_dir.exists() and not roles_dir.is_dir():
        raise PackagerError(f"-o {roles_dir}: not a folder", "name a roles/ folder")
    roles_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=roles_dir))
    try:
        for rel, data in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
            dest.unlink()   # never rmtree through a link
        elif dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest, True
