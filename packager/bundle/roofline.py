"""The graphs `run.py bench --roofline` and `edgepack compare` time for the machine's best rate.

One 512x512 MatMul is no ceiling: onnxruntime's NCHWc convolutions and its QLinearConv kernels
beat it (an INT8 ResNet-18-class CNN ran at 127 % of it). The ceiling is the best of several
graphs of each kind instead: MatMuls of square and of conv-like (im2col: M=HW, K=9C, N=C) shapes,
two 3x3 convolutions, and the model's own heaviest convolutions at its batch, in FP32 and in the
integer forms a bundle runs: MatMulInteger, QLinearMatMul and QLinearConv of its activation type,
and the QDQ form (DequantizeLinear, MatMul or Conv, QuantizeLinear) that onnxruntime fuses into
those and that OpenVINO runs on its own INT8 kernels (AMX where the CPU has it). Each graph is a
few hundred bytes: inputs are fed at run time and a weight is a ConstantOfShape, which
onnxruntime and OpenVINO fold into a constant when the session starts (so their kernels prepack
it as they do a real weight).
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..graph.modelio import load_model, save_model
from ..targets import Target

# (M, K, N): square, and the im2col shapes of a ResNet's 3x3 convs at 56, 28, 14 px
MATMUL_SHAPES = ((512, 512, 512), (256, 256, 256), (1024, 1024, 1024), (3136, 576, 64),
                 (784, 1152, 128), (196, 2304, 256))
# x [N, C, H, W], w [M, C/group, kh, kw]: a ResNet's 3x3 convs at 28 and 56 px, in every set
GENERIC_CONVS = tuple({"x": [1, 128, size, size], "w": [128, 128, 3, 3], "strides": [1, 1],
                       "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1}
                      for size in (28, 56))
MODEL_CONVS = 3          # the model's heaviest distinct conv shapes added to the set
MAX_CONV_OPS = 16e9      # larger single convs are left out (each would take long to time)
ROOFLINE_SIZE = 512   # M = K = N: large enough to reach a CPU's GEMM rate, 0.27 GOP a call


def heaviest_convs(model: onnx.ModelProto, count: int = MODEL_CONVS) -> list[dict[str, Any]]:
    """The *count* distinct Conv/QLinearConv shapes with the most operations, at the model's
    batch."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:   # shapes unknown: no model convs, the generic set still stands
        return []
    shapes: dict[str, list[int]] = {}
    for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
        if dims and all(d > 0 for d in dims):
            shapes[v.name] = dims
    shapes.update({i.name: list(i.dims) for i in inferred.graph.initializer})
    found: dict[str, dict[str, Any]] = {}
    for node in inferred.graph.node:
        if node.op_type not in ("Conv", "QLinearConv") or len(node.input) < 2:
            continue
        x = shapes.get(node.input[0])
        w = shapes.get(node.input[3] if node.op_type == "QLinearConv" else node.input[1])
        if not x or not w or len(x) != 4 or len(w) != 4:
            continue
        attrs = {a.name: list(a.ints) if a.ints else a.i for a in node.attribute}
        if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", 0) and "pads" not in attrs:
            continue
        conv = {"x": list(x), "w": w, "strides": attrs.get("strides") or [1, 1],
                "pads": attrs.get("pads") or [0, 0, 0, 0],
                "dilations": attrs.get("dilations") or [1, 1], "group": int(attrs.get("group") or 1)}
        conv["ops"] = conv_ops(conv)
        if 0 < conv["ops"] <= MAX_CONV_OPS:
            found[repr(sorted(conv.items()))] = conv
    return sorted(found.values(), key=lambda c: -c["ops"])[:count]


