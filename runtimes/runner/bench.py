"""`run.py bench`: latency, throughput, memory, and optionally the device's MatMul roofline."""

import os

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import BundleError, one_line
from .facts import device_info, gpu_facts, gpu_memory_mb, peak_rss_mb
from .manifest import load_golden, regular_file, require_intact, select_parts
from .metrics import io_binding_call, latency_stats, timed
from .sessions import CPU, full_session, open_session, session_origin, session_settings
from .tuning import save_tuned, tune


def bench_part(bundle, manifest, part, args):
    session, opened = open_session(bundle, manifest, part, args)
    inputs, _ = load_golden(bundle, part)
    feed = {k: np.asarray(v[0]) for k, v in inputs.items()}
    names = [o.name for o in session.get_outputs()]
    times = timed(lambda: session.run(names, feed), args.warmup, args.runs)
    batch = max(int(next(iter(feed.values())).shape[0]) if feed else 1, 1)
    result = {
        "precision": opened["precision"], "batch": batch,
        "latency_ms": latency_stats(times),
        "throughput_per_s": float(1000.0 * batch / np.mean(times)),
        "session_load_ms": opened["load_ms"], "graph": opened["graph"],
        "loaded": opened["loaded"],
        "not_running": opened["not_running"], "provider_options": opened["provider_options"],
        "providers": session.get_providers(),
    }
    if getattr(args, "io_binding", False):
        device = "cpu" if opened["provider"] == CPU else "cuda"
        bound = timed(io_binding_call(session, feed, names, device), args.warmup, args.runs)
        result["io_binding"] = {"device": device, "latency_ms": latency_stats(bound),
                                "throughput_per_s": float(1000.0 * batch / np.mean(bound))}
    if opened["provider"] != CPU:
        result["gpu_memory_mb"] = gpu_memory_mb()
    ops = (part.get("operations") or {}).get("per_call")
    if isinstance(ops, (int, float)) and ops > 0:
        result["operations_per_call"] = ops
        result["achieved_gops"] = ops / (result["latency_ms"]["p50"] * 1e6)
    return result


def roofline_feeds(spec):
    """{"fp32": ..., "int8": ...}: the inputs of the manifest's roofline graphs (*spec*)."""
    n = int(spec.get("size", 512))
    rng = np.random.RandomState(0)
    return {"fp32": {"a": rng.rand(n, n).astype(np.float32),
                     "b": rng.rand(n, n).astype(np.float32)},
            "int8": {"a": rng.randint(0, 127, (n, n)).astype(
                np.uint8 if spec.get("int8_kind") == "u8s8" else np.int8),
                "b": rng.randint(-64, 64, (n, n)).astype(np.int8)}}


def roofline(bundle, manifest, args, threads):
    """GOP/s of an FP32 MatMul and of the bundle's MatMulInteger kind on this device with the
    same threads: the ceiling the bundle's GOP/s is a share of."""
    import onnxruntime as ort

    spec = manifest.get("roofline") or {}
    if not spec.get("fp32") or not spec.get("int8"):
        raise BundleError("this bundle has no roofline graphs (built by an older edgepack); "
                          "rebuild it to use --roofline")
    n = int(spec.get("size", 512))
    feeds = roofline_feeds(spec)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    result = {"threads": threads, "size": n, "int8_kind": spec.get("int8_kind")}
    for kind in ("fp32", "int8"):
        # require_intact has checked both are regular files of the file table, hashes and all
        path = os.path.join(bundle, spec[kind])
        if spec[kind] not in (manifest.get("files") or {}) or not regular_file(path):
            raise BundleError("manifest: roofline.%s = %r is not a graph file of the bundle; "
                              "rebuild it" % (kind, spec[kind][:80]))
        try:
            session = ort.InferenceSession(path, sess_options=so, providers=[CPU])
        except Exception as exc:   # a file of the table that is no graph: a damaged build
            raise BundleError("%s: onnxruntime cannot load it (%s); rebuild the bundle"
                              % (spec[kind], one_line(exc))) from None
        times = timed(lambda s=session, f=feeds[kind]: s.run(None, f), 3, 10)
        result["%s_gops" % kind] = 2.0 * n ** 3 / (float(np.percentile(times, 50)) * 1e6)
    return result


def cmd_bench(bundle, manifest, args):
    require_intact(bundle, manifest)
    tuning = None
    if getattr(args, "tune", False):
        tuning = tune(bundle, manifest, args)
        tuning["saved"] = None if args.no_save else save_tuned(bundle, manifest, tuning)
        args.tuned = {"session": tuning["chosen"]}
    parts = {}
    for part in select_parts(manifest, args.part):
        parts[part["name"]] = bench_part(bundle, manifest, part, args)
    first = next(iter(parts.values()))
    ceiling = None
    if getattr(args, "roofline", False):
        threads = int(session_settings(manifest, args).get("intra_op_threads", 0)) or \
            (os.cpu_count() or 1)
        ceiling = roofline(bundle, manifest, args, threads)
        for entry in parts.values():
            if "achieved_gops" in entry:
                kind = "int8" if entry["precision"] == "int8" else "fp32"
                entry["roofline_share"] = entry["achieved_gops"] / ceiling[kind + "_gops"]
    return {
        "tuning": tuning,
        "session_from": session_origin(manifest, args),
        "roofline": ceiling,
        "bundle": manifest.get("name"),
        "target": manifest.get("target", {}).get("name"),
        "runs": args.runs, "warmup": args.warmup,
        "session": full_session(session_settings(manifest, args)),
        "parts": parts,
        "providers": first["providers"],
        "peak_rss_mb": peak_rss_mb(),
        "device": device_info(),
        "gpu": gpu_facts() if first["providers"][0] != CPU else None,
        "onnxruntime": __import__("onnxruntime").__version__,
    }
