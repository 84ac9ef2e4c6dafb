"""Eager PyTorch as a baseline: what a user with a PyTorch model already runs.

For a PyTorch source, "the original" the build times against is the model's plain ONNX export,
which is not what the user had: a real speaker-embedding LSTM bundle read "1.00x the original"
while running at 0.54-0.79x eager PyTorch's speed. The bundle's graph (on the CPU provider, as
a device without OpenVINO runs it) and the module in eager mode (torch.inference_mode, the same
thread count, the same input) are timed here interleaved in the same blocks.
"""

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._runtimes.runner.load import noise
from ..graph.execute import Sample
from ..timing import SETTLE, machine, session, time_blocks


def against_eager(graph: Path, loaded: Any, export_info: dict[str, Any] | None, feed: Sample,
                  target: Any, why_not: str) -> dict[str, Any]:
    """The bundle's CPU-provider *graph* against *loaded*'s module in eager PyTorch, or why it
    was not timed (*why_not*: why this host cannot time the target)."""
    if why_not:
        return {"measured": False, "why": why_not}
    if (export_info or {}).get("consts"):
        return {"measured": False, "why": "forward() takes --const arguments the export bound"}
    import onnx

    proto = onnx.load(str(graph), load_external_data=False)
    inits = {i.name for i in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in inits]
    return time_against_eager(graph, loaded.module, names, feed,
                              int(target.session.get("intra_op_threads", 0)))


def time_against_eager(graph: Path, module: Any, names: Sequence[str], feed: Sample,
                       threads: int) -> dict[str, Any]:
    """p50 and p10-p90 of *graph* (onnxruntime, CPU provider) and of *module* called with
    *feed*'s tensors in *names* order (eager, inference mode), at *threads* (0: every core)."""
    import torch

    tensors = [torch.from_numpy(np.ascontiguousarray(feed[n])) for n in names]
    before = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        sess = session(graph, threads)
        with torch.inference_mode():
            module(*tensors)
            runs = {"bundle": lambda: sess.run(None, feed), "eager": lambda: module(*tensors)}
            block = _block(runs["eager"])
            times = time_blocks(runs, rounds=5, block=block, settle=SETTLE)
    finally:
        torch.set_num_threads(before)
    mine, theirs = times["bundle"], times["eager"]
    return {"measured": True, "bundle_p50_ms": round(mine["p50"], 4),
            "eager_p50_ms": round(theirs["p50"], 4),
            "eager_p10_p90_ms": [round(theirs["p10"], 4), round(theirs["p90"], 4)],
            "bundle_p10_p90_ms": [round(mine["p10"], 4), round(mine["p90"], 4)],
            "speedup": round(theirs["p50"] / mine["p50"], 3), "threads": threads,
            "provider": "CPUExecutionProvider", "measured_on": machine(),
            "load": mine.get("load")}


def _block(call: Any) -> int:
    """Calls per timed block: about 0.3 s, 3 to 20 (as the build's other timings)."""
    import time

    start = time.perf_counter()
    for _ in range(3):
        call()
    per_call = (time.perf_counter() - start) / 3
    return max(3, min(20, int(0.3 / max(per_call, 1e-6))))


def eager_line(record: dict[str, Any]) -> str:
    """The build's words on eager PyTorch: how the bundle compares, and plainly when it does
    not beat it beyond timing noise."""
    if not record.get("measured"):
        return f"not compared with eager PyTorch ({record.get('why', '?')})"
    mine, theirs = record["bundle_p50_ms"], record["eager_p50_ms"]
    low, high = record["bundle_p10_p90_ms"]
    threads = record.get("threads") or "all"
    text = (f"against eager PyTorch ({theirs:.3f} ms p50, {threads} threads) the bundle on the "
            f"CPU provider runs {mine:.3f} ms: {record['speedup']:.2f}x its speed")
    why = noise(record.get("load"), {"p10": low, "p90": high})
    if why:   # PyTorch's OpenMP threads wait on a busy core: eager's figure is the first hit
        text += (f"; NOISY ({why}): eager PyTorch slows far more than ONNX Runtime on a busy "
                 "machine, build again on a quiet one for this comparison")
    if low <= theirs <= high:
        return text + ("; ONNX Runtime does not beat eager PyTorch here beyond timing noise "
                       "(eager's p50 lies inside the bundle's p10-p90)")
    if mine > theirs:
        return text + (f"; ONNX Runtime does not beat eager PyTorch here: the bundle is slower "
                       f"than the PyTorch you started from ({mine:.3f} vs {theirs:.3f} ms p50 "
                       f"at {threads} threads)")
    return text
