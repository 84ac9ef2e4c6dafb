"""Whether a graph is quantized already: the ops only a quantized graph holds."""

import onnx

# ops only a quantized graph holds: a model shipped with them is INT8 already
QUANTIZED_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger",
                 "MatMulInteger", "QLinearConv", "QLinearMatMul", "QGemm",
                 "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention",
                 "DynamicQuantizeLSTM", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
                 "QLinearGlobalAveragePool", "QLinearConcat", "QLinearAveragePool")


def quantized_ops(graph: onnx.GraphProto) -> dict[str, int]:
    """{op type: count} of the quantization ops in *graph* (empty for a float graph)."""
    found: dict[str, int] = {}
    for node in graph.node:
        if node.op_type in QUANTIZED_OPS:
            found[node.op_type] = found.get(node.op_type, 0) + 1
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def quantized_summary(found: dict[str, int]) -> str:
    """'ConvInteger 3, MatMulInteger 1' (the four most common)."""
    return ", ".join(f"{op} {n}" for op, n in list(found.items())[:4]) + \
        (", ..." if len(found) > 4 else "")
