"""Eager PyTorch as a baseline: what a user with a PyTorch model already runs.

For a PyTorch source, "the original" the build times against is the model's plain ONNX export,
which is not what the user had: a real speaker-embedding LSTM bundle read "1.00x the original"
while running at 0.54-0.79x eager PyTorch's speed. The bundle's graph (on the CPU provider, as
a device without OpenVINO runs it) and the module in eager mode (torch.inference_mode, the
thread count the bundle's session runs with here, the same input) are timed here interleaved in
the same blocks.
"""

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._runtimes.runner.load import noise
from ..graph.execute import Sample
from ..timing import SETTLE, calls_per_block, machine, session, time_blocks


def against_eager(graph: Path, loaded: Any, export_info: dict[str, Any] | None, feed: Sample,
                  target: Any, why_not: str, *,
                  forward: tuple[Sequence[str], Mapping[str, np.ndarray]]) -> dict[str, Any]:
    """The bundle's CPU-provider *graph* on *feed* against *loaded*'s module in eager PyTorch,
    or why it was not timed (*why_not*: why this host cannot time the target).

    *forward* is the exported graph's inputs in forward()'s order and the values --const froze
    into the bundle (eager PyTorch still takes them as arguments)."""
    if why_not:
        return {"measured": False, "why": why_not}
    if (export_info or {}).get("consts"):
        return {"measured": False, "why": "forward() takes --const arguments the export bound"}
    names, frozen = forward
    given = {**frozen, **feed}
    missing = [n for n in names if n not in given]
    if missing or not names:
        return {"measured": False, "why": f"forward()'s input '{(missing or ['?'])[0]}' is not "
                                          "among the bundle's"}
    return time_against_eager(graph, loaded.module, [given[n] for n in names], feed,
                              int(target.session.get("intra_op_threads", 0)))


def time_against_eager(graph: Path, module: Any, args: Sequence[np.ndarray], feed: Sample,
                       threads: int) -> dict[str, Any]:
    """p50 and p10-p90 of *graph* (onnxruntime, CPU provider, *threads* intra-op threads, 0:
    its default) on *feed* and of *module* called with *args* (eager, inference mode) at the
    thread count that session runs with."""
    import torch

    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in args]
    count = threads or ort_default_threads()
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        sess = session(graph, threads)
        with torch.inference_mode():
            try:
                module(*tensors)
            except Exception as exc:   # a baseline the build cannot take costs its line only
                return {"measured": False, "why": f"forward() failed on the bundle's inputs "
                        f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"}
            runs = {"bundle": lambda: sess.run(None, feed), "eager": lambda: module(*tensors)}
            times = time_blocks(runs, rounds=5, block=calls_per_block(runs["eager"]), settle=SETTLE)
    finally:
        torch.set_num_threads(before)
    return _record(times["bundle"], times["eager"], count, threads)


def _record(mine: dict[str, Any], theirs: dict[str, Any], count: int,
            threads: int) -> dict[str, Any]:
    return {"measured": True, "bundle_p50_ms": round(mine["p50"], 4),
            "eager_p50_ms": round(theirs["p50"], 4),
            "eager_p10_p90_ms": [round(theirs["p10"], 4), round(theirs["p90"], 4)],
            "bundle_p10_p90_ms": [round(mine["p10"], 4), round(mine["p90"], 4)],
            "speedup": round(theirs["p50"] / mine["p50"], 3), "threads": count,
            "intra_op_threads": threads, "provider": "CPUExecutionProvider",
            "measured_on": machine(), "load": mine.get("load")}


def ort_default_threads() -> int:
    """The intra-op threads onnxruntime runs with when a session asks for 0: one per physical
    core of the machine (hyperthread siblings count once; measured here, onnxruntime 1.32 does
    not narrow it to the process's CPU affinity)."""
    cores = set()
    for cpu in Path("/sys/devices/system/cpu").glob("cpu[0-9]*"):
        try:
            cores.add(((cpu / "topology/physical_package_id").read_text().strip(),
                       (cpu / "topology/core_id").read_text().strip()))
        except OSError:   # offline CPUs have no topology
            continue
    return len(cores) or os.cpu_count() or 1


def eager_line(record: dict[str, Any]) -> str:
    """The build's words on eager PyTorch: how the bundle compares, and plainly when it does
    not beat it beyond timing noise (the rule of the speed line: eager's p50 inside the
    bundle's p10-p90 is the same speed)."""
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
    plain = (f"; ONNX Runtime does not beat eager PyTorch here: bundle {mine:.3f} ms vs eager "
             f"{theirs:.3f} ms p50 at {threads} threads")
    if low <= theirs <= high:
        return text + plain + (", the same speed within timing noise (eager's p50 lies inside "
                               "the bundle's p10-p90)")
    if mine > theirs:
        return text + plain + ", slower than the PyTorch you started from"
    return text
