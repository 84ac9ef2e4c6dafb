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
    its default) on *feed* and of *module* called with *args* (eager, inference mode), warm and
    interleaved, at the thread count that session runs with and at 1 thread (on a busy machine
    PyTorch's OpenMP threads wait on each other: 796 ms at 2 threads where a warm loop gave
    8-31 ms): eager's faster is the baseline. A noisy timing is measured once more; still noisy,
    the ratio is a range (eager's p10-p90 against the bundle's), never one figure."""
    import torch

    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in args]
    count = threads or ort_default_threads()
    before = torch.get_num_threads()
    try:
        sess = session(graph, threads)
        with torch.inference_mode():
            try:
                module(*tensors)
            except Exception as exc:   # a baseline the build cannot take costs its line only
                return {"measured": False, "why": f"forward() failed on the bundle's inputs "
                        f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"}
            runs = {"bundle": lambda: sess.run(None, feed),
                    **{f"eager {n}": _at_threads(module, tensors, n)
                       for n in sorted({count, 1}, reverse=True)}}
            passes = []   # (why noisy, the timings), once more where the first was noisy
            for _ in range(2):
                times = time_blocks(runs, rounds=5, block=calls_per_block(
                    runs[f"eager {count}"]), settle=SETTLE)
                passes.append((_noisy(times), times))
                if not passes[-1][0]:
                    break
    finally:
        torch.set_num_threads(before)
    noisy, times = min(passes, key=lambda p: _spread(p[1]) + (10.0 if p[0] else 0.0))
    best = min((k for k in times if k.startswith("eager")), key=lambda k: times[k]["p50"])
    return _record(times["bundle"], times[best], int(best.split()[1]), threads, noisy,
                   {k.split()[1]: round(v["p50"], 4) for k, v in times.items()
                    if k.startswith("eager")})


def _at_threads(module: Any, tensors: Sequence[Any], count: int) -> Any:
    """A call of *module* at *count* torch threads (set once per block, not per call)."""
    import torch

    def call() -> Any:
        if torch.get_num_threads() != count:
            torch.set_num_threads(count)
        return module(*tensors)
    return call


def _spread(times: dict[str, dict[str, Any]]) -> float:
    return max([t["p90"] / t["p10"] for t in times.values() if t["p10"] > 0], default=1.0)


def _noisy(times: dict[str, dict[str, Any]]) -> str:
    """Why a pass is noisy ('' when not): the machine busy, or any contender's calls spread."""
    return "; ".join(sorted({noise(t.get("load"), t) for t in times.values()} - {""}))


def _record(mine: dict[str, Any], theirs: dict[str, Any], count: int, threads: int,
            noisy: str = "", by_threads: dict[str, float] | None = None) -> dict[str, Any]:
    ratio = round(theirs["p50"] / mine["p50"], 3)
    record = {"measured": True, "bundle_p50_ms": round(mine["p50"], 4),
              "eager_p50_ms": round(theirs["p50"], 4),
              "eager_p10_p90_ms": [round(theirs["p10"], 4), round(theirs["p90"], 4)],
              "bundle_p10_p90_ms": [round(mine["p10"], 4), round(mine["p90"], 4)],
              "speedup": None if noisy else ratio, "threads": count,
              "intra_op_threads": threads, "provider": "CPUExecutionProvider",
              "eager_p50_ms_by_threads": by_threads or {str(count): round(theirs["p50"], 4)},
              "measured_on": machine(), "load": mine.get("load")}
    if noisy:   # one figure would be a guess: the range the two spreads allow
        record["noisy"] = noisy
        record["speedup_range"] = [round(theirs["p10"] / mine["p90"], 3),
                                   round(theirs["p90"] / mine["p10"], 3)]
        record["speedup_p50"] = ratio
    return record


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
    bundle's p10-p90 is the same speed). A noisy timing gives a range, not one figure."""
    if not record.get("measured"):
        return f"not compared with eager PyTorch ({record.get('why', '?')})"
    mine, theirs = record["bundle_p50_ms"], record["eager_p50_ms"]
    low, high = record["bundle_p10_p90_ms"]
    threads = record.get("threads") or "all"
    tried = record.get("eager_p50_ms_by_threads") or {}
    best = (f", the faster of {' and '.join(sorted(tried, key=int, reverse=True))} threads"
            if len(tried) > 1 else "")
    head = (f"against eager PyTorch ({theirs:.3f} ms p50, {threads} threads{best}) the bundle "
            f"on the CPU provider runs {mine:.3f} ms: ")
    if record.get("speedup") is None and record.get("speedup_range"):
        lo_x, hi_x = record["speedup_range"]
        return head + (f"between {lo_x:.2f}x and {hi_x:.2f}x its speed; NOISY twice "
                       f"({record.get('noisy', '?')}): eager PyTorch slows far more than ONNX "
                       "Runtime on a busy machine, so no one figure is given; build again on a "
                       "quiet one for this comparison")
    text = head + f"{record['speedup']:.2f}x its speed"
    why = noise(record.get("load"), {"p10": low, "p90": high})
    if why:   # (a record from before noisy timings were measured again)
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
