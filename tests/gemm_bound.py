"""The weight GEMMs of a MiniLM-L6 encoder alone, through each of onnxruntime's integer ops.

A lower bound on any INT8 bundle of that model on this machine: attention scores, softmax,
LayerNorm and quantizing the activations all come on top. With --model, the given graphs (a
bundle's model.onnx, or any graph of the same encoder) are timed in the same run, interleaved with
the bound's GEMMs, and each gets its share: bound / its p50 (100 % would be a graph that is only
its weight GEMMs at the best integer op's speed). --profile adds onnxruntime's profile of each
graph: its time by op type, which says where the rest goes.

    .venv/bin/python tests/gemm_bound.py
    .venv/bin/python tests/gemm_bound.py --model out/minilm/model.onnx \\
        --feeds out/minilm/golden/model.inputs.npz --profile
"""

import argparse
import json
import os
import platform
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

TOKENS, LAYERS, THREADS = 128, 6, 2
SHAPES = [(384, 1152), (384, 384), (384, 1536), (1536, 384)]   # QKV, out, FFN up, FFN down
OPS = ["MatMulInteger", "QLinearMatMul", "MatMulIntegerToFloat", "QLinearConv"]
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "neon", "asimddp")


def const(name, value, dtype):
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def options(profile: str = "") -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.log_severity_level = 3
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    return opts


def graph(op, k, n):
    rng = np.random.default_rng(0)
    q = [const("xs", 0.02, np.float32), const("xz", 128, np.uint8),
         const("ws", 0.01, np.float32), const("wz", 0, np.int8)]
    out_q = [const("ys", 0.05, np.float32), const("yz", 128, np.uint8)]
    weight = rng.integers(-127, 127, (k, n)).astype(np.int8)
    shape, out, domain = [TOKENS, k], TensorProto.UINT8, ""
    if op == "MatMulInteger":
        inputs, inits, out = ["x", "w"], [], TensorProto.INT32
    elif op == "QLinearMatMul":
        inputs, inits = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], q + out_q
    elif op == "MatMulIntegerToFloat":
        inputs, inits = ["x", "w", "xs", "ws", "xz", "wz"], q
        out, domain = TensorProto.FLOAT, "com.microsoft"
    else:   # QLinearConv 1x1 over [1, k, 1, tokens]
        inputs, inits = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], q + out_q
        weight, shape = weight.T.reshape(n, k, 1, 1).copy(), [1, k, 1, TOKENS]
    inits = inits + [numpy_helper.from_array(weight, "w")]
    node = helper.make_node(op, inputs, ["y"], domain=domain)
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, shape)],
        [helper.make_tensor_value_info("y", out, None)], inits),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), options(),
                                   providers=["CPUExecutionProvider"])
    return session, {"x": rng.integers(0, 255, shape).astype(np.uint8)}


CLOCK = time.perf_counter


