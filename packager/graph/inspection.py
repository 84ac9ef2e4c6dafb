"""Describe an ONNX model: opset, I/O, ops, parameters, FLOPs, quantization."""

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .modelio import load_model, opset_of

QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
             "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "QGemm"}


def dtype_name(elem_type: int) -> str:
    """numpy name of an ONNX element type ('float32', 'int64', ...)."""
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:
        pass
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:   # a damaged file: a type number onnx does not know
        return f"unknown type {elem_type}"


def _itemsize(elem_type: int) -> int:
    """Bytes per element of an ONNX type; 0 for strings and unknown types."""
    try:
        return 0 if elem_type == onnx.TensorProto.STRING else \
            np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except Exception:
        return 0


def dims_of(value_info: onnx.ValueInfoProto) -> list[int | str]:
    """Dims of a tensor: ints where static, the symbol (or '?') where not."""
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in shape.dim]


def io_specs(values) -> list[dict[str, Any]]:
    return [{"name": v.name, "shape": dims_of(v), "dtype": dtype_name(v.type.tensor_type.elem_type)}
            for v in values]


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Real inputs: graph inputs that are not initializers (old exporters list both)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def check_labels(labels: Sequence[str], model: onnx.ModelProto, path: Path | str,
                 source: Path | str = "") -> None:
    """Raise unless *labels* (from the file *source*) name one class per score of *model*'s
    class-score outputs (float, 1 x classes, as the runner labels them); silent when the
    model has no such output."""
    from ..errors import SpecError

    scores = {}
    for value in model.graph.output:
        dims = dims_of(value)
        if len(dims) != 2 or not dtype_name(value.type.tensor_type.elem_type).startswith("float"):
            continue
        batch, classes = dims
        if (batch == 1 or isinstance(batch, str)) and isinstance(classes, int) and classes >= 2:
            scores[value.name] = classes
    if scores and len(labels) not in scores.values():
        name, classes = next(iter(scores.items()))
        raise SpecError(f"--labels {source}{' ' if source else ''}has {len(labels)} labels but "
                        f"{path}'s output "
                        f"'{name}' scores {classes} classes",
                        "give one class name per line, one per class, in the model's order")


def model_family(model: onnx.ModelProto) -> str:
    """'transformer' when the graph has attention (a MatMul of two activations and a Softmax),
    else 'default'. Target profiles can give transformers their own quantization preset."""
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    ops = {n.op_type for n in model.graph.node}
    attention = any(n.op_type == "MatMul" and not set(n.input[:2]) & constants
                    for n in model.graph.node)
    if (attention and "Softmax" in ops) or "Attention" in ops or "MultiHeadAttention" in ops:
        return "transformer"
    return "default"


def _static(dims) -> bool:
    return all(isinstance(d, int) and d > 0 for d in dims)


def estimate_flops(model: onnx.ModelProto) -> int | None:
    """Multiply-accumulate x2 for Conv / ConvTranspose / Gemm / MatMul with known shapes."""
    try:
        if any(n.domain == "com.microsoft" for n in model.graph.node):
            # onnxruntime's contrib ops (fused attention, LayerNorms): only its own symbolic
            # shape inference knows their output shapes
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            from ..atomic import scratch_cwd

            with scratch_cwd():   # an incomplete inference leaves files in the current folder
                inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
        else:
            inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:   # shapes unknown: no estimate, not an error
        return None
    shapes = {v.name: dims_of(v) for v in list(inferred.graph.value_info) +
              list(inferred.graph.input) + list(inferred.graph.output)}
    shapes.update({i.name: list(i.dims) for i in model.graph.initializer})
    total, known = 0, False
    for node in inferred.graph.node:
        ins = [shapes.get(n) for n in node.input]
        out = shapes.get(node.output[0]) if node.output else None
        if node.op_type in ("Conv", "QLinearConv", "ConvInteger"):
            w = ins[3] if node.op_type == "QLinearConv" else ins[1]
            if w and out and _static(w) and _static(out):
                # each output element: Cin/group x kernel multiply-adds
                total += 2 * int(np.prod(out)) * int(np.prod(w[1:]))
                known = True
        elif node.op_type == "ConvTranspose":
            x, w = ins[0], ins[1]
            if x and w and _static(x) and _static(w):
                total += 2 * int(np.prod(x)) * int(np.prod(w[1:]))
                known = True
        elif node.op_type in ("Attention", "QAttention") and ins and ins[0] and \
                len(ins) > 1 and ins[1] and _static(ins[0]) and _static(ins[1]) and \
                len(ins[0]) == 3:
            # onnxruntime's fused attention: the QKV projection, then Q.K^T and scores.V
            batch, seq, width = ins[0]
            hidden = ins[1][-1] // 3
            total += 2 * batch * seq * width * ins[1][-1] + 2 * 2 * batch * seq * seq * hidden
            known = True
        elif node.op_type in ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul"):
            a = ins[0]
            if a and out and _static(a) and _static(out) and len(a) >= 1:
                k = a[-1] if not (node.op_type == "Gemm" and _attr(node, "transA")) else a[0]
                total += 2 * int(np.prod(out)) * k
                known = True
    return total if known else None


def _attr(node: onnx.NodeProto, name: str) -> int:
    return next((a.i for a in node.attribute if a.name == name), 0)


def node_list(model: Path) -> list[dict[str, str]]:
    """Every node of *model* in graph order: name (what --exclude takes) and op type."""
    proto = load_model(model, check=False, external_data=False)
    return [{"name": n.name, "op": n.op_type} for n in proto.graph.node]


def constant_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The tensors Constant nodes of the main graph hold (their `value` attribute)."""
    return [a.t for n in proto.graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
            for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR]


def inspect_model(model: Path) -> dict[str, Any]:
    """Return a JSON-ready description of the ONNX model at *model*."""
    proto = load_model(model, check=False, external_data=False)
    ops = Counter(n.op_type for n in proto.graph.node)
    # weights live in initializers, or in Constant nodes (some exporters: tf2onnx, paddle2onnx)
    held = list(proto.graph.initializer) + constant_tensors(proto)
    params = sum(int(np.prod(i.dims)) for i in held)
    param_bytes = sum(int(np.prod(i.dims)) * _itemsize(i.data_type) for i in held)
    in_constants = sum(int(np.prod(t.dims)) for t in constant_tensors(proto))
    external = sorted({e.value for i in proto.graph.initializer for e in i.external_data
                       if e.key == "location"})
    return {
        "file": str(model),
        "file_bytes": Path(model).stat().st_size,
        "ir_version": proto.ir_version,
        "opset": opset_of(proto),
        "opsets": {e.domain or "ai.onnx": e.version for e in proto.opset_import},
        "producer": f"{proto.producer_name} {proto.producer_version}".strip(),
        "inputs": io_specs(graph_inputs(proto)),
        "outputs": io_specs(proto.graph.output),
        "nodes": len(proto.graph.node),
        "ops": dict(ops.most_common()),
        "parameters": params,
        "parameter_bytes": param_bytes,
        "parameters_in_constant_nodes": in_constants,
        "flops": estimate_flops(proto),
        "external_data": external,
        "quantized": bool(QUANT_OPS & set(ops)),
    }
