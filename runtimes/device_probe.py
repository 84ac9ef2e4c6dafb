"""Probe a device for `edgepack deploy`: piped over SSH to the device's python3 and run there.

    python3 - preflight REMOTE_DIR < device_probe.py   # Python, numpy, onnxruntime, disk
    python3 - integrity REMOTE_DIR < device_probe.py   # every file against the manifest

Python 3.8+ and the standard library only; it prints one JSON object. It installs nothing.
"""

import hashlib
import json
import os
import platform
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
    listed = set(rel.split("/")[0] for rel in files) | {"manifest.json"}
    for name in sorted(os.listdir(root)):   # what `python3 run.py` would import from its folder
        if name not in listed and (name.endswith((".py", ".pyc", ".so", ".pth")) or
                                   os.path.isfile(os.path.join(root, name, "__init__.py"))):
            problems.append("%s: not part of the bundle, and Python would import it before "
                            "run.py's own modules" % name)
    # the host compares this with the digest of the manifest it deployed: the table above is
    # only as good as the manifest that holds it
    return {"problems": problems, "files": len(files),
            "manifest_sha256": sha256(os.path.join(root, "manifest.json"))}


if __name__ == "__main__":
    mode, directory = sys.argv[1], sys.argv[2]
    print(json.dumps(preflight(directory) if mode == "preflight" else integrity(directory)))
