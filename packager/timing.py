"""Latency measurement that is fair between contenders (graphs, providers) on one noisy machine.

Contenders run interleaved in blocks: every round gives each contender a few untimed calls (its thread
pool and caches warm up after the switch) and then a block of timed calls. Alternating single
calls between PyTorch and ONNX Runtime makes their thread pools fight; measured here, it
inflated PyTorch's latency up to 4x.
"""

import contextlib
import os
import platform
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._runtimes.runner.load import load_facts, snapshot

# the device script and the host stop timing rounds by one rule
from ._runtimes.time_models import (  # noqa: F401
    MIN_ROUNDS,
    SETTLE,
    TIMING_SECONDS,
    WARMUP_SECONDS,
    apart,
    blocks,
    enough_rounds,
    hopeless,
    settled,
    warm_up,
)
from .progress import OFF, Progress

# Every timing is bounded in seconds, as on the device (time_models): no round starts after
# TIMING_SECONDS (one round at least), and a contender's warm-up stops after WARMUP_SECONDS
# (one call at least). Kokoro-82M runs 1.4 s a call here: 5 rounds of its original and its
# graph took about 100 s on a quiet machine, and a build on a loaded one ran 35 minutes of it.

# a cold start, in a fresh process: import, load and the first call (compare's column)
COLD_ORT = """import json, sys, time
t0 = time.perf_counter()
import numpy as np, onnxruntime as ort
t1 = time.perf_counter()
so = ort.SessionOptions(); so.intra_op_num_threads = int(sys.argv[3])
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
feed = dict(np.load(sys.argv[2]))
t3 = time.perf_counter()
s.run(None, feed)
t4 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "load_ms": (t2 - t1) * 1e3,
                  "first_call_ms": (t4 - t3) * 1e3, "total_ms": (t2 - t0 + t4 - t3) * 1e3}))
"""


class Tally:
    """Seconds spent in time_blocks while it is open (see `tally`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0


_tallies: list[Tally] = []


@contextlib.contextmanager
def tally() -> Iterator[Tally]:
    """Count the seconds every time_blocks inside spends (the build's "timing" stage)."""
    counter = Tally()
    _tallies.append(counter)
    try:
        yield counter
    finally:
        _tallies.remove(counter)


def time_blocks(contenders: Mapping[str, Callable[[], Any]], *, rounds: int = 5, block: int = 20,
                switch_warmup: int = 3, warmup: int = 5, steps: Progress | None = None,
                phase: str = "timing", settle: float | None = None,
                seconds: float = TIMING_SECONDS) -> dict[str, dict[str, float]]:
    """p50/p90/mean (ms) per contender over rounds x block timed calls, interleaved in blocks.

    *steps* reports each block (round x contender), weighted by the contender's warm-up time per call.
    A contender more than twice the fastest's warm-up time per call gets a shorter block (3 calls
    at least), and with *settle* it leaves the rounds once a round confirms it (hopeless): its
    p50 still counts, and a losing graph no longer sets the stage's length.
    *settle* (e.g. SETTLE) ends the rounds early once `enough_rounds` holds for the per-round
    medians: from MIN_ROUNDS on, the fastest is clear or ties within *settle*; from
    two rounds on, the fastest is CLEAR (1.25x) apart from every other in each.
    No round starts after *seconds*, and warm-ups stop after WARMUP_SECONDS (a model that
    takes a second a call: one warm-up call, a round or two).
    """
    began = time.perf_counter()
    before = snapshot()
    steps = steps or OFF
    times: dict[str, list[float]] = {name: [] for name in contenders}
    medians: dict[str, list[float]] = {name: [] for name in contenders}
    cost = {}
    for name, fn in contenders.items():
        cost[name] = warm_up(fn, warmup)[1] if warmup else 0.0
    # a contender SLOW (2x) slower than the fastest in warm-up: a shorter block (time_models.blocks)
    calls = blocks(cost, block) if warmup else dict.fromkeys(contenders, block)
    steps.start(phase, [(cost[name] or 1e-6) * calls[name] / block
                        for _ in range(rounds) for name in contenders])
    racing = dict(contenders)   # a contender hopeless after a round (time_models.hopeless) stops
    done = 0
    for r in range(rounds):
        for name, fn in racing.items():
            steps.step(f"round {r + 1}/{rounds}, {name}")
            for _ in range(switch_warmup if cost.get(name, 0.0) * switch_warmup <
                           WARMUP_SECONDS else 1):
                fn()
            for _ in range(calls[name]):
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1000.0)
            medians[name].append(float(np.median(times[name][-calls[name]:])))
        done = r + 1
        if done < rounds and time.perf_counter() - began > seconds:
            break
        if settle is None or done == rounds:
            continue
        for name in hopeless({n: cost[n] for n in racing}, {n: medians[n] for n in racing}) \
                if warmup else ():
            del racing[name]
        if len(racing) < 2 or enough_rounds(medians, done, settle):
            break
    steps.finish()
    for counter in _tallies:
        counter.seconds += time.perf_counter() - began
        counter.calls += 1
    load = load_facts(before, wait=False)   # (a timing under 0.5 s: load unknown)
    return {name: {"p10": float(np.percentile(t, 10)), "p50": float(np.percentile(t, 50)),
                   "p90": float(np.percentile(t, 90)), "mean": float(np.mean(t)),
                   "calls": len(t), "rounds": len(medians[name]), "load": load}
            for name, t in times.items()}


