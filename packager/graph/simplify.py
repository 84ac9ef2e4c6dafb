"""Simplify a graph with onnxsim (ONNX Runtime's basic optimiser when onnxsim fails)."""

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

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


def upgrade_opset(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """Convert a model below opset 13 to opset 13."""
    if opset_of(model) >= MIN_OPSET:
        return model
    try:
        return onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:
        raise ModelError(f"{path}: opset {opset_of(model)} could not be upgraded to {MIN_OPSET} "
                         f"({str(exc).splitlines()[0][:160]})",
                         "re-export the model with opset >= 13") from None


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
def _quiet_stderr():
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


def run_onnxsim(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, str]:
    """Return (simplified model, "") or (None, why onnxsim could not be used)."""
    try:
        import onnxsim

        with _quiet_stderr():
            simplified, ok = onnxsim.simplify(model)
    except Exception as exc:  # onnxsim raises anything from RuntimeError to protobuf errors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None, f"onnxsim failed: {first[:160]}"
    if not ok:
        return None, "onnxsim's output check failed (outputs differ from the original)"
    return simplified, ""


def simplify_proto(model: onnx.ModelProto, path: Path) -> tuple[onnx.ModelProto, str, str]:
    """Prepare and simplify an in-memory model: (model, simplifier, fallback reason)."""
    model = upgrade_opset(model, path)
    constants_to_initializers(model)
    simplified, reason = run_onnxsim(model)
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
