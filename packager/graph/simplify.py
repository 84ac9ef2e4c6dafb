"""Simplify a graph with onnxsim (ONNX Runtime's basic optimiser when onnxsim fails), and keep
whichever FP32 graph runs fastest: onnxsim's, onnxsim's without its Pad folds, or the unsimplified.

onnxsim folds a Pad into the Conv (or pool) after it. When the pads are asymmetric (TF "same"
padding, nn.ZeroPad2d((1, 2, 0, 1))) onnxruntime runs that Conv far slower than Pad + a
symmetric Conv: on an audio CNN the simplified graph ran 3.3-3.8 ms against 1.6-1.9 ms for the
plain torch.onnx.export (EPYC, AVX2, onnxruntime 1.2x), and 29.0 vs 24.3 ms here on a
generated 6-layer Pad+Conv net (Xeon with AVX-512 VNNI/AMX, onnxruntime 1.32).
"""

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..atomic import atomic_file
from ..errors import ModelError
from .modelio import load_model, opset_of, save_model

MIN_OPSET = 13  # the quantizer writes invalid per-channel QDQ graphs below opset 13


@dataclass(frozen=True)
class SimplifyResult:
    output: Path
    nodes_before: int
    nodes_after: int
    simplifier: str          # "onnxsim" or "onnxruntime-basic"
    fallback_reason: str     # why onnxsim was not used ("" when it was)
    opset_before: int
    opset_after: int