def conv_output(conv: dict[str, Any]) -> list[int]:
    x, w, s, p, d = conv["x"], conv["w"], conv["strides"], conv["pads"], conv["dilations"]
    size = [(x[2 + i] + p[i] + p[i + 2] - d[i] * (w[2 + i] - 1) - 1) // s[i] + 1 for i in (0, 1)]
    return [x[0], w[0], *size]


def conv_ops(conv: dict[str, Any]) -> int:
    """2 x multiply-adds: each output element takes C/group x kh x kw of them."""
    out = conv_output(conv)
    return 2 * int(np.prod(out)) * int(np.prod(conv["w"][1:])) if min(out) > 0 else 0


def _model(nodes, name: str, inputs, output, initializers=()) -> onnx.ModelProto:
    from onnx import helper

    graph = helper.make_graph(nodes, name, inputs, [output], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def _matmul(kind: str, op: str, m: int, k: int, n: int, activation: int) -> onnx.ModelProto:
    from onnx import TensorProto as T
    from onnx import helper

    a = T.FLOAT if kind == "fp32" else activation
    b = T.FLOAT if kind == "fp32" else T.INT8
    inputs = [helper.make_tensor_value_info("a", a, [m, k]),
              helper.make_tensor_value_info("b", b, [k, n])]
    if op == "QDQ MatMul":   # a QDQ model's form, B a weight (ConstantOfShape, folded)
        from onnx import numpy_helper

        init = [numpy_helper.from_array(np.array([k, n], np.int64), "b_shape"),
                helper.make_tensor("as", T.FLOAT, [], [0.02]), helper.make_tensor("az", a, [], [0]),
                helper.make_tensor("bs", T.FLOAT, [], [0.01]), helper.make_tensor("bz", b, [], [0]),
                helper.make_tensor("ys", T.FLOAT, [], [float(k) / 50]),
                helper.make_tensor("yz", a, [], [0])]
        nodes = [helper.make_node("ConstantOfShape", ["b_shape"], ["b"],
                                  value=helper.make_tensor("value", T.INT8, [1], [1])),
                 helper.make_node("DequantizeLinear", ["a", "as", "az"], ["af"]),
                 helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"]),
                 helper.make_node("MatMul", ["af", "bf"], ["yf"]),
                 helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"])]
        return _model(nodes, "roofline_qdq_matmul", inputs[:1],
                      helper.make_tensor_value_info("y", a, [m, n]), init)
    if op == "QLinearMatMul":   # scales chosen so the u8/s8 result neither saturates nor is 0
        init = [helper.make_tensor("as", T.FLOAT, [], [0.02]), helper.make_tensor("az", a, [], [0]),
                helper.make_tensor("bs", T.FLOAT, [], [0.01]), helper.make_tensor("bz", b, [], [0]),
                helper.make_tensor("ys", T.FLOAT, [], [float(k) / 50]),
                helper.make_tensor("yz", a, [], [0])]
        node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
        return _model([node], f"roofline_{op}", inputs,
                      helper.make_tensor_value_info("y", a, [m, n]), init)
    out = T.FLOAT if kind == "fp32" else T.INT32
    return _model([helper.make_node(op, ["a", "b"], ["y"])], f"roofline_{op}", inputs,
                  helper.make_tensor_value_info("y", out, [m, n]))


def _conv(kind: str, conv: dict[str, Any], activation: int, qdq: bool = False) -> onnx.ModelProto:
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    attrs = {k: conv[k] for k in ("strides", "pads", "dilations", "group")}
    wtype = T.FLOAT if kind == "fp32" else T.INT8
    x = T.FLOAT if kind == "fp32" else activation
    init = [numpy_helper.from_array(np.array(conv["w"], np.int64), "w_shape")]
    nodes = [helper.make_node("ConstantOfShape", ["w_shape"], ["w"], value=helper.make_tensor(
        "value", wtype, [1], [0.01 if kind == "fp32" else 1]))]
    if kind == "fp32":
        nodes.append(helper.make_node("Conv", ["x", "w"], ["y"], **attrs))
    else:
        depth = int(np.prod(conv["w"][1:]))
        init += [helper.make_tensor("xs", T.FLOAT, [], [0.02]), helper.make_tensor("xz", x, [], [0]),
                 helper.make_tensor("ws", T.FLOAT, [], [0.01]),
                 helper.make_tensor("wz", T.INT8, [], [0]),
                 helper.make_tensor("ys", T.FLOAT, [], [max(depth, 1) / 50]),
                 helper.make_tensor("yz", x, [], [0])]
        if qdq:   # the form a QDQ bundle has: onnxruntime fuses it, OpenVINO runs it in INT8
            nodes += [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
                      helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"]),
                      helper.make_node("Conv", ["xf", "wf"], ["yf"], **attrs),
                      helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"])]
        else:
            nodes.append(helper.make_node("QLinearConv",
                                          ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
                                          ["y"], **attrs))
    return _model(nodes, "roofline_conv", [helper.make_tensor_value_info("x", x, conv["x"])],
                  helper.make_tensor_value_info("y", x, conv_output(conv)), init)


def write_graphs(folder: Path, prefix: str, activation: str,
                 convs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Write every roofline graph but the two 512x512 MatMuls into *folder*; their entries
    (file relative to *folder*'s parent, named *prefix*/...): kind, op, shape, ops, inputs."""
    from onnx import TensorProto as T

    act = T.UINT8 if activation == "uint8" else T.INT8
    adt = "uint8" if activation == "uint8" else "int8"
    entries = []

    def add(model, kind, op, shape, ops, inputs):
        name = f"{len(entries):02d}_{op.lower().replace(' ', '_')}_{'x'.join(map(str, shape))}.onnx"
        save_model(model, folder / name)
        entries.append({"kind": kind, "op": op, "shape": list(shape), "ops": int(ops),
                        "file": f"{prefix}/{name}", "inputs": inputs})

    for m, k, n in MATMUL_SHAPES:
        ops = 2 * m * k * n
        for kind, op, inputs in (
                ("fp32", "MatMul", {"a": ["float32", [m, k]], "b": ["float32", [k, n]]}),
                ("int8", "MatMulInteger", {"a": [adt, [m, k]], "b": ["int8", [k, n]]}),
                ("int8", "QLinearMatMul", {"a": [adt, [m, k]], "b": ["int8", [k, n]]}),
                ("int8", "QDQ MatMul", {"a": [adt, [m, k]]})):
            if (m, k, n) == (512, 512, 512) and op in ("MatMul", "MatMulInteger"):
                continue   # the two graphs of roofline.fp32 / roofline.int8
            if kind == "fp32" and ops > 2 * 512 ** 3 * 4:
                continue   # FP32 GEMMs this large run below the smaller ones' rate (memory)
            add(_matmul(kind, op, m, k, n, act), kind, op, (m, k, n), ops, inputs)
    for conv in [*GENERIC_CONVS, *convs]:
        shape = [*conv["x"], *conv["w"], conv["strides"][0], conv["group"]]
        for kind, op, x in (("fp32", "Conv", "float32"), ("int8", "QLinearConv", adt),
                            ("int8", "QDQ Conv", adt)):
            if any(e["op"] == op and e["shape"] == shape for e in entries):
                continue
            add(_conv(kind, conv, act, qdq=op == "QDQ Conv"), kind, op, shape, conv_ops(conv),
                {"x": [x, conv["x"]]})
    return entries


def write_roofline(tmp: Path, parts: Sequence[Any], target: Target,
                   model: Any = None) -> dict[str, Any]:
    """The graphs `run.py bench --roofline` times for the machine's best rate (below):
    an FP32 MatMul and a MatMulInteger of the bundle's integer types at 512x512 (roofline.fp32,
    roofline.int8), then roofline.graphs: more MatMul shapes, QLinearMatMul, and FP32 and
    QLinearConv convolutions, the heaviest of *model*'s (else of the parts' reference graphs)
    among them. Inputs are fed at run time: no weights, a few hundred bytes a graph."""
    from onnx import TensorProto, helper

    int8 = next((p.precision for p in parts if p.precision.get("precision") == "int8"), None)
    activation = (int8 or {}).get("activation_type") or target.quantization.activation_type
    types = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}
    n = ROOFLINE_SIZE
    (tmp / "roofline").mkdir()
    graphs = {}
    for kind, a, b, out, op in (
            ("fp32", TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.FLOAT, "MatMul"),
            ("int8", types.get(activation, TensorProto.UINT8), TensorProto.INT8,
             TensorProto.INT32, "MatMulInteger")):
        graph = helper.make_graph(
            [helper.make_node(op, ["a", "b"], ["y"])], f"roofline_{kind}",
            [helper.make_tensor_value_info("a", a, [n, n]),
             helper.make_tensor_value_info("b", b, [n, n])],
            [helper.make_tensor_value_info("y", out, [n, n])])
        model_ = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                   ir_version=7)
        save_model(model_, tmp / "roofline" / f"matmul_{kind}.onnx")
        graphs[kind] = f"roofline/matmul_{kind}.onnx"
    convs = []
    for source in ([model] if model is not None else
                   [load_model(p.reference or p.model, check=False, external_data=False)
                    for p in parts]):
        convs += heaviest_convs(source)
    convs = sorted({repr(sorted(c.items())): c for c in convs}.values(),
                   key=lambda c: -c["ops"])[:3]
    integer = "u8s8" if activation == "uint8" else "s8s8"
    return {"size": n, "ops_per_call": 2 * n ** 3, "fp32": graphs["fp32"],
            "int8": graphs["int8"], "int8_kind": integer,
            "graphs": write_graphs(tmp / "roofline", "roofline", activation, convs)}
