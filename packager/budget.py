"""Accuracy-aware quantization: meet an accuracy budget by keeping the most sensitive nodes FP32.

Quantize, measure against FP32 on held-out samples; while the budget is missed, rank nodes by the
error they add (sensitivity.layer_errors), exclude the worst, quantize again. Stop when the
budget holds or nothing is left to exclude; report what was excluded and what it cost.
"""

import importlib.util
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .accuracy import measure_accuracy, run_model
from .calibration import Sample
from .errors import PackagerError
from .quantize import QuantConfig, quantize_file
from .sensitivity import layer_errors, suggest

Log = Callable[[str], None]
Metric = Callable[[dict[str, np.ndarray], Sequence[Any] | None], float]
METHODS = ("minmax", "entropy", "percentile")
PROBE_SAMPLES = 4       # samples whose intermediate tensors are compared per round
SMALL_CALIBRATION = 32


@dataclass(frozen=True)
class AccuracyBudget:
    """min_cosine: every held-out sample's output cosine to FP32; max_drop: the fall in accuracy
    (top-1 agreement with FP32 for class scores, else mean cosine; or the user's metric)."""

    min_cosine: float | None = None
    max_drop: float | None = None
    metric: Metric | None = None
    metric_name: str = ""

    @property
    def active(self) -> bool:
        return self.min_cosine is not None or self.max_drop is not None

    def describe(self) -> str:
        parts = []
        if self.min_cosine is not None:
            parts.append(f"cosine >= {self.min_cosine}")
        if self.max_drop is not None:
            parts.append(f"{self.metric_name or 'accuracy'} drop <= {100 * self.max_drop:g}%")
        return " and ".join(parts) or "none"

    def evaluate(self, candidate: Path, fp32: Path, held: Sequence[Sample],
                 labels: Sequence[Any] | None = None) -> dict[str, Any]:
        """measure_accuracy plus the drop and whether the budget holds."""
        acc = measure_accuracy(candidate, fp32, held)
        if self.metric is not None:
            reference = self.metric(run_model(fp32, held), labels)
            score = self.metric(run_model(candidate, held), labels)
            acc.update({"metric": self.metric_name, "metric_fp32": float(reference),
                        "metric_quantized": float(score)})
            drop = float(reference) - float(score)
        else:
            drop = 1.0 - acc.get("top1_agreement", acc["cosine_mean"])
        acc["drop"] = drop
        failures = []
        if self.min_cosine is not None and acc["cosine_min"] < self.min_cosine:
            failures.append(f"cosine {acc['cosine_min']:.4f} < {self.min_cosine}")
        if self.max_drop is not None and drop > self.max_drop:
            failures.append(f"drop {100 * drop:.2f}% > {100 * self.max_drop:g}%")
        acc["budget"] = {"spec": self.describe(), "passed": not failures, "failures": failures}
        return acc


def parse_drop(text: str) -> float:
    """'1%' or '0.01' -> 0.01."""
    value = text.strip()
    try:
        number = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise PackagerError(f"--max-accuracy-drop {text!r} is not a number or percentage",
                            "for example --max-accuracy-drop 1%") from None
    if not 0 <= number < 1:
        raise PackagerError(f"--max-accuracy-drop {text}: must be between 0% and 100%",
                            "for example 1%")
    return number


