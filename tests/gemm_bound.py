"""The weight GEMMs of a MiniLM-L6 encoder alone, through each of onnxruntime's integer ops.

A lower bound on any INT8 bundle of that model on this machine: attention scores, softmax,
LayerNorm and quantizing the activations all come on top. Run: .venv/bin/python tests/gemm_bound.py
"""

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

TOKENS, LAYERS, THREADS = 128, 6, 2
SHAPES = [(384, 1152), (384, 384), (384, 1536), (1536, 384)]   # QKV, out, FFN up, FFN down


def const(name, value, dtype):
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


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
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session, {"x": rng.integers(0, 255, shape).astype(np.uint8)}


def median_ms(session, feeds, runs=200):
    for _ in range(20):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main():
    ops = ["MatMulInteger", "QLinearMatMul", "MatMulIntegerToFloat", "QLinearConv"]
    print(f"onnxruntime {ort.__version__}, {THREADS} threads, {TOKENS} tokens, u8 x s8\n")
    print("| k x n | " + " | ".join(ops) + " | best |")
    print("| --- " * (len(ops) + 2) + "|")
    total = {op: 0.0 for op in ops} | {"best": 0.0}
    for k, n in SHAPES:
        times = {op: median_ms(*graph(op, k, n)) for op in ops}
        times["best"] = min(times.values())
        for op, ms in times.items():
            total[op] += ms
        print(f"| {k} x {n} | " + " | ".join(f"{ms:.3f} ms ({2 * TOKENS * k * n / ms / 1e6:.0f} "
                                           "GOP/s)" for ms in times.values()) + " |")
    print(f"| {LAYERS} layers | " + " | ".join(f"{LAYERS * ms:.2f} ms" for ms in total.values())
          + " |")


if __name__ == "__main__":
    main()
