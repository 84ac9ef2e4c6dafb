"""Our attention rewrite: the packed-QKV attention of nn.MultiheadAttention (and today's
transformers BERT) as onnxruntime's contrib Attention op, where onnxruntime's own fusion patterns
miss it. Used by fusion.fuse_transformer before onnxruntime's optimizer runs."""

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .dataflow import Graph, back, find_linear, forward, live_nodes, reads, replay, static_facts

# --- our rewrite: the packed-QKV attention of nn.MultiheadAttention --------------------------
#
# Matched on what the graph computes, not on the exporter's node sequence: the layout nodes
# between the QKV projection and the attention MatMuls (Reshape, Transpose, Gather, Split...)
# are replayed on element numbers, and must give exactly onnxruntime's split of the packed
# projection into heads; the mask's likewise must give one value per key, the same for every
# query and head. The exports before and after onnxsim, batch-first or not, all reduce to those
# checks. The scale must be 1/sqrt(head size). Rows whose keys are all masked (an all-zero
# attention mask) are the one difference: PyTorch gives NaN (or the guard's 0), Attention the
# mean of V.

PACKED_ATTENTION = "1.14"   # Attention's mask_filter_value, which torch's -inf mask needs


def fuse_packed_attention(model: onnx.ModelProto) -> onnx.ModelProto:
    """*model* with each self-attention whose query, key and value come from one input
    (nn.MultiheadAttention's packed projection, or three Linears) replaced by onnxruntime's
    Attention op; the graph unchanged where nothing matches exactly."""
    if not any(n.op_type == "Softmax" for n in model.graph.node):
        return model
    g = Graph(model, *static_facts(model))
    plans, taken = {}, set()
    for softmax in [n for n in model.graph.node if n.op_type == "Softmax"]:
        try:
            plan = _match(softmax, g)
        except Exception:   # a shape or layout the replay cannot follow: not a match
            plan = None
        if plan is not None and not plan.remove & taken:
            plans[plan.anchor] = plan
            taken |= plan.remove
    if not plans:
        return model
    fused = onnx.ModelProto.FromString(model.SerializeToString())
    nodes, inits, infos, masks = [], [], [], {}
    for i, (node, copy) in enumerate(zip(model.graph.node, fused.graph.node, strict=True)):
        if id(node) not in taken:
            nodes.append(copy)
        for name in node.output if id(node) in taken else ():
            if name in plans:   # the new nodes take the place of the last one they replace
                new = _Emit(f"packed_attention_{i}/")
                plans[name].emit(new, masks)
                nodes, inits, infos = nodes + new.nodes, inits + new.inits, infos + new.infos
    nodes = live_nodes(nodes, fused.graph)
    made = {i.name for i in fused.graph.input} | {t.name for t in fused.graph.initializer} | \
        {t.name for t in inits} | {o for n in nodes for o in n.output}
    del fused.graph.node[:]
    for node in nodes:   # a Shape of a removed tensor: its folded value instead
        fused.graph.node.extend([node] if reads(node) <= made else [onnx.helper.make_node(
            "Constant", [], [o], value=numpy_helper.from_array(g.values[o], o))
            for o in node.output if o])
    fused.graph.initializer.extend(inits)
    typed = {v.name for v in fused.graph.value_info}
    fused.graph.value_info.extend(v for v in infos if v.name not in typed)
    used = set().union(*(reads(n) for n in fused.graph.node)) | \
        {i.name for i in fused.graph.input}   # an initializer that is an input's default stays
    present = used | {o for n in fused.graph.node for o in n.output}
    for field_, keep in ((fused.graph.initializer, used), (fused.graph.value_info, present)):
        kept = [t for t in field_ if t.name in keep]
        del field_[:]
        field_.extend(kept)
    if not any(o.domain == "com.microsoft" for o in fused.opset_import):
        fused.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return fused


@dataclass
class _Plan:
    """One attention to rewrite: the nodes it replaces, the tensor its new nodes end in."""

    remove: set[int]   # node ids
    anchor: str
    emit: Any          # (_Emit, masks made so far) -> None


