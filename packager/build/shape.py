"""The part's graph with static shapes and simplified, and what the part asks of the build:
its task, its family and the precision requested, decided once here."""

from dataclasses import replace
from typing import Any

import onnx

from ..errors import SpecError
from ..graph.inspection import check_labels, graph_inputs, io_specs, model_family
from ..graph.metadata import class_names, head_task
from ..graph.shapes import fix_shapes_proto
from ..quantization.decision import requested_precision
from ..quantization.preprocessing import check_fits
from ..targets import Target
from ..tasks.part import task_for
from .fp32_graph import simplify_static
from .part_shapes import shapes_for
from .plan import SINGLE, PartRequest
from .records import BuildContext, Frozen, Loaded, PartPlan, Reference, Shaped


def shape_part(req: PartRequest, loaded: Loaded, frozen: Frozen, target: Target,
               ctx: BuildContext) -> Shaped:
    """Static input shapes (--input, the preprocessing, the data, the target's batch), then
    onnxsim (or the fallback); a preprocessing spec that does not fit the input is named
    before shapes are fixed, so a misfit reads as a preprocessing error."""
    proto = frozen.proto
    shapes = {s.name: list(s.shape) for s in req.inputs}
    if req.preprocess:
        first = io_specs(graph_inputs(proto))[0]
        check_fits(req.preprocess, first["name"], shapes.get(first["name"], first["shape"]),
                   first["dtype"])
    fixed = fix_shapes_proto(proto, shapes_for(proto, shapes, req.preprocess, req.calib,
                                                target.batch), batch=target.batch, strict=False)
    ctx.clock.lap("shapes")
    # what stays open after this is resolved from a real run once the samples are loaded
    simplified, simplifier, reason = simplify_static(fixed, loaded.path, batch=target.batch,
                                                     frozen=bool(frozen.consts))
    ctx.clock.lap("simplify")
    ctx.log(f"simplify: {frozen.nodes} -> {len(simplified.graph.node)} nodes ({simplifier})")
    if reason:
        ctx.log("simplify: onnxsim not used, fell back to onnxruntime basic optimisation "
                f"({reason})")
    inputs = io_specs(graph_inputs(simplified))
    ctx.log("shapes: " + ", ".join(f"{i['name']} {'x'.join(map(str, i['shape']))}"
                                   for i in inputs))
    if req.preprocess:
        check_fits(req.preprocess, inputs[0]["name"], inputs[0]["shape"], inputs[0]["dtype"])
    return Shaped(fixed, simplified, simplifier, reason, tuple(inputs))


def model_labels(req: PartRequest, frozen: Frozen, shaped: Shaped, ctx: BuildContext
                 ) -> PartRequest:
    """*req* with the class names the model's metadata holds (graph/metadata.py) when --labels
    gave none and they fit its class scores; the log says which key they came from, or why
    they were not used."""
    found = None if req.labels else class_names(frozen.proto)
    if found is None:
        return req
    names, key = found
    try:
        check_labels(names, shaped.simplified, "the model")
    except SpecError as exc:
        ctx.log(f"{req.label()}labels: the model's metadata '{key}' names {len(names)} classes, "
                f"not used ({exc.message.split(' but ', 1)[-1]}); --labels FILE gives them")
        return req
    ctx.log(f"{req.label()}labels: {len(names)} class names from the model's metadata "
            f"'{key}' ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}); --labels "
            "FILE overrides them")
    return replace(req, labels=tuple(names), labels_from=f"metadata '{key}'",
                   head_task=head_task(frozen.proto))


def recognised_task(req: PartRequest, graph: Any, log: Any) -> dict[str, Any] | None:
    """The task a part that declares none has without doubt, applied by default and said in
    one line: classify, where the model's own metadata names its classes and its one row of
    scores counts them; detect, where the metadata says its head detects (Ultralytics) and its
    one output holds four box numbers (and an objectness) beside a score per named class for
    every anchor (a user who knows better passes --task raw)."""
    outputs = graph.graph.output
    speech = _speech(req, graph, log)
    if speech is not None:
        return speech
    if not req.labels_from or not req.labels or len(outputs) != 1:
        return None
    dims = [d.dim_value for d in outputs[0].type.tensor_type.shape.dim]
    if req.head_task == "detect":
        return _detector(req, outputs[0].name, dims, log)
    if not dims or dims[-1] != len(req.labels) or any(d != 1 for d in dims[:-1]):
        return None
    log(f"{req.label()}task: classify, applied by default: the model's {req.labels_from} "
        f"names its {len(req.labels)} classes and output '{outputs[0].name}' holds their scores; "
        "the candidates are judged by the answer (expected top-1 drop) and run.py infer answers "
        "with labels (--task raw opts out)")
    return {"kind": "classify"}


SPEECH_NAMES = ("audio", "wav", "waveform", "speech")


def speech_graph(graph: Any) -> bool:
    """Whether *graph* is recognised as speech (_speech: a waveform output by its name, spoken
    from integer tokens)."""
    return _speech(PartRequest(SINGLE, ""), graph, lambda _: None) is not None


