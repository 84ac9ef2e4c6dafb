"""Assemble a bundle directory and its .tar.gz: model, manifest, runner, golden data, docs."""

import importlib.metadata
import platform
import re
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from .accuracy import compare_outputs, run_model
from .atomic import atomic_dir, atomic_file, check_free
from .calibration import Sample, stack
from .compat import fit_to_runtime
from .errors import BundleError
from .inspection import dims_of, graph_inputs, io_specs
from .manifest import MANIFEST, Manifest
from .modelio import load_model, opset_of, save_model
from .targets import Target

RUNNER_FILE = "run.py"


@dataclass(frozen=True)
class BundleResult:
    directory: Path
    archive: Path
    manifest: dict[str, Any]


def sha256(path: Path) -> str:
    from ._runtimes import ort_runner  # one hashing routine for packager and device

    return ort_runner.sha256(str(path))


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in ("edgepack", "onnx", "onnxruntime", "onnxsim", "numpy", "torch",
                 "opencv-python-headless"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def runner_source() -> Path:
    from ._runtimes import ort_runner

    return Path(ort_runner.__file__)


def archive_path(directory: Path) -> Path:
    return directory.with_name(directory.name + ".tar.gz")


def _tolerance(cosine_min: float) -> float:
    """Device-side floor: the host's golden cosine less a margin for other kernels/CPUs."""
    return float(np.floor(max(0.0, min(cosine_min, 1.0) - 0.01) * 1e4) / 1e4)


def _budget(part: "PartPayload") -> float | None:
    """The accuracy budget the build kept (min cosine to FP32), when it decided one."""
    value = (part.precision.get("decision") or {}).get("budget_min_cosine")
    return float(value) if value is not None else None


def _floor(part: "PartPayload", cosine_min: float) -> float:
    """What `run.py check` demands on the device: near the host's figure, and never below the
    budget the bundle promises (the golden samples are held-out samples that kept it)."""
    budget = _budget(part)
    return _tolerance(cosine_min) if budget is None else max(_tolerance(cosine_min), budget)


PART_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class PartPayload:
    """One model of a bundle (most bundles have one, named "model")."""

    name: str
    model: Path                       # the model to ship (quantized or not)
    reference: Path                   # the FP32 model whose outputs become the golden data
    golden_samples: Sequence[Sample]
    precision: dict[str, Any]
    accuracy: dict[str, Any] | None = None
    preprocess: dict[str, Any] | None = None
    labels: Sequence[str] | None = None
    source: dict[str, Any] = field(default_factory=dict)   # file, sha256, export validation


def _io_lines(values: Sequence[dict[str, Any]]) -> str:
    return "\n".join(f"- `{v['name']}`: {'x'.join(map(str, v['shape']))} {v['dtype']}"
                     for v in values)


def _accuracy_text(acc: dict[str, Any]) -> str:
    if not acc:
        return "not measured"
    text = f"cosine {acc['cosine_min']:.4f} (min) to FP32 on {acc['samples']} held-out samples"
    if acc.get("data") == "random":
        text += " (random inputs: no calibration data was given)"
    if "top1_agreement" in acc:
        text += f", top-1 agreement {100 * acc['top1_agreement']:.1f}%"
    return text


def _provider_text(p: Any) -> str:
    name = p.name.replace("ExecutionProvider", "")
    notes = [label for key, label in (("trt_fp16_enable", "FP16"), ("trt_int8_enable", "INT8 from "
                                      "the QDQ graph")) if p.options.get(key)]
    if p.options.get("trt_engine_cache_enable"):
        notes.append("engines cached in cache/trt/, built on first run")
    return name + (f" ({', '.join(notes)})" if notes else "")


def _readme(m: Manifest, target: Target) -> str:
    sections = []
    for p in m.parts:
        sections.append(f"""### {p['name']} (`{p['model']['file']}`)

{p['precision']['description']}; accuracy {_accuracy_text(p['accuracy'])}.

Inputs:
{_io_lines(p['inputs'])}

Outputs:
{_io_lines(p['outputs'])}
""")
    several = len(m.parts) > 1
    part_arg = f" --part {m.parts[0]['name']}" if several else ""
    providers = " → ".join(_provider_text(p) for p in target.providers)
    return f"""# {m.name}

Bundle for **{target.name}** ({target.description}), built by edgepack
{m.tools.get('edgepack', '')}{f", {len(m.parts)} models" if several else ""}.

## Install on the device

Python {target.python}+ and:

    {target.install}

(`requirements.txt` lists the same.) Nothing else is needed; `run.py` installs nothing.

Execution providers, tried in this order: {providers}. The runner prints which one runs;
`--require-provider NAME` makes a fallback an error.

## Run

    python3 run.py check                  # file hashes + outputs vs the golden FP32 outputs
    python3 run.py bench --runs 200       # latency p50/p90/p99, throughput, peak memory{
        " (each model)" if several else ""}
    python3 run.py bench --json           # the same as one JSON object
    python3 run.py infer{part_arg} input.npy --json # or an image file when it has preprocessing
    python3 run.py serve --port 8080      # HTTP: POST /infer, GET /health, GET /metadata

{"Every command takes `--part NAME` to run one model only. " if several else ""}Exit codes: 0
passed, 1 a check failed, 2 bad input or a broken bundle.

## {"Models" if several else "Model"}

{chr(10).join(sections)}
`manifest.json` holds everything else: preprocessing, providers, session options,
quantization settings, checksums and tool versions.
"""


def bundle(parts: Sequence[PartPayload], output: Path, *, target: Target,
           name: str | None = None, force: bool = False) -> BundleResult:
    """Write *output*/ and *output*.tar.gz for *target*, holding every part's model.

    Each part's golden data is its FP32 reference's outputs on its golden samples.
    """
    output = Path(output)
    archive = archive_path(output)
    check_free(output, force=force)
    check_free(archive, force=force)
    names = [p.name for p in parts]
    if not parts or len(set(names)) != len(names):
        raise BundleError(f"part names must be unique and non-empty, got {names}",
                          "give each --part its own name")
    for part_name in names:
        if not PART_NAME.match(part_name):
            raise BundleError(f"part name {part_name!r} is not usable as a file name",
                              "use letters, digits, '-' and '_', starting with a letter")
    protos = [fit_to_runtime(load_model(p.model), target.min_onnxruntime) for p in parts]
    with atomic_dir(output, force=force) as tmp:
        (tmp / "golden").mkdir()
        entries = []
        for part, proto in zip(parts, protos, strict=True):
            entries.append(_write_part(tmp, part, proto))
        shutil.copyfile(runner_source(), tmp / RUNNER_FILE)
        reqs = [f"{target.runtime_package}>={target.min_onnxruntime}", "numpy"]
        if any(p.preprocess for p in parts):
            reqs.append("opencv-python-headless  # image inputs only")
        (tmp / "requirements.txt").write_text("\n".join(reqs) + "\n")
        manifest = Manifest(
            name=name or output.name,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            target={"name": target.name, "arch": target.arch, "python": target.python,
                    "runtime_package": target.runtime_package,
                    "min_onnxruntime": target.min_onnxruntime, "install": target.install},
            parts=entries,
            providers=[{"name": p.name, "options": p.options} for p in target.providers],
            session=target.session,
            budget={"latency_p90_ms": target.latency_p90_ms, "min_cosine": target.min_cosine},
            tools=tool_versions(),
        )
        (tmp / "README.md").write_text(_readme(manifest, target))
        files = {p.relative_to(tmp).as_posix(): sha256(p) for p in sorted(tmp.rglob("*"))
                 if p.is_file()}
        manifest = Manifest(**{**manifest.__dict__, "files": files})
        manifest.write(tmp / MANIFEST)
        with atomic_file(archive, force=force) as tar_tmp:
            with tarfile.open(tar_tmp, "w:gz") as tar:
                tar.add(tmp, arcname=output.name)
    return BundleResult(output, archive, manifest.to_dict())


def _write_part(tmp: Path, part: PartPayload, proto: Any) -> dict[str, Any]:
    """Write the part's model and golden data into *tmp*; return its manifest entry."""
    model_file = f"{part.name}.onnx"
    save_model(proto, tmp / model_file)
    golden_in, golden_out = f"golden/{part.name}.inputs.npz", f"golden/{part.name}.outputs.npz"
    reference = run_model(part.reference, part.golden_samples)
    np.savez(tmp / golden_in, **stack(part.golden_samples))
    np.savez(tmp / golden_out, **reference)
    own = compare_outputs(run_model(tmp / model_file, part.golden_samples), reference)
    inputs = graph_inputs(proto)
    return {
        "name": part.name,
        "model": {"file": model_file, "sha256": sha256(tmp / model_file),
                  "bytes": (tmp / model_file).stat().st_size, "ir_version": proto.ir_version,
                  "opset": opset_of(proto)},
        "inputs": [{**s, "shape": dims_of(v)} for s, v in
                   zip(io_specs(inputs), inputs, strict=True)],
        "outputs": io_specs(proto.graph.output),
        "preprocess": part.preprocess,
        "labels": list(part.labels) if part.labels else None,
        "precision": part.precision,
        "accuracy": part.accuracy or {},
        "golden": {"inputs": golden_in, "outputs": golden_out,
                   "samples": len(part.golden_samples), "reference": "fp32",
                   "min_cosine": _floor(part, min(o["cosine_min"] for o in own.values())),
                   "budget_min_cosine": _budget(part), "host": own},
        "source": part.source,
    }
