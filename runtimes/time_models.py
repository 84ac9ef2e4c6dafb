"""Time candidate models on a device for `edgepack build --precision auto --time-on HOST`.

    python3 time_models.py FEED.npz THREADS ROUNDS BLOCK [--providers P.json] model1.onnx ...

Runs the models interleaved in blocks (untimed calls after every switch), prints one JSON object
with p50/p90 per model, the provider each ran on, and the device. P.json lists the target's
providers ([[name, options], ...], in order); each model runs on the first that starts, as the
bundle's runner would (default: the CPU). Python 3.8+, stdlib + numpy + onnxruntime; installs
nothing.
"""

import json
import os
import platform
import sys
import time

import numpy as np


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


def main(argv):
    import onnxruntime as ort

    feed_path, threads, rounds, block = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    models = argv[4:]
    providers = [("CPUExecutionProvider", {})]
    if models[:1] == ["--providers"]:
        with open(models[1]) as f:
            providers = [(name, options) for name, options in json.load(f)]
        models = models[2:]
    with np.load(feed_path) as f:
        feed = {k: f[k] for k in f.files}
    sessions = {}
    for path in models:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[path] = open_first(ort, path, so, providers)
    times = dict((path, []) for path in sessions)
    for session in sessions.values():
        for _ in range(5):
            session.run(None, feed)
    for _ in range(rounds):
        for path, session in sessions.items():
            for _ in range(3):
                session.run(None, feed)
            for _ in range(block):
                start = time.perf_counter()
                session.run(None, feed)
                times[path].append((time.perf_counter() - start) * 1000.0)
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
        "timings": dict((p, {"p50": float(np.percentile(t, 50)),
                             "p90": float(np.percentile(t, 90))}) for p, t in times.items()),
        "providers": dict((p, s.get_providers()[0]) for p, s in sessions.items()),
    }))


if __name__ == "__main__":
    main(sys.argv[1:])
