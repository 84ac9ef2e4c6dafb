"""Write report files into a bundle's folder without following links, atomically.

A bundle folder is input from elsewhere: its `reports/` (or `reports/HOST/`, or a report file in
it) may be a symbolic link planted to make edgepack overwrite a file of the user's. So every
folder below the one the user named is created and opened relative to its parent's descriptor
with O_NOFOLLOW, refused when it is a link or not a folder, and each file is written to a new
temporary file in that folder (O_CREAT | O_EXCL | O_NOFOLLOW) and renamed over the old one: a
link in its place is replaced, never followed, and a full disk leaves the old report (or none),
never a truncated one.
"""

import errno
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import BundleError

REPORTS = "reports"   # BUNDLE/reports: verify's report, deploy's reports/HOST, the page
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def folder_name_problem(name: str) -> str | None:
    """Why *name* cannot be one folder below another (empty, '.', '..', a '/'), or None."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return f"{name!r} is not a single folder name"
    return None


def write_files(base: Path, folders: Sequence[str], files: Mapping[str, str]) -> Path:
    """Write *files* (name -> text) into base/folders[0]/folders[1]/..., creating the folders.

    *base* is the folder the user named (it may be reached through links); each of *folders*
    must be one plain name and, where it exists, a real folder, not a link. Returns the folder
    written to. BundleError names the path and the fix."""
    where = Path(base)
    try:
        fd = os.open(where, _DIR_FLAGS)
    except OSError as exc:
        raise BundleError(f"{where}: cannot open the folder for reports ({exc.strerror})",
                          "check the path") from None
    try:
        for name in folders:
            problem = folder_name_problem(name)
            if problem:
                raise BundleError(f"reports in {where}: {problem}",
                                  "name the host (or folder) with letters, digits, '.', '_' or "
                                  "'-'")
            sub = _enter(fd, where, name)
            os.close(fd)
            fd, where = sub, where / name
        for name, text in files.items():
            _write_one(fd, where, name, text.encode("utf-8", "replace"))   # never a crash
    finally:
        os.close(fd)
    return where


def _enter(parent: int, where: Path, name: str) -> int:
    """Create (if absent) and open the folder *name* in *parent* without following a link:
    its descriptor."""
    path = where / name
    try:
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            pass
        try:
            return os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP or os.path.islink(path):
                raise BundleError(f"{path}: is a symbolic link; reports are never written "
                                  "through a link (it could point anywhere)",
                                  f"remove it (rm {path}) and run again") from None
            if exc.errno == errno.ENOTDIR:
                raise BundleError(f"{path}: exists and is not a folder",
                                  "remove or rename it (it is where reports go) and run "
                                  "again") from None
            raise
    except OSError as exc:
        raise BundleError(f"{path}: cannot create the reports folder ({exc.strerror})",
                          "free some space or fix the folder's permissions, and run "
                          "again") from None


def _write_one(folder: int, where: Path, name: str, data: bytes) -> None:
    path = where / name
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
                      | getattr(os, "O_CLOEXEC", 0), 0o644, dir_fd=folder)
        try:
            with os.fdopen(out, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=folder)
            except OSError:
                pass
            raise
    except IsADirectoryError:
        raise BundleError(f"{path}: is a folder, not a report file",
                          "remove or rename it and run again") from None
    except OSError as exc:
        raise BundleError(f"{path}: cannot be written ({exc.strerror or exc}); no partial "
                          "report was left", "free some space (or fix the folder's "
                          "permissions) and run again") from None


def bundle_digest(bundle: Path) -> str:
    """The bundle's identity: the sha256 of its manifest.json, which holds every other file's
    hash. `build` prints it; `verify` and `deploy` record it and compare it with
    --expect-digest; the bundle's page says it."""
    from ..hashing import sha256

    return "sha256:" + sha256(Path(bundle) / "manifest.json")
