"""Probe a device for `edgepack deploy`: piped over SSH to the device's python3 and run there.

    python3 - preflight REMOTE_DIR [NEEDS] < device_probe.py   # Python, numpy, onnxruntime, disk
    python3 - prepare BASE RELEASE < device_probe.py           # make BASE/releases/RELEASE
    python3 - integrity REMOTE_DIR < device_probe.py           # every file against the manifest
    python3 - switch BASE RELEASE [WAIT] < device_probe.py     # BASE/current -> releases/RELEASE
    python3 -c "$READ_N_BYTES_AND_EXEC" hold BASE RELEASE [SECONDS]   # mark RELEASE busy

NEEDS (JSON, see `problems`) adds "problems": one line per thing the device lacks for the
bundle. The Ansible role runs the same file with its `script` module. Python 3.8+ and the
standard library only; it prints one JSON object. It installs nothing. A `~` in BASE or
REMOTE_DIR is the login's home; a relative path is relative to the login's home (where ssh
starts), and `prepare` answers with the absolute paths every later step should use.

A mode that cannot do its job prints {"error": "one line naming the path and the fix"} and
exits 1 (never a traceback for a state of the device it can describe).

The release contract (the SSH engine and the Ansible role both keep it):

- A release is a real directory (never a symbolic link) in BASE/releases/ whose name is 12
  lowercase hex digits equal to the first 12 hex digits of the sha256 of its own manifest.json.
  Nothing else in releases/ is edgepack's, and nothing else there is ever touched.
- BASE/current and BASE/previous are symbolic links to releases/ID. A `current` or `previous`
  that is anything else (a real folder, a file) is the user's: switch refuses and changes nothing.
  A BASE/releases that is a symbolic link or not a folder is refused the same way.
- `switch` takes an exclusive flock on BASE/.edgepack.lock (waiting up to WAIT seconds, by
  default LOCK_WAIT, then failing "another deploy holds the lock on ..."), checks under that
  lock that RELEASE is still a release, points `previous` at the old `current` and `current`
  at RELEASE (each an atomic rename of a new link), then cleans up, still under the lock.
- Clean-up removes a release (and its archive releases/ID.tar.gz, a regular file, which the role
  copies) unless it is RELEASE, the target of `current` or `previous`, or busy. Links are never
  followed.
- Busy: `hold BASE RELEASE [SECONDS]` takes a shared flock on BASE/.edgepack-busy/RELEASE.lock,
  prints {"held": RELEASE}, then blocks until its stdin closes or SECONDS pass (default
  HOLD_SECONDS); the lock dies with the process. A deploy keeps a hold running from before its
  copy until after its switch; clean-up skips a release whose busy lock it cannot take with
  LOCK_EX | LOCK_NB, and holds that exclusive lock while it deletes (a new hold waits for it).
  So two deploys to one BASE both end consistent: the last switch wins, the other release is
  `previous`, and `current` never points at a deleted release. The lock files stay (empty);
  removing a lock file others may be waiting on would break the lock.
"""

import errno
import hashlib
import importlib.machinery
import json
import os
import platform
import re
import select
import shutil
import sys
import time

LOCK_WAIT = 60.0        # seconds a switch waits for another deploy's switch to finish
HOLD_SECONDS = 3 * 3600  # a hold ends by itself after this long, even if its deploy never ends
RELEASE_NAME = re.compile(r"[0-9a-f]{12}\Z")


class ProbeError(Exception):
    """A state of the device this probe can describe: one line, the path and the fix."""


def nearest_existing(path):
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def preflight(remote_dir):
    info = {"python": platform.python_version(), "arch": platform.machine(),
            "numpy": None, "onnxruntime": None, "providers": [], "cv2": None}
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except Exception as exc:  # broken installs raise more than ImportError
        info["numpy_error"] = "%s: %s" % (type(exc).__name__, exc)
    try:
        import onnxruntime
        info["onnxruntime"] = onnxruntime.__version__
        info["providers"] = onnxruntime.get_available_providers()
    except Exception as exc:
        info["onnxruntime_error"] = "%s: %s" % (type(exc).__name__, exc)
    try:
        import cv2
        info["cv2"] = cv2.__version__
    except Exception:
        pass
    stat = os.statvfs(nearest_existing(remote_dir))
    info["free_mb"] = stat.f_bavail * stat.f_frsize / 1e6
    return info


