"""Our residual-LayerNorm rewrite: LayerNorm(Linear(x) + residual) as onnxruntime's contrib
SkipLayerNormalization. Used by fusion.fuse_transformer before onnxruntime's optimizer runs,
which then fuses attention through it and takes the Linear's bias Add into it.

onnxruntime's own SkipLayerNormalization fusion needs its symbolic shape inference to succeed on
the whole graph, and one op it cannot type anywhere (a ReduceL2 with its axes as an input, in the
mean-pooling and L2-normalising tail of a sentence encoder, as `F.normalize` exports it) turns the
fusion off for every layer. Here the shapes are the graph's static ones. A Linear that onnxsim made
a Reshape -> Gemm -> Reshape (rows merged, then split back) becomes the MatMul + Add it was, so
that the optimizer's bias fusion finds it.

Exact: SkipLayerNormalization(input, skip, gamma, beta) is LayerNormalization(input + skip) over
the last axis with the LayerNorm's epsilon, both tensors of one (batch, sequence, hidden) shape.
"""

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .dataflow import Graph, find_linear, live_nodes, static_facts

SKIP_NORM = "1.8"   # SkipLayerNormalization on the CPU


@dataclass
class _Plan:
    """One residual LayerNorm: the nodes it replaces, and the nodes and weights it writes."""

    remove: set[int]
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    infos: list = field(default_factory=list)


def fuse_skip_norms(model: onnx.ModelProto) -> onnx.ModelProto:
    """*model* with each LayerNormalization of a Linear's output plus another tensor of the same
    static (batch, sequence, hidden) shape as one SkipLayerNormalization; unchanged where none."""
    if not any(n.op_type == "LayerNormalization" for n in model.graph.node):
        return model
    g = Graph(model, *static_facts(model))
    plans, taken = {}, set()
    for i, node in enumerate(model.graph.node):
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        plan = _match(node, g, f"skip_norm_{i}/")
        if plan is not None and not plan.remove & taken:
            plans[id(node)], taken = plan, taken | plan.remove
    if not plans:
        return model
    fused = onnx.ModelProto.FromString(model.SerializeToString())
    nodes = []
    for node, copy in zip(model.graph.node, fused.graph.node, strict=True):
        if id(node) in plans:   # the new nodes take the LayerNorm's place: all inputs made
            nodes += plans[id(node)].nodes
        elif id(node) not in taken:
            nodes.append(copy)
    nodes = live_nodes(nodes, fused.graph)
    del fused.graph.node[:]
    fused.graph.node.extend(nodes)
    fused.graph.initializer.extend(t for p in plans.values() for t in p.inits)
    typed = {v.name for v in fused.graph.value_info}
    fused.graph.value_info.extend(v for p in plans.values() for v in p.infos
                                  if v.name not in typed)
    used = {i for n in nodes for i in n.input} | {i.name for i in fused.graph.input}
    kept = [t for t in fused.graph.initializer if t.name in used]
    del fused.graph.initializer[:]
    fused.graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in fused.opset_import):
        fused.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return fused


def _only_reader(name: str, node, g: Graph) -> bool:
    return g.readers.get(name, []) == [node]


def _vector(name: str, g: Graph, width: int) -> np.ndarray | None:
    value = g.const(name)
    if value is None or value.dtype != np.float32 or value.size != width:
        return None
    return value.reshape(width)


