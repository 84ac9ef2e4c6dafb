"""edgepack: package PyTorch and ONNX models into verified bundles for edge devices.

The library mirrors the CLI: one function per command.
"""

from .budget import AccuracyBudget, quantize_checked
from .bundle import bundle
from .compare import compare
from .deploy import DeployOptions, deploy
from .errors import PackagerError
from .export import export
from .inspection import inspect_model
from .pipeline import build
from .quantize import QuantConfig, quantize
from .sensitivity import layer_errors
from .shapes import fix_shapes
from .simplify import simplify
from .targets import list_targets, load_target
from .verify import verify

__all__ = ["AccuracyBudget", "DeployOptions", "PackagerError", "QuantConfig", "build", "bundle",
           "compare", "deploy", "export", "fix_shapes", "inspect_model", "layer_errors",
           "list_targets", "load_target", "quantize", "quantize_checked", "simplify", "verify"]
