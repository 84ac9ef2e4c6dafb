"""Agreement between outputs, and latency: timed runs and their statistics."""

import time

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None


def compare(got, ref):
    """Per-output agreement between two (samples, ...) arrays."""
    a = got.reshape(got.shape[0], -1).astype(np.float64)
    b = ref.reshape(ref.shape[0], -1).astype(np.float64)
    # the same non-finite value on both sides (a log-mel's -inf of silence) agrees; a NaN or
    # infinity the reference lacks leaves the cosine NaN, which callers count as a miss
    agree = ~np.isfinite(b) & ((a == b) | (np.isnan(a) & np.isnan(b)))
    if agree.any():
        a, b = np.where(agree, 0.0, a), np.where(agree, 0.0, b)
    ref_norm = np.linalg.norm(b, axis=1)
    norms = np.linalg.norm(a, axis=1) * ref_norm
    err = np.abs(a - b).max(axis=1) if a.size else np.zeros(len(a))
    with np.errstate(invalid="ignore"):   # inf / inf: NaN, a miss for the callers
        cos = np.where(norms > 0, (a * b).sum(axis=1) / np.maximum(norms, 1e-30),
                       np.where(err == 0, 1.0, 0.0))
    # A sample whose reference is near silence (a text detector's map of a photo with no
    # text: 1e-5 everywhere) has no direction to compare: there the output must stay within
    # 1 % of the outputs' range over all samples instead (false text there still fails).
    silent = ref_norm < 1e-3 * ref_norm.max() if len(ref_norm) else ref_norm > 0
    scale = float(np.abs(b).max()) if b.size else 0.0
    cos = np.where(silent, np.where(err <= 0.01 * scale, 1.0, 0.0), cos)
    result = {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
              "max_abs": float(err.max()) if a.size else 0.0}
    if silent.any():
        result["silent_samples"] = int(silent.sum())
    if looks_like_scores(ref):
        result["top1_agreement"] = float((a.argmax(axis=1) == b.argmax(axis=1)).mean())
    return result


def looks_like_scores(arr):
    """Class scores: float, shape (samples, 1, classes) with at least two classes."""
    return arr.dtype.kind == "f" and arr.ndim == 3 and arr.shape[1] == 1 and arr.shape[2] >= 2


def latency_stats(times):
    t = np.asarray(times)
    return {"p10": float(np.percentile(t, 10)), "p50": float(np.percentile(t, 50)),
            "p90": float(np.percentile(t, 90)),
            "p99": float(np.percentile(t, 99)), "mean": float(t.mean()), "std": float(t.std()),
            "min": float(t.min()), "max": float(t.max())}


def timed(call, warmup, runs):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def io_binding_call(session, feed, names, device):
    """One run with inputs and outputs kept on *device* ('cuda' under CUDA and TensorRT), as an
    application that chains GPU work would: no host copies inside the timed call."""
    import onnxruntime as ort

    binding = session.io_binding()
    for name, value in feed.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, device, 0))
    for name in names:
        binding.bind_output(name, device)

    def call():
        session.run_with_iobinding(binding)
    return call
