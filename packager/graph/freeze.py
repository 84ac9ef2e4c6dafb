"""Freeze inputs to constants (`--const NAME=VALUE`) and fold the If nodes that then decide
nothing: a sample rate, a flag or a fixed state leaves the bundle's signature, and the branch it
selects is inlined, so the rest of the pipeline sees one straight graph. An input that decides
an If and holds one value in every calibration sample is frozen without being asked
(calibration_consts)."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import SpecError
from .inspection import dims_of, dtype_name, graph_inputs


def const_value(model: onnx.ModelProto, name: str, value: Any) -> np.ndarray:
    """*value* (a number, nested list or array) as the input's dtype and static shape."""
    inputs = {i.name: i for i in graph_inputs(model)}
    if name not in inputs:
        raise SpecError(f"--const {name}: the model has no input '{name}'",
                        f"inputs are: {', '.join(inputs)}")
    info = inputs[name]
    dtype = np.dtype(dtype_name(info.type.tensor_type.elem_type))
    array = exact_array(name, value, dtype)
    dims = dims_of(info)
    static = all(isinstance(d, int) and d > 0 for d in dims)
    if list(array.shape) == [d for d in dims] or (not static and array.ndim == len(dims)):
        return array
    if array.size == 1 and static:
        return np.full(dims, array.reshape(()), dtype=dtype)
    raise SpecError(f"--const {name}: value of shape {list(array.shape)} does not fit the input's "
                    f"shape {dims}", "give one value (it fills the shape) or an array of that shape")


def exact_array(name: str, value: Any, dtype: np.dtype) -> np.ndarray:
    """*value* as *dtype*, refused unless every element converts exactly: the graph must hold
    the value the manifest records (1e999 or 16000.5 cannot become an int64, 1+2j no real)."""
    import warnings

    shown = _shown(value)
    try:
        given = np.asarray(value)
        if given.dtype == object:   # ragged lists, or ints beyond 64 bits
            given = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SpecError(f"--const {name}={shown}: not a {dtype} value ({exc})",
                        "give a number, a list, or a .npy file") from None
    if given.dtype.kind == "c" and dtype.kind != "c":
        raise SpecError(f"--const {name}={shown}: complex values, the input is {dtype}",
                        "give real numbers")
    if given.dtype.kind not in "biufc":
        raise SpecError(f"--const {name}={shown}: not a {dtype} value (it holds "
                        f"{given.dtype} values)", f"give {dtype} numbers")
    if given.dtype.kind == "f" and dtype.kind != "f" and not np.isfinite(given).all():
        raise SpecError(f"--const {name}={shown}: NaN or infinity cannot be a {dtype} value",
                        f"give a finite whole number in {dtype}'s range")
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        array = given.astype(dtype)
        if dtype.kind == "f":   # rounding to the nearest float is expected; overflow is not
            same = np.array_equal(np.isfinite(array), np.isfinite(given))
        else:
            same = np.array_equal(array.astype(given.dtype), given)
            if dtype.kind in "iu" and given.size:   # 2**63 wraps round and back unchanged
                info = np.iinfo(dtype)
                same = same and int(info.min) <= given.min().item() and \
                    given.max().item() <= int(info.max)
    if not same:
        kind = "a finite" if dtype.kind == "f" else "a whole number that fits"
        raise SpecError(f"--const {name}={shown}: not {kind} {dtype} (the graph would "
                        f"hold {_shown(array.tolist())})", f"give a value that fits {dtype}")
    return array


def _shown(value: Any) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def freeze_inputs(model: onnx.ModelProto, values: Mapping[str, Any]) -> onnx.ModelProto:
    """Return a copy of *model* where each input in *values* is a constant initializer."""
    if not values:
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    arrays = {name: const_value(model, name, value) for name, value in values.items()}
    kept = [i for i in model.graph.input if i.name not in arrays]
    if not [i for i in kept if i.name not in {t.name for t in model.graph.initializer}]:
        raise SpecError(f"--const freezes every input ({', '.join(arrays)}): no inputs left",
                        "leave at least one input unfrozen; a bundle needs an input to run on")
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for name, array in arrays.items():
        model.graph.initializer.append(numpy_helper.from_array(array, name))
    return fold_constant_ifs(model)


def constant_value(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The value of tensor *name* when it depends on constants only (computed with ONNX's
    reference evaluator), else None."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    inits = {i.name for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    needed, stack = [], [name]
    while stack:
        tensor = stack.pop()
        if tensor in inits or not tensor:
            continue
        node = producer.get(tensor)
        if node is None or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                               for a in node.attribute):
            return None   # reads a graph input, or control flow
        if node not in needed:
            needed.append(node)
            stack.extend(node.input)
    order = [n for n in graph.node if n in needed]
    sub = onnx.helper.make_graph(order, "cond", [], [onnx.ValueInfoProto(name=name)],
                                 [i for i in graph.initializer])
    sub_model = onnx.helper.make_model(sub, opset_imports=model.opset_import)
    try:
        return np.asarray(ReferenceEvaluator(sub_model).run(None, {})[0])
    except Exception:  # an op the reference evaluator lacks: leave the If alone
        return None


