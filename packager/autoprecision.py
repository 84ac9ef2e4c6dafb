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


INTEGER_OPS = {"QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
               "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "QGemm"}


def _has_integer_ops(path: Path) -> bool:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return any(n.op_type in INTEGER_OPS for n in graph.node)


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


# Times models: (paths, feed, threads, rounds, block) -> ({path: {"p50", "p90"}}, device info)
Timer = Callable[[Sequence[Path], Sample, int, int, int], tuple[dict[str, dict], dict[str, Any]]]


def local_timer(paths: Sequence[Path], feed: Sample, threads: int, rounds: int,
                block: int) -> tuple[dict[str, dict], dict[str, Any]]:
    runs = {str(p): _runner(session(p, threads), feed) for p in paths}
    return time_blocks(runs, rounds=rounds, block=block), machine()


def remote_timer(host: Any, *, ssh_config: Path | None = None, python: str = "python3",
                 log: Log = lambda _: None) -> Timer:
    """Time the candidates on a device over SSH (copied to a scratch folder, removed after)."""
    import json
    import shlex
    import shutil
    import tempfile
    import uuid

    import numpy as np

    from ._runtimes import time_models
    from .remote import Connection, DeviceError, have_local

    def timer(paths, feed, threads, rounds, block):
        conn = Connection(host, ssh_config=ssh_config)
        remote = f"edgepack/.auto-{uuid.uuid4().hex[:8]}"
        with tempfile.TemporaryDirectory(prefix="edgepack-auto-") as tmp:
            folder = Path(tmp)
            for p in paths:
                shutil.copyfile(p, folder / p.name)
            np.savez(folder / "feed.npz", **feed)
            shutil.copyfile(time_models.__file__, folder / "time_models.py")
            conn.run(f"mkdir -p {shlex.quote(remote)}")
            probe = conn.run("command -v rsync >/dev/null 2>&1 && echo RSYNC")
            rsync = probe.stdout.startswith("RSYNC") and have_local("rsync")
            method = "rsync" if rsync else "scp"
            log(f"precision auto: timing {len(paths)} candidates on {host.name}")
            conn.copy(folder, remote, method=method)
            names = " ".join(shlex.quote(p.name) for p in paths)
            proc = conn.run(f"cd {shlex.quote(remote)} && {shlex.quote(python)} time_models.py "
                            f"feed.npz {threads} {rounds} {block} {names}; "
                            f"code=$?; cd && rm -rf {shlex.quote(remote)}; exit $code")
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise DeviceError(f"{host.name}: timing the candidates failed ({last})",
                              "check python3, numpy and onnxruntime on the device")
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        by_name = {Path(k).name: v for k, v in data["timings"].items()}
        return {str(p): by_name[p.name] for p in paths}, {**data["device"], "host": host.name}
    return timer


def choose(fp32: Path, folder: Path, *, target: Target, family: str,
           overrides: dict[str, Any], calib: Sequence[Sample], held_out: Sequence[Sample],
           budget: float, rounds: int = 5, block: int = 20, timer: Timer | None = None,
           log: Log = lambda _: None) -> tuple[Candidate, dict[str, Any]]:
    """Build and time every candidate (here, or with *timer* on a device); return the one to
    ship and the decision record."""
    threads = int(target.session.get("intra_op_threads", 0))
    candidates = []
    for i, config in enumerate(candidate_configs(target, family, overrides)):
        path = folder / f"auto_{i}_{config.precision}_{config.mode}.onnx"
        try:
            quantize_file(fp32, path, config=config, samples=calib)
            if config.precision == "int8" and not _has_integer_ops(path):
                candidates.append(Candidate(config, path, {}, error="no operator in this model "
                                            "could be quantized, so it cannot be faster"))
                continue
            candidates.append(Candidate(config, path, measure_accuracy(path, fp32, held_out)))
        except QuantizationError as exc:
            candidates.append(Candidate(config, path, {}, error=exc.message))
    runnable = [c for c in candidates if not c.error]
    log(f"precision auto: timing {len(runnable)} candidates ({rounds} rounds x {block} calls, "
        "interleaved)")
    timed, measured_on = (timer or local_timer)([c.path for c in runnable], held_out[0],
                                                threads, rounds, block)
    for c in runnable:
        c.p50_ms, c.p90_ms = timed[str(c.path)]["p50"], timed[str(c.path)]["p90"]
    fp32_c = candidates[0]
    ok = [c for c in runnable if c.meets(budget)]
    best = min(ok, key=lambda c: c.p50_ms)
    reasons = []
    for c in candidates[1:]:
        name = c.config.describe()
        if c.error:
            reasons.append(f"{name}: {c.error}")
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
              "min_gain_over_fp32": MIN_GAIN, "threads": threads, "measured_on": measured_on,
              "candidates": [c.summary(budget) for c in candidates]}
    return best, record
