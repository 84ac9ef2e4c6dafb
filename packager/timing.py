"""Latency measurement that is fair between engines sharing one noisy machine.

Engines run interleaved in blocks: every round gives each engine a few untimed calls (its thread
pool and caches warm up after the switch) and then a block of timed calls. Alternating single
calls between PyTorch and ONNX Runtime makes their thread pools fight; measured here, it
inflated PyTorch's latency up to 4x.
"""

import os
import platform
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .progress import OFF, Progress


def time_blocks(engines: Mapping[str, Callable[[], Any]], *, rounds: int = 5, block: int = 20,
                switch_warmup: int = 3, warmup: int = 5, steps: Progress | None = None,
                phase: str = "timing") -> dict[str, dict[str, float]]:
    """p50/p90/mean (ms) per engine over rounds x block timed calls, interleaved in blocks.

    *steps* reports each block (round x engine), weighted by the engine's warm-up time per call.
    """
    steps = steps or OFF
    times: dict[str, list[float]] = {name: [] for name in engines}
    cost = {}
    for name, fn in engines.items():
        start = time.perf_counter()
        for _ in range(warmup):
            fn()
        cost[name] = (time.perf_counter() - start) / max(warmup, 1)
    steps.start(phase, [cost[name] or 1e-6 for _ in range(rounds) for name in engines])
    for r in range(rounds):
        for name, fn in engines.items():
            steps.step(f"round {r + 1}/{rounds}, {name}")
            for _ in range(switch_warmup):
                fn()
            for _ in range(block):
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1000.0)
    steps.finish()
    return {name: {"p50": float(np.percentile(t, 50)), "p90": float(np.percentile(t, 90)),
                   "mean": float(np.mean(t)), "calls": len(t)} for name, t in times.items()}


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
    """A CPU session for timing next to other engines.

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
