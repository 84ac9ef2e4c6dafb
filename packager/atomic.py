"""Write outputs so that a failure or Ctrl-C never leaves a half-written file or folder."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import BundleError


def check_free(path: Path, *, force: bool) -> None:
    """Raise unless *path* is free to write (or *force* allows replacing it)."""
    if path.exists() and not force:
        raise BundleError(f"{path} already exists", "pass --force to replace it, or pick another -o")


@contextmanager
def atomic_file(path: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside *path*; move it onto *path* only if the block succeeds."""
    path = Path(path)
    check_free(path, force=force)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside *path*; rename it onto *path* only on success."""
    path = Path(path)
    check_free(path, force=force)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