def version(text):
    parts = []
    for piece in (text or "0").split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def problems(info, needs):
    """One line per thing the device lacks, saying what to install. *needs*: runtime_package,
    min_onnxruntime, install (the target's install line), providers (the target's, in order),
    allow_fallback, need_mb (free space where the bundle goes)."""
    package, minimum = needs["runtime_package"], needs["min_onnxruntime"]
    install = needs.get("install") or "pip install %s" % package
    found = []
    if version(info["python"]) < (3, 8):
        found.append("Python %s is older than 3.8, which run.py needs" % info["python"])
    if not info.get("numpy"):
        found.append("numpy is missing (%s); install it: %s"
                     % (info.get("numpy_error", "not installed"), install))
    if not info.get("onnxruntime"):
        found.append("%s is missing (%s); install it: %s"
                     % (package, info.get("onnxruntime_error", "not installed"), install))
    elif version(info["onnxruntime"]) < version(minimum):
        found.append("onnxruntime %s is older than %s, the oldest this bundle is built for; "
                     "upgrade: %s" % (info["onnxruntime"], minimum, install))
    elif not needs.get("allow_fallback"):
        missing = [p for p in needs.get("providers", []) if p not in info.get("providers", [])]
        if missing:
            found.append("onnxruntime %s on the device has no %s (it has %s); %s with them: %s; "
                         "or pass --allow-fallback" % (info["onnxruntime"], ", ".join(missing),
                                                       ", ".join(info["providers"]), package,
                                                       install))
    if info.get("free_mb", 0) < needs.get("need_mb", 0):
        found.append("only %.0f MB free where the bundle goes, it needs about %.0f MB; free some "
                     "space or pass --remote-dir" % (info["free_mb"], needs["need_mb"]))
    return found


def sha256(path):
    # The same routine as run.py's, on purpose not imported from it: run.py is one of the files
    # being checked, and nothing from the bundle may run before its hash matches.
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def entries(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


# What Python could import in place of the runner's own modules: the rule of the runner's
# integrity_problems (runner/manifest.py), restated here for the same reason as sha256.
IMPORTABLE = tuple(sorted(set(importlib.machinery.all_suffixes()) | {".py", ".pyc", ".so",
                                                                      ".pth"}))


MAX_WALK = 10000   # unlisted entries looked at inside one folder beside run.py


def importable_inside(folder, files):
    """The first file under *folder* (walked without following links) that the file table
    does not list and whose name Python imports, or None: a package (an __init__ of any
    suffix) or a namespace package. The runner's rule (runner/manifest.py), restated."""
    seen = 0
    root = os.path.dirname(folder)
    for top, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(top, name), root).replace(os.sep, "/")
            if rel in files:
                continue
            if name.endswith(IMPORTABLE):
                return rel
            seen += 1
            if seen > MAX_WALK:
                return "more than %d files the manifest does not list" % MAX_WALK
    return None


def integrity(remote_dir):
    root = os.path.expanduser(remote_dir)
    try:
        with open(os.path.join(root, "manifest.json")) as f:
            files = json.load(f).get("files", {})
        if not isinstance(files, dict):
            raise ValueError("'files' is not a table")
    except (OSError, ValueError, AttributeError) as exc:
        return {"problems": ["manifest.json: unreadable (%s)" % exc]}
    problems = []
    for rel in files:
        if not isinstance(rel, str) or os.path.isabs(rel) or ".." in rel.split("/"):
            problems.append("manifest: file table entry %r points outside the bundle" % (rel,))
    for rel, expected in sorted((k, v) for k, v in files.items() if isinstance(k, str)):
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            problems.append("%s: missing" % rel)
        elif sha256(path) != expected:
            problems.append("%s: sha256 mismatch" % rel)
    listed = set(rel.split("/")[0] for rel in files if isinstance(rel, str)) | {"manifest.json"}
    for name in entries(root):
        path = os.path.join(root, name)
        if name == "runner" and os.path.isdir(path):
            problems += ["runner/%s: not part of the runner" % entry
                         for entry in entries(path) if "runner/" + entry not in files]
        elif os.path.isdir(path):
            found = importable_inside(path, files)
            if found:
                problems.append("%s: not part of the bundle, and Python could import it (%s) "
                                "in place of run.py's own modules" % (name, found))
        elif name not in listed and name.endswith(IMPORTABLE):
            problems.append("%s: not part of the bundle, and Python would import it before "
                            "run.py's own modules" % name)
    # the host compares this with the digest of the manifest it deployed: the table above is
    # only as good as the manifest that holds it
    return {"problems": problems, "files": len(files),
            "manifest_sha256": sha256(os.path.join(root, "manifest.json"))}


