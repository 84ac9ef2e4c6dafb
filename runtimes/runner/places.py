"""Places a bundle names on disk: provider options that name a file or folder must stay inside
the bundle (or the runner's cache), and files the runner reads must be regular files."""

import os
import stat

PATH_WORDS = ("path", "dir", "file", "folder", "config")   # in an option's name: a place


def names_a_place(key, value):
    """Whether a provider option names a file or folder: its name says so (*_path, cache_dir,
    *_file, OpenVINO's load_config...) or its value looks like one (a separator, or ~ or . at
    its start). onnxruntime and the providers create and read such places."""
    if any(word in str(key).lower() for word in PATH_WORDS):
        return True
    return isinstance(value, str) and (
        "/" in value or "\\" in value or value.startswith(("~", ".")))


def provider_path_problems(manifest):
    """Provider options that name a file or folder (names_a_place) must name a place in the
    bundle ({bundle}/... without '..', or {cache}): onnxruntime, the providers and the runner
    create folders there, and nowhere else."""
    problems = []
    for i, entry in enumerate(manifest.get("providers") or []):
        for key, value in sorted(((entry or {}).get("options") or {}).items()):
            if not names_a_place(key, value) or value == "{cache}":
                continue
            rel = value[len("{bundle}/"):] if isinstance(value, str) and \
                value.startswith("{bundle}/") else None
            if rel is None or not rel or rel.startswith("/") or \
                    ".." in rel.replace("\\", "/").split("/"):
                problems.append("manifest: providers[%d].options.%s = %r is not a file or folder"
                                " in the bundle ({bundle}/NAME, or {cache})" % (i, key, str(value)[:80]))
    return problems


def regular_file(path):
    """Whether *path* is a regular file (a link to one counts); a FIFO or a device is not, and
    reading one could block or never end."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False
