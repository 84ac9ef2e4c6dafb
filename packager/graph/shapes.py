"""Make every input, intermediate and output shape of a model static."""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from ..atomic import atomic_file, scratch_cwd
from ..errors import ShapeError
from .inspection import dims_of, graph_inputs
from .modelio import load_model, save_model

# the profiler's element type names (output_type_shape) as ONNX's
ELEMENT_TYPES = {"float": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6,
                 "int64": 7, "string": 8, "bool": 9, "float16": 10, "double": 11, "uint32": 12,
                 "uint64": 13, "bfloat16": 16}


@dataclass(frozen=True)
class ShapeResult:
    output: Path
    inputs: dict[str, list[int]]
    outputs: dict[str, list[int]]
    dynamic: list[str] = field(default_factory=list)   # data-dependent: they stay dynamic


def static_inputs(model: onnx.ModelProto, path: Path, command: str) -> list[dict[str, Any]]:
    """io_specs of *model*'s inputs, or ShapeError naming the first dynamic one and the fix."""
    from .inspection import io_specs

    specs = io_specs(graph_inputs(model))
    for spec in specs:
        dims = spec["shape"]
        if not all(isinstance(d, int) and d > 0 for d in dims):
            example = "x".join(str(d) if isinstance(d, int) and d > 0 else "1" if i == 0 else "N"
                               for i, d in enumerate(dims))
            raise ShapeError(f"{path}: input '{spec['name']}' is dynamic "
                             f"({'x'.join(map(str, dims))}) and `edgepack {command}` needs static "
                             "shapes", f"run `edgepack fix-shapes {path} --input {spec['name']}:"
                             f"{example} -o static.onnx` first, or use `edgepack build`, which "
                             "fixes shapes itself")
    return specs


def resolve_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]],
                         *, batch: int | None) -> dict[str, list[int]]:
    """Static shape per input: from *shapes*, else static dims kept and dim 0 set to *batch*."""
    inputs = {i.name: dims_of(i) for i in graph_inputs(model)}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise ShapeError(f"--input names '{unknown[0]}', which is not a model input",
                         f"inputs are: {', '.join(inputs)}")
    resolved = {}
    for name, dims in inputs.items():
        if name in shapes:
            given = [int(d) for d in shapes[name]]
            if len(given) != len(dims):
                raise ShapeError(f"input '{name}' has rank {len(dims)} {dims}, --input gives "
                                 f"rank {len(given)} {given}", "give one size per dimension")
            # a size the model declares may be re-declared: exporters fix sizes a fully
            # convolutional graph does not depend on (CenterFace ships as 10x3x32x32); whether
            # the graph runs at the new size is found by shape inference and a real run
            for i, want in enumerate(given):
                if want < 1:
                    raise ShapeError(f"input '{name}' dim {i}: size {want}", "sizes must be >= 1")
            resolved[name] = given
            continue
        out = []
        for i, d in enumerate(dims):
            if isinstance(d, int) and d > 0:
                out.append(d)
            elif i == 0 and batch is not None:
                out.append(batch)
            else:
                raise ShapeError(f"input '{name}' dim {i} ('{d}') is dynamic and nothing fixes it",
                                 f"pass --input {name}:" + "x".join(
                                     str(x) if isinstance(x, int) and x > 0 else "N" for x in dims))
        resolved[name] = out
    return resolved


def check_runs_at(model: onnx.ModelProto, resolved: Mapping[str, Sequence[int]],
                  declared: Mapping[str, Sequence[Any]]) -> None:
    """Raise ShapeError unless onnxruntime runs *model* with inputs of the *resolved* sizes,
    where --input re-declared sizes the model fixed (*declared*): a graph with sizes baked into
    a Reshape does not, and would fail later in calibration with a less useful message."""
    import numpy as np

    probe = onnx.ModelProto.FromString(model.SerializeToString())
    for value in graph_inputs(probe):
        value.type.tensor_type.ClearField("shape")
    dtypes = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
              for i in graph_inputs(probe)}
    try:
        probe_session(probe).run(None, {k: np.zeros(v, dtypes[k]) for k, v in resolved.items()})
    except Exception as exc:
        name, dims = next(iter(declared.items()))
        raise ShapeError(
            f"input '{name}' is declared {'x'.join(map(str, dims))} in the model and --input "
            f"gives {'x'.join(map(str, resolved[name]))}, but the model does not run at that "
            f"size: {(str(exc).strip().splitlines() or [''])[0][:200]}",
            "use the model's declared size, or export it with a dynamic axis") from None


