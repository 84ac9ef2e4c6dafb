"""The bundle contract: manifest.json, written by the packager and read by the runner."""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BundleError

SCHEMA_VERSION = 2   # 2: a bundle holds one or more models under `parts`
MANIFEST = "manifest.json"


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


def read_manifest(bundle: Path) -> dict[str, Any]:
    """The manifest of *bundle* as a dict, or BundleError naming the fix."""
    path = Path(bundle) / MANIFEST
    if not path.is_file():
        raise BundleError(f"{bundle}: no {MANIFEST}; not an edgepack bundle",
                          "pass the directory written by `edgepack build` or `edgepack bundle`")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise BundleError(f"{path}: not valid JSON ({exc})", "rebuild the bundle") from None
    if data.get("schema_version") != SCHEMA_VERSION:
        raise BundleError(f"{path}: schema_version {data.get('schema_version')!r}, this edgepack "
                          f"reads {SCHEMA_VERSION}", "rebuild the bundle with this edgepack")
    return data
