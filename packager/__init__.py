"""edgepack: package ONNX models into verified bundles for edge devices.

The library mirrors the CLI: one function per command.
"""

from .bundle import bundle
from .errors import PackagerError
from .inspection import inspect_model
from .pipeline import build
from .quantize import QuantConfig, quantize
from .shapes import fix_shapes
from .simplify import simplify
from .targets import list_targets, load_target
from .verify import verify

__all__ = ["PackagerError", "QuantConfig", "build", "bundle", "fix_shapes", "inspect_model",
           "list_targets", "load_target", "quantize", "simplify", "verify"]