def probe_session(model: onnx.ModelProto) -> Any:
    """A quiet onnxruntime CPU session over *model*, for probing runs."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4   # (a failing run's error is the exception's, not stderr's)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def symbolic_inference() -> Any:
    """onnxruntime's SymbolicShapeInference, loaded from its file on its own: importing it as
    onnxruntime.tools.symbolic_shape_infer runs onnxruntime/tools/__init__.py, which imports
    torch wherever torch is installed (2.1 s of every .onnx build, for PyTorch export helpers
    its shape inference does not use). It imports only numpy, onnx, sympy and packaging."""
    import importlib.util
    import sys

    name = "onnxruntime.tools.symbolic_shape_infer"
    if name in sys.modules:
        return sys.modules[name].SymbolicShapeInference
    private = "_edgepack_symbolic_shape_infer"
    if private not in sys.modules:
        import onnxruntime

        path = Path(onnxruntime.__file__).parent / "tools" / "symbolic_shape_infer.py"
        spec = importlib.util.spec_from_file_location(private, path)
        if spec is None or spec.loader is None or not path.is_file():
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            return SymbolicShapeInference
        module = importlib.util.module_from_spec(spec)
        sys.modules[private] = module
        spec.loader.exec_module(module)
    return sys.modules[private].SymbolicShapeInference


def infer_static(model: onnx.ModelProto) -> onnx.ModelProto:
    """Run shape inference (ONNX Runtime's symbolic shape inference, then ONNX's) and return the model."""
    try:
        SymbolicShapeInference = symbolic_inference()
        with scratch_cwd():   # an incomplete inference saves sym_shape_infer_temp.onnx there
            inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=False,
                                                           guess_output_rank=False)
        if inferred is not None:
            return inferred
    except Exception:  # symbolic inference lacks some ops; ONNX's own inference is the fallback
        pass
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise ShapeError(f"shape inference failed: {str(exc).splitlines()[0][:200]}",
                         "check the model with onnx.checker") from None


def dynamic_tensors(model: onnx.ModelProto) -> list[tuple[str, str, list]]:
    """(tensor, producing node, dims) for every tensor whose shape is not fully static."""
    producers = {o: f"{n.op_type} node '{n.name or '?'}'" for n in model.graph.node for o in n.output}
    known = {v.name: v for v in model.graph.value_info}
    found = []
    for node in model.graph.node:
        for name in node.output:
            if not name:
                continue
            info = known.get(name)
            dims = dims_of(info) if info is not None and info.type.tensor_type.HasField("shape") else None
            if info is not None and not info.type.HasField("tensor_type"):
                continue  # sequences / maps have no tensor shape to fix
            if dims is None or not all(isinstance(d, int) and d >= 0 for d in dims):
                found.append((name, producers[name], dims))
    for out in model.graph.output:
        dims = dims_of(out) if out.type.tensor_type.HasField("shape") else None
        if dims is None or not all(isinstance(d, int) and d >= 0 for d in dims):
            found.append((out.name, producers.get(out.name, "graph input"), dims))
    return found


# Ops whose output's size is a count taken from their inputs' values (a range's end, the
# elements that pass, k, the boxes kept, a loop's trips): an open tensor they make, or one made
# from it, is data-dependent even where the runs at hand happened to agree on its size. (Ops
# that take a shape as an input, Expand or Reshape, are left out: after onnxsim at static
# input shapes, a shape computed from the input's own shape is folded, and a BERT's Expand,
# seen open in a fused graph, would be kept dynamic for nothing.)
VALUE_SHAPED = ("Range", "NonZero", "Compress", "Unique", "TopK", "NonMaxSuppression", "Loop")


def value_shaped(model: onnx.ModelProto, open_: Sequence[str]) -> set[str]:
    """The *open_* tensors made by a VALUE_SHAPED op, or downstream of one (in graph order)."""
    opened, tainted = set(open_), set()
    for node in model.graph.node:
        if node.op_type in VALUE_SHAPED or any(i in tainted for i in node.input):
            tainted.update(o for o in node.output if o in opened)
    return tainted


def shapes_from_run(model: onnx.ModelProto, feeds: Sequence[Mapping[str, Any]],
                    sizes: dict[str, int] | None = None) -> tuple[onnx.ModelProto, list[str]]:
    """Fill in the shapes shape inference left open (through If/Loop, custom-domain ops) from
    real onnxruntime runs at the static input shapes.

    Returns the model and the data-dependent tensors, which stay dynamic: those whose shape
    differed between *feeds* (e.g. a detector's box count), and those a VALUE_SHAPED op makes
    (or made from one), whose sizes two runs can share by chance (a length regulator's frame
    count where both samples' durations add up alike).
    """

    open_ = [name for name, _, _ in dynamic_tensors(model)]
    if not open_:
        return model, []
    try:
        shapes, types = profiled_shapes(model, feeds)
        missing = [n for n in open_ if n not in shapes]
        if missing:   # (a node the profiler did not report): ask for those tensors themselves
            found, kinds = fetched_shapes(model, missing, feeds)
            shapes.update(found)
            types.update(kinds)
    except Exception as exc:
        small = [i.name for i in graph_inputs(model)
                 if len(dims_of(i)) == 0 or dims_of(i) == [1]]
        has_if = any(n.op_type in ("If", "Loop") for n in model.graph.node)
        hint = (f"an If on an input may pick branches that disagree at these shapes: freeze "
                f"it, e.g. --const {small[0]}=VALUE" if has_if and small
                else "check the --input shapes and the calibration data")
        unknown = re.search(r"([\w.]+:\w+)\(-?\d+\) is not a registered function/op",
                            str(exc))
        if unknown:   # (ai.onnx.preview.training:Gradient): no shape or sample would help
            raise ShapeError(f"the model uses {unknown.group(1)}, an op ONNX Runtime has no "
                             "kernel for: it cannot run on any target",
                             "export the model without it (a training op or a custom op)") \
                from None
        raise ShapeError(f"shapes of {len(open_)} tensor(s) (first: '{open_[0]}') could not be "
                         "inferred, and running the model at the static shapes failed: "
                         f"{(str(exc).strip().splitlines() or [''])[0][:200]}", hint) from None
    tainted = value_shaped(model, open_)
    varying = [n for n in dict.fromkeys(open_) if len(shapes.get(n, ())) > 1 or n in tainted]
    if sizes is not None:   # the data-dependent tensors' bytes, from these same runs
        sizes.update((n, _largest_bytes(shapes, types, n)) for n in varying)
    infos = {v.name: v for v in model.graph.value_info}
    outputs = {o.name: o for o in model.graph.output}
    for name in open_:
        if name in varying or name not in types:
            continue   # data-dependent; or a sequence or map, which keeps no tensor shape
        targets = [v for v in (outputs.get(name), infos.get(name)) if v is not None]
        if not targets:
            targets = [model.graph.value_info.add()]
            targets[0].name = name
        for info in targets:
            info.type.tensor_type.elem_type = types[name]
            shape = info.type.tensor_type.shape
            shape.Clear()
            for size in next(iter(shapes[name])):
                shape.dim.add().dim_value = size
    return model, varying


def profiled_shapes(model: onnx.ModelProto, feeds: Sequence[Mapping[str, Any]]
                    ) -> tuple[dict[str, set], dict[str, int]]:
    """({tensor: the shapes it took over *feeds*}, {tensor: its ONNX element type}) of every
    main-graph node's outputs, from onnxruntime's profiler over plain runs (no optimisation,
    so its nodes are the graph's): the memory of one inference. Asking for every open tensor
    as an output instead kept them all alive: a TTS model's 1,159 took 15.6 GB in two runs
    where one inference needs 0.4 GB."""
    import json
    import tempfile

    import onnxruntime as ort

    probe = onnx.ModelProto.FromString(model.SerializeToString())
    outputs_of = {}
    for index, node in enumerate(probe.graph.node):
        node.name = f"edgepack_probe_{index}"   # one name per node: the profiler's key
        outputs_of[node.name] = list(node.output)
    shapes: dict[str, set] = {}
    types: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="edgepack-shapes-") as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.enable_profiling = True
        so.profile_file_prefix = f"{tmp}/profile"
        session = ort.InferenceSession(probe.SerializeToString(), so,
                                       providers=["CPUExecutionProvider"])
        for feed in feeds:
            session.run(None, dict(feed))
        with open(session.end_profiling()) as f:
            events = json.load(f)
    for event in events:
        names = outputs_of.get(event.get("name", "").removesuffix("_kernel_time"))
        seen = (event.get("args") or {}).get("output_type_shape")
        if event.get("cat") != "Node" or names is None or not isinstance(seen, list):
            continue
        if len(seen) != len(names):   # (an optional output left out: "")
            names = [n for n in names if n]
            if len(seen) != len(names):
                continue
        for name, typed in zip(names, seen, strict=True):
            if name and isinstance(typed, dict) and len(typed) == 1:
                (kind, dims), = typed.items()
                if kind in ELEMENT_TYPES and isinstance(dims, list):
                    shapes.setdefault(name, set()).add(tuple(int(d) for d in dims))
                    types[name] = ELEMENT_TYPES[kind]
    return shapes, types


def observed_bytes(model: onnx.ModelProto, names: Sequence[str],
                   feeds: Sequence[Mapping[str, Any]]) -> int:
    """Bytes of the tensors *names* at the largest shape each took over runs on *feeds* (the
    data-dependent tensors a calibration holds too, which static shapes cannot count)."""

    shapes, types = profiled_shapes(model, feeds)
    return sum(_largest_bytes(shapes, types, n) for n in dict.fromkeys(names))


def _largest_bytes(shapes: dict[str, set], types: dict[str, int], name: str) -> int:
    """Bytes of tensor *name* at the largest shape it took (0 when it was not seen)."""
    import numpy as np

    if name not in shapes or name not in types:
        return 0
    size = onnx.helper.tensor_dtype_to_np_dtype(types[name]).itemsize
    return max(int(np.prod(s)) for s in shapes[name]) * size


def fetched_shapes(model: onnx.ModelProto, names: Sequence[str],
                   feeds: Sequence[Mapping[str, Any]]) -> tuple[dict[str, set], dict[str, int]]:
    """profiled_shapes' answer for *names*, asked of runs that return them as outputs."""
    import numpy as np

    probe = onnx.ModelProto.FromString(model.SerializeToString())
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    session = probe_session(probe)
    shapes: dict[str, set] = {n: set() for n in names}
    types: dict[str, int] = {}
    for feed in feeds:
        for name, value in zip(names, session.run(list(names), dict(feed)), strict=True):
            shapes[name].add(tuple(np.shape(value)))
            if isinstance(value, np.ndarray):
                types[name] = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
    return shapes, types


def fix_shapes_proto(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]],
                     *, batch: int | None = 1, strict: bool = True) -> onnx.ModelProto:
    """Return a copy of *model* with static input shapes and inferred static shapes throughout.

    With *strict* False, tensors whose shapes only a simplifier can resolve (shape arithmetic
    that constant folding removes) may stay dynamic; the build checks again after simplifying.
    """
    if batch is not None and batch < 1:
        raise ShapeError(f"--batch {batch}: a batch holds at least one sample",
                         "pass --batch 1 or more")
    resolved = resolve_input_shapes(model, shapes, batch=batch)
    redeclared = {i.name: dims_of(i) for i in graph_inputs(model)
                  if any(isinstance(d, int) and d > 0 and d != want
                         for d, want in zip(dims_of(i), resolved[i.name], strict=True))}
    if redeclared:
        check_runs_at(model, resolved, redeclared)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in graph_inputs(model):
        shape = value.type.tensor_type.shape
        for dim, size in zip(shape.dim, resolved[value.name], strict=True):
            dim.Clear()
            dim.dim_value = size
    del model.graph.value_info[:]
    declared = [onnx.TypeProto.FromString(o.type.SerializeToString()) for o in model.graph.output]
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    inferred = infer_static(onnx.ModelProto.FromString(model.SerializeToString()))
    # keep only the top-level shapes: inference also writes into If/Loop bodies, and there it
    # merges the branches' shapes into ones that break onnxruntime's own type inference
    # (silero VAD: "LSTM: First input tensor must have rank 3")
    model.graph.value_info.extend(inferred.graph.value_info)
    for out, known, before in zip(model.graph.output, inferred.graph.output, declared,
                                  strict=True):
        # an output inference cannot follow (a com.microsoft op of a QOperator model) keeps
        # its declared shape: an output with no shape at all is an invalid model
        out.type.CopyFrom(known.type if known.type.tensor_type.HasField("shape") else before)
    dynamic = dynamic_tensors(model)
    if dynamic and strict:
        name, producer, dims = dynamic[0]
        why = ("its shape could not be inferred" if dims is None
               else f"its shape {dims} depends on values computed at run time")
        raise ShapeError(f"tensor '{name}' (output of {producer}) stays dynamic: {why}"
                         f" ({len(dynamic)} tensor(s) in all)",
                         "simplify the model first, or export it with static shapes")
    return model


def fix_shapes(model: Path, output: Path, *, shapes: Mapping[str, Sequence[int]],
               batch: int | None = 1, force: bool = False) -> ShapeResult:
    """Write *model* to *output* with every symbolic dim replaced by a static size.

    Shapes inference cannot follow (a simplified graph may keep some) come from runs at the
    static shapes, as `build` does (on zeros and on noise: `random_feeds`); tensors whose shape
    differs between them depend on the data (a detector's box count) and stay dynamic
    (ShapeResult.dynamic)."""
    fixed = fix_shapes_proto(load_model(model), shapes, batch=batch, strict=False)
    varying: list[str] = []
    if dynamic_tensors(fixed):
        fixed, varying = shapes_from_run(fixed, random_feeds(fixed, 3))
    with atomic_file(Path(output), force=force, inputs=(model,)) as tmp:
        save_model(fixed, tmp)
    return ShapeResult(Path(output), {i.name: dims_of(i) for i in graph_inputs(fixed)},
                       {o.name: dims_of(o) for o in fixed.graph.output}, varying)


def random_feeds(model: onnx.ModelProto, count: int) -> list[dict[str, Any]]:
    """*count* feeds for *model*'s static inputs, as unlike as can be: all zeros first, then
    normal floats (integers zero, booleans true), seeded. A box count or a NonZero differs
    between zeros and noise, so what depends on the data shows as such."""
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = []
    for n in range(count):
        feed = {}
        for value in graph_inputs(model):
            dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            shape = [max(int(d), 1) if isinstance(d, int) else 1 for d in dims_of(value)]
            if n == 0 or not (np.issubdtype(dtype, np.floating) or dtype == np.bool_):
                feed[value.name] = np.zeros(shape, dtype)
            else:
                feed[value.name] = (np.ones(shape, dtype) if dtype == np.bool_ else
                                    rng.standard_normal(shape).astype(dtype))
        feeds.append(feed)
    return feeds