def _match(norm, g: Graph, prefix: str) -> _Plan | None:
    """The rewrite of LayerNorm *norm* when it normalises the last axis of Add(a, b), a and b of
    its (batch, sequence, hidden) shape, one of them a Linear read by that Add alone."""
    attrs = {a.name: helper.get_attribute_value(a) for a in norm.attribute}
    shape = g.shapes.get(norm.input[0])
    if shape is None or len(shape) != 3 or attrs.get("axis", -1) % 3 != 2 or \
            attrs.get("stash_type", 1) != 1 or \
            any(o and g.readers.get(o) for o in norm.output[1:]):   # its mean or 1/std read
        return None
    hidden = shape[-1]
    gamma = _vector(norm.input[1], g, hidden) if len(norm.input) > 1 else None
    beta = norm.input[2] if len(norm.input) > 2 and norm.input[2] else ""
    if gamma is None or (beta and _vector(beta, g, hidden) is None):
        return None
    add = g.producer.get(norm.input[0])
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or \
            not _only_reader(add.output[0], norm, g) or \
            any(g.const(i) is not None or g.shapes.get(i) != shape for i in add.input):
        return None
    plan = _Plan({id(norm), id(add)})
    for side in (0, 1):
        linear = _linear(add.input[side], add, g, shape, plan, prefix)
        if linear is not None:
            break
    else:
        return None
    inputs = [linear, add.input[1 - side], norm.input[1],
              beta or _const(plan, prefix + "beta", np.zeros(hidden, np.float32))]
    plan.nodes.append(helper.make_node(
        "SkipLayerNormalization", inputs, [norm.output[0]], name=prefix + "SkipLayerNorm",
        domain="com.microsoft", epsilon=float(attrs.get("epsilon", 1e-5))))
    plan.infos.append(helper.make_tensor_value_info(norm.output[0], onnx.TensorProto.FLOAT,
                                                    list(shape)))
    return plan


def _const(plan: _Plan, name: str, value: np.ndarray) -> str:
    plan.inits.append(numpy_helper.from_array(value, name))
    return name


def _node(plan: _Plan, op: str, inputs: list, name: str, shape) -> str:
    plan.nodes.append(helper.make_node(op, inputs, [name + "_output"], name=name))
    plan.infos.append(helper.make_tensor_value_info(name + "_output", onnx.TensorProto.FLOAT,
                                                    list(shape)))
    return name + "_output"


def _linear(name: str, add, g: Graph, shape, plan: _Plan, prefix: str):
    """The Linear that alone feeds *add* with *name*: *name*, or where it is onnxsim's Reshape ->
    Gemm -> Reshape, the MatMul + Add bias that replaces them (planned in *plan*)."""
    node = g.producer.get(name)
    if node is None or not _only_reader(name, add, g):
        return None
    if node.op_type in ("MatMul", "Add") and find_linear(name, g) is not None:
        return name   # its bias Add stays: onnxruntime's optimizer takes it in after attention
    if node.op_type != "Reshape":
        return None
    gemm = g.producer.get(node.input[0])   # onnxsim's Reshape -> Gemm -> Reshape of a Linear
    if gemm is None or gemm.op_type != "Gemm" or not _only_reader(gemm.output[0], node, g):
        return None
    linear = find_linear(gemm.output[0], g)
    if linear is None:
        return None
    x, weight, weight_name, bias = linear[:4]
    rows, width = shape[0] * shape[1], weight.shape[0]
    # the Reshape after the Gemm only splits its rows into the two leading dims: the Gemm's
    # input with its rows split the same way is the MatMul's
    if g.shapes.get(x) != (rows, width) or g.shapes.get(gemm.output[0]) != (rows, shape[-1]):
        return None
    flat = g.producer.get(x)
    if flat is not None and flat.op_type == "Reshape" and \
            g.shapes.get(flat.input[0]) == (*shape[:2], width):
        x = flat.input[0]
    else:
        x = _node(plan, "Reshape", [x, _const(plan, prefix + "rows", np.array(
            [*shape[:2], width], np.int64))], prefix + "unflat", (*shape[:2], width))
    plan.remove |= {id(node), id(gemm)}
    weight_name = weight_name or _const(plan, prefix + "weight", np.ascontiguousarray(weight))
    product = _node(plan, "MatMul", [x, weight_name], prefix + "MatMul", shape)
    if bias is None:
        return product
    return _node(plan, "Add", [product, _const(plan, prefix + "bias", np.ascontiguousarray(
        bias, np.float32))], prefix + "Add", shape)