def _speech(req: PartRequest, graph: Any, log: Any) -> dict[str, Any] | None:
    """tts, where the model's one output is a float waveform by its name (audio, wav,
    waveform, speech) whose length no input shape fixes, and an integer input of shape (1, n)
    holds the tokens: Kokoro-82M (tokens, style, speed -> audio) built without --task shipped
    its graph at 64 tokens, and padding a sentence to 64 moved its speech 16 dB."""
    outputs = graph.graph.output
    if len(outputs) != 1:
        return None
    out = outputs[0]
    kind = out.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in kind.shape.dim]
    if kind.elem_type != onnx.TensorProto.FLOAT or not 1 <= len(dims) <= 3 or dims[-1] > 0 \
            or any(d not in (0, 1) for d in dims[:-1]) or \
            not any(word in out.name.lower() for word in SPEECH_NAMES):
        return None
    inits = {t.name for t in graph.graph.initializer}
    tokens = [i.name for i in graph.graph.input if i.name not in inits
              and i.type.tensor_type.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
              and len(i.type.tensor_type.shape.dim) == 2]
    if not tokens:
        return None
    log(f"{req.label()}task: tts, applied by default: output '{out.name}' is a waveform whose "
        f"length no input fixes, spoken from the tokens of '{tokens[0]}'; the candidates are "
        "judged as speech (the same length, log-mel distance, at 24000 Hz: --task "
        "tts:rate=N for another), the length is kept open where padding moves the speech, "
        "and run.py infer writes WAV files (--task raw opts out)")
    return {"kind": "tts"}


def _detector(req: PartRequest, output: str, dims: list[int], log: Any
              ) -> dict[str, Any] | None:
    """detect with the YOLO decoder the head's shape fits: (1, 4 + classes, anchors) is
    YOLOv8's (and YOLOv5u's, YOLO11's), (1, anchors, 5 + classes) YOLOv5's; None otherwise."""
    classes = len(req.labels or ())
    if len(dims) != 3 or dims[0] != 1:
        return None
    if 4 + classes in dims[1:]:
        decoder, per = "yolov8", f"4 box numbers and {classes} class scores"
    elif 5 + classes in dims[1:]:
        decoder, per = "yolov5", f"4 box numbers, an objectness and {classes} class scores"
    else:
        return None
    anchors = dims[2] if dims[1] in (4 + classes, 5 + classes) else dims[1]
    log(f"{req.label()}task: detect (decoder {decoder}), applied by default: the model's "
        f"metadata says its head detects and its {req.labels_from} names {classes} classes; "
        f"output '{output}' holds {per} for each of {anchors} anchors; the candidates are "
        "judged by the boxes (recall and precision against FP32's) and run.py infer answers "
        "with boxes (--task raw opts out)")
    return {"kind": "detect", "decoder": decoder}


def recognised_fits(req: PartRequest, plan: PartPlan, shaped: Shaped, ref: Reference,
                    ctx: BuildContext) -> tuple[PartPlan, Reference]:
    """*plan* and *ref* without the detect task the build recognised where its decoder does
    not read boxes from FP32's outputs on the held-out samples (a declared one is refused in
    measure._guard instead, naming --task): a guess that does not fit is said and dropped,
    never an error."""
    if req.task is not None or plan.task is None or plan.task.get("kind") != "detect" or \
            not ref.outputs:
        return plan, ref
    from ..tasks.fit import check_decoder_fits, input_size

    try:
        check_decoder_fits(plan.task, shaped.simplified, ref.outputs,
                           input_size(req.preprocess, shaped.simplified))
    except SpecError as exc:
        ctx.log(f"{req.label()}task: detect not applied after all: "
                f"{exc.message.removeprefix('--task detect: ')}; the outputs are judged raw")
        return replace(plan, task=None), replace(ref, guard=replace(ref.guard, task=None,
                                                                    truth=None))
    return plan, ref


def plan_part(req: PartRequest, loaded: Loaded, shaped: Shaped, target: Target,
              ctx: BuildContext) -> PartPlan:
    """The part's labels checked against its outputs, its declared task against the graph, its
    family (the target's preset for it) and the precision it asks for."""
    if req.labels:
        check_labels(req.labels, shaped.simplified, loaded.where)
    declared = req.task   # (--task raw declares raw: it opts out of a recognised task)
    if declared is None:
        declared = recognised_task(req, shaped.simplified, ctx.log)
    task = task_for(declared, ctx.keep, shaped.simplified, loaded.where)
    family = model_family(shaped.simplified)
    preset = target.preset_for(family)
    if family != "default" and family in target.family_quantization:
        ctx.log(f"{family} model: using the target's {family} preset")
    requested = requested_precision(req.quant.precision, preset)
    # only a forced static INT8 cannot do without calibration data (auto falls back to dynamic)
    needs_calib = requested == "int8" and (req.quant.mode or preset.mode) == "static"
    return PartPlan(task, family, requested, needs_calib)
