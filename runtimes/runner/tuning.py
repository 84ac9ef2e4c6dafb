"""`run.py bench --tune`: session options timed on this device, the fastest kept (when it is
clearly faster and still passes check) in session.tuned.json."""

import argparse
import json
import os
import sys
import time

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .check import cmd_check
from .errors import BundleError, one_line
from .facts import device_info
from .load import BUSY, load_facts, snapshot
from .manifest import load_golden, manifest_digest, select_parts
from .metrics import timed
from .sessions import TUNED, describe_session, full_session, open_session, session_settings
from .tuned import TUNE_MARGIN, session_problem

TUNE_LEVELS = ("basic", "extended", "all")
TUNE_ROUNDS = 3      # the winner and the current settings, timed alternately
MODES = ("sequential", "parallel")


def tune_threads(cores):
    counts, n = set([cores]), 1
    while n < cores:
        counts.add(n)
        n *= 2
    return sorted(counts)


class TuneProgress(object):
    """'tune: 3/9 ... about 0:12 left' in place on a terminal; nothing elsewhere."""

    def __init__(self, total):
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.live = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()

    def step(self, what):
        self.done += 1
        if not self.live:
            return
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * max(self.total - self.done, 0)
        sys.stderr.write("\r\x1b[Ktune: %d/%d %s · about %d:%02d left" % (
            self.done, self.total, what, left // 60, left % 60))
        sys.stderr.flush()

    def close(self):
        if self.live:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def tune(bundle, manifest, args):
    """tune_settings's table; its `chosen` is always a session that session_problem accepts
    on this device (`build --tune --time-on` writes it into a manifest)."""
    result = tune_settings(bundle, manifest, args)
    problem = session_problem(result["chosen"], result["cores"])
    if problem:   # tune_settings only ever picks bounded settings: this would be a bug
        raise AssertionError("bench --tune chose an invalid session: %s" % problem)
    return result


def within_cores(conf, cores):
    """*conf* with thread counts above *cores* lowered to it (a target's manifest may ask for
    more threads than this device has cores)."""
    return dict(conf, **dict((key, min(conf[key], cores))
                             for key in ("intra_op_threads", "inter_op_threads")))


def tune_settings(bundle, manifest, args):
    """Time the bundle under thread counts, then optimisation levels, then the parallel
    execution mode, each step keeping the fastest so far; re-time the winner against the
    current settings alternately; keep it only when it is TUNE_MARGIN faster and still passes
    check. Returns the table of what was tried and what was chosen."""
    parts = select_parts(manifest, args.part)
    feeds = []
    for part in parts:
        inputs, _ = load_golden(bundle, part)
        feeds.append((part, {k: np.asarray(v[0]) for k, v in inputs.items()}))
    cores = os.cpu_count() or 1
    current = within_cores(full_session(session_settings(manifest, args)), cores)
    threads = tune_threads(cores)
    progress = TuneProgress(len(threads) + len(TUNE_LEVELS) + (cores > 1) + 2 * TUNE_ROUNDS)

    def trial(conf):
        trial_args = argparse.Namespace(**vars(args))
        trial_args.tuned, trial_args.quiet_open = {"session": conf}, True
        total = 0.0
        for part, feed in feeds:
            session, _ = open_session(bundle, manifest, part, trial_args)
            names = [o.name for o in session.get_outputs()]
            total += float(np.percentile(timed(
                lambda s=session, n=names, f=feed: s.run(n, f), args.warmup, args.runs), 50))
        return total

    tried, seen = [], {}

    def consider(stage, conf):
        key = json.dumps(conf, sort_keys=True)
        if key in seen:
            return
        seen[key] = p50 = trial(conf)
        tried.append({"stage": stage, "session": conf, "p50_ms": p50})
        progress.step("%s: p50 %.3f ms" % (describe_session(conf), p50))

    def best():
        return min(tried, key=lambda t: t["p50_ms"])["session"]

    base = dict(current, inter_op_threads=0, execution_mode="sequential")
    before = snapshot()   # how busy the machine is while tuning: a busy one changes nothing
    try:
        for n in threads:
            consider("threads", dict(base, intra_op_threads=n))
        for level in TUNE_LEVELS:
            consider("optimisation level", dict(best(), graph_optimization_level=level))
        if cores > 1:
            consider("execution mode", dict(best(), execution_mode="parallel",
                                            inter_op_threads=2))
        winner, rounds = best(), {"current": [], "winner": []}
        if winner != current:
            for _ in range(TUNE_ROUNDS):
                for name, conf in (("current", current), ("winner", winner)):
                    rounds[name].append(trial(conf))
                    progress.step("re-timing %s settings" % name)
    finally:
        progress.close()
    result = {"runs": args.runs, "warmup": args.warmup, "cores": cores, "tried": tried,
              "current": current, "margin": TUNE_MARGIN,
              "load": load_facts(before)}
    return _verdict(bundle, manifest, args, result, rounds, winner,
                    seen.get(json.dumps(current, sort_keys=True)))


def _verdict(bundle, manifest, args, result, rounds, winner, current_p50):
    """*result* with the settings chosen and why: the winner only when, re-timed alternately
    with the current settings (*rounds*), it is TUNE_MARGIN faster and still passes check."""
    current = result["current"]
    share = result["load"].get("other_share")
    result["noisy"] = share is not None and share > BUSY
    if not rounds["winner"]:
        result.update(chosen=current, chosen_p50_ms=current_p50, speedup=1.0,
                      reason="the current settings are the fastest tried")
        return result
    now, new = float(np.median(rounds["current"])), float(np.median(rounds["winner"]))
    result.update(current_p50_ms=now, winner=winner, winner_p50_ms=new, speedup=now / new)
    if result["noisy"]:
        result.update(chosen=current, chosen_p50_ms=now,
                      reason="the machine was busy while tuning (other processes used %.0f%% "
                             "of the %d cores): the current settings are kept; tune again on a "
                             "quiet machine" % (100 * share, result["cores"]))
        return result
    if now < new * (1 + TUNE_MARGIN):
        result.update(chosen=current, chosen_p50_ms=now,
                      reason="the fastest tried (%s) is not %d%% faster than these when "
                             "re-timed (x%.3f)" % (describe_session(winner), 100 * TUNE_MARGIN,
                                                   now / new))
        return result
    check_args = argparse.Namespace(**vars(args))
    check_args.tuned, check_args.quiet_open = {"session": winner}, True
    checked = cmd_check(bundle, manifest, check_args)
    if not checked["passed"]:
        result.update(chosen=current, chosen_p50_ms=now,
                      reason="the fastest tried (%s) fails check: its outputs differ beyond "
                             "the bundle's floors" % describe_session(winner))
        return result
    result.update(chosen=winner, chosen_p50_ms=new,
                  reason="x%.2f faster than the current settings, check passed" % (now / new))
    return result


def save_tuned(bundle, manifest, tuning):
    """Write (or, when the manifest's own settings won, remove) session.tuned.json, atomically."""
    import onnxruntime as ort

    path = os.path.join(bundle, TUNED)
    if tuning["chosen"] == full_session(manifest.get("session", {})):
        if os.path.exists(path):
            os.remove(path)
        return None
    data = {"manifest": manifest_digest(bundle), "onnxruntime": ort.__version__,
            "cores": os.cpu_count(), "session": tuning["chosen"],
            "tuned": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": device_info(),
            "tried": tuning["tried"], "speedup": tuning.get("speedup", 1.0)}
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as exc:   # a full disk, a read-only bundle: nothing half-written stays
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise BundleError("%s: cannot write it (%s); free some space or make the bundle "
                          "writable, or pass --no-save" % (path, exc.strerror or one_line(exc))
                          ) from None
    return TUNED


def print_tuning(tuning):
    print("tuning: %d settings tried on %d cores, %d runs each (p50, summed over parts):" % (
        len(tuning["tried"]), tuning["cores"], tuning["runs"]))
    print("  %-7s %-8s %-10s %-8s %9s  %s" % ("threads", "inter-op", "mode", "opt", "p50 ms",
                                               "stage"))
    fastest = min(t["p50_ms"] for t in tuning["tried"])
    for t in tuning["tried"]:
        conf = t["session"]
        print("  %-7s %-8s %-10s %-8s %9.3f  %s%s" % (
            conf["intra_op_threads"] or "auto", conf["inter_op_threads"] or "auto",
            conf["execution_mode"], conf["graph_optimization_level"], t["p50_ms"], t["stage"],
            "  <- fastest" if t["p50_ms"] == fastest else ""))
    print("tuning %s %s: %s%s" % (
        "kept the current settings," if tuning["chosen"] == tuning["current"] else "chose",
        describe_session(tuning["chosen"]), tuning["reason"],
        "; saved in %s" % tuning["saved"] if tuning.get("saved") else
        "; nothing saved" if tuning.get("saved") is None else ""))
