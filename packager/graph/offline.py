"""Faster start on the device: a part's graph optimised offline by this onnxruntime.

Level "extended" only: its fusions are the same on every CPU, while level "all" adds NCHWc
layout transforms sized for this host's vector width, which another CPU would compute wrongly.
The graph is saved as .onnx and in the ORT format; the one that loads fastest at the target's
optimisation level ships when it loads at least MIN_GAIN faster than the original and computes
the same outputs. Both formats hold this onnxruntime's version of its contrib ops, so the runner
loads it only under the same onnxruntime version family (major.minor) and otherwise loads the
original and says why.
"""

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from .execute import compare_outputs

FORMATS = (("onnx", ".opt.onnx"), ("ort", ".ort"))
LEVEL = "extended"
MIN_GAIN = 0.10       # ship only when the load is at least 10 % faster
SAME_COSINE = 0.99999  # the optimised graph must compute what the original does
RUN_SLACK = 0.03      # and run no slower (ORT format at level "all" skips layout transforms)
ROUNDS = 5
RUNS = 20             # timed calls per round for the run-time comparison


def family(version: str) -> str:
    """'1.32.0' -> '1.32'."""
    return ".".join(version.split(".")[:2])


def _options(level: str, save: Path | None = None, fmt: str = "onnx"):
    import onnxruntime as ort

    from .._runtimes.runner.sessions import session_options

    so = session_options(ort, {"graph_optimization_level": level})
    so.log_severity_level = 3   # level "extended" writes no hardware warning; keep others out
    if save is not None:
        so.optimized_model_filepath = str(save)
        if fmt == "ort":
            so.add_session_config_entry("session.save_model_format", "ORT")
    return so


def _load_ms(path: Path, level: str) -> float:
    import onnxruntime as ort

    start = time.perf_counter()
    ort.InferenceSession(str(path), _options(level), providers=["CPUExecutionProvider"])
    return (time.perf_counter() - start) * 1000.0


def _session(path: Path, level: str):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), _options(level), providers=["CPUExecutionProvider"])


def _run_ms(sessions: dict[str, Any], samples: dict[str, np.ndarray]) -> dict[str, float]:
    """p50 of one call per session, timed in interleaved rounds."""
    from .._runtimes.runner.metrics import timed

    feed = {k: np.asarray(v[0]) for k, v in samples.items()}
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(ROUNDS):
        for key, session in sessions.items():
            times[key] += timed(lambda s=session: s.run(None, feed), 3, RUNS)
    return {k: float(np.percentile(v, 50)) for k, v in times.items()}


def offline_graph(folder: Path, model_file: str, samples: dict[str, np.ndarray],
                  level: str, reference: dict[str, np.ndarray]) -> dict[str, Any]:
    """Write the fastest-loading offline-optimised form of *folder*/*model_file* beside it, or
    nothing; return the manifest's record of what was measured and why it ships (or not).
    *level*: the optimisation level the device's sessions use; *reference*: the model's outputs
    on *samples* at that level (the bundle's golden "shipped" outputs)."""
    import onnxruntime as ort

    from ..hashing import sha256

    source = folder / model_file
    stem = model_file[:-len(".onnx")]
    made, failed = {}, {}
    for fmt, suffix in FORMATS:
        path = folder / (stem + suffix)
        try:
            ort.InferenceSession(str(source), _options(LEVEL, path, fmt),
                                 providers=["CPUExecutionProvider"])
            made[fmt] = path
        except Exception as exc:   # noqa: BLE001 - onnxruntime's own refusal, recorded
            failed[fmt] = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else \
                type(exc).__name__
            path.unlink(missing_ok=True)
    times: dict[str, list[float]] = {"original": [], **{f: [] for f in made}}
    for _ in range(ROUNDS):   # interleaved: a noisy moment hits every form alike
        times["original"].append(_load_ms(source, level))
        for fmt, path in made.items():
            times[fmt].append(_load_ms(path, level))
    load = {k: statistics.median(v) for k, v in times.items()}
    from .._runtimes.runner.sessions import run_samples

    sessions = {"original": _session(source, level),
                **{f: _session(p, level) for f, p in made.items()}}
    run = _run_ms(sessions, samples)
    same = {}
    for fmt in list(made):
        stats = compare_outputs(run_samples(sessions[fmt], samples), reference)
        same[fmt] = min(s["cosine_min"] for s in stats.values())
        if same[fmt] < SAME_COSINE:
            failed[fmt] = f"its outputs differ from the original's (cosine {same[fmt]:.6f})"
        elif run[fmt] > run["original"] * (1 + RUN_SLACK):
            failed[fmt] = (f"it runs slower: p50 {run[fmt]:.3f} ms against "
                           f"{run['original']:.3f} ms")
    usable = [f for f in made if f not in failed]
    best = min(usable, key=lambda f: load[f]) if usable else None
    record: dict[str, Any] = {
        "level": LEVEL, "loaded_at": level, "onnxruntime": ort.__version__,
        "family": family(ort.__version__),
        "load_ms": {(model_file if k == "original" else made[k].name): round(v, 3)
                    for k, v in load.items()},
        "run_p50_ms": {(model_file if k == "original" else made[k].name): round(v, 4)
                       for k, v in run.items()},
        **({"not_usable": failed} if failed else {})}
    gain = 1.0 - load[best] / load["original"] if best else 0.0
    if best and gain >= MIN_GAIN:
        chosen = made[best]
        record.update(file=chosen.name, sha256=sha256(chosen), bytes=chosen.stat().st_size,
                      format=best, cosine_min=same[best],
                      reason=f"loads in {load[best]:.1f} ms against {load['original']:.1f} ms "
                             f"for {model_file} (-{100 * gain:.0f}%)")
    else:
        record["reason"] = (f"the fastest form ({made[best].name}, {load[best]:.1f} ms) loads "
                            f"less than {100 * MIN_GAIN:.0f}% faster than {model_file} "
                            f"({load['original']:.1f} ms)" if best else
                            "no optimised form is usable: " + "; ".join(
                                f"{stem}{dict(FORMATS)[f]}: {why}" for f, why in failed.items()))
    for path in made.values():
        if path.name != record.get("file"):
            path.unlink(missing_ok=True)
    return record
