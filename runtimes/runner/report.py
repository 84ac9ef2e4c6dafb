"""The human-readable report of check, bench and infer, and the JSON text of every report and
answer the runner writes (--json, serve)."""

import json
import math

from .contents import optional_module
from .sessions import describe_session

NON_FINITE_SHOWN = 20   # paths named in a report's "non_finite" field


def finite(obj, path, found):
    """*obj* with each NaN or infinity replaced by None, its JSON Pointer appended to *found*."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        found.append(path)
        return None
    if isinstance(obj, dict):
        return dict((key, finite(value, "%s/%s" % (
            path, str(key).replace("~", "~0").replace("/", "~1")), found))
            for key, value in obj.items())
    if isinstance(obj, (list, tuple)):
        return [finite(value, "%s/%d" % (path, i), found) for i, value in enumerate(obj)]
    return obj


def to_json(obj, **options):
    """*obj* as JSON that every parser reads (JavaScript's JSON.parse too): Python's json
    writes NaN and Infinity, which JSON does not have. Each one becomes null, and a dict says
    so in its "non_finite" field (how many, and where as JSON Pointers). The one serialiser of
    what the runner prints or answers; *options* go to json.dumps."""
    try:
        return json.dumps(obj, allow_nan=False, **options)
    except ValueError:   # a NaN or an infinity somewhere: the walk below is the slow path
        pass
    found = []
    obj = finite(obj, "", found)
    if isinstance(obj, dict):
        obj["non_finite"] = {
            "count": len(found), "paths": found[:NON_FINITE_SHOWN],
            "note": "%d number(s) were NaN or infinite, which JSON cannot hold: written as null"
                    % len(found)}
    return json.dumps(obj, allow_nan=False, **options)


def figure(stats, floor, label="", why=""):
    """'cosine 0.99812 >= 0.9950, max abs 0.01: ok', or '... < ... (why), ...: FAILED'."""
    ok = stats["cosine_min"] >= floor
    text = "cosine %.5f %s %s%.4f%s, max abs %.4g" % (
        stats["cosine_min"], ">=" if ok else "<", label, floor, "" if ok else why, stats["max_abs"])
    if "top1_agreement" in stats:
        text += ", top-1 agreement %.1f%%" % (100 * stats["top1_agreement"])
    return text + (": ok" if ok else ": FAILED")


def reproduce_line(entry, rep):
    if not rep["checked"]:
        return "reproduction not checked: " + rep["reason"]
    precision = (entry.get("precision") or "").upper()
    kind = precision + " " if precision in ("INT8", "FP16", "FP32") else ""
    return "reproduces the host's %soutputs: %s" % (kind, figure(
        rep, rep["min_cosine"], why=" (a kernel computes differently on this device)"))


def load_line(entry, report):
    """How the figure was taken and how busy the machine was, and 'noisy' when it was."""
    load = entry.get("load") or {}
    share = load.get("other_share")
    text = "%d runs after %d untimed, %s threads; %s" % (
        report["runs"], report["warmup"], report["session"]["intra_op_threads"] or "auto",
        "other processes used %.0f%% of the %d cores" % (100 * share, load["cores"])
        if share is not None else "machine load unknown")
    if entry.get("noisy"):
        text += "; NOISY (%s): run it again on a quiet machine" % entry["noisy"]
    return text


def print_human(command, report):
    """The report of `run.py check`, `bench` or `infer` (infer.py's) as lines a person reads."""
    if command == "infer":
        return optional_module("infer").print_infer(report)
    {"check": _print_check, "bench": _print_bench}[command](report)


def _print_check(report):
    for line in report.get("integrity", []):
        print("integrity: " + line)
    for part, entry in report.get("parts", {}).items():
        for name, s in entry["outputs"].items():
            print("%s/%s: %s" % (part, name, reproduce_line(entry, s["reproduce"])))
            if entry["reference"] == "fp32":
                print("%s/%s: vs FP32 reference: %s" % (
                    part, name, figure(s, s["min_cosine"], "floor ")))
            small = s.get("small_output")
            if small:
                print("%s/%s: a few values a sample: max abs %.4g <= %.4g (the host's "
                      "%.4g + 1%% of its largest value): %s" % (
                          part, name, small["max_abs"], small["allowed"],
                          small["host_max_abs"], "ok" if small["passed"] else "FAILED"))
            elif not s["reproduce"]["checked"]:  # the host's outputs, with a looser floor
                print("%s/%s: vs the host's outputs (no FP32 reference): %s" % (
                    part, name, figure(s, s["min_cosine"])))
        task = entry.get("task")
        if task:
            print("%s: %s vs the %s: %s%s" % (
                part, task["kind"], "FP32 reference" if entry["reference"] == "fp32"
                else "host's outputs", task["text"],
                "" if not task["passed"] else ": ok" if task["shown"] else
                ": NOT PROVEN (too few golden samples to show it)"))
        if entry.get("evidence"):
            print("%s: the build's accuracy evidence: %s" % (part, entry["evidence"]))
    if report.get("pipeline"):
        print(optional_module("cascade_judge").pipeline_line(report["pipeline"]))
    note = report.get("target_note")
    print("check %s%s" % ("passed" if report["passed"] else "FAILED",
                          " (not on the target: %s)" % note if note else ""))


def _print_bench(report):
    tuning = report.get("tuning")
    if tuning:   # bench --tune: only a bundle that ships tuning.py
        optional_module("tuning").print_tuning(tuning)
    print("%s on %s (%s, %s cores), %d runs" % (
        report["bundle"], report["providers"][0], report["device"]["arch"],
        report["device"]["cores"], report["runs"]))
    print("session: %s (from %s)%s" % (
        describe_session(report["session"]), report["session_from"],
        "" if tuning or "tuned" in report["session_from"] else
        "; threads not tuned on this device: --tune times other thread counts and keeps "
        "the fastest"))
    for part, entry in report["parts"].items():
        lat = entry["latency_ms"]
        print("%s (%s, %s): p50 %.3f ms (p10-p90 %.3f-%.3f)  p99 %.3f  mean %.3f ms, "
              "%.1f/s" % (part, entry["graph"], entry["precision"], lat["p50"],
                          lat.get("p10", lat["min"]), lat["p90"], lat["p99"], lat["mean"],
                          entry["throughput_per_s"]))
        print("%s: %s" % (part, load_line(entry, report)))
        print("%s: session load %.1f ms%s" % (
            part, entry["session_load_ms"], " (%s, optimised offline)" % entry["loaded"]
            if entry.get("loaded", entry["graph"]) != entry["graph"] else ""))
        if entry.get("achieved_gops"):
            share = entry.get("roofline_share")
            print("%s: %.3g GOP per call, %.1f GOP/s%s" % (
                part, entry["operations_per_call"] / 1e9, entry["achieved_gops"],
                " (%.0f%% of this device's best %s rate)" % (
                    100 * share, (report["roofline"]["int8_kind"] if entry["precision"] ==
                                  "int8" else "FP32")) if share is not None else ""))
        bound = entry.get("io_binding")
        if bound:
            lat = bound["latency_ms"]
            print("%s with I/O binding on %s: p50 %.3f  p90 %.3f  p99 %.3f ms, %.1f/s" % (
                part, bound["device"], lat["p50"], lat["p90"], lat["p99"],
                bound["throughput_per_s"]))
        if entry.get("profile"):   # bench --profile: only a bundle that ships profile.py
            optional_module("profile").print_profile(part, entry["profile"])
        if entry.get("stages"):
            print(optional_module("stages").stages_line(part, entry["stages"]))
        if entry.get("gpu_memory_mb") is not None:
            print("%s: GPU memory %.0f MB" % (part, entry["gpu_memory_mb"]))
    if report.get("speech"):   # bench FILE... on a tts pipeline: whole sentences
        optional_module("cascade").print_speech_bench(report["speech"])
    if report.get("roofline"):   # bench --roofline: only a bundle that ships roofline.py
        optional_module("roofline").print_ceiling(report["roofline"])
    gpu = report.get("gpu")
    if gpu:
        print("GPU %s (compute %s), driver %s, CUDA %s runtime / %s driver, cuDNN %s, "
              "TensorRT %s" % tuple(gpu.get(k) or "?" for k in (
                  "name", "compute_capability", "driver", "cuda_runtime", "cuda_driver",
                  "cudnn", "tensorrt")))
    rss = report["peak_rss_mb"]
    print("peak RSS %s MB" % ("%.1f" % rss if rss is not None else "n/a"))
