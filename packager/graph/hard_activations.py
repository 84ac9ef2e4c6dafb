"""Write HardSwish / HardSigmoid decompositions as the single ONNX ops they compute.

paddle2onnx and older exporters write x * clip(x + 3, 0, 6) / 6 as Add, Clip, Mul and Div.
onnxruntime fuses Conv + HardSwish-less chains poorly, and its INT8 graph puts a Q/DQ pair
around each of the four ops (PaddleOCR's text-direction classifier: QLinearMul 0.6 ms and
QLinearAdd 0.3 ms over FP32's, 27 float islands). One HardSwish (opset 14) is the same function:
the rewrite is exact up to float rounding, and the quantizer sees one activation per block.
"""

from pathlib import Path
from typing import Any

import numpy as np

from .modelio import load_model, save_model

HARDSWISH_OPSET = 14
# opset 14 changed no op's default behaviour from 13 (new types, Reshape's allowzero=0, the
# recurrent ops' layout=0, BatchNormalization's training outputs), so a 13 graph is raised to 14
RAISABLE_OPSET = 13


def _scalar(graph: Any, name: str, consts: dict[str, np.ndarray]) -> float | None:
    value = consts.get(name)
    if value is None or value.size != 1:
        return None
    return float(value.reshape(()))


def _constants(graph: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    found = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            found[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return found


def _clip_bounds(node: Any, consts: dict[str, np.ndarray], graph: Any) -> tuple | None:
    if len(node.input) >= 3 and node.input[1] and node.input[2]:
        return (_scalar(graph, node.input[1], consts), _scalar(graph, node.input[2], consts))
    attrs = {a.name: a.f for a in node.attribute}
    if "min" in attrs and "max" in attrs:
        return attrs["min"], attrs["max"]
    return None


def _close(value: float | None, want: float) -> bool:
    return value is not None and abs(value - want) <= 1e-6 * max(1.0, abs(want))


def rewrite(model: Any) -> dict[str, int]:
    """Rewrite *model* (ModelProto) in place; returns how many of each op were made."""
    import onnx

    graph = model.graph
    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset.version < RAISABLE_OPSET:
        return {"HardSwish": 0, "HardSigmoid": 0}
    consts = _constants(graph)
    users: dict[str, list] = {}
    for node in graph.node:
        for i in node.input:
            users.setdefault(i, []).append(node)
    outputs = {o.name for o in graph.output}

    def only_user(tensor: str) -> Any:
        found = users.get(tensor, [])
        return found[0] if len(found) == 1 and tensor not in outputs else None

    def other(node: Any, tensor: str) -> str | None:
        rest = [i for i in node.input if i != tensor]
        return rest[0] if len(node.input) == 2 and len(rest) == 1 else None

    def div_by_six(node: Any, tensor: str) -> bool:
        k = _scalar(graph, other(node, tensor) or "", consts)
        return (node.op_type == "Div" and node.input[0] == tensor and _close(k, 6.0)) or \
            (node.op_type == "Mul" and _close(k, 1 / 6))

    drop, made = set(), {"HardSwish": 0, "HardSigmoid": 0}
    replaced: dict[int, Any] = {}
    for add in list(graph.node):
        if add.op_type != "Add" or id(add) in drop:
            continue
        x = next((i for i in add.input if _close(_scalar(graph, i, consts), 3.0)
                  and i in consts), None)
        x = other(add, x) if x else None
        clip = only_user(add.output[0]) if x else None
        if clip is None or clip.op_type != "Clip" or clip.input[0] != add.output[0]:
            continue
        bounds = _clip_bounds(clip, consts, graph)
        if not bounds or not _close(bounds[0], 0.0) or not _close(bounds[1], 6.0):
            continue
        nxt = only_user(clip.output[0])
        if nxt is None:
            continue
        chain, op, out = [add, clip], None, None
        if nxt.op_type == "Mul" and other(nxt, clip.output[0]) == x:   # x * clip / 6
            last = only_user(nxt.output[0])
            if last is not None and div_by_six(last, nxt.output[0]):
                chain, op, out = chain + [nxt, last], "HardSwish", last.output[0]
        elif div_by_six(nxt, clip.output[0]):                          # clip / 6 (* x)
            last = only_user(nxt.output[0])
            if last is not None and last.op_type == "Mul" and other(last, nxt.output[0]) == x:
                chain, op, out = chain + [nxt, last], "HardSwish", last.output[0]
            else:
                chain, op, out = chain + [nxt], "HardSigmoid", nxt.output[0]
        if op is None:
            continue
        attrs = {"alpha": 1 / 6, "beta": 0.5} if op == "HardSigmoid" else {}
        fused = onnx.helper.make_node(op, [x], [out], name=f"{add.name or out}_{op}", **attrs)
        replaced[id(chain[-1])] = fused
        drop.update(id(n) for n in chain[:-1])
        made[op] += 1
    if not replaced:
        return made
    if made["HardSwish"] and opset.version < HARDSWISH_OPSET:
        opset.version = HARDSWISH_OPSET
    kept = [replaced.get(id(n), n) for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(kept)
    _drop_unused_constants(graph)
    return made


def _drop_unused_constants(graph: Any) -> None:
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [n for n in graph.node if n.op_type != "Constant" or n.output[0] in used]
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    inits = [i for i in graph.initializer if i.name in used]
    if len(inits) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(inits)


def fuse_hard_activations(model: Path, output: Path) -> dict[str, int]:
    """Write *model* to *output* with its HardSwish/HardSigmoid chains as single ops."""
    proto = load_model(model)
    made = rewrite(proto)
    save_model(proto, output)
    return made