def absolute(base):
    return os.path.abspath(os.path.expanduser(base))


def is_release(where, name):
    """Whether releases/NAME is a release edgepack made (see the module's docstring)."""
    path = os.path.join(where, name)
    if not RELEASE_NAME.match(name) or os.path.islink(path) or not os.path.isdir(path):
        return False
    manifest = os.path.join(path, "manifest.json")
    try:
        return not os.path.islink(manifest) and sha256(manifest)[:12] == name
    except OSError:
        return False


def check_layout(base):
    """Refuse a BASE whose releases/, current or previous are not what edgepack makes."""
    where = os.path.join(base, "releases")
    if os.path.islink(where):
        raise ProbeError("%s is a symbolic link; edgepack keeps its releases in a real folder "
                         "and never follows a link there: remove the link or deploy to another "
                         "--remote-dir" % where)
    if os.path.lexists(where) and not os.path.isdir(where):
        raise ProbeError("%s is not a folder; move it away or deploy to another --remote-dir"
                         % where)
    for name in ("current", "previous"):
        path = os.path.join(base, name)
        if os.path.lexists(path) and not os.path.islink(path):
            raise ProbeError("%s is a real %s, not the link edgepack makes; move it away or "
                             "deploy to another --remote-dir"
                             % (path, "folder" if os.path.isdir(path) else "file"))
    return where


def prepare(base, release):
    """Make BASE/releases/RELEASE (a fresh one or one a cut-off copy left)."""
    base = absolute(base)
    if not RELEASE_NAME.match(release):
        raise ProbeError("%r is not a release id (12 hex digits)" % release)
    where = check_layout(base)
    path = os.path.join(where, release)
    there = os.path.isdir(path) and not os.path.islink(path)
    if os.path.lexists(path) and not there:
        raise ProbeError("%s is not a folder edgepack made; move it away" % path)
    os.makedirs(path, exist_ok=True)
    current = os.path.join(base, "current")
    return {"base": base, "release": path, "there": there,
            "current": os.path.basename(os.readlink(current)) if os.path.islink(current) else ""}