def times_ms(session, feeds, runs):
    for _ in range(max(3, runs // 10)):
        session.run(None, feeds)
    out = []
    for _ in range(runs):
        start = CLOCK()
        session.run(None, feeds)
        out.append((CLOCK() - start) * 1e3)
    return out


def median_ms(session, feeds, runs=200):
    return float(np.median(times_ms(session, feeds, runs)))


def model_feeds(session, path: Path | None) -> dict:
    """The first sample of *path* (an .npz of (samples, *shape) arrays, as a bundle's golden
    inputs), else ones for integer inputs and a fixed normal draw for float ones."""
    data = np.load(path) if path else {}
    feeds, rng = {}, np.random.default_rng(0)
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in spec.shape]
        if spec.name in data:
            value = data[spec.name]
            feeds[spec.name] = value[0] if value.ndim == len(shape) + 1 else value
        elif "int" in spec.type:
            feeds[spec.name] = np.ones(shape, np.int64 if "64" in spec.type else np.int32)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def machine() -> str:
    name, flags = platform.machine(), set()
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags |= set(value.split())
    return f"{name}, {os.cpu_count()} cores, flags: " + \
        (" ".join(f for f in FLAGS if f in flags) or "none of " + "/".join(FLAGS))


def profile_by_op(path: Path, feeds: dict, runs: int = 30) -> Counter:
    """Kernel time per run by op type, from onnxruntime's profiler (ms): each node's median over
    *runs*, so that the moments another process had the core fall out."""
    with tempfile.TemporaryDirectory() as tmp:
        session = ort.InferenceSession(str(path), options(str(Path(tmp) / "p")),
                                       providers=["CPUExecutionProvider"])
        for _ in range(runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    per_node, op_of = {}, {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            per_node.setdefault(event["name"], []).append(event["dur"] / 1e3)
            op_of[event["name"]] = event["args"]["op_name"]
    by_op = Counter()
    for name, durations in per_node.items():
        by_op[op_of[name]] += float(np.median(durations))
    return by_op


def main():
    global THREADS, CLOCK
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[], type=Path,
                        help="an ONNX graph of the encoder to time against the bound")
    parser.add_argument("--feeds", type=Path, help=".npz of the models' inputs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=THREADS,
                        help="intra-op threads of every session (default: the target's 2)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the CPU time of the calling thread, not the wall clock (with "
                             "--threads 1, where onnxruntime computes on that thread: what a "
                             "busy machine's other processes do not inflate)")
    parser.add_argument("--profile", action="store_true", help="time by op type per model")
    args = parser.parse_args()
    THREADS = args.threads
    if args.cpu_time:
        if THREADS != 1:
            parser.error("--cpu-time needs --threads 1 (other threads' time is not counted)")
        CLOCK = time.thread_time
    print(f"onnxruntime {ort.__version__}, {THREADS} threads, {TOKENS} tokens, u8 x s8, "
          f"{'CPU time of the thread' if args.cpu_time else 'wall clock'}; "
          f"{machine()}\n")
    gemms = {(op, k, n): graph(op, k, n) for k, n in SHAPES for op in OPS}
    models = {}
    for path in args.model:
        session = ort.InferenceSession(str(path), options(), providers=["CPUExecutionProvider"])
        models[path] = (session, model_feeds(session, args.feeds))
    samples = {key: [] for key in [*gemms, *models]}
    for _ in range(args.rounds):   # interleaved: a busy moment costs every row alike
        for key, (session, feeds) in gemms.items():
            samples[key] += times_ms(session, feeds, 60)
        for key, (session, feeds) in models.items():
            samples[key] += times_ms(session, feeds, 20)
    p50 = {key: float(np.median(v)) for key, v in samples.items()}
    print("| k x n | " + " | ".join(OPS) + " | best |")
    print("| --- " * (len(OPS) + 2) + "|")
    total = {op: 0.0 for op in OPS} | {"best": 0.0}
    for k, n in SHAPES:
        times = {op: p50[(op, k, n)] for op in OPS}
        times["best"] = min(times.values())
        for op, ms in times.items():
            total[op] += ms
        print(f"| {k} x {n} | " + " | ".join(f"{ms:.3f} ms ({2 * TOKENS * k * n / ms / 1e6:.0f} "
                                           "GOP/s)" for ms in times.values()) + " |")
    print(f"| {LAYERS} layers | " + " | ".join(f"{LAYERS * ms:.2f} ms" for ms in total.values())
          + " |")
    bound = LAYERS * total["best"]
    if models:
        print(f"\n| graph | p50 | share of the bound ({bound:.2f} ms) |\n| --- | --- | --- |")
        for path in models:
            print(f"| {path} | {p50[path]:.2f} ms | {100 * bound / p50[path]:.0f} % |")
    for path, (_, feeds) in models.items() if args.profile else ():
        by_op = profile_by_op(path, feeds)
        kernels = sum(by_op.values())
        print(f"\n{path}: {kernels:.2f} ms of kernels per run (each node's median; the p50 "
              f"above {p50[path]:.2f} ms)\n\n| op | ms per run | share |\n| --- | --- | --- |")
        for op, ms in by_op.most_common():
            print(f"| {op} | {ms:.3f} | {100 * ms / kernels:.1f} % |")


if __name__ == "__main__":
    main()
