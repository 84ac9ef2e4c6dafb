"""File hashes: one sha256 routine for the packager and the device (the runner's own)."""

from pathlib import Path


def sha256(path: Path) -> str:
    """Hex sha256 of a file, read in blocks, as the runner checks it on the device."""
    from ._runtimes.runner.manifest import sha256

    return sha256(str(path))
