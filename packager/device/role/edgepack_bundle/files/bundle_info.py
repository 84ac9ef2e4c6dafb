"""Read an edgepack bundle archive on the Ansible controller, before anything is copied.

    python3 bundle_info.py BUNDLE.tar.gz [EXPECTED_DIGEST]

Prints one JSON object: the bundle's name and digest (the sha256 of its manifest.json), the
archive's sha256, what the device needs (for device_probe.py's preflight) and the run.py
arguments the role uses. Exits 1 with one line on stderr when the archive is not a bundle, a
file in it does not match the manifest's sha256, or the digest is not the expected one.
Standard library only (Python 3.8+): the controller needs nothing from edgepack.
"""

import hashlib
import json
import sys
import tarfile


def refuse(message):
    sys.stderr.write("edgepack_bundle: %s; nothing was copied\n" % message)
    sys.exit(1)


def main(path, expected=None):
    archive = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                archive.update(block)
        tar = tarfile.open(path, "r:gz")
    except (OSError, tarfile.TarError) as exc:
        refuse("%s: not a readable .tar.gz (%s)" % (path, exc))
    with tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        manifests = [m for m in members if m.name.count("/") == 1
                     and m.name.endswith("/manifest.json")]
        if len(manifests) != 1:
            refuse("%s: expected one bundle folder with a manifest.json inside" % path)
        top = manifests[0].name.split("/")[0]
        text = tar.extractfile(manifests[0]).read()
        manifest = json.loads(text.decode("utf-8"))
        digest = "sha256:" + hashlib.sha256(text).hexdigest()
        if expected and expected != digest:
            refuse("%s: the bundle's digest is %s, not the expected %s" % (path, digest, expected))
        inside = {m.name[len(top) + 1:]: m for m in members if m.name.startswith(top + "/")}
        size = 0
        for rel, want in sorted(manifest.get("files", {}).items()):
            if rel not in inside:
                refuse("%s: %s is listed in the manifest but not in the archive" % (path, rel))
            got = hashlib.sha256(tar.extractfile(inside[rel]).read()).hexdigest()
            if got != want:
                refuse("%s: %s: sha256 mismatch against the manifest" % (path, rel))
            size += inside[rel].size
    for bad in inside:
        if bad.startswith("/") or ".." in bad.split("/"):
            refuse("%s: unsafe path %s in the archive" % (path, bad))
    target = manifest["target"]
    print(json.dumps({
        "name": manifest.get("name") or top, "folder": top, "digest": digest,
        "release": digest.split(":")[1][:12], "archive_sha256": archive.hexdigest(),
        "files": len(manifest.get("files", {})), "bytes": size,
        "roofline": bool(manifest.get("roofline")),
        "latency_budget_ms": (manifest.get("budget") or {}).get("latency_p90_ms"),
        "needs": {"runtime_package": target["runtime_package"],
                  "min_onnxruntime": target["min_onnxruntime"], "install": target.get("install"),
                  "providers": [p["name"] for p in manifest.get("providers", [])],
                  "need_mb": 2 * size / 1e6 + 50},
    }))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None)