def load_metric(spec: str) -> tuple[Metric, str]:
    """`path/to/file.py:function`: function(outputs, labels) -> float, higher is better."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not Path(path).is_file():
        raise PackagerError(f"--metric {spec}: expected path/to/file.py:function",
                            "the function takes (outputs, labels) and returns a float, "
                            "higher is better")
    module_spec = importlib.util.spec_from_file_location("_edgepack_metric", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise PackagerError(f"--metric {spec}: importing {path} failed ({exc})",
                            "fix the file") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise PackagerError(f"--metric {spec}: {path} has no function {name}", "fix the name")
    return fn, name


def hygiene(calib: Sequence[Sample], held: Sequence[Sample]) -> list[str]:
    """Warnings about the calibration set: too small, or unlike the held-out samples."""
    notes = []
    if len(calib) < SMALL_CALIBRATION:
        notes.append(f"only {len(calib)} calibration samples; {SMALL_CALIBRATION} or more give "
                     "steadier activation ranges")
    if calib and held:
        for name in calib[0]:
            a = np.stack([s[name] for s in calib]).astype(np.float64)
            b = np.stack([s[name] for s in held]).astype(np.float64)
            if calib[0][name].dtype.kind != "f" or a.std() == 0:
                continue
            shift = abs(a.mean() - b.mean()) / a.std()
            ratio = b.std() / a.std()
            if shift > 0.5 or not 0.5 <= ratio <= 2.0:
                notes.append(f"input {name}: held-out samples differ from the calibration set "
                             f"(mean {b.mean():.3g} vs {a.mean():.3g}, std {b.std():.3g} vs "
                             f"{a.std():.3g}); calibrate on data like what the device will see")
    return notes


def calibration_record(calib: Sequence[Sample], method: str) -> dict[str, Any]:
    """Hash, sample count and method of the calibration set, for the manifest."""
    import hashlib

    digest = hashlib.sha256()
    for sample in calib:
        for name in sorted(sample):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(sample[name]).tobytes())
    return {"sha256": digest.hexdigest(), "samples": len(calib), "method": method}


def worst_samples(fp32: Path, candidate: Path, held: Sequence[Sample], count: int) -> list[Sample]:
    """The held-out samples on which *candidate* agrees least with FP32: where to look."""
    ref, got = run_model(fp32, held), run_model(candidate, held)
    score = np.ones(len(held))
    for name, r in ref.items():
        a = got[name].reshape(len(held), -1).astype(np.float64)
        b = r.reshape(len(held), -1).astype(np.float64)
        norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        score = np.minimum(score, np.where(norms > 0, (a * b).sum(1) / np.maximum(norms, 1e-30),
                                           1.0))
    return [held[i] for i in np.argsort(score)[:count]]


def quantize_to_budget(fp32: Path, output: Path, *, config: QuantConfig,
                       calib: Sequence[Sample], held: Sequence[Sample], budget: AccuracyBudget,
                       labels: Sequence[Any] | None = None, max_rounds: int = 12,
                       log: Log = lambda _: None,
                       progress=None) -> tuple[QuantConfig, dict[str, Any], dict[str, Any]]:
    """Quantize *fp32* into *output*, excluding sensitive nodes until *budget* holds.

    Returns the final config, its accuracy, and a record (method trials, rounds, excluded).
    """
    static = config.precision == "int8" and config.mode == "static"
    trials = []
    if static and config.calibration_method == "auto":
        best = None
        for method in METHODS:
            trial = replace(config, calibration_method=method)
            quantize_file(fp32, output, config=trial, samples=calib, progress=progress)
            acc = budget.evaluate(output, fp32, held, labels)
            trials.append({"method": method, "cosine_min": acc["cosine_min"],
                           "drop": acc["drop"], "passed": acc["budget"]["passed"]})
            log(f"calibration method {method}: cosine min {acc['cosine_min']:.4f}, drop "
                f"{100 * acc['drop']:.2f}%")
            key = (acc["budget"]["passed"], -acc["drop"], acc["cosine_min"])
            if best is None or key > best[0]:
                best = (key, method)
        config = replace(config, calibration_method=best[1])
        log(f"calibration method: {best[1]} (best of {', '.join(METHODS)})")
    elif config.calibration_method == "auto":
        config = replace(config, calibration_method="minmax")
    excluded = list(config.exclude)
    rounds = []
    for round_no in range(max_rounds + 1):
        current = replace(config, exclude=tuple(excluded))
        quantize_file(fp32, output, config=current, samples=calib, progress=progress)
        acc = budget.evaluate(output, fp32, held, labels)
        rounds.append({"excluded": list(excluded), "cosine_min": acc["cosine_min"],
                       "drop": acc["drop"], "passed": acc["budget"]["passed"]})
        if not budget.active or acc["budget"]["passed"] or config.precision != "int8":
            break
        if round_no == 0:   # the plain INT8 model, kept to price the exclusions in latency
            shutil.copyfile(output, first_model(output))
        rows = layer_errors(fp32, output, worst_samples(fp32, output, held, PROBE_SAMPLES))
        picks = suggest(rows, excluded, count=1 if round_no < 4 else 2)
        if not picks:
            log("accuracy budget missed and no quantized node is left to exclude")
            break
        log(f"budget missed ({'; '.join(acc['budget']['failures'])}): keeping "
            + "; ".join(f"{name} in FP32 ({why})" for name, why in picks))
        excluded += [name for name, _ in picks]
    if round_no == max_rounds and not acc["budget"]["passed"]:
        log(f"stopped after {max_rounds} rounds of exclusion")
    record = {"budget": budget.describe(), "method_trials": trials, "rounds": rounds,
              "excluded": [n for n in excluded if n not in config.exclude],
              "passed": acc["budget"]["passed"]}
    return current, acc, record


def first_model(output: Path) -> Path:
    """Where quantize_to_budget keeps the first (plain) INT8 model when it had to exclude."""
    return output.with_name(output.stem + ".first.onnx")


def latency_cost(fp32: Path, first: Path, final: Path, threads: int = 0) -> dict[str, float]:
    """p50 of FP32, the first INT8 model and the final one (with exclusions), interleaved."""
    from .compare import session
    from .timing import time_blocks

    feeds = {}
    for name, path in (("fp32", fp32), ("int8_first", first), ("int8_final", final)):
        sess = session(path, threads)
        shape_feed = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape],
                                       dtype=_np_type(i.type)) for i in sess.get_inputs()}
        feeds[name] = (lambda s=sess, f=shape_feed: s.run(None, f))
    timed = time_blocks(feeds, rounds=3, block=10)
    return {f"{k}_p50_ms": v["p50"] for k, v in timed.items()}


def _np_type(ort_type: str):
    return {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
            "tensor(float16)": np.float16, "tensor(bool)": np.bool_,
            "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}.get(ort_type, np.float32)


def quantize_checked(model: Path, output: Path, *, config: QuantConfig,
                     calib: Sequence[Sample], held: Sequence[Sample], budget: AccuracyBudget,
                     labels: Sequence[Any] | None = None, force: bool = False,
                     log: Log = lambda _: None, progress=None) -> tuple[QuantConfig, dict, dict]:
    """`edgepack quantize` with a budget: quantize_to_budget from *model* into *output*."""
    import tempfile

    from .atomic import atomic_file
    from .modelio import load_model, save_model
    from .sensitivity import name_nodes

    if not held:
        raise PackagerError("an accuracy budget needs held-out samples",
                            "pass --calib (a fraction is held out, see --holdout)")
    with tempfile.TemporaryDirectory(prefix="edgepack-budget-") as tmp:
        fp32 = save_model(name_nodes(load_model(model)), Path(tmp) / "fp32.onnx")
        work = Path(tmp) / "quantized.onnx"
        final, acc, record = quantize_to_budget(fp32, work, config=config, calib=calib,
                                                held=held, budget=budget, labels=labels,
                                                log=log, progress=progress)
        with atomic_file(Path(output), force=force) as out:
            save_model(load_model(work), out, location=Path(output).name + ".data")
    return final, acc, record
