"""The onnx package's backend reference models as a conformance suite (hostile-cases-turn5).

Each model that ships in the onnx wheel (`onnx/backend/test/data/{light,pytorch-converted,
pytorch-operator,simple}`; `real` names the `light` ones again) comes with its inputs and expected
outputs (the `light` CNNs with expected outputs for the input onnx's runner generates:
arange(n) / n). `judge` builds it as a user would (`edgepack build MODEL --precision fp32 --calib
DIR`, DIR holding the reference input and 3 perturbed copies), runs the bundle's model on the
reference input and compares with the expected outputs. The outcome is one of:

- "reproduces": exit 0 and every output within 1e-3 of the expected output's largest magnitude
  (at --precision fp32; "builds": exit 0 at --precision auto, INT8 or FP32 as it decided);
- "refuses": exit 1 or 2 with one line (no traceback) that is not a bug edgepack names;
- "defect: ...": anything else (a wrong answer with exit 0, exit 3, "bug in edgepack", a
  traceback, a false budget miss).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
SUITES = ("light", "pytorch-converted", "pytorch-operator", "simple")
SAMPLES = 4


@dataclass(frozen=True)
class Case:
    name: str                 # suite/model
    model: Path
    inputs: tuple[Path, ...]  # input_*.pb, in order ("" for light: generated)
    outputs: tuple[Path, ...]


@dataclass(frozen=True)
class Result:
    outcome: str   # "reproduces", "refuses" or "defect: why"
    detail: str    # the error line, or the worst relative error


def cases() -> list[Case]:
    found = []
    for suite in SUITES:
        root = DATA / suite
        if not root.is_dir():
            continue
        if suite == "light":
            for model in sorted(root.glob("light_*.onnx")):
                outs = tuple(sorted(root.glob(f"{model.stem}_output_*.pb")))
                found.append(Case(f"light/{model.stem[len('light_'):]}", model, (), outs))
            continue
        for folder in sorted(p for p in root.iterdir() if (p / "model.onnx").is_file()):
            data = folder / "test_data_set_0"
            found.append(Case(f"{suite}/{folder.name}", folder / "model.onnx",
                              tuple(sorted(data.glob("input_*.pb"), key=_index)),
                              tuple(sorted(data.glob("output_*.pb"), key=_index))))
    return found


def _index(path: Path) -> int:
    return int(re.findall(r"\d+", path.stem)[-1])


def _read(path: Path) -> np.ndarray | None:
    tensor = onnx.TensorProto()
    try:
        tensor.ParseFromString(path.read_bytes())
        return numpy_helper.to_array(tensor)
    except Exception:   # a sequence, map or optional: not a tensor
        return None


def reference_inputs(case: Case) -> dict[str, np.ndarray] | str:
    """{input name: array} for the model's reference input, or why none can be made."""
    model = onnx.load(str(case.model), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in inits]
    if not case.inputs:   # light: what onnx's runner feeds (generate_dummy_data)
        feeds = {}
        for x in graph_inputs:
            if x.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
                return "a light model with a non-float input"
            shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                          for d in x.type.tensor_type.shape.dim)
            n = int(np.prod(shape))
            feeds[x.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
        return feeds
    arrays = [_read(p) for p in case.inputs]
    if any(a is None for a in arrays) or len(arrays) != len(graph_inputs):
        return "an input that is not a tensor"
    return {x.name: a for x, a in zip(graph_inputs, arrays, strict=True)}


def calibration(feeds: dict[str, np.ndarray], folder: Path) -> Path:
    """An .npz of SAMPLES samples: the reference input and perturbed copies (floats only)."""
    rng = np.random.default_rng(0)
    stacked = {}
    for name, value in feeds.items():
        copies = [value]
        for _ in range(SAMPLES - 1):
            if value.dtype.kind == "f" and value.size:
                noise = rng.standard_normal(value.shape) * 0.01 * (np.abs(value).max() or 1.0)
                copies.append((value + noise).astype(value.dtype))
            else:
                copies.append(value)
        stacked[name] = np.stack(copies)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "calib.npz", **stacked)
    return folder


def expected_outputs(case: Case) -> list[np.ndarray | None]:
    return [_read(p) for p in case.outputs]


def compare(got: list[np.ndarray], want: list[np.ndarray | None]) -> tuple[bool, str]:
    """Whether every output is within 1e-3 of the expected output's largest magnitude."""
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if w is None:
            continue
        g = np.asarray(g)
        if g.shape != w.shape:
            if g.size == w.size:
                g = g.reshape(w.shape)
            else:
                return False, f"output {i}: shape {g.shape}, expected {w.shape}"
        if w.dtype.kind not in "fc":
            if not np.array_equal(g, w):
                return False, f"output {i}: values differ"
            continue
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        finite = np.isfinite(w64)
        if not np.array_equal(finite, np.isfinite(g64)) or \
                not np.array_equal(w64[~finite], g64[~finite], equal_nan=True):
            return False, f"output {i}: NaN or infinity where the expected output has none"
        scale = float(np.abs(w64[finite]).max()) if finite.any() else 0.0
        err = float(np.abs(w64[finite] - g64[finite]).max()) if finite.any() else 0.0
        rel = err / scale if scale else err
        worst = max(worst, rel)
        if rel > 1e-3:
            return False, f"output {i}: relative error {rel:.2e}"
    return True, f"worst relative error {worst:.1e}"


def run_bundle(bundle: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: feeds[n] for n in names})


def judge(case: Case, work: Path, *, precision: str = "fp32") -> Result:
    """Build *case* with edgepack (in this process) and judge the bundle."""
    from click.testing import CliRunner

    from packager.cli import main

    feeds = reference_inputs(case)
    if isinstance(feeds, str):
        return Result("not run", feeds)
    calib = calibration(feeds, work / "calib")
    out = work / "bundle"
    r = CliRunner().invoke(main, ["build", str(case.model), "--precision", precision,
                                  "--target", "x86_64-cpu", "--calib", str(calib),
                                  "-o", str(out)])
    text = r.output
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        return Result(f"defect: {type(r.exception).__name__} escaped", str(r.exception)[:300])
    if "Traceback" in text:
        return Result("defect: a traceback", last)
    if r.exit_code == 3 or "bug in edgepack" in text:
        return Result("defect: a bug edgepack names", last)
    if r.exit_code != 0:
        error = next((line for line in lines if line.startswith("error:")), last)
        if "misses" in text and precision == "fp32":
            return Result("defect: FP32 misses the budget against itself", error)
        return Result("refuses", error)
    if precision != "fp32":   # INT8 or FP32, as the build decided within its budget
        return Result("builds", next((line for line in lines if line.strip().startswith(
            "shipped:")), last).strip())
    ok, detail = compare(run_bundle(out, feeds), expected_outputs(case))
    return Result("reproduces" if ok else "defect: a wrong answer with exit 0", detail)
