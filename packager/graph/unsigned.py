"""Signed INT8 activations made unsigned: the same numbers, and OpenVINO runs them right.

NNCF's ONNX backend quantizes an activation that can go negative (SiLU's output) to signed
int8 with zero point 0. OpenVINO's CPU plugin (2025.4 inside onnxruntime-openvino 1.24.1, and
2026.4.1 standalone) runs such a graph wrong where a signed tensor is split and one piece feeds
a quantized Conv while another goes on as it is (YOLOv8's C2f block: Split, Conv, Concat): the
piece that goes on comes out rounded to whole numbers (1.183 became 1.0). On nudenet's YOLOv8n
every class score vanished under OpenVINO (max 0.011 against FP32's 0.743) while the CPU
provider ran the same graph within budget. Six nodes reproduce it (tests/test_openvino.py);
with unsigned activations OpenVINO agrees with the CPU provider to the last bit there and on
nudenet, and runs as fast (4.80 vs 4.73 ms p50 for the signed graph, one run, AMD EPYC
avx512_vnni).

The rewrite is exact: uint8 with zero point z + 128 holds what int8 with zero point z held
(q' = q + 128 over the same clamp range, and (q' - z') * scale = (q - z) * scale), so every
figure judged on the CPU provider stays what it was. Weights (a DequantizeLinear of a
constant) stay signed, as both runtimes want them.
"""

import numpy as np
import onnx
from onnx import numpy_helper


def unsigned_activations(model: onnx.ModelProto) -> int:
    """Rewrite each QuantizeLinear of an activation with an int8 zero point, and the
    DequantizeLinear nodes that read it, to uint8 with the zero point moved by 128. Returns how
    many quantizers changed. A quantizer whose output anything but a DequantizeLinear reads is
    left as it is, and so is one per channel (NNCF quantizes an Add's input per channel for
    OpenVINO; onnxruntime fuses an unsigned one into a QLinearConv output, which takes one zero
    point only, and fails at run time)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    infos = {info.name: info for info in graph.value_info}
    made: dict[str, str] = {}
    changed = 0
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or len(node.input) < 3 or node.input[0] in inits:
            continue
        zero = inits.get(node.input[2])
        if zero is None or numpy_helper.to_array(zero).dtype != np.int8 or \
                numpy_helper.to_array(zero).size != 1:
            continue
        dqs = readers.get(node.output[0], [])
        if node.output[0] in outputs or not dqs or any(
                d.op_type != "DequantizeLinear" or d.input[0] != node.output[0]
                or len(d.input) < 3 or d.input[2] != node.input[2] for d in dqs):
            continue
        name = made.get(zero.name)
        if name is None:
            name = made[zero.name] = _free_name(zero.name + "_u8", inits)
            shifted = numpy_helper.to_array(zero).astype(np.int16) + 128
            inits[name] = numpy_helper.from_array(shifted.astype(np.uint8), name)
            graph.initializer.append(inits[name])
        for user in [node, *dqs]:
            user.input[2] = name
        for attr in node.attribute:
            if attr.name == "output_dtype":
                attr.i = onnx.TensorProto.UINT8
        if node.output[0] in infos:
            infos[node.output[0]].type.tensor_type.elem_type = onnx.TensorProto.UINT8
        changed += 1
    used = {name for node in graph.node for name in node.input}
    for name in made:   # an int8 zero point nothing reads any more goes
        if name not in used:
            graph.initializer.remove(inits[name])
    return changed


def _free_name(name: str, taken: dict) -> str:
    stem, n = name, 1
    while name in taken:
        name, n = f"{stem}{n}", n + 1
    return name
