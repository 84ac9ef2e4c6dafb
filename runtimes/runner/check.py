"""`run.py check`: integrity, the host's outputs reproduced, the accuracy floor kept, and a
pipeline bundle's cascade judged on its golden photos."""

import platform

from .contents import optional_module, task_kind
from .manifest import integrity_problems, load_golden, read_npz, select_parts
from .metrics import compare
from .sessions import full_session, open_session, run_samples, session_origin, session_settings


def cmd_check(bundle, manifest, args):
    """Integrity, then per output two promises: the device reproduces the host's outputs of the
    shipped model (a kernel that computes differently here fails it), and it keeps the accuracy
    floor against the reference (the FP32 model's outputs, or the host's when there is none)."""
    report = {"bundle": manifest.get("name"), "integrity": integrity_problems(bundle, manifest),
              "parts": {}, "device": {"arch": platform.machine()}}
    if report["integrity"]:
        report["passed"] = False
        return report
    passed = True
    sessions = {}
    for part in select_parts(manifest, args.part):
        session, opened = open_session(bundle, manifest, part, args)
        sessions[part["name"]] = session
        report.setdefault("providers", session.get_providers())
        inputs, reference = load_golden(bundle, part)
        golden = part["golden"]
        got = run_samples(session, inputs)
        own = opened["graph"] != part["model"]["file"]   # this provider's own graph
        min_cosine = opened["entry"]["min_cosine"] if own else golden.get("min_cosine", 0.99)
        host = golden.get("shipped_provider", "CPUExecutionProvider")
        running = opened["provider"]
        if not golden.get("shipped"):
            skipped = "the bundle has no host outputs of its model (built by an older edgepack)"
        elif running != host:
            skipped = "the host ran %s, this device runs %s, whose kernels differ by design" % (
                host, running)
        elif own:
            skipped = "the host's outputs are of %s; %s runs %s" % (
                part["model"]["file"], running, opened["graph"])
        else:
            skipped, shipped = None, read_npz(bundle, golden["shipped"])
        entry = {"outputs": {}, "min_cosine": min_cosine,
                 "reference": golden.get("reference", "fp32"),
                 "precision": opened["precision"], "graph": opened["graph"],
                 "loaded": opened["loaded"],
                 "not_running": opened["not_running"],
                 "samples": len(next(iter(inputs.values()))), "providers": session.get_providers()}
        for name, ref in reference.items():
            stats = compare(got[name], ref)
            stats["min_cosine"] = min_cosine
            stats["passed"] = stats["cosine_min"] >= min_cosine
            if skipped:
                stats["reproduce"] = {"checked": False, "reason": skipped}
            else:
                same = compare(got[name], shipped[name])
                same.update(checked=True, min_cosine=golden["reproduce_min_cosine"])
                same["passed"] = same["cosine_min"] >= same["min_cosine"]
                stats["reproduce"] = same
                stats["passed"] = stats["passed"] and same["passed"]
            drift = small_drift(name, ref, stats, golden)
            if drift:
                stats["small_output"] = drift
                stats["passed"] = stats["passed"] and drift["passed"]
            passed = passed and stats["passed"]
            entry["outputs"][name] = stats
        if task_kind(part.get("task")) != "raw":
            entry["task"] = task_verdict(part["task"], reference, got, inputs)
            passed = passed and entry["task"]["passed"]
        entry["passed"] = all(o["passed"] for o in entry["outputs"].values()) and \
            entry.get("task", {}).get("passed", True)
        entry["evidence"] = evidence_of(part)
        report["parts"][part["name"]] = entry
    if manifest.get("pipeline") and args.part is None:
        cascade = optional_module("cascade")   # shipped only in a pipeline bundle
        report["pipeline"] = optional_module("cascade_judge").pipeline_verdict(
            bundle, manifest, cascade.session_runner(sessions))
        passed = passed and report["pipeline"]["passed"]
    report["passed"] = passed
    report["target_note"] = target_note(manifest, report.get("providers", [""])[0])
    report["session"] = full_session(session_settings(manifest, args))
    report["session_from"] = session_origin(manifest, args)
    return report


def evidence_of(part):
    """The build's word on its accuracy evidence ('shown', 'not proven: 19 samples judged...')."""
    found = part.get("precision")
    for key in ("decision", "evidence", "verdict"):
        found = found.get(key) if isinstance(found, dict) else None
    return found if isinstance(found, str) else ""


SMALL_OUTPUT = 8          # values a sample: a score, a quality model's few numbers
SMALL_OUTPUT_MARGIN = 0.01   # of the reference's largest magnitude, over what the host moved


def small_drift(name, ref, stats, golden):
    """An output of a few values a sample (a [1, 1] score, three MOS numbers), which a cosine
    cannot judge: its max abs error here may exceed the host's own (golden.host) by 1 % of the
    reference's largest magnitude, no more (the build holds such outputs to 1 % too). None for
    larger outputs or a bundle without the host's figures."""
    hosts = golden.get("host")
    host = hosts.get(name) if isinstance(hosts, dict) else None
    if ref.dtype.kind != "f" or not ref.size or ref[0].size > SMALL_OUTPUT or \
            not isinstance(host, dict) or not isinstance(host.get("max_abs"), (int, float)) \
            or isinstance(host.get("max_abs"), bool) or not host["max_abs"] >= 0:
        return None
    scale = float(abs(ref).max())
    allowed = float(host["max_abs"]) + max(SMALL_OUTPUT_MARGIN * scale, 1e-6)
    return {"max_abs": stats["max_abs"], "allowed": allowed, "host_max_abs": host["max_abs"],
            "passed": stats["max_abs"] <= allowed}


def task_verdict(task, reference, got, inputs):
    """The part's task figures on the golden samples, this device's outputs against the
    reference's, judged by what the task keeps (the manifest records it, as the host held it):
    a disagreement fails; a set of golden samples too small to show the figure is said."""
    names = list(reference)
    tf = optional_module("task_figures")   # shipped with a part that has a task
    found = tf.figures(task, tf.split_samples(reference, names), tf.split_samples(got, names),
                       feeds=tf.split_samples(inputs))
    return dict(tf.judge(task, found), kind=task_kind(task))


def target_note(manifest, running, arch=None):
    """'' on the target's arch and first provider, else what differs: a pass elsewhere says
    nothing of the target's kernels. *arch*: the machine's (default: this one's; '' unknown)."""
    target = manifest.get("target", {})
    # a provider the build listed only because it measured faster (OpenVINO) is optional: the
    # next one is the target's own
    listed = manifest.get("providers", [])
    optional = [p["name"] for p in listed if p.get("when") == "faster"]
    wanted = [p["name"] for p in listed if p.get("when") != "faster"] if running not in optional \
        else [p["name"] for p in listed]
    arch = platform.machine() if arch is None else arch
    differs = []
    if target.get("arch") and arch and arch != target["arch"]:
        differs.append("this machine is %s, %s is %s" % (arch, target.get("name"),
                                                         target["arch"]))
    if wanted and running and running != wanted[0]:
        differs.append("%s ran, %s runs %s first" % (running, target.get("name"), wanted[0]))
    return "; ".join(differs)