@dataclass
class _Emit:
    """New nodes, the initializers they read, and the types of what they write (which the
    quantizer's shape inference cannot find past a contrib op)."""

    prefix: str
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    infos: list = field(default_factory=list)

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(value, self.prefix + name))
        return self.prefix + name

    def node(self, op: str, inputs: list, name: str, shape, dtype: int = onnx.TensorProto.FLOAT,
             output: str = "", **attrs) -> str:
        output = output or self.prefix + name
        self.nodes.append(onnx.helper.make_node(op, inputs, [output], name=self.prefix + name,
                                                **attrs))
        self.infos.append(onnx.helper.make_tensor_value_info(output, dtype, list(shape)))
        return output

    def layout(self, steps: list, x: str, shape, name: str,
               dtype: int = onnx.TensorProto.FLOAT, output: str = "") -> str:
        """*x* of *shape* through [(Reshape, shape) or (Transpose, perm)]."""
        for i, (op, arg) in enumerate(steps):
            last = output if i == len(steps) - 1 else ""
            if op == "Reshape":
                shape = list(arg)
                shape_name = self.const(f"{name}_{i}_shape", np.array(arg, np.int64))
                x = self.node("Reshape", [x, shape_name], f"{name}_{i}", shape, dtype, last)
            else:
                shape = [shape[p] for p in arg]
                x = self.node("Transpose", [x], f"{name}_{i}", shape, dtype, last, perm=arg)
        return x


def _row_orders(batch: int, seq: int) -> dict[str, Any]:
    """Row number of token (b, s) in a (batch, seq) and in a (seq, batch) layout."""
    b, s = np.arange(batch)[:, None], np.arange(seq)[None, :]
    return {"bs": b * seq + s, "sb": s * batch + b}


def _match(softmax, g: Graph) -> _Plan | None:
    """The rewrite of the attention around *softmax*, when it is exactly packed-QKV
    self-attention with scale 1/sqrt(head size) and no mask or a key-padding mask."""
    found = _scores(softmax, g)
    if found is None:
        return None
    scores_shape, region, qk, mask_name, scale = found
    seq = scores_shape[-1]
    probs = _probabilities(softmax, g)
    if probs is None:
        return None
    pv, guard = probs
    region += guard + [pv]
    paths = [back(name, g) for name in (qk.input[0], qk.input[1], pv.input[1])]
    if paths[2][3] != 1.0 or (qkv := _qkv([p[0] for p in paths], g)) is None:
        return None
    source, weight, weight_name, bias, projection, rows, starts = qkv
    region += projection + [n for p in paths for n in p[2]]
    scale *= paths[0][3] * paths[1][3]
    width = weight.shape[1]
    hidden = width // 3
    q_shape, k_shape, v_shape = (g.shapes.get(n) for n in (qk.input[0], qk.input[1],
                                                           pv.input[1]))
    if q_shape is None or k_shape is None or v_shape is None:
        return None
    head, lead = q_shape[-1], q_shape[:-2]
    heads, batch = hidden // head, rows // seq
    if heads * head != hidden or batch * seq != rows or q_shape[-2] != seq or \
            k_shape != lead + (head, seq) or v_shape != lead + (seq, head) or \
            scores_shape[:-2] != lead or int(np.prod(lead)) != batch * heads or \
            abs(scale * np.sqrt(head) - 1.0) > 1e-5:
        return None
    q, k, v = (replay(path[1], start, g) for path, start in zip(paths, starts, strict=True))
    if (q.shape, k.shape, v.shape) != (q_shape, k_shape, v_shape):
        return None
    q, k, v = (t.reshape(batch, heads, *t.shape[-2:]) for t in (q, k, v))
    orders = _head_split_orders(q, k, v, batch, heads, seq, head, width)
    mask = _key_padding_mask(mask_name, g, batch, heads, seq, scores_shape) if mask_name \
        else None
    out = _output(pv, g, batch, heads, seq, head)
    if not orders or (mask_name and mask is None) or out is None:
        return None
    region += out["nodes"]
    remove = {id(n) for n in region}
    if _read_outside(region, remove, out["anchor"], g):
        return None
    x_source, x_steps = _attention_input(source, g, orders, batch, seq, weight.shape[0])

    def emit(new: _Emit, masks: dict) -> None:
        inputs = [new.layout(x_steps, x_source, g.shapes.get(x_source), "input"),
                  weight_name or new.const("qkv_weight", weight),
                  new.const("qkv_bias", bias if bias is not None   # QAttention needs one
                            else np.zeros(width, np.float32))]
        attrs = {"num_heads": heads}
        if mask:
            inputs.append(_mask_index(mask, masks, new, batch, seq))
            attrs["mask_filter_value"] = max(mask["fill"], float(np.finfo(np.float32).min))
        attention = new.node("Attention", inputs, "attention", (batch, seq, hidden),
                             domain="com.microsoft", **attrs)
        out["after"](new, attention)

    return _Plan(remove, out["anchor"], emit)


