"""The part's model as a graph: the user's .onnx, or the PyTorch source exported (with the
calibration samples it was validated on), then its constant inputs frozen."""

from pathlib import Path
from typing import Any

from ..errors import ExportError, ModelError, SpecError
from ..graph.freeze import branch_inputs, calibration_consts, const_value, freeze_inputs
from ..graph.inspection import graph_inputs, io_specs
from ..graph.modelio import load_model
from ..hashing import sha256
from ..quantization.calibration import is_image_source, list_sources, load_samples
from ..source.export import export_loaded
from ..source.specs import TensorSpec
from ..source.torchload import LoadedModel, is_torch_source, load_source
from ..targets import Target
from .plan import SINGLE, PartRequest
from .records import BuildContext, Frozen, Loaded

LENGTH = "length"   # the symbol of an open length axis


def load_part(req: PartRequest, target: Target, tmp: Path, ctx: BuildContext) -> Loaded:
    """The part's model file: its .onnx, or its PyTorch source exported into *tmp* (validated
    on the calibration samples when there are some, which are then loaded already)."""
    options = ctx.options
    module = req.source if isinstance(req.source, LoadedModel) else None
    if module is None and is_torch_source(req.source):
        module = load_source(str(req.source), factory_args=options.factory_args,
                             weights=options.weights, submodule=options.submodule)
    if module is None:
        path = Path(req.source)
        return Loaded(path, None, {"file": path.name,
                                   "sha256": sha256(path) if path.is_file() else ""}, None, None)
    samples = None
    specs = list(req.inputs) or module.example_inputs
    if req.calib is not None and specs:
        samples = load_samples(req.calib, inputs=[_as_io(s) for s in specs],
                               preprocess=req.preprocess, progress=ctx.progress)
    def exported_with(open_input: str) -> Any:
        return export_loaded(module, tmp / f"{req.name}.exported.onnx", inputs=specs,
                             consts=req.consts, other_consts=req.name != SINGLE,
                             dynamic={open_input: {1: LENGTH}} if open_input else None,
                             opset=options.opset, target=target,
                             output_names=options.output_names if req.name == SINGLE else (),
                             samples=samples or (), tolerance=options.tolerance, log=ctx.log,
                             force=True)
    tokens = req.open_length or _speech_tokens(req, specs)
    try:
        exported = exported_with(tokens)
    except ExportError as exc:
        if not tokens or req.open_length:
            raise
        ctx.log(f"{req.label()}export: the token length cannot stay open ({exc.message}): the "
                f"bundle speaks exactly {dict((s.name, s.shape) for s in specs)[tokens][1]} "
                "tokens")
        exported = exported_with("")
    export = {"source": exported.source, "exporter": exported.exporter,
              "opset": exported.opset, "validation": exported.validation,
              "weights": exported.weights, "warnings": exported.warnings,
              "consts": exported.consts,
              **({"dynamic": {k: {str(a): v for a, v in d.items()} for k, d in
                              exported.dynamic.items()}} if exported.dynamic else {})}
    source = {"model": module.description,
              "files": {p.name: sha256(p) for p in module.files if p.is_file()},
              "export": export}
    return Loaded(exported.path, module, source, export, samples)


def _speech_tokens(req: PartRequest, specs: list[TensorSpec]) -> str:
    """A tts part's token input (integers of shape (1, T)), exported with T open so that the
    build measures what padding does and keeps the length open where it moves the speech
    (build/length.py), as for an .onnx that takes any length; else ''."""
    if (req.task or {}).get("kind") != "tts":
        return ""
    return next((s.name for s in specs if len(s.shape) == 2 and s.shape[0] == 1 and
                 str(s.dtype).startswith(("int", "uint"))), "")


def freeze_part(req: PartRequest, loaded: Loaded, ctx: BuildContext) -> Frozen:
    """The graph with --const inputs, and inputs an If decides on that hold one value in every
    calibration sample (Silero VAD's `sr`), frozen into it; the source section records them."""
    proto = load_model(loaded.path)
    check_numeric_inputs(proto, loaded.path)
    nodes = len(proto.graph.node)
    names = tuple(i.name for i in graph_inputs(proto))
    # forward() arguments a PyTorch export fixed are constants already (source.export)
    argued = {k: c["value"] for k, c in (loaded.export or {}).get("consts", {}).items()}
    consts = {k: v for k, v in req.consts.items() if k in names and k not in argued}
    if req.name == SINGLE and len(consts) + len(argued) < len(req.consts):
        unknown = sorted(set(req.consts) - set(consts) - set(argued))[0]
        raise SpecError(f"--const {unknown}: the model has no input '{unknown}'",
                        f"inputs are: {', '.join(names)}")
    decided = {k: v for k, v in branch_inputs(proto).items() if k not in consts and k not in
               argued} if req.calib is not None else {}
    if decided and not is_image_source(list_sources(req.calib)):   # an If on sr: one value?
        seen = load_samples(req.calib, inputs=[i for i in io_specs(graph_inputs(proto))
                                                if i["name"] in decided])
        consts = {**consts, **calibration_consts(proto, seen, decided, log=ctx.log)}
    samples = loaded.samples
    if consts:
        # the manifest records the very arrays the graph holds (const_value refuses a value
        # the input's dtype cannot hold)
        consts = {k: const_value(proto, k, v) for k, v in consts.items()}
        proto = freeze_inputs(proto, consts)
        ctx.log("const: " + ", ".join(f"{k}={_short(v)}" for k, v in consts.items())
                + " frozen into the graph (no longer inputs)")
        if samples:
            samples = [{k: v for k, v in s.items() if k not in consts} for s in samples]
    source = dict(loaded.source)   # the manifest's source section, with what was frozen
    if consts:
        source["consts"] = {k: v.tolist() for k, v in consts.items()}
    if argued:
        source["consts"] = {**argued, **source.get("consts", {})}
    return Frozen(proto, nodes, names, consts, argued, samples, source)


def check_numeric_inputs(proto: Any, path: Path) -> None:
    """A model input of strings, or one that is no tensor (a sequence, a map): refused in one
    line before any sample is read (edgepack ships numeric tensors in and out)."""
    for value in graph_inputs(proto):
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type" or value.type.tensor_type.elem_type == 8:   # 8: STRING
            what = "strings" if kind == "tensor_type" else f"a {kind.replace('_type', '')}"
            raise ModelError(f"{path}: input '{value.name}' holds {what}; edgepack builds "
                             "models whose inputs are numeric tensors",
                             "do that step (a tokenizer, a text normaliser) before the model "
                             "and export the model from the first numeric tensor")


def _short(value: Any) -> str:
    text = repr(value.tolist() if hasattr(value, "tolist") else value)
    return text if len(text) <= 40 else text[:37] + "..."


def _as_io(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype}
