"""Time candidate models on a device for `edgepack build --precision auto --time-on HOST`.

    python3 time_models.py FEED.npz THREADS ROUNDS BLOCK model1.onnx model2.onnx ...

Runs the models interleaved in blocks (untimed calls after every switch), prints one JSON object
with p50/p90 per model and the device. Python 3.8+, stdlib + numpy + onnxruntime; installs
nothing.
"""

import json
import platform
import sys
import time

import numpy as np


def main(argv):
    import onnxruntime as ort

    feed_path, threads, rounds, block = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    with np.load(feed_path) as f:
        feed = {k: f[k] for k in f.files}
    sessions = {}
    for path in argv[4:]:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[path] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
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
    }))


if __name__ == "__main__":
    main(sys.argv[1:])