def _scores(softmax, g: Graph):
    """(scores shape, region so far, the Q.K MatMul, the mask input or '', the scale on the
    way) of the scores *softmax* normalises over its last axis, or None."""
    scores_shape = g.shapes.get(softmax.input[0])
    if scores_shape is None or len(scores_shape) not in (3, 4) or \
            scores_shape[-1] != scores_shape[-2]:
        return None
    axis = next((a.i for a in softmax.attribute if a.name == "axis"),
                -1 if g.opset >= 13 else 1)
    if axis % len(scores_shape) != len(scores_shape) - 1:
        return None
    add = g.producer.get(softmax.input[0])
    sides = [(add.input[a], add.input[b]) for a, b in ((0, 1), (1, 0))] \
        if add is not None and add.op_type == "Add" else [(softmax.input[0], "")]
    for scores, mask_name in sides:
        base, _, passed, scale = back(scores, g, layout=False)
        qk = g.producer.get(base)
        if qk is not None and qk.op_type == "MatMul" and g.shapes.get(scores) == scores_shape:
            region = [softmax] + ([add] if mask_name else []) + passed + [qk]
            return scores_shape, region, qk, mask_name, scale
    return None


def _head_split_orders(q, k, v, batch: int, heads: int, seq: int, head: int,
                       width: int) -> list:
    """The token row orders under which Q, K and V (the packed weight's element indices each
    reads) are onnxruntime's head split of one packed QKV row per token."""
    hidden = width // 3
    cols = np.arange(heads)[:, None] * head + np.arange(head)   # onnxruntime's head split
    orders = []
    for order, row in _row_orders(batch, seq).items():
        start = row * width   # (batch, seq): the first element of each token's row
        if np.array_equal(q, start[:, None, :, None] + cols[None, :, None, :]) and \
                np.array_equal(k, start[:, None, None, :] + hidden + cols[None, :, :, None]) \
                and np.array_equal(v, start[:, None, :, None] + 2 * hidden +
                                   cols[None, :, None, :]):
            orders.append(order)
    return orders


def _read_outside(region, remove: set, anchor: str, g: Graph) -> bool:
    """Whether a node outside the rewrite reads what it removes (other than its shape)."""
    for node in region:
        for name in node.output:
            if name and name != anchor and \
                    any(u is None or (id(u) not in remove and
                                      not all(o in g.values for o in u.output))
                        for u in g.readers.get(name, [])):
                return True
    return False


def _probabilities(softmax, g: Graph):
    """The MatMul of *softmax*'s probabilities with V, and the nodes between them: none, or the
    guard transformers writes (Where(IsNaN(p), 0, p)), which only rows with every key masked
    reach; else None."""
    probs, guard = softmax.output[0], []
    readers = g.readers.get(probs, [])
    if len(readers) == 2 and {n.op_type for n in readers if n is not None} == {"IsNaN", "Where"}:
        isnan, where = sorted(readers, key=lambda n: n.op_type)
        zero = g.const(where.input[1])
        if list(where.input) != [isnan.output[0], where.input[1], probs] or zero is None or \
                np.any(zero != 0) or g.shapes.get(where.output[0]) != g.shapes.get(probs):
            return None
        probs, guard = where.output[0], [isnan, where]
    pv = g.next(probs)
    if pv is None or pv.op_type != "MatMul" or pv.input[0] != probs:
        return None
    return pv, guard


def _qkv(tensors: list[str], g: Graph):
    """The projection(s) that compute *tensors* (query, key and value before their heads are
    split): one packed Linear, or three of one input. (input, weight (in, 3 x hidden), its
    initializer, bias or None, nodes, rows, each tensor's element numbers in the packed
    output)."""
    if len(set(tensors)) == 1 and (linear := find_linear(tensors[0], g)) is not None:
        source, weight, weight_name, bias, nodes = linear
        shape = g.shapes.get(tensors[0])
        if weight.shape[1] % 3 or shape is None or shape[-1] != weight.shape[1]:
            return None
        rows = int(np.prod(shape)) // weight.shape[1]
        return source, weight, weight_name, bias, nodes, rows, \
            [np.arange(rows * weight.shape[1]).reshape(shape)] * 3
    linears = [find_linear(t, g) for t in tensors]
    shapes = {g.shapes.get(t) for t in tensors}
    if len(set(tensors)) != 3 or any(x is None for x in linears) or \
            len({x[0] for x in linears}) != 1 or len({x[1].shape for x in linears}) != 1 or \
            len(shapes) != 1 or None in shapes:
        return None
    shape, hidden = shapes.pop(), linears[0][1].shape[1]
    if shape[-1] != hidden:
        return None
    rows = int(np.prod(shape)) // hidden
    bias = None if all(x[3] is None for x in linears) else np.concatenate(
        [x[3] if x[3] is not None else np.zeros(hidden, np.float32) for x in linears])
    starts = [(np.arange(rows)[:, None] * 3 * hidden + part * hidden +
               np.arange(hidden)).reshape(shape) for part in range(3)]
    return linears[0][0], np.concatenate([x[1] for x in linears], axis=1), "", bias, \
        [n for x in linears for n in x[4]], rows, starts


