"""--precision auto: build the candidate precisions, time them here, ship the fastest that keeps
the accuracy budget — and never an INT8 model that is not clearly faster than FP32."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .accuracy import measure_accuracy
from .calibration import Sample
from .compare import session
from .errors import QuantizationError
from .quantize import QuantConfig, quantize_file
from .targets import Target
from .timing import machine, time_blocks

MIN_GAIN = 1.05   # INT8 must beat FP32 by 5% (more than run-to-run noise here) to be shipped
GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
Log = Callable[[str], None]


@dataclass
class Candidate:
    config: QuantConfig
    path: Path
    accuracy: dict[str, Any]
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    error: str = ""

    def summary(self, budget: float) -> dict[str, Any]:
        return {"precision": self.config.describe(), "p50_ms": self.p50_ms,
                "p90_ms": self.p90_ms, "cosine_min": self.accuracy.get("cosine_min"),
                "bytes": self.path.stat().st_size if self.path.exists() else None,
                "meets_budget": self.meets(budget), "error": self.error or None}

    def meets(self, budget: float) -> bool:
        return not self.error and self.accuracy.get("cosine_min", 0.0) >= budget


def _runner(sess: Any, feed: Sample) -> Callable[[], Any]:
    return lambda: sess.run(None, feed)


def candidate_configs(target: Target, family: str, overrides: dict[str, Any]) -> list[QuantConfig]:
    """FP32, the target's INT8 preset, dynamic INT8 (if the preset is static), FP16 on GPUs."""
    preset = target.preset_for(family)
    fixed = {k: v for k, v in overrides.items() if k != "precision"}
    base = QuantConfig.from_preset(preset, **fixed)
    if base.calibration_method == "auto":   # the method search belongs to a chosen precision
        base = replace(base, calibration_method="minmax")
    configs = [replace(base, precision="fp32"), replace(base, precision="int8")]
    if base.mode == "static":
        configs.append(replace(base, precision="int8", mode="dynamic"))
    if any(p.name in GPU_PROVIDERS for p in target.providers):
        configs.append(replace(base, precision="fp16"))
    return configs


def choose(fp32: Path, folder: Path, *, target: Target, family: str,
           overrides: dict[str, Any], calib: Sequence[Sample], held_out: Sequence[Sample],
           budget: float, rounds: int = 5, block: int = 20,
           log: Log = lambda _: None) -> tuple[Candidate, dict[str, Any]]:
    """Build and time every candidate; return the one to ship and the decision record."""
    threads = int(target.session.get("intra_op_threads", 0))
    candidates = []
    for i, config in enumerate(candidate_configs(target, family, overrides)):
        path = folder / f"auto_{i}_{config.precision}_{config.mode}.onnx"
        try:
            quantize_file(fp32, path, config=config, samples=calib)
            candidates.append(Candidate(config, path, measure_accuracy(path, fp32, held_out)))
        except QuantizationError as exc:
            candidates.append(Candidate(config, path, {}, error=exc.message))
    runnable = [c for c in candidates if not c.error]
    feed = held_out[0]
    runs = {str(i): _runner(session(c.path, threads), feed) for i, c in enumerate(runnable)}
    log(f"precision auto: timing {len(runnable)} candidates ({rounds} rounds x {block} calls, "
        "interleaved)")
    timed = time_blocks(runs, rounds=rounds, block=block)
    for i, c in enumerate(runnable):
        c.p50_ms, c.p90_ms = timed[str(i)]["p50"], timed[str(i)]["p90"]
    fp32_c = candidates[0]
    ok = [c for c in runnable if c.meets(budget)]
    best = min(ok, key=lambda c: c.p50_ms)
    reasons = []
    for c in candidates[1:]:
        name = c.config.describe()
        if c.error:
            reasons.append(f"{name} failed to quantize ({c.error})")
        elif not c.meets(budget):
            reasons.append(f"{name} missed the accuracy budget (cosine {c.accuracy['cosine_min']:.4f}"
                           f" < {budget})")
        elif c.p50_ms * MIN_GAIN > fp32_c.p50_ms and c.config.precision == "int8":
            reasons.append(f"{name} was not faster than FP32 by {100 * (MIN_GAIN - 1):.0f}% "
                           f"({c.p50_ms:.3f} vs {fp32_c.p50_ms:.3f} ms p50)")
    if best.config.precision == "int8" and best.p50_ms * MIN_GAIN > fp32_c.p50_ms:
        best = fp32_c   # never ship INT8 that is not clearly faster than FP32
    if best is fp32_c:
        reason = "FP32: " + ("; ".join(reasons) or "no candidate was faster")
    else:
        reason = (f"{best.config.describe()}: {fp32_c.p50_ms / best.p50_ms:.2f}x faster than FP32 "
                  f"({best.p50_ms:.3f} vs {fp32_c.p50_ms:.3f} ms p50) at cosine "
                  f"{best.accuracy['cosine_min']:.4f} >= {budget}")
    log(f"precision auto: {reason}")
    record = {"chosen": best.config.describe(), "reason": reason, "budget_min_cosine": budget,
              "min_gain_over_fp32": MIN_GAIN, "threads": threads, "measured_on": machine(),
              "candidates": [c.summary(budget) for c in candidates]}
    return best, record
