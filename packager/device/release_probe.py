"""What a device runs, for `edgepack status` and `rollback`: piped to the device's python3 over SSH
(or run by Ansible's `script` module) and run there; it prints one JSON object.

    python3 - state [BASE] < release_probe.py          # current, previous, their last checks
    python3 - record RELEASE JSON < release_probe.py   # keep a check's verdict in RELEASE

`state` reads BASE (a deploy's remote folder: releases/, current, previous, see device_probe.py's
release contract), or without BASE every folder in ~/edgepack/ that holds a releases/ folder.
For `current` and `previous` it answers the release id, the bundle's name, target, arch,
precision and build time from its manifest.json, and the last check `deploy` or `rollback`
recorded there (RELEASE/.edgepack-check.json: when, by what, passed or not). It changes nothing.

`record` writes that file (atomically) into RELEASE, a release folder edgepack made, and
answers the base's `current` and `previous` as they were before any switch.

Python 3.8+ and the standard library only; it never follows a link out of BASE and never
prints a traceback for a state of the device it can describe: {"error": "..."}, exit 1.
"""

import hashlib
import json
import os
import re
import sys

RELEASE_NAME = re.compile(r"[0-9a-f]{12}\Z")
RECORD = ".edgepack-check.json"
MAX_RECORD = 64 * 1024      # bytes of a check record read back (it is a few hundred)
MAX_BASES = 200             # folders in ~/edgepack/ looked at without BASE


class ProbeError(Exception):
    """A state of the device this probe can describe: one line, the path and the fix."""


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def link_id(base, name):
    """The release id BASE/NAME points at ('' when it is not edgepack's link to releases/ID)."""
    path = os.path.join(base, name)
    if not os.path.islink(path):
        return ""
    target = os.readlink(path)
    rid = target.rsplit("/", 1)[-1]
    return rid if target == "releases/" + rid and RELEASE_NAME.match(rid) else ""


def read_json(path, limit):
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def release_info(base, rid):
    """What `status` says about releases/RID: None when there is no id."""
    if not rid:
        return None
    path = os.path.join(base, "releases", rid)
    info = {"id": rid, "present": False}
    manifest = os.path.join(path, "manifest.json")
    if os.path.islink(path) or not os.path.isdir(path) or os.path.islink(manifest) \
            or not os.path.isfile(manifest):
        return info
    info["present"] = True
    info["intact"] = sha256(manifest)[:12] == rid
    data = read_json(manifest, 64 << 20) or {}
    target = data.get("target") if isinstance(data.get("target"), dict) else {}
    parts = data.get("parts") if isinstance(data.get("parts"), list) else []
    # parts[i].precision.precision: int8, fp16, fp32 (a part's precision table)
    precisions = [p["precision"].get("precision") for p in parts if isinstance(p, dict)
                  and isinstance(p.get("precision"), dict)]
    info.update(name=data.get("name"), created=data.get("created"), target=target.get("name"),
                arch=target.get("arch"),
                precision="/".join(str(p) for p in precisions if isinstance(p, str)) or None,
                check=read_json(os.path.join(path, RECORD), MAX_RECORD))
    return info


def absolute(base):
    """BASE as deploy reads it: `~` and a relative path are the login's home."""
    return os.path.abspath(os.path.join(os.path.expanduser("~"), os.path.expanduser(base)))


def state_of(base):
    base = absolute(base)
    where = os.path.join(base, "releases")
    if not os.path.isdir(base):
        return {"dir": base, "exists": False, "current": None, "previous": None, "releases": []}
    releases = []
    if os.path.isdir(where) and not os.path.islink(where):
        releases = sorted(n for n in os.listdir(where) if RELEASE_NAME.match(n)
                          and os.path.isdir(os.path.join(where, n))
                          and not os.path.islink(os.path.join(where, n)))
    return {"dir": base, "exists": True, "current": release_info(base, link_id(base, "current")),
            "previous": release_info(base, link_id(base, "previous")), "releases": releases}


def state(base=None):
    if base:
        return {"bundles": [state_of(base)]}
    home = os.path.expanduser("~/edgepack")
    found = []
    if os.path.isdir(home) and not os.path.islink(home):
        for name in sorted(os.listdir(home))[:MAX_BASES]:
            path = os.path.join(home, name)
            if not os.path.islink(path) and os.path.isdir(os.path.join(path, "releases")):
                found.append(state_of(path))
    return {"bundles": found, "searched": home}


def record(release, text):
    """Write RELEASE/.edgepack-check.json; answer BASE's current and previous (before a switch)."""
    release = absolute(release)
    rid = os.path.basename(release)
    base = os.path.dirname(os.path.dirname(release))
    manifest = os.path.join(release, "manifest.json")
    if not RELEASE_NAME.match(rid) or os.path.islink(release) or not os.path.isdir(release) \
            or os.path.islink(manifest) or not os.path.isfile(manifest) \
            or sha256(manifest)[:12] != rid:
        raise ProbeError(f"{release} is not a release edgepack made (releases/ID whose "
                         "manifest.json hashes to ID); deploy again")
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ProbeError("the check record is not a JSON object")
    tmp = os.path.join(release, f".{RECORD}.{os.getpid()}")
    path = os.path.join(release, RECORD)
    if os.path.islink(path):
        os.remove(path)    # never written through a link
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
                     0o644)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(value, sort_keys=True))
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)
    return {"recorded": path, "current": link_id(base, "current"),
            "previous": link_id(base, "previous")}


def main(argv):
    mode = argv[1] if len(argv) > 1 else ""
    if mode == "state":
        result = state(argv[2] if len(argv) > 2 and argv[2] else None)
    elif mode == "record" and len(argv) > 3:
        result = record(argv[2], argv[3])
    else:
        raise ProbeError("usage: release_probe.py state [BASE] | record RELEASE JSON")
    print(json.dumps(result))


if __name__ == "__main__":
    try:
        main(sys.argv)
    except ProbeError as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(1)
    except (OSError, ValueError) as exc:
        where = getattr(exc, "filename", None) or "the device"
        print(json.dumps({"error": f"{where}: {getattr(exc, 'strerror', None) or exc}"}))
        sys.exit(1)
