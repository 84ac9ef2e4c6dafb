"""Assemble a bundle directory and its .tar.gz: model, manifest, runner, golden data, docs."""

import importlib.metadata
import platform
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from .accuracy import compare_outputs, run_model
from .atomic import atomic_dir, atomic_file, check_free
from .calibration import Sample, stack
from .compat import fit_to_runtime
from .inspection import dims_of, graph_inputs, io_specs
from .manifest import MANIFEST, Manifest
from .modelio import load_model, opset_of, save_model
from .targets import Target

MODEL_FILE = "model.onnx"
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


def _readme(m: Manifest, target: Target) -> str:
    ins = "\n".join(f"- `{i['name']}`: {'x'.join(map(str, i['shape']))} {i['dtype']}"
                    for i in m.inputs)
    outs = "\n".join(f"- `{o['name']}`: {'x'.join(map(str, o['shape']))} {o['dtype']}"
                     for o in m.outputs)
    acc = m.accuracy
    acc_line = (f"cosine {acc['cosine_min']:.4f} (min) to FP32 on {acc['samples']} held-out samples"
                + (f", top-1 agreement {100 * acc['top1_agreement']:.1f}%"
                   if "top1_agreement" in acc else "")) if acc else "not measured"
    return f"""# {m.name}

Bundle for **{target.name}** ({target.description}), built by edgepack
{m.tools.get('edgepack', '')}. Precision: {m.precision['description']}; accuracy {acc_line}.

## Install on the device

Python {target.python}+ and:

    {target.install}

(`requirements.txt` lists the same.) Nothing else is needed; `run.py` installs nothing.

## Run

    python3 run.py check                  # file hashes + outputs vs the golden FP32 outputs
    python3 run.py bench --runs 200       # latency p50/p90/p99, throughput, peak memory
    python3 run.py bench --json           # the same as one JSON object
    python3 run.py infer input.npy --json # or an image file when the bundle has preprocessing

Exit codes: 0 passed, 1 a check failed, 2 bad input or a broken bundle.

## Model

Inputs:
{ins}

Outputs:
{outs}

`manifest.json` holds everything else: preprocessing, providers, session options,
quantization settings, checksums and tool versions.
"""


def bundle(model: Path, output: Path, *, target: Target, reference: Path,
           golden_samples: Sequence[Sample], precision: dict[str, Any],
           accuracy: dict[str, Any] | None = None, preprocess: dict[str, Any] | None = None,
           labels: Sequence[str] | None = None, name: str | None = None,
           source: Path | None = None, force: bool = False) -> BundleResult:
    """Write *output*/ and *output*.tar.gz for *target* from the (quantized) *model*.

    *reference* is the FP32 model whose outputs on *golden_samples* become the golden data.
    """
    output = Path(output)
    archive = archive_path(output)
    check_free(output, force=force)
    check_free(archive, force=force)
    proto = fit_to_runtime(load_model(model), target.min_onnxruntime)
    golden_ref = run_model(reference, golden_samples)
    with atomic_dir(output, force=force) as tmp:
        save_model(proto, tmp / MODEL_FILE)
        shutil.copyfile(runner_source(), tmp / RUNNER_FILE)
        reqs = [f"{target.runtime_package}>={target.min_onnxruntime}", "numpy"]
        if preprocess:
            reqs.append("opencv-python-headless  # image inputs only")
        (tmp / "requirements.txt").write_text("\n".join(reqs) + "\n")
        (tmp / "golden").mkdir()
        np.savez(tmp / "golden" / "inputs.npz", **stack(golden_samples))
        np.savez(tmp / "golden" / "outputs.npz", **golden_ref)
        own = compare_outputs(run_model(tmp / MODEL_FILE, golden_samples), golden_ref)
        manifest = Manifest(
            name=name or output.name,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            target={"name": target.name, "arch": target.arch, "python": target.python,
                    "runtime_package": target.runtime_package,
                    "min_onnxruntime": target.min_onnxruntime, "install": target.install},
            model={"file": MODEL_FILE, "sha256": sha256(tmp / MODEL_FILE),
                   "bytes": (tmp / MODEL_FILE).stat().st_size, "ir_version": proto.ir_version,
                   "opset": opset_of(proto)},
            inputs=[{**s, "shape": dims_of(v)} for s, v in
                    zip(io_specs(graph_inputs(proto)), graph_inputs(proto), strict=True)],
            outputs=io_specs(proto.graph.output),
            preprocess=preprocess,
            precision=precision,
            providers=[{"name": p.name, "options": p.options} for p in target.providers],
            session=target.session,
            accuracy=accuracy or {},
            golden={"inputs": "golden/inputs.npz", "outputs": "golden/outputs.npz",
                    "samples": len(golden_samples), "reference": "fp32",
                    "min_cosine": _tolerance(min(o["cosine_min"] for o in own.values())),
                    "host": own},
            budget={"latency_p90_ms": target.latency_p90_ms, "min_cosine": target.min_cosine},
            labels=list(labels) if labels else None,
            tools=tool_versions(),
            source={"file": Path(source).name, "sha256": sha256(Path(source))} if source else {},
            files={},
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