def lock(path, mode, wait, what):
    """An open file holding flock *mode* on *path*, waiting up to *wait* seconds."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    raise ProbeError(what) from None
                raise
        time.sleep(0.1)


def busy(base, name):
    """An fd holding the exclusive busy lock of release NAME, or None if a deploy holds it."""
    import fcntl

    folder = os.path.join(base, ".edgepack-busy")
    path = os.path.join(folder, name + ".lock")
    if not os.path.isdir(folder) or os.path.islink(folder) or not os.path.exists(path):
        return -1      # nobody ever held it
    fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def hold(base, release, seconds=HOLD_SECONDS):
    """Mark RELEASE busy until stdin closes or *seconds* pass (see the module's docstring)."""
    import fcntl

    base = absolute(base)
    if not RELEASE_NAME.match(release):
        raise ProbeError("%r is not a release id (12 hex digits)" % release)
    folder = os.path.join(base, ".edgepack-busy")
    if os.path.islink(folder):
        raise ProbeError("%s is a symbolic link; remove it" % folder)
    os.makedirs(folder, exist_ok=True)
    fd = lock(os.path.join(folder, release + ".lock"), fcntl.LOCK_SH, LOCK_WAIT,
              "%s is being removed by another deploy's clean-up for more than %.0f s; try again"
              % (os.path.join(base, "releases", release), LOCK_WAIT))
    print(json.dumps({"held": release}))
    sys.stdout.flush()
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([0], [], [], min(left, 60.0))
        if ready and not os.read(0, 65536):
            break     # stdin closed: the deploy is over (or gone)
    os.close(fd)
    return None


def point(base, links):
    """BASE/NAME -> TARGET for each (NAME, TARGET) in *links*, each replaced atomically (a reader
    sees the old link or the new one). Every new link is made before any is renamed into
    place, so a full disk (no inode for a link) changes nothing and leaves no .NAME.PID."""
    made = []
    try:
        for name, target in links:
            tmp = os.path.join(base, ".%s.%d" % (name, os.getpid()))
            if os.path.lexists(tmp):
                os.remove(tmp)
            os.symlink(target, tmp)
            made.append((tmp, os.path.join(base, name)))
        for tmp, path in made:
            os.replace(tmp, path)
    finally:
        for tmp, _ in made:
            if os.path.lexists(tmp):
                os.remove(tmp)


def switch(base, release, wait=LOCK_WAIT):
    """Put release RELEASE in use: `previous` -> the one in use until now, `current` -> it;
    then remove the releases nothing uses (see the module's docstring). `deploy --engine ssh`
    and the role both switch with this."""
    import fcntl

    base = absolute(base)
    if not os.path.isdir(base):
        raise ProbeError("%s: no such folder" % base)
    where = check_layout(base)
    fd = lock(os.path.join(base, ".edgepack.lock"), fcntl.LOCK_EX, wait,
              "another deploy holds the lock on %s for more than %.0f s; try again once it "
              "is done" % (os.path.join(base, ".edgepack.lock"), wait))
    try:
        where = check_layout(base)     # again, under the lock
        if not is_release(where, release):
            raise ProbeError("%s is gone or is not the release deployed (its manifest.json "
                             "does not match its name); deploy again" % os.path.join(where,
                                                                                     release))
        return _switch(base, where, release)
    finally:
        os.close(fd)


def _switch(base, where, release):
    wanted = "releases/" + release

    def target(name):
        path = os.path.join(base, name)
        return os.readlink(path) if os.path.islink(path) else ""

    before = target("current")
    switched = before != wanted
    if switched:
        point(base, ([("previous", before)] if before else []) + [("current", wanted)])
    keep = {release, os.path.basename(target("current")), os.path.basename(target("previous"))}
    removed = []
    for name in entries(where):
        rid = name[:-len(".tar.gz")] if name.endswith(".tar.gz") else name
        path = os.path.join(where, name)
        if rid in keep or not RELEASE_NAME.match(rid):
            continue
        if name == rid:
            if not is_release(where, name):
                continue           # not edgepack's: left alone
        elif os.path.islink(path) or not os.path.isfile(path):
            continue
        fd = busy(base, rid)
        if fd is None:
            continue               # another deploy is copying or checking it
        try:
            if name == rid:
                shutil.rmtree(path)
            else:
                os.remove(path)
        finally:
            if fd >= 0:
                os.close(fd)
        removed.append("releases/" + name)
    return {"previous": os.path.basename(before), "current": release, "switched": switched,
            "removed": removed}


def describe(exc):
    """One line for an OSError, naming the path; a full disk says so."""
    where = exc.filename or "the device"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ("%s: no space left on the device (blocks or inodes); free some space there or "
                "pass --remote-dir on another file system" % where)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "%s: %s; pass a --remote-dir the login can write" % (where, exc.strerror)
    return "%s: %s" % (where, exc.strerror or exc)


def main(argv):
    mode, directory = argv[1], argv[2]
    if mode == "preflight":
        result = preflight(directory)
        if len(argv) > 3:
            result["problems"] = problems(result, json.loads(argv[3]))
    elif mode == "prepare":
        result = prepare(directory, argv[3])
    elif mode == "switch":
        result = switch(directory, argv[3], float(argv[4]) if len(argv) > 4 else LOCK_WAIT)
    elif mode == "hold":
        return hold(directory, argv[3], float(argv[4]) if len(argv) > 4 else HOLD_SECONDS)
    else:
        result = integrity(directory)
    print(json.dumps(result))
    return None


if __name__ == "__main__":
    try:
        main(sys.argv)
    except ProbeError as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(1)
    except OSError as exc:
        print(json.dumps({"error": describe(exc)}))
        sys.exit(1)
