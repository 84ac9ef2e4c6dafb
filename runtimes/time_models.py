"""Time candidate models on a device for `edgepack build --precision auto --time-on HOST`.

    python3 time_models.py FEED.npz THREADS ROUNDS BLOCK [--all-rounds] [--providers P.json] \
        model1.onnx ...
    python3 time_models.py FEED.npz THREADS ROUNDS BLOCK [--all-rounds] --plan PLAN.json
    python3 time_models.py --outputs SAMPLES.npz OUT.npz THREADS --plan PLAN.json

Runs the models interleaved in blocks (untimed calls after every switch), up to ROUNDS rounds
(fewer once the order is clear, see `enough_rounds`, unless --all-rounds), prints one JSON
object with p50/p90 per model, the provider each ran on, and the device. P.json lists the
target's providers ([[name, options], ...], in order); each model runs on the first that starts, as the
bundle's runner would (default: the CPU). PLAN.json lists [key, model path, providers] rows
instead: one model may be timed under several providers in the same blocks (edgepack times a
graph under onnxruntime's CPU and OpenVINO providers side by side this way), and the JSON is
keyed by *key*. --outputs runs each plan row on every sample of SAMPLES.npz (arrays "i/input",
sample i), or on the sample numbers a row lists fourth ([key, model, providers, [i, ...]]: a
model calibrated without those samples judged on them), and saves its outputs as OUT.npz
("key/i/output") instead of timing; one model is open at a time. Python 3.8+,
stdlib + numpy + onnxruntime; installs nothing.
"""

import json
import os
import platform
import sys
import time

import numpy as np

SETTLE = 0.03    # rounds stop early once the fastest is apart from or tied this close (3%) to each
MIN_ROUNDS = 3   # fewer rounds than this never settle a tie: one slow round must be outvoted
CLEAR = 1.25     # ... but two rounds do when the fastest is this far (1.25x) from every other
SLOW = 2.0       # a model this much slower than the fastest in warm-up gets a shorter block
# no round starts after this many seconds (one round at least), and warm-ups stop after
# WARMUP_SECONDS (one call at least): a model that takes a second a call (Kokoro-82M, 1.4 s)
# is timed in well under a minute, on a loaded machine too
TIMING_SECONDS = 30.0
WARMUP_SECONDS = 1.0


def warm_up(call, count):
    """*call* up to *count* times, stopping after WARMUP_SECONDS (one call at least): the
    calls made and their mean seconds (the host's timing and profile warm up the same way)."""
    start, made = time.perf_counter(), 0
    while made < count and (made == 0 or time.perf_counter() - start < WARMUP_SECONDS):
        call()
        made += 1
    return made, (time.perf_counter() - start) / made


def blocks(costs, block):
    """Timed calls per block for each model, from its warm-up seconds per call (*costs*): *block*
    for every model within SLOW of the fastest; a slower one gets fewer (3 at least), so that its
    block lasts about as long as SLOW times the fastest's. A dynamic INT8 graph at 5x FP32's time
    would otherwise take most of a build's timing stage to confirm that it loses."""
    fastest = max(min(costs.values()), 1e-9)
    return dict((name, block if cost <= SLOW * fastest else
                 max(3, min(block, int(block * SLOW * fastest / cost))))
                for name, cost in costs.items())


def settled(rounds, tolerance):
    """Whether more rounds would not change which model is fastest: it either has round
    medians that do not overlap another's, or both lie within *tolerance* of each other (a tie
    that more rounds cannot break either). The order among the slower ones decides nothing."""
    spans = dict((name, (min(r), max(r))) for name, r in rounds.items() if r)
    if len(spans) < 2:
        return True
    first = min(spans, key=lambda name: float(np.median(rounds[name])))
    lo_a, hi_a = spans[first]
    for name, (lo_b, hi_b) in spans.items():
        if name == first or hi_a < lo_b or hi_b < lo_a:
            continue
        if max(hi_a, hi_b) > min(lo_a, lo_b) * (1 + tolerance):
            return False
    return True


def apart(rounds, factor=CLEAR):
    """Whether the fastest model is *factor* apart from every other in every round so far (its
    slowest round median times *factor* below their fastest): the winner is known, whatever the
    order of the rest."""
    spans = sorted((min(r), max(r)) for r in rounds.values() if r)
    return len(spans) < 2 or all(spans[0][1] * factor <= lo for lo, _ in spans[1:])


def hopeless(costs, rounds):
    """Models SLOW times slower than the fastest both in warm-up (*costs*) and in the last round
    (*rounds*: per-model round medians): their figures so far stand, and more rounds would only
    confirm that they lose."""
    last = dict((name, r[-1]) for name, r in rounds.items() if r)
    if len(last) < 2:
        return set()
    best, fastest = min(last.values()), min(costs.values())
    return set(name for name, value in last.items()
               if value > SLOW * best and costs[name] > SLOW * fastest)


def enough_rounds(rounds, done, tolerance=SETTLE):
    """Whether *done* rounds (per-model lists of round medians) already give the order."""
    return (done >= MIN_ROUNDS and settled(rounds, tolerance)) or (done >= 2 and apart(rounds))


