"""Probe a device for `edgepack deploy`: piped over SSH to the device's python3 and run there.

    python3 - preflight REMOTE_DIR [NEEDS] < device_probe.py   # Python, numpy, onnxruntime, disk
    python3 - integrity REMOTE_DIR < device_probe.py           # every file against the manifest
    python3 - switch BASE RELEASE < device_probe.py            # BASE/current -> releases/RELEASE

NEEDS (JSON, see `problems`) adds "problems": one line per thing the device lacks for the
bundle. The Ansible role runs the same file with its `script` module. Python 3.8+ and the
standard library only; it prints one JSON object. It installs nothing.
"""

import hashlib
import importlib.machinery
import json
import os
import platform
import shutil
import sys


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
        found.append("numpy is missing (%s); install it: python3 -m pip install numpy"
                     % info.get("numpy_error", "not installed"))
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


def integrity(remote_dir):
    root = os.path.expanduser(remote_dir)
    try:
        with open(os.path.join(root, "manifest.json")) as f:
            files = json.load(f).get("files", {})
    except (OSError, ValueError) as exc:
        return {"problems": ["manifest.json: unreadable (%s)" % exc]}
    problems = []
    for rel, expected in sorted(files.items()):
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            problems.append("%s: missing" % rel)
        elif sha256(path) != expected:
            problems.append("%s: sha256 mismatch" % rel)
    # what Python could import in place of the runner's own modules: the rule of the runner's
    # integrity_problems (runner/manifest.py), restated here for the same reason as sha256
    importable = tuple(set(importlib.machinery.all_suffixes()) | {".py", ".pyc", ".so", ".pth"})
    listed = set(rel.split("/")[0] for rel in files) | {"manifest.json"}
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name == "runner" and os.path.isdir(path):
            problems += ["runner/%s: not part of the runner" % entry
                         for entry in sorted(os.listdir(path)) if "runner/" + entry not in files]
        elif os.path.isdir(path):
            if any(e.startswith("__init__.") and e.endswith(importable) for e in os.listdir(path)):
                problems.append("%s: not part of the bundle, and Python would import it before "
                                "run.py's own modules" % name)
        elif name not in listed and name.endswith(importable):
            problems.append("%s: not part of the bundle, and Python would import it before "
                            "run.py's own modules" % name)
    # the host compares this with the digest of the manifest it deployed: the table above is
    # only as good as the manifest that holds it
    return {"problems": problems, "files": len(files),
            "manifest_sha256": sha256(os.path.join(root, "manifest.json"))}


def point(base, name, target):
    """BASE/NAME -> TARGET, replaced atomically (a reader sees the old link or the new one)."""
    tmp = os.path.join(base, ".%s.%d" % (name, os.getpid()))
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, os.path.join(base, name))


def switch(base, release):
    """Put release RELEASE in use: `previous` -> the one in use until now, `current` -> it;
    then remove every other release (and its archive, releases/RELEASE.tar.gz, which the Ansible
    role copies). `deploy --engine ssh` and the role both switch with this."""
    base = os.path.expanduser(base)
    wanted = "releases/" + release

    def target(name):
        path = os.path.join(base, name)
        return os.readlink(path) if os.path.islink(path) else ""

    before = target("current")
    switched = before != wanted
    if switched:
        if before:
            point(base, "previous", before)
        point(base, "current", wanted)
    keep = {release, os.path.basename(target("previous"))}
    removed = []
    where = os.path.join(base, "releases")
    for name in sorted(os.listdir(where)) if os.path.isdir(where) else []:
        if name.replace(".tar.gz", "") not in keep:
            path = os.path.join(where, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            removed.append("releases/" + name)
    return {"previous": os.path.basename(before), "current": release, "switched": switched,
            "removed": removed}


if __name__ == "__main__":
    mode, directory = sys.argv[1], sys.argv[2]
    if mode == "preflight":
        result = preflight(directory)
        if len(sys.argv) > 3:
            result["problems"] = problems(result, json.loads(sys.argv[3]))
    elif mode == "switch":
        result = switch(directory, sys.argv[3])
    else:
        result = integrity(directory)
    print(json.dumps(result))
