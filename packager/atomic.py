"""Write outputs so that a failure or Ctrl-C never leaves a half-written file or folder, never
clobbers an input, and fails before the slow work when the output cannot be written."""

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .errors import BundleError

BUNDLE_MARK = "manifest.json"   # a folder --force may replace holds one

_held: dict[str, list] = {}   # output -> [fd, lock file, folders made, claims]


def lock_path(path: Path) -> Path:
    """The lock file of output *path*: `.NAME.lock` beside it."""
    here = Path(os.path.abspath(path))
    return here.with_name(f".{here.name}.lock")


@contextmanager
def output_lock(*paths: Path) -> Iterator[None]:
    """Hold an exclusive lock on each output path for the block: a second edgepack run writing
    the same -o fails at once ("another edgepack run is writing -o PATH") instead of racing
    this one to replace it. Nested claims of one path in this process share the lock."""
    taken = []
    try:
        for path in paths:
            taken.append(_claim(path))
        yield
    finally:
        for key in reversed(taken):
            _release(key)


def _claim(path: Path) -> str:
    """Lock *path*: a `flock` on `.NAME.lock` beside it, whose folder is made if missing (and
    removed on release if still empty). Where no lock file can be made (a read-only folder),
    there is no lock: the write itself fails later with its own message."""
    import fcntl

    here = Path(os.path.abspath(path))
    key = str(here)
    if Path(path).name in ("", ".", ".."):   # check_free refuses such an -o
        _held.setdefault(key, [None, None, [], 0])[3] += 1
        return key
    if key in _held:
        _held[key][3] += 1
        return key
    made = []
    parent = here.parent
    while not parent.exists():
        made.append(parent)
        parent = parent.parent
    lock = lock_path(here)
    while True:
        try:
            for folder in reversed(made):
                folder.mkdir(exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            _remove_made(made)
            _held[key] = [None, lock, [], 1]
            return key
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            _remove_made(made)
            raise BundleError(f"another edgepack run is writing -o {path} (it holds {lock})",
                              "wait for it to finish, or pick another -o") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except OSError:
            same = False
        if same:   # else the holder removed the file as we opened it: lock the new one
            break
        os.close(fd)
    _held[key] = [fd, lock, made, 1]
    return key


def _release(key: str) -> None:
    entry = _held.get(key)
    if entry is None:
        return
    entry[3] -= 1
    if entry[3] > 0:
        return
    del _held[key]
    fd, lock, made, _ = entry
    if fd is None:
        return
    try:
        lock.unlink(missing_ok=True)   # while still locked: no one is left waiting on it
    except OSError:
        pass
    os.close(fd)
    _remove_made(made)


def _remove_made(made: Sequence[Path]) -> None:
    for folder in made:   # innermost first
        try:
            folder.rmdir()
        except OSError:
            break


@contextmanager
def scratch_cwd() -> Iterator[Path]:
    """Run a library that writes temporaries into the current folder (onnxruntime's symbolic
    shape inference leaves `sym_shape_infer_temp.onnx` and a `<uuid>` data file there) inside a
    temporary folder that is removed afterwards; the user's folder stays as it was."""
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="edgepack-cwd-") as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(cwd)


def check_named(path: Path | str) -> Path:
    """*path* as a Path, unless it names no file or folder of its own (., .., /, ''): the one
    error every output option gives for that."""
    shown = str(path) or "''"
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise BundleError(f"-o {shown}: names no file or folder",
                          "name the output itself, e.g. -o out/mynet")
    return path


def check_free(path: Path, *, force: bool, inputs: Sequence[Path | str] = ()) -> None:
    """Raise unless *path* is free to write (or *force* allows replacing it), is not one of
    *inputs*, does not contain one and does not lie inside one."""
    path = check_named(path)
    here = Path(os.path.abspath(path))
    for given in inputs:
        source = Path(os.path.abspath(given))
        if here == source or source.is_relative_to(here) or here.is_relative_to(source):
            relation = ("is" if here == source else "contains" if source.is_relative_to(here)
                        else "lies inside")
            raise BundleError(f"-o {path} {relation} the input {given}",
                              "write the output somewhere else")
    if path.exists() or path.is_symlink():
        if path.is_dir() and not (path / BUNDLE_MARK).is_file():   # --force would not help
            raise BundleError(f"{path} is a folder that is not an edgepack bundle; --force "
                              "replaces bundles only", "pick another -o")
        if not force:
            raise BundleError(f"{path} already exists",
                              "pass --force to replace it, or pick another -o")