def open_first(ort, path, so, providers):
    """A session on the first of *providers* that really starts, with its own options."""
    for name, options in providers:
        if name not in ort.get_available_providers():
            continue
        options = dict((k, os.path.abspath("cache") if v == "{cache}" else v)
                       for k, v in options.items())
        if any(v == os.path.abspath("cache") for v in options.values()):
            if not os.path.isdir("cache"):
                os.makedirs("cache")
        chain = [name] if name == "CPUExecutionProvider" else [name, "CPUExecutionProvider"]
        try:
            session = ort.InferenceSession(
                path, so, providers=chain,
                provider_options=[options] if len(chain) == 1 else [options, {}],
                enable_fallback=0)
        except Exception:
            continue
        if session.get_providers()[0] == name:
            return session
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def own_inputs(session, feed):
    names = set(i.name for i in session.get_inputs())
    return dict((k, v) for k, v in feed.items() if k in names)


def read_plan(path):
    """[(key, model path, [(provider, options), ...]), ...] from a PLAN.json (a row's fourth
    item, the samples it runs on, is read by save_outputs)."""
    with open(path) as f:
        return read_plan_rows(json.load(f))


def read_plan_rows(rows):
    return [(row[0], row[1], [(name, options) for name, options in row[2]]) for row in rows]


def open_plan(ort, plan, threads):
    sessions = {}
    for key, path, providers in plan:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[key] = open_first(ort, path, so, providers)
    return sessions


def save_outputs(argv):
    """--outputs SAMPLES.npz OUT.npz THREADS --plan PLAN.json: every row's outputs per sample."""
    import onnxruntime as ort

    samples_path, out_path, threads = argv[0], argv[1], int(argv[2])
    with open(argv[4]) as f:
        rows = json.load(f)
    with np.load(samples_path) as f:
        arrays = {k: f[k] for k in f.files}
    count = len(set(k.split("/", 1)[0] for k in arrays))
    saved, providers = {}, {}
    for row in rows:   # one session at a time: a plan may list many graphs
        key = row[0]
        session = open_plan(ort, read_plan_rows([row]), threads)[key]
        providers[key] = session.get_providers()[0]
        asked = row[2][0][0] if row[2] else providers[key]
        if providers[key] != asked:   # it did not start there: its outputs judge nothing
            del session               # (Kokoro-82M: 8 sentences run for nothing, 60 s)
            continue
        names = [o.name for o in session.get_outputs()]
        for i in (row[3] if len(row) > 3 else range(count)):
            feed = dict((k.split("/", 1)[1], v) for k, v in arrays.items()
                        if k.split("/", 1)[0] == str(i))
            for name, value in zip(names, session.run(names, own_inputs(session, feed))):
                saved["%s/%d/%s" % (key, i, name)] = value
        del session
    np.savez(out_path, **saved)
    print(json.dumps({"providers": providers}))


def main(argv):
    import onnxruntime as ort

    if argv[:1] == ["--outputs"]:
        return save_outputs(argv[1:])
    feed_path, threads, rounds, block = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    models = argv[4:]
    every = models[:1] == ["--all-rounds"]
    models = models[1:] if every else models
    providers = [("CPUExecutionProvider", {})]
    if models[:1] == ["--providers"]:
        with open(models[1]) as f:
            providers = [(name, options) for name, options in json.load(f)]
        models = models[2:]
    with np.load(feed_path) as f:
        feed = {k: f[k] for k in f.files}
    if models[:1] == ["--plan"]:
        sessions = open_plan(ort, read_plan(models[1]), threads)
    else:
        sessions = open_plan(ort, [(path, path, providers) for path in models], threads)
    times = dict((path, []) for path in sessions)
    # each model gets the inputs it has (a model with a constant folded in has fewer)
    feeds = dict((path, own_inputs(s, feed)) for path, s in sessions.items())
    costs = {}
    began = time.perf_counter()
    for path, session in sessions.items():
        costs[path] = warm_up(lambda s=session, f=feeds[path]: s.run(None, f), 5)[1]
    calls = blocks(costs, block)
    medians = dict((path, []) for path in sessions)
    racing = dict(sessions)   # a model that is hopeless after a round is timed no further
    done = 0
    while done < rounds:
        for path, session in racing.items():
            for _ in range(3 if costs[path] * 3 < WARMUP_SECONDS else 1):
                session.run(None, feeds[path])
            for _ in range(calls[path]):
                start = time.perf_counter()
                session.run(None, feeds[path])
                times[path].append((time.perf_counter() - start) * 1000.0)
            medians[path].append(float(np.median(times[path][-calls[path]:])))
        done += 1
        if time.perf_counter() - began > TIMING_SECONDS:
            break
        if not every:
            for path in hopeless(dict((p, costs[p]) for p in racing),
                                 dict((p, medians[p]) for p in racing)):
                del racing[path]
            if len(racing) < 2 or enough_rounds(medians, done):
                break
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("model name", "Model"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    print(json.dumps({
        "device": {"arch": platform.machine(), "python": platform.python_version(),
                   "onnxruntime": ort.__version__, "cpu": cpu},
        "timings": dict((p, {"p10": float(np.percentile(t, 10)),
                             "p50": float(np.percentile(t, 50)),
                             "p90": float(np.percentile(t, 90)), "rounds": len(medians[p])})
                        for p, t in times.items()),
        "providers": dict((p, s.get_providers()[0]) for p, s in sessions.items()),
    }))


if __name__ == "__main__":
    main(sys.argv[1:])
