"""Small text files a user names (an @FILE list, a task or pipeline .toml, --labels): a regular
file under a size cap, opened without blocking (a FIFO would wait for a writer) and read no
further than the cap (/dev/zero never ends)."""

import os
import stat
from pathlib import Path

from .errors import PackagerError, SpecError


def read_text(path: Path, *, cap: int, where: str, fix: str,
              error: type[PackagerError] = SpecError) -> str:
    """The UTF-8 text of *path*, or *error* saying "WHERE PATH: what is wrong" (*where*: the
    option) with the *fix*."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise error(f"{where} {path}: no such file", fix) from None
    except OSError as exc:
        raise error(f"{where} {path}: cannot be read ({exc.strerror})", fix) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{where} {path}: not a regular file (a folder, FIFO, device or "
                        "socket)", fix)
        data = f.read(cap + 1)
    if len(data) > cap:
        size = f"{cap >> 20} MB" if cap >= 1 << 20 else f"{cap >> 10} KB"
        raise error(f"{where} {path}: larger than {size}, which no such file needs", fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where} {path}: not a text file (byte {exc.start} is not UTF-8)",
                    fix) from None
