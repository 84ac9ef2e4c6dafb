"""The bundle contract: manifest.json, written by the packager and read by the runner."""

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._runtimes.runner.manifest import (
    MAX_MANIFEST_BYTES,  # noqa: F401  (one cap, shared)
    SAFE_NAME,
)
from ..errors import BundleError

SCHEMA_VERSION = 2   # 2: a bundle holds one or more models under `parts`
MANIFEST = "manifest.json"
# the name becomes a folder on devices (~/edgepack/NAME) and an archive name: one path component
BUNDLE_NAME = SAFE_NAME   # the runner's: one safe file name
NAME_RULE = "1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"


def name_problem(name: object) -> str | None:
    """What makes *name* unusable as a bundle name (a single safe path component), or None."""
    shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
    if not isinstance(name, str):
        return f"name {shown} is not a string"
    if not BUNDLE_NAME.fullmatch(name):
        return f"name {shown} is not {NAME_RULE}"
    return None


def safe_name(text: str) -> str:
    """*text* made into a bundle name: other characters become '-', ends trimmed; '' if
    nothing usable is left."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).lstrip("._-")[:100].rstrip("-")
    return name if name_problem(name) is None else ""


@dataclass(frozen=True)
class Manifest:
    """Everything the device needs to know about a bundle; see DESIGN.md."""

    name: str
    target: dict[str, Any]          # name, arch, python, runtime package, min_onnxruntime
    parts: list[dict[str, Any]]     # per model: name, model (file, sha256, bytes, ir_version,
    #                                 opset), inputs, outputs (static shapes), preprocess,
    #                                 labels, precision, accuracy vs FP32, golden, source
    providers: list[dict[str, Any]]  # priority order, with options
    session: dict[str, Any]
    budget: dict[str, Any]
    tools: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)   # every file but this one: sha256
    roofline: dict[str, Any] = field(default_factory=dict)  # bench --roofline's MatMul graphs
    tuning: dict[str, Any] = field(default_factory=dict)    # build --tune: what it tried, where
    created: str = ""
    schema_version: int = SCHEMA_VERSION
    pipeline: dict[str, Any] = field(default_factory=dict)   # parts run as one cascade

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not out["pipeline"]:   # a bundle without one has no such key
            del out["pipeline"]
        return out

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


def read_manifest(bundle: Path) -> dict[str, Any]:
    """The manifest of *bundle* as a dict whose shape is checked (every field the host and the
    runner read, and a name that is one safe path component), or BundleError naming the field
    and the fix."""
    path = Path(bundle) / MANIFEST
    if not Path(bundle).exists():
        raise BundleError(f"{bundle}: no such bundle folder",
                          "pass the directory written by `edgepack build` or `edgepack bundle`")
    if Path(bundle).is_file():
        raise BundleError(f"{bundle}: a file, not a bundle folder" + (
            " (the archive)" if str(bundle).endswith(".tar.gz") else ""),
            "pass the folder beside it (out/net for out/net.tar.gz), or unpack the archive "
            "and pass that folder")
    if not path.is_file():
        raise BundleError(f"{bundle}: no {MANIFEST}; not an edgepack bundle",
                          "pass the directory written by `edgepack build` or `edgepack bundle`")
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise BundleError(f"{path}: {path.stat().st_size} bytes, more than a manifest holds "
                              f"({MAX_MANIFEST_BYTES >> 20} MiB)", "rebuild the bundle")
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise BundleError(f"{path}: cannot be read ({exc.strerror or exc})",
                          "check the file, or rebuild the bundle") from None
    except (ValueError, RecursionError) as exc:   # UnicodeDecodeError is a ValueError
        raise BundleError(f"{path}: not valid JSON ({str(exc)[:200]})",
                          "rebuild the bundle") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path}: not a JSON object", "rebuild the bundle")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise BundleError(f"{path}: schema_version {data.get('schema_version')!r}, this edgepack "
                          f"reads {SCHEMA_VERSION}", "rebuild the bundle with this edgepack")
    problem = shape_problem(data)
    if problem:
        raise BundleError(f"{path}: {problem}", "rebuild the bundle with edgepack")
    return data


def shape_problem(data: dict[str, Any]) -> str | None:
    """The first field of a manifest that is missing or of the wrong type, or None: the
    runner's own shape check, then what the host reads besides (name, target, precision)."""
    from .._runtimes.runner.errors import BundleError as RunnerError
    from .._runtimes.runner.manifest import check_manifest

    try:
        check_manifest(data)
    except RunnerError as exc:
        return str(exc).split("; rebuild")[0].removeprefix(f"{MANIFEST}: ")
    if "name" not in data:
        return "name is missing"
    problem = name_problem(data["name"])
    if problem:
        return problem
    target = data.get("target")
    if not isinstance(target, dict):
        return "target is missing" if target is None else "target is not an object"
    if not isinstance(target.get("name"), str) or not target["name"]:
        return "target.name is missing or not a string"
    if not data["parts"]:
        return "parts is empty"
    for i, part in enumerate(data["parts"]):
        decision = (part.get("precision") or {}).get("decision")
        if decision is not None and not (
                isinstance(decision, dict) and isinstance(decision.get("chosen"), str)
                and isinstance(decision.get("reason"), str)
                and isinstance(decision.get("candidates"), list)
                and all(_candidate(c) for c in decision["candidates"])):
            return (f"parts[{i}].precision.decision is not an object with chosen, reason and "
                    "candidates (precision, meets_budget, cosine_min, bytes, p50_ms, p90_ms)")
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _candidate(c: Any) -> bool:
    """One row of the precision decision's table, as verify's report shows it."""
    return (isinstance(c, dict) and isinstance(c.get("precision"), str)
            and isinstance(c.get("label", ""), str) and isinstance(c.get("meets_budget"), bool)
            and all(c.get(k) is None or _number(c[k])
                    for k in ("cosine_min", "bytes", "p50_ms", "p90_ms")))
