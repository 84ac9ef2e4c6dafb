"""Read an edgepack bundle archive on the Ansible controller, before anything is copied.

    python3 bundle_info.py BUNDLE.tar.gz [EXPECTED_DIGEST]

Prints one JSON object: the bundle's name and digest (the sha256 of its manifest.json), the
archive's sha256, what the device needs (for device_probe.py's preflight: bundle_needs.py's
rule, so a provider listed for speed is not needed, only noted where missing) and the run.py
arguments the role uses. Exits 1 with one line on stderr when the archive is not a bundle, a
file in it does not match the manifest's sha256, or the digest is not the expected one.

Every member is looked at, not only the listed files, because the device unpacks all of them
(GNU tar, often as root): a member that is not a regular file or folder (symbolic or hard link,
device node, FIFO), a name outside the bundle's one folder (absolute, `..`, another top
folder), a name given twice, or a mode beyond 0755 (setuid, setgid, sticky, group- or
world-writable) refuses the whole archive, naming the member.
Standard library only (Python 3.8+): the controller needs nothing from edgepack.
"""

import hashlib
import json
import re
import sys
import tarfile

# what the device needs: the rule deploy --engine ssh applies too (files/bundle_needs.py, beside
# this script, so Python finds it first)
from bundle_needs import needs, notes_if_missing

# the bundle's name is a folder name on the device (~/edgepack/NAME): one plain path component
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def refuse(message):
    sys.stderr.write("edgepack_bundle: %s; nothing was copied\n" % message)
    sys.exit(1)


def kind(member):
    if member.issym():
        return "a symbolic link"
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device node"
    if member.isfifo():
        return "a FIFO"
    return "not a regular file or folder"


def check_members(path, members):
    """The bundle's top folder; refuse() on the first member the device must not unpack."""
    tops = set()
    seen = set()
    for m in members:
        name = m.name
        parts = name.split("/")
        if name.startswith("/") or ".." in parts or "\\" in name or any(
                ord(c) < 32 for c in name):
            refuse("%s: member %r is outside the bundle folder" % (path, name))
        if not (m.isfile() or m.isdir()) or m.islnk():
            refuse("%s: member %r is %s; a bundle holds only files and folders"
                   % (path, name, kind(m)))
        if m.mode & ~0o755:
            refuse("%s: member %r has mode %04o; a bundle's files are 0644 or 0755 (no setuid, "
                   "setgid, sticky or group/world write)" % (path, name, m.mode))
        key = name.rstrip("/")
        if key in seen:
            refuse("%s: member %r is in the archive twice" % (path, name))
        seen.add(key)
        tops.add(parts[0])
    if len(tops) != 1 or "" in tops or "." in tops:
        refuse("%s: expected one bundle folder with everything inside it" % path)
    return tops.pop()


def main(path, expected=None):
    archive = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                archive.update(block)
        tar = tarfile.open(path, "r:gz")
        with tar:
            members = tar.getmembers()
            top = check_members(path, members)
            files = {m.name[len(top) + 1:]: m for m in members
                     if m.isfile() and m.name.startswith(top + "/")}
            if "manifest.json" not in files:
                refuse("%s: expected one bundle folder with a manifest.json inside" % path)
            text = tar.extractfile(files["manifest.json"]).read()
            digest = "sha256:" + hashlib.sha256(text).hexdigest()
            if expected and expected != digest:
                refuse("%s: the bundle's digest is %s, not the expected %s"
                       % (path, digest, expected))
            try:
                manifest = json.loads(text.decode("utf-8"))
                listed = sorted(manifest.get("files", {}).items())
                target = manifest["target"]
                needs(manifest, 0)   # a manifest without what the device needs is refused here
                notes = notes_if_missing(manifest)
                budget = (manifest.get("budget") or {}).get("latency_p90_ms")
                arch, target_name = target.get("arch"), target.get("name")
            except (ValueError, AttributeError, KeyError, TypeError) as exc:
                refuse("%s: manifest.json is not an edgepack manifest (%s: %s)"
                       % (path, type(exc).__name__, exc))
            name = manifest.get("name") or top
            if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
                refuse("%s: manifest.json: name %r is not a plain name (letters, digits, '.', "
                       "'_', '-', at most 100, starting with a letter or digit)" % (path, name))
            size = 0
            for rel, want in listed:
                if rel not in files:
                    refuse("%s: %s is listed in the manifest but not in the archive"
                           % (path, rel))
                got = hashlib.sha256(tar.extractfile(files[rel]).read()).hexdigest()
                if got != want:
                    refuse("%s: %s: sha256 mismatch against the manifest" % (path, rel))
                size += files[rel].size
    except (OSError, EOFError, tarfile.TarError) as exc:
        refuse("%s: not a readable .tar.gz (%s)" % (path, exc))
    print(json.dumps({
        "name": name, "folder": top, "digest": digest,
        "release": digest.split(":")[1][:12], "archive_sha256": archive.hexdigest(),
        "files": len(listed), "bytes": size,
        "roofline": bool(manifest.get("roofline")),
        "latency_budget_ms": budget,
        "needs": needs(manifest, size),
        "notes_if_missing": notes,
        "arch": arch if isinstance(arch, str) else "",
        "target": target_name if isinstance(target_name, str) else "",
    }))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None)
