"""A dataflow view of an ONNX graph for pattern rewrites: who makes and reads each tensor, the
constants and static shapes, and layout nodes replayed on element numbers (packed_attention.py)."""

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

LAYOUT_OPS = {"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Gather", "Slice", "Split",
              "Flatten", "Identity", "Expand"}   # data movement: the data in, constants beside


FOLD_LIMIT = 1 << 16   # elements: fold shape arithmetic and masks, never a weight


@dataclass
class Graph:
    """A graph's producers, readers, constant values and static shapes."""

    model: Any
    values: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    producer: dict[str, Any] = field(default_factory=dict)
    readers: dict[str, list] = field(default_factory=dict)

    def __post_init__(self):
        for node in self.model.graph.node:
            for name in node.output:
                self.producer[name] = node
            for name in reads(node):
                self.readers.setdefault(name, []).append(node)
        for output in self.model.graph.output:   # read from outside: None
            self.readers.setdefault(output.name, []).append(None)
        self.initializers = {i.name for i in self.model.graph.initializer}
        self.opset = next((o.version for o in self.model.opset_import
                           if o.domain in ("", "ai.onnx")), 0)

    def const(self, name: str) -> Any:
        return self.values.get(name) if name else None

    def next(self, name: str) -> Any:
        """The one node that reads *name*, or None."""
        users = self.readers.get(name, [])
        return users[0] if len(users) == 1 else None

    def initializer(self, name: str) -> str:
        """*name*, or the initializer it is an Identity of; '' when it is neither."""
        while name not in self.initializers and (node := self.producer.get(name)) is not None \
                and node.op_type == "Identity":
            name = node.input[0]
        return name if name in self.initializers else ""


def reads(node) -> set[str]:
    """The tensors *node* reads, those its subgraphs read from the outer scope included."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for inner in graph.node:
                names |= reads(inner)
    return names


def live_nodes(nodes: list, graph) -> list:
    """*nodes* without those whose outputs nothing reads."""
    needed, live = {o.name for o in graph.output}, []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed |= reads(node)
    return live[::-1]


def evaluate(node, feeds: dict, opset: int) -> dict[str, Any]:
    """*node*'s outputs by the onnx reference runtime, at the model's opset."""
    from onnx.reference import ReferenceEvaluator

    outputs = [o for o in node.output if o]
    function = onnx.helper.make_function(
        "edgepack", "probe", [i for i in node.input if i], outputs, [node],
        [onnx.helper.make_opsetid("", opset)])
    return dict(zip(outputs, ReferenceEvaluator(function).run(None, feeds, attributes={}),
                    strict=True))


def static_facts(model) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """The constant tensors of *model* (initializers, Constants, and what small arithmetic on
    them and on static shapes computes) and the static shape of every tensor that has one."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    shapes: dict[str, tuple[int, ...]] = {}
    for _ in range(4):   # a folded shape lets inference reach further, and folding after it
        known = len(values)
        shapes = inferred_shapes(model, values)
        for node in model.graph.node:
            inputs = [i for i in node.input if i]
            if node.domain not in ("", "ai.onnx") or all(o in values for o in node.output) or \
                    node.op_type.startswith("Random") or node.op_type in ("Bernoulli",
                                                                          "Multinomial"):
                continue
            if node.op_type == "Shape" and shapes.get(node.input[0]) is not None:
                attrs = {a.name: a.i for a in node.attribute}
                dims = shapes[node.input[0]][attrs.get("start", 0):attrs.get("end")]
                values[node.output[0]] = np.array(dims, np.int64)
            elif node.op_type == "Identity" and node.input[0] in values:
                values[node.output[0]] = values[node.input[0]]
            elif (inputs or node.op_type == "Constant") and \
                    all(i in values and values[i].size <= FOLD_LIMIT for i in inputs):
                try:
                    outs = evaluate(node, {i: values[i] for i in inputs}, opset)
                except Exception:   # an op the reference runtime lacks: not a constant to us
                    continue
                values.update({name: np.asarray(v) for name, v in outs.items()
                               if v is not None and np.asarray(v).size <= FOLD_LIMIT})
        if len(values) == known:
            break
    return values, shapes