def fold_constant_ifs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Inline every top-level If whose condition depends on constants only."""
    graph = model.graph
    undecided: set[str] = set()
    while True:
        index = cond = None
        for i, n in enumerate(graph.node):
            if n.op_type == "If" and n.name not in undecided:
                cond = constant_value(model, n.input[0])
                if cond is not None:
                    index = i
                    break
                undecided.add(n.name)
        if index is None:
            return model
        node = graph.node[index]
        branch_name = "then_branch" if bool(cond.all()) else "else_branch"
        branch = next(a.g for a in node.attribute if a.name == branch_name)
        inlined = _inline(branch, node, graph)
        del graph.node[index]
        for offset, new in enumerate(inlined):
            graph.node.insert(index + offset, new)


def _inline(branch: onnx.GraphProto, node: onnx.NodeProto,
            graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The branch's nodes, renamed apart, then Identity nodes onto the If's outputs."""
    prefix = f"{node.name or 'If'}/{len(graph.node)}/"
    local = {o for n in branch.node for o in n.output} | {i.name for i in branch.initializer}
    rename = {name: prefix + name for name in local}
    for init in branch.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = rename[init.name]
        graph.initializer.append(copy)
    nodes = []
    for inner in branch.node:
        new = onnx.NodeProto()
        new.CopyFrom(inner)
        new.name = prefix + (inner.name or inner.op_type)
        new.input[:] = [rename.get(i, i) for i in inner.input]
        new.output[:] = [rename.get(o, o) for o in inner.output]
        for attr in new.attribute:   # nested If/Loop bodies read the branch's tensors by name
            for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _rename_outer(body, rename)
        nodes.append(new)
    for out, branch_out in zip(node.output, branch.output, strict=True):
        nodes.append(onnx.helper.make_node("Identity", [rename.get(branch_out.name,
                                                                   branch_out.name)], [out],
                                           name=prefix + "out/" + out))
    return nodes


def _rename_outer(body: onnx.GraphProto, rename: Mapping[str, str]) -> None:
    """Rename the outer-scope tensors a subgraph reads (its own names shadow them)."""
    own = {o for n in body.node for o in n.output} | {i.name for i in body.input} | \
        {i.name for i in body.initializer}
    outer = {k: v for k, v in rename.items() if k not in own}
    for n in body.node:
        n.input[:] = [outer.get(i, i) for i in n.input]
        for attr in n.attribute:
            for inner in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _rename_outer(inner, outer)
    for out in body.output:
        if out.name in outer:
            out.name = outer[out.name]


def branch_inputs(model: onnx.ModelProto) -> dict[str, list[str]]:
    """The one-element inputs that decide a top-level If (its condition is computed from them
    and constants only, as silero VAD's `Equal(sr, 16000)`): {input: [If names]}."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    inputs = {i.name: i for i in graph_inputs(model)}
    producer = {o: n for n in graph.node for o in n.output}
    found: dict[str, list[str]] = {}
    for node in graph.node:
        if node.op_type != "If":
            continue
        reached, seen, stack, decided = set(), set(), [node.input[0]], True
        while stack and decided:
            tensor = stack.pop()
            if not tensor or tensor in inits or tensor in seen:
                continue
            seen.add(tensor)
            if tensor in inputs:
                dims = dims_of(inputs[tensor])
                decided = all(isinstance(d, int) and d == 1 for d in dims)
                reached.add(tensor)
                continue
            source = producer.get(tensor)
            decided = source is not None and not any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for a in source.attribute)
            stack.extend(source.input if decided else ())
        for name in reached if decided else ():
            found.setdefault(name, []).append(node.name or "If")
    return found


def calibration_consts(model: onnx.ModelProto, samples: Sequence[Mapping[str, Any]],
                       decided: Mapping[str, Sequence[str]], *,
                       log: Callable[[str], None]) -> dict[str, np.ndarray]:
    """The inputs in *decided* (from branch_inputs) that hold one value in every sample, to
    freeze: the bundle is then checked on the branch it was calibrated on, the If folds away
    and its branch is quantized. An input holding several values is refused where the If's
    branches give outputs of other shapes (one static graph cannot take them all)."""
    frozen = {}
    for name, ifs in decided.items():
        values = [np.asarray(s[name]) for s in samples if name in s]
        if not values:
            continue
        distinct = {v.tobytes(): v for v in values}
        if len(distinct) == 1:
            frozen[name] = values[0]
            log(f"input {name} is {_shown(values[0].reshape(-1)[0].item())} in every "
                f"calibration sample and an If branches on it: frozen (pass --const "
                f"{name}=... to choose)")
            continue
        if not all(_branches_agree(model, n) for n in ifs):
            shown = ", ".join(_shown(v.reshape(-1)[0].item()) for v in list(distinct.values())[:4])
            raise SpecError(f"input {name} holds {len(distinct)} values in the calibration "
                            f"samples ({shown}) and the If '{ifs[0]}' branches on it into "
                            "outputs of other shapes: one static graph cannot take them all",
                            f"pass --const {name}=VALUE to build for one value (a bundle per "
                            "value for several)")
    return frozen


def _branches_agree(model: onnx.ModelProto, name: str) -> bool:
    """True where the If's two branches are known to give outputs of one type and static
    shape (declared or inferred); unknown counts as not."""
    inferred = onnx.ModelProto.FromString(model.SerializeToString())
    node = next((n for n in inferred.graph.node if n.op_type == "If" and
                 (n.name or "If") == name), None)
    if node is None:
        return False
    for attr in node.attribute:   # what the branches compute, not what an exporter declared
        for out in attr.g.output if attr.HasField("g") else ():
            out.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(inferred)
    except Exception:
        return False
    node = next(n for n in inferred.graph.node if n.op_type == "If" and (n.name or "If") == name)
    then, other = (next(a.g for a in node.attribute if a.name == b)
                   for b in ("then_branch", "else_branch"))
    for a, b in zip(then.output, other.output, strict=True):
        shapes = [[d.dim_value if d.HasField("dim_value") else None
                   for d in v.type.tensor_type.shape.dim] for v in (a, b)]
        if a.type.tensor_type.elem_type != b.type.tensor_type.elem_type or \
                shapes[0] != shapes[1] or None in shapes[0] or \
                not a.type.tensor_type.HasField("shape"):
            return False
    return True
