"""Load, validate and save ONNX models, with their external data."""

import heapq
from pathlib import Path

import onnx

from ..errors import ModelError

PROTOBUF_LIMIT = 2 * 1024**3  # protobuf cannot serialise a single message above 2 GiB


def load_model(path: Path, *, check: bool = True, external_data: bool = True) -> onnx.ModelProto:
    """Load *path* (and any external data beside it) or raise ModelError naming the fix."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: no such file", "check the path to the .onnx model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning, ValueError...
        raise ModelError(f"{path}: not a readable ONNX model ({type(exc).__name__})",
                         "the file is corrupt or truncated, or not ONNX; export it again") from None
    if not model.graph.node or not model.opset_import:
        raise ModelError(f"{path}: not an ONNX model (no graph nodes or opset)",
                         "pass a .onnx file exported from your framework")
    if not model.graph.output:
        raise ModelError(f"{path}: the graph has no outputs",
                         "the file is corrupt, or the export lost its outputs; export it again")
    damaged = _first_non_text(model)
    if damaged:
        raise ModelError(f"{path}: not a readable ONNX model ({damaged} is not UTF-8 text)",
                         "the file is corrupt or truncated; export it again")
    if external_data and has_external_data(model):
        # onnx names neither a missing data file nor the tensor (it raises ValidationError)
        for location in external_locations(model):
            if not (path.parent / location).is_file():
                raise ModelError(f"{path}: external data file missing ({location})",
                                 f"keep {location} next to {path.name}, as exported")
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ModelError(f"{path}: its external data cannot be read ({first[:200]})",
                             "the .data file is truncated or not this model's; export it "
                             "again") from None
    if check:
        check_opset(model, path)
    if check:
        try:
            onnx.checker.check_model(model, full_check=False)
        except (onnx.checker.ValidationError, Exception) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"{path}: invalid ONNX model ({first[:200]})",
                             "re-export the model; onnx.checker must accept it") from None
    return model


def _first_non_text(model: onnx.ModelProto) -> str:
    """Where a damaged file has bytes in a name (protobuf hands invalid UTF-8 back as bytes)."""
    graph = model.graph
    for node in graph.node:
        for field, value in (("op type", node.op_type), ("node name", node.name),
                             ("domain", node.domain)):
            if isinstance(value, bytes):
                return f"a {field}"
        if any(isinstance(n, bytes) for n in [*node.input, *node.output]):
            return "a tensor name"
    values = [*graph.input, *graph.output, *graph.value_info, *graph.initializer]
    if any(isinstance(v.name, bytes) for v in values) or \
            any(isinstance(e.domain, bytes) for e in model.opset_import):
        return "a tensor name"
    return ""


def external_locations(model: onnx.ModelProto) -> list[str]:
    """The files *model*'s external tensors live in, relative to the model's folder."""
    found = []
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entry = {e.key: e.value for e in tensor.external_data}
            if entry.get("location") and entry["location"] not in found:
                found.append(entry["location"])
    return found


def check_opset(model: onnx.ModelProto, path: Path) -> None:
    """Refuse a model stamped with an opset newer than onnx and onnxruntime here read."""
    import onnxruntime

    opset, newest = opset_of(model), onnx.defs.onnx_opset_version()
    if opset > newest:
        raise ModelError(f"{path}: opset {opset} is newer than this onnx {onnx.__version__} / "
                         f"onnxruntime {onnxruntime.__version__} support (opsets 7 to {newest})",
                         f"export the model at opset {newest} or lower (e.g. --opset 17)")


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def is_large(model: onnx.ModelProto) -> bool:
    """True when *model* must keep its weights in an external data file (protobuf's limit)."""
    return has_external_data(model) or model.ByteSize() >= PROTOBUF_LIMIT


def save_model(model: onnx.ModelProto, path: Path, *, location: str | None = None) -> Path:
    """Save *model* to *path*, self-contained below 2 GiB, else with a `<name>.data` file.

    *location* names the data file when *path* is a temporary name for the final file.
    """
    path = Path(path)
    if is_large(model):
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=location or path.name + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))
    return path


def opset_of(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return 0


def sort_topologically(graph: onnx.GraphProto) -> None:
    """Reorder *graph*'s nodes so each comes after the nodes that produce its inputs (stable:
    nodes already in order keep it). Names no node here produces (graph inputs, initializers,
    an outer graph's values) count as ready."""
    nodes = list(graph.node)
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    needs = [{producer[name] for name in _consumed(n) if name in producer and producer[name] != i}
             for i, n in enumerate(nodes)]
    users: dict[int, list[int]] = {}
    for i, deps in enumerate(needs):
        for d in deps:
            users.setdefault(d, []).append(i)
    waiting = [len(deps) for deps in needs]
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise ModelError("the graph has a cycle", "export the model again")
    if order != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)


def _consumed(node: onnx.NodeProto) -> set[str]:
    """The names *node* reads, its subgraphs' reads from the outer scope included."""
    names = {name for name in node.input if name}
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            inner = {o for n in sub.node for o in n.output} | {i.name for i in sub.input} | \
                {t.name for t in sub.initializer}
            names |= {name for n in sub.node for name in _consumed(n)} - inner
    return names