def inferred_shapes(model, values) -> dict[str, tuple[int, ...]]:
    """Static shapes by onnx shape inference, given the folded tensors as initializers (and
    the weights as typed inputs, so that inference copies no weight)."""
    graph = onnx.helper.make_graph(
        [n for n in model.graph.node if not all(o in values for o in n.output)],
        model.graph.name, list(model.graph.input), list(model.graph.output))
    inputs = {i.name for i in model.graph.input}
    # onnx has no schema for onnxruntime's contrib ops: the types our rewrites wrote for their
    # outputs carry inference past them (a fused layer's output into the next layer)
    contrib = {o for n in model.graph.node if n.domain not in ("", "ai.onnx") for o in n.output}
    graph.value_info.extend(v for v in model.graph.value_info if v.name in contrib)
    for name, value in values.items():
        if value.size <= FOLD_LIMIT:
            graph.initializer.append(numpy_helper.from_array(value, name))
        elif name not in inputs:
            graph.input.append(onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
    probe = onnx.helper.make_model(graph, opset_imports=list(model.opset_import),
                                   ir_version=model.ir_version)
    with contextlib.suppress(Exception):   # what inference cannot type stays unknown
        probe = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    shapes = {}
    for info in list(probe.graph.value_info) + list(probe.graph.input) + \
            list(probe.graph.output):
        tensor = info.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[info.name] = tuple(d.dim_value for d in tensor.shape.dim)
    shapes.update({name: tuple(v.shape) for name, v in values.items()})
    return shapes


def replay(chain, index, g: Graph):
    """*index* (element numbers) carried through the layout nodes of *chain*."""
    for node, out in chain:
        if node is None:   # an elementwise op with a constant that only spreads: to its shape
            index = np.broadcast_to(index, g.shapes[out])
            continue
        feeds = {node.input[0]: index, **{i: g.values[i] for i in node.input[1:] if i}}
        index = evaluate(node, feeds, g.opset)[out]
    return index


def is_layout(node, g: Graph) -> bool:
    return node.op_type in LAYOUT_OPS and node.domain in ("", "ai.onnx") and \
        g.const(node.input[0]) is None and \
        all(g.const(i) is not None for i in node.input[1:] if i)


def back(name: str, g: Graph, layout: bool = True):
    """From *name* back through layout nodes (unless *layout* is False) and multiplications
    or divisions by a constant scalar: (the tensor they start from, the layout chain in
    forward order as (node, output), every node passed, the product of the scalars)."""
    chain, passed, factor = [], [], 1.0
    while (node := g.producer.get(name)) is not None:
        if layout and is_layout(node, g):
            chain.append((node, name))
            passed.append(node)
            name = node.input[0]
            continue
        if node.op_type not in ("Mul", "Div") or node.domain not in ("", "ai.onnx") or \
                g.shapes.get(name) is None:
            break
        sides = ((0, 1), (1, 0)) if node.op_type == "Mul" else ((0, 1),)
        found = [(node.input[d], float(c.ravel()[0])) for d, o in sides
                 if g.const(node.input[d]) is None and (c := g.const(node.input[o])) is not None
                 and c.size == 1 and c.ravel()[0] != 0 and
                 g.shapes.get(node.input[d]) == g.shapes[name]]
        if not found:
            break
        name, value = found[0]
        factor *= value if node.op_type == "Mul" else 1.0 / value
        passed.append(node)
    return name, chain[::-1], passed, factor


def forward(name: str, g: Graph) -> list:
    """The layout nodes that alone read *name*, one after the other: [(node, output)]."""
    chain = []
    while (node := g.next(name)) is not None and node.op_type != "Split" and \
            is_layout(node, g) and node.input[0] == name:
        chain.append((node, node.output[0]))
        name = node.output[0]
    return chain


def find_linear(out: str, g: Graph):
    """The Linear that computes *out* (MatMul, MatMul + Add bias, Gemm): (its input, weight
    as (in, out), the weight's initializer when it has that layout, bias or None, nodes)."""
    node, nodes, bias = g.producer.get(out), [], None
    if node is not None and node.op_type == "Add":
        for a, b in ((0, 1), (1, 0)):
            inner, value = g.producer.get(node.input[a]), g.const(node.input[b])
            if inner is not None and inner.op_type == "MatMul" and value is not None and \
                    value.ndim == 1:
                nodes, bias, node = [node], value, inner
                break
        else:
            return None
    if node is None or node.domain not in ("", "ai.onnx") or \
            g.const(node.input[0]) is not None:
        return None
    weight, name = g.const(node.input[1]), g.initializer(node.input[1])
    if node.op_type == "Gemm" and weight is not None:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or \
                attrs.get("beta", 1.0) != 1.0:
            return None
        if attrs.get("transB", 0):
            weight, name = weight.T, ""
        if len(node.input) > 2 and node.input[2]:
            bias = g.const(node.input[2])
            if bias is None or bias.size != weight.shape[-1]:
                return None
            bias = bias.reshape(-1)
    elif node.op_type != "MatMul" or weight is None:
        return None
    if weight.ndim != 2 or weight.dtype != np.float32 or \
            (bias is not None and (bias.shape != (weight.shape[1],) or bias.dtype != np.float32)):
        return None
    return node.input[0], weight, name, bias, nodes + [node]