def calls_per_block(call: Callable[[], Any]) -> int:
    """Calls per timed block for *call* (warm already): about 0.3 s, 3 to 20 calls."""
    start = time.perf_counter()
    for _ in range(3):
        call()
    per_call = (time.perf_counter() - start) / 3
    return max(3, min(20, int(0.3 / max(per_call, 1e-6))))


def machine() -> dict[str, Any]:
    """CPU model, cores and the instruction-set flags that decide INT8 speed."""
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                if line.startswith(("flags", "Features")) and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16", "asimddp",
              "i8mm", "sve")
    import onnxruntime

    return {"cpu": model or "?", "arch": platform.machine(), "cores": os.cpu_count(),
            "flags": [f for f in wanted if f in flags], "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__}


def machine_line(info: dict[str, Any]) -> str:
    return (f"{info['cpu']} ({info['arch']}, {info['cores']} cores; "
            f"{' '.join(info['flags']) or 'no VNNI/AMX flags'}), onnxruntime {info['onnxruntime']}")


def session(path: Path, threads: int, level: str = "ORT_ENABLE_ALL"):
    """A CPU session for timing next to other contenders.

    Intra-op spinning is off: with it on, the idle sessions' spinning threads stalled PyTorch
    calls by up to 40 ms (p90) on a 2-core machine; it costs ORT ~0.01 ms per call there.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class Stages:
    """Seconds per build stage, from laps: `lap(name)` ends the stage *name* begun at the last
    lap. Time spent in time_blocks while it is open counts as "timing", not as the stage's."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._tally = Tally()
        self._mark = time.perf_counter()
        self._timed = 0.0

    def __enter__(self) -> "Stages":
        _tallies.append(self._tally)
        self._mark = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        _tallies.remove(self._tally)

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        timed = self._tally.seconds - self._timed
        self.add(name, now - self._mark - timed)
        if timed:
            self.add("timing", timed)
        self._mark, self._timed = now, self._tally.seconds

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + max(seconds, 0.0)

    def since(self, before: dict[str, float]) -> dict[str, float]:
        """The seconds added since *before* (a copy of `seconds`), rounded."""
        return {name: round(s - before.get(name, 0.0), 2) for name, s in self.seconds.items()
                if s - before.get(name, 0.0) > 0.005}

    def record(self) -> dict[str, float]:
        return {name: round(s, 2) for name, s in self.seconds.items()}

    def line(self) -> str:
        total = sum(self.seconds.values())
        return ", ".join(f"{name} {s:.1f} s" for name, s in self.seconds.items() if s >= 0.05) \
            + f"; total {total:.1f} s"