def _key_padding_mask(name: str, g: Graph, batch: int, heads: int, seq: int,
                      scores_shape) -> dict | None:
    """The (batch, seq) boolean mask of keys that *name* spreads over the scores: Where(cond,
    fill, 0) or Where(cond, 0, fill), cond that mask through layout nodes and Ands with
    all-true constants, each key the same for every query and head; else None."""
    base, after, passed, factor = back(name, g)
    where = g.producer.get(base)
    if factor != 1.0 or len(passed) != len(after) or where is None or \
            where.op_type != "Where":
        return None
    a, b = g.const(where.input[1]), g.const(where.input[2])
    if a is None or b is None or any(np.any(c != c.ravel()[0]) for c in (a, b)):
        return None   # one value each side: Where only spreads its condition
    a, b = float(a.ravel()[0]), float(b.ravel()[0])
    if b == 0 and a < 0:
        masked, fill = True, a   # cond true: the key is masked
    elif a == 0 and b < 0:
        masked, fill = False, b
    else:
        return None
    steps, name = [(None, base)] + after, where.input[0]
    while True:
        key, chain, passed, _ = back(name, g)
        node = g.producer.get(key)
        if len(passed) != len(chain):
            return None
        steps = chain + steps
        ones = [d for d, o in ((0, 1), (1, 0)) if node is not None and node.op_type == "And"
                and (c := g.const(node.input[o])) is not None and c.dtype == bool and c.all()]
        if not ones:
            break
        steps, name = [(None, key)] + steps, node.input[ones[0]]   # And(x, true): x, spread
    if g.shapes.get(key) is None or int(np.prod(g.shapes[key])) != batch * seq:
        return None
    spread = replay(steps, np.arange(batch * seq).reshape(g.shapes[key]), g)
    spread = np.broadcast_to(spread, scores_shape).reshape(batch, heads, seq, seq)
    keys = np.broadcast_to(np.arange(batch * seq).reshape(batch, 1, 1, seq), spread.shape)
    if not np.array_equal(spread, keys):
        return None
    return {"cond": key, "masked": masked, "fill": fill, "shape": g.shapes[key]}


