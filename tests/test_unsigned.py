"""Signed INT8 activations rewritten unsigned (packager/graph/unsigned.py): the same numbers.

The graph is the six-node pattern that OpenVINO runs wrong with signed activations (a signed
tensor split, one piece into a quantized Conv, the other into a Concat); tests/test_openvino.py
runs the rewritten graph under OpenVINO."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from packager.graph.unsigned import unsigned_activations

X = np.random.default_rng(1).normal(0.5, 2, (1, 32, 8, 8)).astype(np.float32)


def split_conv_concat(zero: int = 0, dtype=np.int8) -> onnx.ModelProto:
    """x -> Q/DQ (activation) -> Split -> [a, Conv(b)] -> Concat: the C2f pattern of YOLOv8."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (16, 16, 3, 3)).astype(np.float32)
    ws = (np.abs(w).max((1, 2, 3)) / 127).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(0.169, np.float32), "s"),
             numpy_helper.from_array(np.array(zero, dtype), "z"),
             numpy_helper.from_array(np.round(w / ws[:, None, None, None]).astype(np.int8), "wq"),
             numpy_helper.from_array(ws, "ws"),
             numpy_helper.from_array(np.zeros(16, np.int8), "wz"),
             numpy_helper.from_array(np.array([16, 16], np.int64), "sp")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
             helper.make_node("Split", ["xd", "sp"], ["a", "b"], axis=1),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["b", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "c"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, "split_conv_concat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, X.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8, 8])], inits,
        value_info=[helper.make_tensor_value_info("xq", TensorProto.INT8, X.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def run(model: onnx.ModelProto) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": X})[0]


def _zero_points(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {n.name or n.output[0]: inits[n.input[2]] for n in model.graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2}


def test_signed_activations_become_unsigned_with_the_same_numbers():
    signed = split_conv_concat(zero=-3)
    before = run(signed)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(signed)
    assert unsigned_activations(rewritten) == 1
    onnx.checker.check_model(rewritten)
    zeros = _zero_points(rewritten)
    assert zeros["q"].dtype == np.uint8 and int(zeros["q"]) == 125   # -3 + 128
    assert zeros["dq"].dtype == np.uint8 and int(zeros["dq"]) == 125
    assert zeros["w"].dtype == np.int8    # a weight's zero point stays signed
    assert "z" not in {i.name for i in rewritten.graph.initializer}   # nothing reads it now
    assert [v.type.tensor_type.elem_type for v in rewritten.graph.value_info
            if v.name == "xq"] == [TensorProto.UINT8]
    np.testing.assert_array_equal(run(rewritten), before)   # bit for bit
    assert unsigned_activations(rewritten) == 0                # done once


def test_a_quantizer_read_by_anything_but_a_dequantizer_is_left_signed():
    model = split_conv_concat()
    model.graph.output.append(helper.make_tensor_value_info("xq", TensorProto.INT8, X.shape))
    assert unsigned_activations(model) == 0
    assert _zero_points(model)["q"].dtype == np.int8
    unsigned = split_conv_concat(zero=128, dtype=np.uint8)   # unsigned already: nothing to do
    assert unsigned_activations(unsigned) == 0


def test_a_quantizer_per_channel_is_left_signed():
    """NNCF quantizes an Add's input per channel; unsigned, onnxruntime fused it into a
    QLinearConv output (one zero point only) and failed at run time (PP-OCRv4 det)."""
    model = split_conv_concat()
    inits = {i.name: i for i in model.graph.initializer}
    inits["s"].CopyFrom(numpy_helper.from_array(np.full(32, 0.169, np.float32), "s"))
    inits["z"].CopyFrom(numpy_helper.from_array(np.zeros(32, np.int8), "z"))
    for node in model.graph.node[:2]:
        node.attribute.append(helper.make_attribute("axis", 1))
    before = run(model)
    assert unsigned_activations(model) == 0
    np.testing.assert_array_equal(run(model), before)
