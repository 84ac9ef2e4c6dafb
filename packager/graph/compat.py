"""Keep a model loadable by the oldest onnxruntime a target names."""

import onnx

from ..errors import BundleError
from .modelio import opset_of

# onnxruntime release -> (newest IR version it reads, newest ai.onnx opset it implements),
# from onnxruntime's docs/Versioning.md.
RUNTIME_LIMITS = {
    (1, 14): (8, 18), (1, 15): (9, 19), (1, 16): (9, 19), (1, 17): (9, 20), (1, 18): (10, 21),
    (1, 19): (10, 21), (1, 20): (10, 21), (1, 21): (10, 22), (1, 22): (11, 22), (1, 23): (11, 23),
}


def runtime_limits(version: str) -> tuple[int, int]:
    """(max IR version, max opset) for an onnxruntime version string like '1.17' or '1.19.2'."""
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        raise BundleError(f"onnxruntime version {version!r} is not MAJOR.MINOR",
                          "fix min_version in the target profile") from None
    known = sorted(RUNTIME_LIMITS)
    if (major, minor) < known[0]:
        raise BundleError(f"onnxruntime {version} is older than edgepack supports",
                          f"targets need onnxruntime >= {known[0][0]}.{known[0][1]}")
    return RUNTIME_LIMITS[max(k for k in known if k <= (major, minor))]


# Operator domains onnxruntime's CPU build implements; anything else needs a custom-op library.
RUNTIME_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def fit_to_runtime(model: onnx.ModelProto, min_version: str) -> onnx.ModelProto:
    """Lower the IR version stamp for *min_version*, or raise if an op is too new for it."""
    max_ir, max_opset = runtime_limits(min_version)
    opset = opset_of(model)
    if opset > max_opset:
        raise BundleError(f"the model uses opset {opset}, onnxruntime {min_version} on the target "
                          f"implements up to {max_opset}",
                          f"export with opset <= {max_opset}, or raise the target's min_version")
    for node in model.graph.node:
        if node.domain not in RUNTIME_DOMAINS:
            raise BundleError(f"node '{node.name or node.op_type}' is {node.domain}.{node.op_type}, "
                              f"an operator onnxruntime {min_version} does not implement",
                              "replace it with standard ONNX ops before export, or export the "
                              "parts around it (--part)")
    if model.ir_version > max_ir:
        # the IR stamp follows the onnx package that saved the file, not the features used
        model.ir_version = max_ir
    return model