def check_writable(path: Path, *, need_bytes: int = 0) -> None:
    """Raise unless a file can be created beside *path* with *need_bytes* free: found up front,
    not after the whole pipeline ran."""
    parent = Path(os.path.abspath(path)).parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise BundleError(f"-o {path}: {existing} is not writable",
                          "pick an -o in a folder you can write to")
    free = shutil.disk_usage(existing).free
    if free < need_bytes:
        raise BundleError(f"-o {path}: {free / 1e6:.0f} MB free on {existing}, about "
                          f"{need_bytes / 1e6:.0f} MB needed", "free some space or pick another -o")


def write_error(exc: OSError, path: Path) -> BundleError:
    """An OSError met while writing *path* as the one line the user can act on."""
    if exc.errno == errno.ENOSPC:
        return BundleError(f"no space left writing {path}", "free some space or pick another -o")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return BundleError(f"cannot write {path} ({exc.strerror})", "pick another -o")
    return BundleError(f"cannot write {path} ({exc.strerror or exc})", "pick another -o")


def _default_mode(directory: bool) -> int:
    """What open()/mkdir() would give under the user's umask (mkstemp/mkdtemp give 0600/0700)."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


@contextmanager
def atomic_file(path: Path, *, force: bool = False,
                inputs: Sequence[Path | str] = ()) -> Iterator[Path]:
    """Yield a temporary path beside *path*; move it onto *path* only if the block succeeds.
    The file gets the mode of the file it replaces, else the umask's."""
    path = Path(path)
    with output_lock(path):
        check_free(path, force=force, inputs=inputs)
        with _atomic_file(path, force=force) as tmp:
            yield tmp


@contextmanager
def _atomic_file(path: Path, *, force: bool) -> Iterator[Path]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    except OSError as exc:
        raise write_error(exc, path) from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        mode = path.stat().st_mode & 0o7777 if path.is_file() else _default_mode(False)
        os.chmod(tmp_path, mode)
        if not force and (path.exists() or path.is_symlink()):
            raise BundleError(f"{path} appeared while this run wrote it",
                              "pass --force to replace it, or pick another -o")
        os.replace(tmp_path, path)
    except OSError as exc:
        raise write_error(exc, path) from None
    finally:
        tmp_path.unlink(missing_ok=True)


@contextmanager
def atomic_pair(directory: Path, archive: Path, *, force: bool = False,
                inputs: Sequence[Path | str] = ()) -> Iterator[tuple[Path, Path]]:
    """Yield a temporary folder and file beside *directory* and *archive*; on success put both
    in place together: neither appears (nor is replaced) without the other, even when the last
    step fails or is interrupted."""
    directory, archive = Path(directory), Path(archive)
    with output_lock(directory, archive):
        for path in (directory, archive):
            check_free(path, force=force, inputs=inputs)
        with _atomic_pair(directory, archive, force=force) as pair:
            yield pair


@contextmanager
def _atomic_pair(directory: Path, archive: Path, *, force: bool
                 ) -> Iterator[tuple[Path, Path]]:
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".part",
                                        dir=directory.parent))
        fd, tmp = tempfile.mkstemp(prefix=f".{archive.name}.", suffix=".part", dir=archive.parent)
        os.close(fd)
    except OSError as exc:
        raise write_error(exc, directory) from None
    tmp_file = Path(tmp)
    try:
        yield tmp_dir, tmp_file
        for tree, _, files in os.walk(tmp_dir):
            os.chmod(tree, _default_mode(True))
            for name in files:
                os.chmod(os.path.join(tree, name), _default_mode(False))
        os.chmod(tmp_file, _default_mode(False))
        _publish([(tmp_dir, directory), (tmp_file, archive)], force=force)
    except OSError as exc:
        raise write_error(exc, directory) from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        tmp_file.unlink(missing_ok=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _publish(moves: Sequence[tuple[Path, Path]], *, force: bool) -> None:
    """Rename each temporary onto its final path, all or none: what they replace (only with
    *force*) is set aside first and put back if any rename fails or is interrupted."""
    if not force:
        for _, final in moves:
            if final.exists() or final.is_symlink():
                raise BundleError(f"{final} appeared while this run wrote it",
                                  "pass --force to replace it, or pick another -o")
    aside: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for _, final in moves:
            if final.exists() or final.is_symlink():
                old = final.with_name(f".{final.name}.old-{os.getpid()}")
                _remove(old)
                os.replace(final, old)
                aside.append((old, final))
        for tmp, final in moves:
            os.replace(tmp, final)
            placed.append(final)
    except BaseException:
        for final in placed:
            _remove(final)
        for old, final in aside:
            os.replace(old, final)
        raise
    for old, _ in aside:
        _remove(old)
