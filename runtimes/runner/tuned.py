"""session.tuned.json read back (shipped with tune): the session options `run.py bench --tune`
(tuning.py) kept on this device, applied by every command while they still fit the bundle,
onnxruntime and cores."""

import json
import os
import sys

from .errors import BundleError, one_line
from .manifest import manifest_digest, session_value_problem
from .sessions import TUNE_MARGIN, TUNED  # noqa: F401 (tuning.py reads TUNE_MARGIN here)

TUNED_FIELDS = {"manifest": str, "onnxruntime": str, "cores": int, "session": dict,
                "tuned": str, "device": dict, "tried": list, "speedup": (int, float)}
REQUIRED = ("manifest", "onnxruntime", "cores", "session")


def session_problem(session, cores):
    """What is wrong with a session's options on a device with *cores* cores, or '': thread
    counts from 0 (onnxruntime's choice) to *cores*, known levels and modes, nothing else.
    (4096 threads on 2 cores kept `check` busy for minutes.)"""
    for key, value in sorted(session.items()):
        problem = session_value_problem(key, value, max_threads=cores)
        if problem:
            return "session.%s %s" % (key, problem)
    return ""


def tuned_problem(data):
    """What is wrong with a session.tuned.json's content, or '': its thread counts are bounded
    by its own core count, which load_tuned then compares with this device's."""
    if not isinstance(data, dict):
        return "not a JSON object"
    for key in sorted(data):
        if key not in TUNED_FIELDS:
            return "unknown field %r" % str(key)[:40]
    for key, kind in sorted(TUNED_FIELDS.items()):
        value = data.get(key)
        if value is None and key not in REQUIRED:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            return "%r is missing or not a %s" % (key, getattr(kind, "__name__", "number"))
    if not data["manifest"].startswith("sha256:") or len(data["manifest"]) != 71:
        return "'manifest' is not a sha256: digest"
    if not 1 <= data["cores"] <= 65536:
        return "'cores' must be a core count, got %r" % data["cores"]
    return session_problem(data["session"], data["cores"])


def load_tuned(bundle, manifest):
    """This device's tuned session options ({"session": ...}), or None: there are none, or they
    were measured for another version of the bundle, another onnxruntime or another core count
    (a note says so, and the manifest's options apply)."""
    import onnxruntime as ort

    path = os.path.join(bundle, TUNED)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        problem = tuned_problem(data)
    except (OSError, ValueError) as exc:
        problem = one_line(exc)
    if problem:
        raise BundleError("%s: %s; delete it, or run `run.py bench --tune` again to rewrite it"
                          % (TUNED, problem))
    stale = []
    if data["manifest"] != manifest_digest(bundle):
        stale.append("another version of this bundle")
    if data["onnxruntime"] != ort.__version__:
        stale.append("onnxruntime %s (this is %s)" % (data["onnxruntime"], ort.__version__))
    if data["cores"] != os.cpu_count():
        stale.append("%d cores (this device has %s)" % (data["cores"], os.cpu_count()))
    if stale:
        sys.stderr.write("edgepack: %s was tuned for %s; ignored, the manifest's session options "
                         "apply (run `run.py bench --tune` again)\n" % (TUNED, " and ".join(stale)))
        return None
    return data
