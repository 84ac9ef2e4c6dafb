"""Agreement between outputs, and latency: timed runs and their statistics."""

import time

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None


WARMUP_S, TIMED_S, MIN_RUNS = 1.0, 30.0, 5   # timed()'s bounds
RAGGED = ".ragged."   # an .npz key NAME.ragged.I: sample I of an output whose length varies


def stack_or_ragged(arrays):
    """(samples, *shape) when every sample's shape agrees, else a ragged output: an object
    array of each sample's own array (a waveform whose length follows the text)."""
    if len(set(a.shape for a in arrays)) <= 1:
        return np.stack(arrays)
    out = np.empty(len(arrays), dtype=object)
    for i, a in enumerate(arrays):
        out[i] = a
    return out


def npz_arrays(outputs):
    """*outputs* as np.savez takes them without pickling: a ragged one as NAME.ragged.I."""
    flat = {}
    for name, arr in outputs.items():
        if arr.dtype == object:
            flat.update(("%s%s%d" % (name, RAGGED, i), a) for i, a in enumerate(arr))
        else:
            flat[name] = arr
    return flat


def from_npz(flat):
    """npz_arrays undone: NAME.ragged.0, NAME.ragged.1... back into one ragged output."""
    out, ragged = {}, {}
    for key, arr in flat.items():
        name, sep, index = key.rpartition(RAGGED)
        if sep and index.isdigit():
            ragged.setdefault(name, {})[int(index)] = arr
        else:
            out[key] = arr
    for name, rows in ragged.items():
        out[name] = stack_or_ragged([rows[i] for i in sorted(rows)])
    return out


def compare(got, ref):
    """Per-output agreement between two (samples, ...) arrays."""
    if got.dtype == object or ref.dtype == object:
        return _compare_ragged(got, ref)
    a = got.reshape(got.shape[0], -1).astype(np.float64)
    b = ref.reshape(ref.shape[0], -1).astype(np.float64)
    # the same non-finite value on both sides (a log-mel's -inf of silence) agrees; a NaN or
    # infinity the reference lacks leaves the cosine NaN, which callers count as a miss
    agree = ~np.isfinite(b) & ((a == b) | (np.isnan(a) & np.isnan(b)))
    if agree.any():
        a, b = np.where(agree, 0.0, a), np.where(agree, 0.0, b)
    s = np.where(np.isfinite(b), np.abs(b), 0.0).max(axis=1, initial=0.0)[:, None]
    s = np.where(s > 0, s, 1.0)   # each sample scaled: squares near 1e154 overflow float64
    with np.errstate(invalid="ignore", over="ignore"):   # inf / inf: NaN, a miss for callers
        an, bn = a / s, b / s
        ref_norm = np.linalg.norm(bn, axis=1) * s[:, 0]
        norms = np.linalg.norm(an, axis=1) * np.linalg.norm(bn, axis=1)
        err = np.abs(a - b).max(axis=1) if a.size else np.zeros(len(a))
        cos = np.where(norms > 0, (an * bn).sum(axis=1) / np.maximum(norms, 1e-300),
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


def _compare_ragged(got, ref):
    """compare() of outputs whose length varies by sample: each pair flattened and zero-padded
    to the longer, so that a length that differs costs cosine as values missing would; with
    how many samples differ in length."""
    a = [np.asarray(x, dtype=np.float64).ravel() for x in got]
    b = [np.asarray(x, dtype=np.float64).ravel() for x in ref]
    width = max([1] + [max(len(x), len(y)) for x, y in zip(a, b)])
    result = compare(*[np.stack([np.pad(r, (0, width - len(r))) for r in rows])
                       for rows in (a, b)])
    result["length_mismatch"] = sum(len(x) != len(y) for x, y in zip(a, b))
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
    """Milliseconds of *runs* calls after *warmup*, each loop bounded in seconds (WARMUP_S,
    TIMED_S after MIN_RUNS): 100 runs of Kokoro-82M's 1.5 s calls took minutes."""
    start = time.perf_counter()
    for _ in range(warmup):
        call()
        if time.perf_counter() - start > WARMUP_S:
            break
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000.0)
        if len(times) >= MIN_RUNS and sum(times) > TIMED_S * 1000.0:
            break
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