def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Move top-level `Constant` nodes into initializers (the quantizer only sees initializers)."""
    keep, moved = [], 0
    for node in model.graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1:
            attr = node.attribute[0]
            value = onnx.helper.get_attribute_value(attr)
            if attr.name == "value":
                tensor = value
            elif attr.name in ("value_float", "value_int", "value_floats", "value_ints"):
                dtype = np.float32 if "float" in attr.name else np.int64
                tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype))
            else:  # sparse / string constants stay nodes
                keep.append(node)
                continue
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
            moved += 1
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return moved


MIN_IR = 7   # the IR version opset 13 came with


def upgrade_opset(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """Convert a model below opset 13 to opset 13, and its IR version to at least 7."""
    if opset_of(model) >= MIN_OPSET:
        return weights_not_inputs(model)
    try:
        upgraded = onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:
        raise ModelError(f"{path}: opset {opset_of(model)} could not be upgraded to {MIN_OPSET} "
                         f"({str(exc).splitlines()[0][:160]})",
                         "re-export the model with opset >= 13") from None
    upgraded = weights_not_inputs(upgraded)
    if opset_of(model) < 7:
        channel_slopes(upgraded)
    return upgraded


def channel_slopes(model: onnx.ModelProto) -> int:
    """Reshape each PRelu's per-channel slope [C] to [C, 1, ...] (how many were).

    Before opset 7, PRelu broadcast a 1-D slope over the channel axis; from 7 on it broadcasts
    numpy's way (from the last axis), and onnx's converter leaves the slope as it was, so ONNX
    Runtime refused the upgraded graph ("broadcast an axis by a dimension other than 1")."""
    slopes = {t.name: t for t in model.graph.initializer}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return 0
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in
             [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
             if v.type.tensor_type.HasField("shape")}
    fixed = 0
    for node in model.graph.node:
        if node.op_type != "PRelu" or len(node.input) < 2 or node.input[1] not in slopes:
            continue
        slope, rank = slopes[node.input[1]], ranks.get(node.input[0], 0)
        if len(slope.dims) == 1 and slope.dims[0] > 1 and rank > 2:
            value = numpy_helper.to_array(slope).reshape([slope.dims[0]] + [1] * (rank - 2))
            slope.CopyFrom(numpy_helper.from_array(value, slope.name))
            fixed += 1
    return fixed


def weights_not_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Raise an IR-3 model (every initializer also a graph input, as IR 3 requires: the onnx
    reference CNNs, old Caffe2 and PyTorch exports) to IR 7. Its weights leave the graph
    inputs, as they are constants to ONNX Runtime at IR 3: at IR 4 and later a weight that is
    also an input could be fed, and onnx's checker (after simplification adds initializers of
    its own) refused the graph: "X in initializer but not in graph input"."""
    if model.ir_version >= 4:
        return model
    weights = {t.name for t in model.graph.initializer}
    kept = [i for i in model.graph.input if i.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.ir_version = MIN_IR
    return model


def ort_basic_optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant folding and redundant-node removal by ONNX Runtime (portable, basic level)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        save_model(model, src)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(dst)
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
        return onnx.load(str(dst))


@contextlib.contextmanager
def quiet_stderr():
    """Send file descriptor 2 to /dev/null: onnxsim's C++ prints a WARNING and a Python
    traceback there for every op it cannot fold, even when it then succeeds."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


PAD_FOLDS = ("fuse_pad_into_conv", "fuse_pad_into_pool")   # onnxsim's (onnxoptimizer's) passes
PADDED = ("Conv", "ConvTranspose", "AveragePool", "MaxPool")


def run_onnxsim(model: onnx.ModelProto, skipped: Sequence[str] = ()
                ) -> tuple[onnx.ModelProto | None, str]:
    """Return (simplified model, "") or (None, why onnxsim could not be used).

    *skipped* names onnxsim's optimizer passes to leave out (PAD_FOLDS)."""
    try:
        import onnxsim

        with quiet_stderr():
            simplified, ok = onnxsim.simplify(model, skipped_optimizers=list(skipped) or None)
    except Exception as exc:  # onnxsim raises anything from RuntimeError to protobuf errors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None, f"onnxsim failed: {first[:160]}"
    if not ok:
        return None, "onnxsim's output check failed (outputs differ from the original)"
    return simplified, ""


def simplify_proto(model: onnx.ModelProto, path: Path, *, fold_pads: bool = True
                   ) -> tuple[onnx.ModelProto, str, str]:
    """Prepare and simplify an in-memory model: (model, simplifier, fallback reason).

    *fold_pads* False keeps each Pad before a Conv or pool a node of its own (PAD_FOLDS)."""
    model = upgrade_opset(model, path)
    constants_to_initializers(model)
    simplified, reason = run_onnxsim(model, () if fold_pads else PAD_FOLDS)
    simplifier = "onnxsim"
    if simplified is None:
        simplifier = "onnxruntime-basic"
        try:
            simplified = ort_basic_optimize(model)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ModelError(f"{path}: neither onnxsim nor ONNX Runtime can load the model "
                             f"({first[:200]})", "check that the model runs in onnxruntime") from None
    if not simplified.graph.node:   # every output is an input or a constant: no model left
        raise ModelError(f"{path}: no output is computed by a node (outputs: "
                         f"{', '.join(o.name for o in model.graph.output)[:200]}), simplifying "
                         "leaves an empty graph", "the file is corrupt, or its outputs are "
                         "wrong; export it again")
    try:
        onnx.checker.check_model(simplified)
    except Exception as exc:
        raise ModelError(f"{path}: the simplified model is invalid ({str(exc)[:200]})",
                         "this is a bug in edgepack's simplification: please report it with "
                         "the model") from None
    return simplified, simplifier, reason


def simplify(model: Path, output: Path, *, force: bool = False) -> SimplifyResult:
    """Simplify *model* into *output*: opset >= 13, constants folded, dead nodes removed."""
    proto = load_model(model)
    before, opset_before = len(proto.graph.node), opset_of(proto)
    simplified, simplifier, reason = simplify_proto(proto, Path(model))
    with atomic_file(Path(output), force=force, inputs=(model,)) as tmp:
        save_model(simplified, tmp)
    return SimplifyResult(Path(output), before, len(simplified.graph.node), simplifier, reason,
                          opset_before, opset_of(simplified))


def padded_ops(model: onnx.ModelProto) -> int:
    """Pad nodes whose output feeds a Conv or a pool (what onnxsim's PAD_FOLDS fold away)."""
    pads = {o for n in model.graph.node if n.op_type == "Pad" for o in n.output}
    return sum(1 for n in model.graph.node if n.op_type in PADDED and n.input and
               n.input[0] in pads)


SAME_OUTPUTS = 0.99999   # graphs that compute the model differ only in float summation order
FASTER = 1.03            # another graph replaces onnxsim's only when this much faster (noise)
# Times graphs interleaved: paths -> {str(path): {"p50": ms, ...}}, and where it was measured
GraphTimer = Callable[[Sequence[Path]], tuple[dict[str, dict[str, float]], Any]]


@dataclass(frozen=True)
class GraphChoice:
    """The FP32 graph the precision decision starts from, and why."""

    label: str
    path: Path
    record: dict[str, Any] = field(default_factory=dict)
    original: Path | None = None   # the graph timed as the user's original, where there is one


def fastest_graph(graphs: Mapping[str, Path], *, samples: Sequence[Mapping[str, Any]],
                  time_graphs: GraphTimer | None, why_not: str = "",
                  original: Path | None = None, log: Callable[[str], None] = lambda _: None
                  ) -> GraphChoice:
    """Keep the fastest of *graphs* (label -> path; the first is onnxsim's, the default) that
    computes what the first does on *samples*. *original* (the user's file or plain export) is
    timed in the same blocks, for the record only. *why_not*: why nothing can be timed here."""
    from .execute import compare_outputs, run_model

    labels = list(graphs)
    default = labels[0]
    record: dict[str, Any] = {"chosen": default, "candidates": {}}
    reference = run_model(graphs[default], samples) if len(labels) > 1 else {}
    usable = [default]
    for label in labels[1:]:
        try:
            with quiet_stderr():   # onnxruntime's warnings on graphs the build does not ship
                outputs = run_model(graphs[label], samples)
            cosine = min(o["cosine_min"] for o in compare_outputs(outputs, reference).values())
        except Exception as exc:   # a graph that does not run here is not a candidate
            record["candidates"][label] = {"dropped": f"{type(exc).__name__}: "
                                           f"{' '.join(str(exc).split())[:160]}"}
            continue
        if cosine < SAME_OUTPUTS:
            record["candidates"][label] = {"dropped": f"outputs differ (cosine {cosine:.6f})"}
            continue
        usable.append(label)
    if len(usable) == 1:   # nothing to choose: the original is timed against the bundle
        record["reason"] = "the only FP32 graph"
        return GraphChoice(default, graphs[default], record)
    if why_not or time_graphs is None:
        record.update(measured=False, why=why_not, reason=f"{default}: not timed ({why_not})")
        log(f"fp32 graph: {default} kept, not timed ({why_not})")
        return GraphChoice(default, graphs[default], record)
    paths = [graphs[label] for label in usable] + ([original] if original else [])
    times, where = time_graphs(paths)
    p50 = {label: times[str(graphs[label])]["p50"] for label in usable}
    for label in usable:
        stats = times[str(graphs[label])]
        record["candidates"][label] = {"p50_ms": round(p50[label], 4),
                                       **{k: round(stats[k], 4) for k in ("p10", "p90")
                                          if k in stats}}
    record["load"] = next(iter(times.values())).get("load")
    fastest = min(usable, key=lambda label: p50[label])
    chosen = fastest if p50[default] > p50[fastest] * FASTER else default
    text = ", ".join(f"{label} {p50[label]:.3f}" for label in usable)
    if original is not None:
        record["original_p50_ms"] = round(times[str(original)]["p50"], 4)
        text += f", original {record['original_p50_ms']:.3f}"
    record.update(chosen=chosen, measured=True, measured_on=where,
                  reason=(f"{chosen}: fastest ({text} ms p50)" if chosen != default else
                          f"{default}: no other graph is {100 * (FASTER - 1):.0f}% faster "
                          f"({text} ms p50)"))
    log(f"fp32 graph: {record['reason']}")
    return GraphChoice(chosen, graphs[chosen], record)
