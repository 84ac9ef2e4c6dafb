"""Read what device_probe.py answered: untrusted input, checked field by field.

A device's answer can be anything (a broken install, a wrapper that prints `{}`, a hostile
device). Each mode's fields are checked for their type before deploy reads them; a bad answer
fails that host with one line naming the step and the field, never the whole fleet.
"""

import json
import math
import subprocess
from typing import Any

from .remote import DeviceError

# field -> kind; a trailing "?" allows null, a leading "~" allows the field to be absent
SHAPES: dict[str, dict[str, str]] = {
    "preflight": {"python": "str", "arch": "str", "numpy": "str?", "onnxruntime": "str?",
                  "providers": "[str]", "~cv2": "str?", "free_mb": "num",
                  "~numpy_error": "str", "~onnxruntime_error": "str", "~problems": "[str]"},
    "prepare": {"base": "path", "release": "path", "there": "bool", "current": "str"},
    "hold": {"held": "str"},
    "integrity": {"problems": "[str]", "~files": "int", "~manifest_sha256": "hex"},
    "switch": {"previous": "str", "current": "str", "switched": "bool", "removed": "[str]"},
}


def _fits(value: Any, kind: str) -> bool:
    if kind.endswith("?"):
        return value is None or _fits(value, kind[:-1])
    if kind == "str":
        return isinstance(value, str) and len(value) < 4096
    if kind == "path":
        return isinstance(value, str) and value.startswith("/") and "\n" not in value
    if kind == "hex":
        return isinstance(value, str) and len(value) == 64 and \
            all(c in "0123456789abcdef" for c in value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "num":
        return isinstance(value, int | float) and not isinstance(value, bool) and \
            math.isfinite(value)
    if kind == "[str]":
        return isinstance(value, list) and all(_fits(v, "str") for v in value)
    raise ValueError(kind)


def answer(proc: subprocess.CompletedProcess, host: str, python: str, step: str,
           mode: str) -> dict[str, Any]:
    """The JSON object device_probe printed for *mode*, its fields checked; DeviceError naming
    *step* when the probe failed, said why ({"error": ...}), or answered something else."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    data: Any = None
    if lines:
        try:
            data = json.loads(lines[-1])
        except ValueError:
            data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str) and len(data) == 1:
        said = " ".join(data["error"].split())[:500]   # one line, whatever the device sent
        raise DeviceError(f"{host}: {step}: {said}", "the release in use there is kept")
    if proc.returncode != 0 and data is None:
        if proc.returncode == 127 or "not found" in proc.stderr:
            raise DeviceError(f"{host}: {step} failed: '{python}' is not on the device",
                              "install Python 3.8+ there, or pass --python PATH")
        last = " ".join((proc.stderr.strip().splitlines() or ["no output"])[-1].split())[:200]
        raise DeviceError(f"{host}: {step}: the device probe failed ({last})",
                          f"check that {python} runs on the device and is Python 3.8+")
    if not isinstance(data, dict):
        raise DeviceError(f"{host}: {step}: the device answered with something that is not "
                          f"edgepack's device probe ({(lines[-1] if lines else 'no JSON')[:80]!r})",
                          f"check that {python} on the device is a plain Python 3.8+")
    for key, kind in SHAPES[mode].items():
        optional = key.startswith("~")
        key = key.lstrip("~")
        if key not in data:
            if optional:
                continue
            why = "has no"
        elif _fits(data[key], kind):
            continue
        else:
            why = "has a bad"
        raise DeviceError(f"{host}: {step}: the device's answer {why} '{key}' field, so it is "
                          "not edgepack's device probe", f"check that {python} on the device "
                          "is a plain Python 3.8+")
    return data
