"""`run.py bench`: latency, throughput, memory; with the extras, the device's ceiling
(roofline.py), photo to answer by stage (stages.py) and settings tried (tuning.py)."""

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .contents import extra_module, optional_module
from .errors import BundleError
from .facts import device_info, peak_rss_mb
from .load import load_facts, noise, snapshot
from .manifest import load_golden, require_intact, select_parts
from .metrics import io_binding_call, latency_stats, timed
from .sessions import (
    CPU,
    GPU_PROVIDERS,
    full_session,
    open_session,
    session_origin,
    session_settings,
)


def bench_part(bundle, manifest, part, args):
    session, opened = open_session(bundle, manifest, part, args)
    inputs, _ = load_golden(bundle, part)
    feed = {k: np.asarray(v[0]) for k, v in inputs.items()}
    names = [o.name for o in session.get_outputs()]
    before = snapshot()
    times = timed(lambda: session.run(names, feed), args.warmup, args.runs)
    load = load_facts(before)
    batch = max(int(next(iter(feed.values())).shape[0]) if feed else 1, 1)
    latency = latency_stats(times)
    result = {
        "precision": opened["precision"], "batch": batch, "runs": len(times),
        "latency_ms": latency, "load": load, "noisy": noise(load, latency),
        "throughput_per_s": float(1000.0 * batch / np.mean(times)),
        "session_load_ms": opened["load_ms"], "graph": opened["graph"],
        "loaded": opened["loaded"],
        "not_running": opened["not_running"], "provider_options": opened["provider_options"],
        "providers": session.get_providers(),
    }
    if (part.get("task") or {}).get("kind") == "tts":   # its real-time factor (task_tts.py)
        result.update(optional_module("task_tts").real_time(session, part, feed, latency))
    if getattr(args, "files", None):   # photo to answer by stage, in the same session
        result["stages"] = extra_module("stages", manifest).stage_times(
            session, part, args.files, args)
    if getattr(args, "io_binding", False):
        device = "cpu" if opened["provider"] == CPU else "cuda"
        bound = timed(io_binding_call(session, feed, names, device), args.warmup, args.runs)
        result["io_binding"] = {"device": device, "latency_ms": latency_stats(bound),
                                "throughput_per_s": float(1000.0 * batch / np.mean(bound))}
    if opened["provider"] in GPU_PROVIDERS:   # (gpu_facts.py: shipped with a GPU provider)
        result["gpu_memory_mb"] = optional_module("gpu_facts").gpu_memory_mb()
    counted = part.get("operations")
    ops = counted.get("per_call") if isinstance(counted, dict) else None
    if isinstance(ops, (int, float)) and ops > 0:
        result["operations_per_call"] = ops
        result["achieved_gops"] = ops / (result["latency_ms"]["p50"] * 1e6)
    return result


def cmd_bench(bundle, manifest, args):
    require_intact(bundle, manifest)
    tuning = None
    if getattr(args, "tune", False):
        tuner = extra_module("tuning", manifest)
        tuning = tuner.tune(bundle, manifest, args)
        tuning["saved"] = None if args.no_save else tuner.save_tuned(bundle, manifest, tuning)
        args.tuned = {"session": tuning["chosen"]}
    parts, sentences = {}, None
    chosen = select_parts(manifest, args.part)
    if not args.part and (manifest.get("pipeline") or {}).get("kind") == "tts":
        # whole sentences: the files, else the golden ones (cascade.py)
        sentences = optional_module("cascade").bench_speech(bundle, manifest, args)
        args.files = None
    if getattr(args, "files", None) and len(chosen) > 1:
        raise BundleError("bench FILE...: this bundle has %d parts; name the one the files feed "
                          "with --part" % len(chosen))
    for part in chosen:
        parts[part["name"]] = bench_part(bundle, manifest, part, args)
    first = next(iter(parts.values()))
    ceiling = extra_module("roofline", manifest).bench_ceiling(bundle, manifest, args, parts) \
        if getattr(args, "roofline", False) else None
    return {
        "tuning": tuning,
        "session_from": session_origin(manifest, args),
        "roofline": ceiling,
        "bundle": manifest.get("name"),
        "target": manifest.get("target", {}).get("name"),
        "runs": min(p["runs"] for p in parts.values()), "warmup": args.warmup,
        "session": full_session(session_settings(manifest, args)),
        "parts": parts, "speech": sentences,
        "providers": first["providers"],
        "peak_rss_mb": peak_rss_mb(),
        "device": device_info(),
        "gpu": optional_module("gpu_facts").gpu_facts()
        if first["providers"][0] in GPU_PROVIDERS else None,
        "onnxruntime": __import__("onnxruntime").__version__,
    }
