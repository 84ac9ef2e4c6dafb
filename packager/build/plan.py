"""The build's arguments as one request per part, checked to fit together."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..quantization.calibration import is_image_source, list_sources
from ..quantization.request import QuantRequest
from ..source.export import DEFAULT_TOLERANCE
from ..source.specs import TensorSpec
from ..source.torchload import LoadedModel, is_torch_source, load_source, select_submodule

SINGLE = "model"      # the part name of a one-model bundle


@dataclass(frozen=True)
class PartRequest:
    """What to build for one part: its source and its own inputs, data and settings."""

    name: str
    source: Path | str | LoadedModel    # .onnx file, PyTorch source spec, or a loaded module
    inputs: tuple[TensorSpec, ...] = ()
    calib: Path | None = None
    preprocess: dict[str, Any] | None = None
    quant: QuantRequest = field(default_factory=QuantRequest)
    labels: Sequence[str] | None = None
    consts: Mapping[str, Any] = field(default_factory=dict)   # inputs frozen to values
    task: Mapping[str, Any] | None = None   # its declared task (tasks/declare.py); None: raw
    labels_from: str = ""   # where the labels came from when not --labels: "metadata 'KEY'"
    head_task: str = ""     # the task the model's metadata names for its head ("detect")
    open_length: str = ""   # the input whose length axis (1) the shipped graphs keep open (a
                            # tts pipeline's encoder, where padding moves the speech)

    def label(self) -> str:
        """'part NAME: ' before a message about a part of several, else ''."""
        return "" if self.name == SINGLE else f"part {self.name}: "


@dataclass(frozen=True)
class ExportOptions:
    """PyTorch sources only: how the model is loaded and exported."""

    weights: Path | None = None
    factory_args: Mapping[str, Any] = field(default_factory=dict)
    submodule: str | None = None
    opset: int | None = None
    tolerance: float = DEFAULT_TOLERANCE
    output_names: Sequence[str] = ()


DEFAULT_EXPORT = ExportOptions()   # build's default (a frozen value, shared)


def input_paths(model: Path | str, calib: Path | None, part_calib: Mapping[str, Path],
                export_options: ExportOptions, parts: Mapping[str, str] = {}) -> list[Path]:
    """The files and folders a build reads, which its output must not replace or lie in."""
    text = str(model)
    path = Path(text.rsplit(":", 1)[0]) if is_torch_source(text) and ".py:" in text else \
        Path(text)
    found = [path, calib, *part_calib.values(), export_options.weights,
             *(ref for ref in parts.values() if is_onnx(ref))]
    return [Path(p) for p in found if p is not None and Path(p).exists()]


def is_onnx(ref: Any) -> bool:
    return str(ref).lower().endswith(".onnx")


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file in a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def plan_parts(model: Path | str, *, inputs: Sequence[TensorSpec], calib: Path | None,
               preprocess: dict[str, Any] | None, quant: QuantRequest,
               labels: Sequence[str] | None, parts: Mapping[str, str],
               part_calib: Mapping[str, Path], part_quant: Mapping[str, QuantRequest],
               export_options: ExportOptions,
               part_preprocess: Mapping[str, dict[str, Any]] = {}) -> list[PartRequest]:
    """Turn the build arguments into one request per part, checking they fit together."""
    prefixed = [s for s in inputs if s.part]
    if not parts:
        if prefixed or part_calib or part_quant:
            raise SpecError(f"--input {prefixed[0].part}/... or a per-part option was given "
                            "without --part" if prefixed else "per-part options need --part",
                            "declare the parts: --part NAME=ATTRIBUTE")
        return [PartRequest(SINGLE, model, tuple(inputs), calib, preprocess, quant, labels)]
    _check_parts(model, inputs, calib, parts, part_calib, part_quant)
    root = None
    requests = []
    for part, ref in parts.items():
        loaded: Path | LoadedModel
        if is_onnx(ref):
            loaded = Path(ref)
        elif is_torch_source(ref):
            loaded = load_source(ref)
        else:
            if root is None:
                root = load_source(str(model), factory_args=export_options.factory_args,
                                   weights=export_options.weights,
                                   submodule=export_options.submodule)
            module = select_submodule(root.module, ref, str(model))
            module.eval()
            loaded = LoadedModel(module, root.kind, f"{root.description} .{ref}", root.files,
                                 weights=root.weights)
        data = part_calib.get(part)
        images = data is not None and is_image_source(list_sources(data))
        requests.append(PartRequest(part, loaded, tuple(s for s in inputs if s.part == part),
                                    data, part_preprocess.get(part,
                                                              preprocess if images else None),
                                    part_quant.get(part, QuantRequest()).over(quant),
                                    labels if len(parts) == 1 else None))
    return requests


def _check_parts(model: Path | str, inputs: Sequence[TensorSpec], calib: Path | None,
                 parts: Mapping[str, str], part_calib: Mapping[str, Path],
                 part_quant: Mapping[str, QuantRequest]) -> None:
    """SpecError where the per-part options do not fit the declared parts."""
    prefixed = [s for s in inputs if s.part]
    # .onnx parts come from a pipeline file (cascade/build.py), which is the model given
    if not is_torch_source(model) and not (str(model).endswith(".toml") and
                                           all(map(is_onnx, parts.values()))):
        raise SpecError("--part needs a PyTorch model (file.py:factory, pkg.module:factory)",
                        "an .onnx file is one part already; build it on its own")
    unknown = sorted(set(part_calib) - set(parts)) + sorted(set(part_quant) - set(parts)) + \
        sorted({s.part for s in prefixed} - set(parts))
    if unknown:
        raise SpecError(f"part '{unknown[0]}' is not declared with --part",
                        f"declared parts: {', '.join(parts)}")
    unprefixed = [s for s in inputs if not s.part]
    if unprefixed:
        raise SpecError(f"--input {unprefixed[0].describe()}: which part is it for?",
                        f"prefix it with the part: --input {next(iter(parts))}/"
                        f"{unprefixed[0].describe()}")
    if calib is not None:
        raise SpecError("--calib DIR is ambiguous with several parts",
                        "give each part its own: --calib PART=DIR")
