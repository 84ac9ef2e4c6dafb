"""edgepack: package PyTorch and ONNX models into verified bundles for edge devices.

The library mirrors the CLI: one function per command.
"""
# ruff: noqa: E402  (the SIGINT handler goes in before the heavy imports)

from .errors import exit_on_early_interrupt

exit_on_early_interrupt()   # before the heavy imports below: Ctrl-C there exits 130, one line

from .build.job import build
from .bundle.assemble import bundle
from .compare import compare
from .device.deploy import DeployOptions, deploy
from .device.page import write_page
from .device.verify import verify
from .errors import PackagerError
from .graph.inspection import inspect_model
from .graph.shapes import fix_shapes
from .graph.simplify import simplify
from .quantization.budget import AccuracyBudget
from .quantization.checked import quantize_checked
from .quantization.quantize import QuantConfig, quantize
from .quantization.sensitivity import layer_errors
from .source.export import export
from .targets import list_targets, load_target

__all__ = ["AccuracyBudget", "DeployOptions", "PackagerError", "QuantConfig", "build", "bundle",
           "compare", "deploy", "export", "fix_shapes", "inspect_model", "layer_errors",
           "list_targets", "load_target", "quantize", "quantize_checked", "simplify", "verify",
           "write_page"]