def _output(pv, g: Graph, batch: int, heads: int, seq: int, head: int) -> dict | None:
    """How the attention's output (batch, seq, hidden) reaches the rest of the graph: the
    layout nodes after scores x V, and the output projection when it can be taken too."""
    hidden = heads * head
    shape = g.shapes.get(pv.output[0])
    if shape not in ((batch, heads, seq, head), (batch * heads, seq, head)):
        return None
    by_head = np.arange(batch * hidden * seq).reshape(batch, heads, seq, head)
    merged = by_head.transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    chain, index, end = forward(pv.output[0], g), by_head.reshape(shape), None
    for i in range(len(chain) + 1):   # the last tensor that is the output's rows, in some order
        if i:
            index = replay(chain[i - 1:i], index, g)
        for order in ("bs", "sb") if index.shape[-1] == hidden else ():
            layout = merged if order == "bs" else merged.transpose(1, 0, 2)
            if np.array_equal(index.reshape(-1, hidden), layout.reshape(-1, hidden)):
                first = index.reshape(-1, hidden)[:, 0]   # element (b, 0, s, 0) of each row
                end = (i, order, index.shape,
                       first // (hidden * seq) * seq + first // head % seq)
    if end is None:
        return None
    taken, order, last_shape, row_of = end
    nodes = [pv] + [c[0] for c in chain[:taken]]
    last = nodes[-1].output[0]
    projection = _projection_after(last, g, batch, seq, hidden, row_of)
    if projection is not None:
        weight, bias, more, anchor = projection

        def after(new: _Emit, attention: str) -> None:
            shape = (batch, seq, weight.shape[1])
            product = new.node("MatMul", [attention, new.const("out_weight", weight)],
                               "out_product", shape, output="" if bias is not None else anchor)
            if bias is not None:
                new.node("Add", [product, new.const("out_bias", bias)], "out_add", shape,
                         output=anchor)
        return {"nodes": nodes + more, "anchor": anchor, "after": after}

    transpose = order == "sb" and batch > 1
    steps = [("Transpose", [1, 0, 2])] if transpose else []
    steps += [("Reshape", list(last_shape))] \
        if tuple(last_shape) != ((seq, batch, hidden) if transpose else (batch, seq, hidden)) \
        else []
    steps = steps or [("Reshape", list(last_shape))]

    def glue(new: _Emit, attention: str) -> None:
        new.layout(steps, attention, (batch, seq, hidden), "output", output=last)
    return {"nodes": nodes, "anchor": last, "after": glue}


def _projection_after(name: str, g: Graph, batch: int, seq: int, hidden: int, row_of):
    """The output projection that alone reads the attention output *name*, when layout nodes
    after it bring its rows back to (batch, seq): (weight (hidden, out), bias or None, its
    nodes and those layout nodes, the tensor they end in); else None."""
    node = g.next(name)
    if node is None or node.op_type not in ("MatMul", "Gemm") or node.input[0] != name:
        return None
    out = node.output[0]
    add = g.next(out) if node.op_type == "MatMul" else None
    if add is not None and add.op_type == "Add" and find_linear(add.output[0], g) is not None:
        out = add.output[0]
    linear = find_linear(out, g)
    if linear is None or linear[0] != name or linear[1].shape[0] != hidden:
        return None
    weight, bias, taken = linear[1], linear[3], linear[4][::-1]
    width = weight.shape[1]
    if g.shapes.get(out) is None or int(np.prod(g.shapes[out])) != batch * seq * width:
        return None
    index = (row_of[:, None] * width + np.arange(width)).reshape(g.shapes[out])
    target = np.arange(batch * seq * width).reshape(batch, seq, width)
    chain, found = forward(out, g), None
    for i in range(len(chain) + 1):
        if i:
            index = replay(chain[i - 1:i], index, g)
        if np.array_equal(index, target):
            found = i
    if found is None:
        return None
    layout = [c[0] for c in chain[:found]]
    return weight, bias, taken + layout, (layout or taken)[-1].output[0]


def _attention_input(source: str, g: Graph, orders, batch: int, seq: int, width: int):
    """Attention's (batch, seq, width) input: an existing tensor, and the fewest layout steps
    [(op, shape or perm)] that make it from the projection's input."""
    while (node := g.producer.get(source)) is not None and node.op_type == "Reshape" and \
            g.shapes.get(node.input[0]) is not None:
        source = node.input[0]   # the same elements in the same order
    shape, options = g.shapes.get(source), []
    if "bs" in orders:
        options.append((source, [] if shape == (batch, seq, width)
                        else [("Reshape", [batch, seq, width])]))
    if "sb" in orders:
        node = g.producer.get(source)
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None) \
            if node is not None and node.op_type == "Transpose" else None
        if perm == [1, 0, 2] and g.shapes.get(node.input[0]) == (batch, seq, width):
            options.append((node.input[0], []))
        else:
            options.append((source, ([] if shape == (seq, batch, width) else
                                     [("Reshape", [seq, batch, width])]) +
                            [("Transpose", [1, 0, 2])]))
    return min(options, key=lambda option: len(option[1]))


def _mask_index(mask: dict, masks: dict, new: _Emit, batch: int, seq: int) -> str:
    """Attention's (batch, seq) int32 mask, 1 where a key is attended: made once per mask."""
    key = (mask["cond"], mask["masked"])
    if key not in masks:
        x, shape, flag = mask["cond"], mask["shape"], onnx.TensorProto.BOOL
        if mask["masked"]:
            x = new.node("Not", [x], "mask_keep", shape, flag)
        x = new.layout([("Reshape", [batch, seq])] if tuple(shape) != (batch, seq) else [], x,
                       shape, "mask_2d", flag)
        masks[key] = new.node("Cast", [x], "mask_index", (batch, seq), onnx.TensorProto.INT32,
                              to=onnx.TensorProto.INT32)
    return masks[key]
