"""`run.py bench --profile`: onnxruntime's per-op kernel time of each part on this device."""

import json
import os
import shutil
import tempfile

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import BundleError, one_line
from .manifest import load_golden, select_parts
from .sessions import CPU, session_options, session_settings

PROFILE_RUNS = 20   # profiled calls per part, after 3 unprofiled-looking warm-up calls


def kernel_times(events, calls):
    """({op type: ms per call}, {op type: nodes}) from onnxruntime's profile *events*."""
    by_op, nodes = {}, {}
    for ev in events:
        if ev.get("cat") != "Node" or not str(ev.get("name", "")).endswith("_kernel_time"):
            continue
        op = (ev.get("args") or {}).get("op_name", "?")
        by_op[op] = by_op.get(op, 0.0) + float(ev.get("dur", 0)) / 1e3 / calls
        nodes.setdefault(op, set()).add(ev["name"])
    return by_op, dict((op, len(names)) for op, names in nodes.items())


def profile_part(bundle, manifest, part, args, graph, runs=PROFILE_RUNS):
    """Per-op-type kernel time of *graph* (the file bench ran) under the CPU provider."""
    import onnxruntime as ort

    inputs, _ = load_golden(bundle, part)
    feed = dict((k, np.asarray(v[0])) for k, v in inputs.items())
    so = session_options(ort, session_settings(manifest, args))
    so.enable_profiling = True
    folder = tempfile.mkdtemp(prefix="edgepack-profile-")
    try:
        so.profile_file_prefix = os.path.join(folder, "profile")
        try:
            session = ort.InferenceSession(os.path.join(bundle, graph), sess_options=so,
                                           providers=[CPU])
        except Exception as exc:
            raise BundleError("%s: onnxruntime cannot profile it (%s)" % (graph, one_line(exc))) from None
        warmup = 3
        for _ in range(warmup + runs):
            session.run(None, feed)
        with open(session.end_profiling()) as handle:
            events = json.load(handle)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    by_op, counts = kernel_times(events, warmup + runs)
    total = sum(by_op.values())
    rows = [{"op": op, "ms": ms, "share": ms / total if total else 0.0,
             "nodes": counts.get(op, 0)}
            for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])]
    qdq = sum(r["ms"] for r in rows if r["op"] in ("QuantizeLinear", "DequantizeLinear",
                                                    "DynamicQuantizeLinear"))
    return {"graph": graph, "provider": CPU, "runs": runs, "kernel_ms": total,
            "qdq_ms": qdq, "ops": rows}


def cmd_profile(bundle, manifest, args, report):
    """Add a per-op profile to each part of *report* (bench's)."""
    for part in select_parts(manifest, args.part):
        entry = report["parts"].get(part["name"])
        if entry is not None:
            entry["profile"] = profile_part(bundle, manifest, part, args, entry["graph"])
    return report


def print_profile(part, prof, top=12):
    """Per-op-type kernel time (onnxruntime's profiler), the costliest first."""
    print("%s: per-op profile of %s under %s, %d runs: %.3f ms in kernels per call%s" % (
        part, prof["graph"], prof["provider"], prof["runs"], prof["kernel_ms"],
        ", Q/DQ %.3f ms" % prof["qdq_ms"] if prof["qdq_ms"] else ""))
    for row in prof["ops"][:top]:
        print("  %-28s %8.3f ms  %5.1f%%  x%d" % (row["op"], row["ms"], 100 * row["share"],
                                                 row["nodes"]))
    if len(prof["ops"]) > top:
        rest = sum(r["ms"] for r in prof["ops"][top:])
        print("  %-28s %8.3f ms" % ("(%d more op types)" % (len(prof["ops"]) - top), rest))
