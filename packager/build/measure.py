"""The part measured: the FP32 reference and how candidates are judged against it, the
precision decision, the graphs each provider runs, and the precision record with the speed
against the original (and eager PyTorch)."""

from pathlib import Path
from typing import Any

from .._runtimes.runner.task_spec import task_kind
from ..errors import SpecError
from ..graph.execute import Sample, run_model
from ..progress import OFF, Log
from ..quantization.budget import (
    EMBEDDING_COSINE,
    AccuracyBudget,
    accuracy_line,
    calibration_record,
    class_outputs,
    embedding_outputs,
    hygiene,
)
from ..quantization.calibration import load_samples, sample_labels
from ..quantization.decision import Decision, decide
from ..quantization.quantize import check_exclude
from ..quantization.streamed import state_pairs
from ..source.eager_timing import against_eager
from ..targets import Target
from ..tasks.declare import parse_task
from ..tasks.fit import check_decoder_fits, input_size
from ..tasks.part import say_suggestion
from .box_labels import box_truth
from .fp32_graph import against_original, choose_fp32, fuse_model, graph_timer, original_graph
from .label_check import check_labelled, labelled_top1, sample_truth
from .plan import PartRequest
from .preprocess_check import check_alternatives
from .provider_choice import choose_provider, provider_graph, provider_pays
from .provider_graphs import provider_graphs
from .records import (
    BuildContext,
    Frozen,
    Loaded,
    PartData,
    PartPlan,
    Precision,
    ProviderPick,
    Reference,
    Shaped,
)
from .text_labels import text_truth


def reference(req: PartRequest, loaded: Loaded, frozen: Frozen, shaped: Shaped, plan: PartPlan,
              data: PartData, target: Target, tmp: Path, ctx: BuildContext) -> Reference:
    """The FP32 graph timed fastest (fused for transformers where that wins), its outputs on
    the held-out samples, and the budget the candidates keep against them."""
    time_graphs, why_not = graph_timer(target, ctx.timer, data.feed)
    original, no_original = original_graph(loaded.path, data.feed)
    choice = choose_fp32(shaped.fixed, shaped.simplified, shaped.simplifier, loaded.path,
                         original, target=target, frozen=bool(frozen.consts),
                         samples=data.held or data.samples, time_graphs=time_graphs,
                         why_not=why_not, folder=tmp, name=req.name, log=ctx.log)
    fp32 = choice.path
    ctx.clock.lap("fp32 graph")
    check_exclude(req.quant.exclude, shaped.simplified.graph,
                  loaded.path if loaded.module is None
                  else f"the export of {loaded.module.description}")
    outputs = run_model(fp32, data.held)   # once: the decision measures against them too
    labelled = (labelled_top1(fp32, data.samples, req.calib, req.labels)
                if data.real and req.preprocess and req.calib is not None else None)
    check_labelled(labelled, ctx.log)   # a model fed wrongly stops here, before any search
    evaluated, eval_samples = _evaluated(fp32, req, shaped, ctx)
    if evaluated:   # fed validly but wrongly: another way scores higher (--eval's images first)
        evaluated = _tried(fp32, ctx.evaluate, len(eval_samples), req, shaped, evaluated, ctx)
    elif labelled and "top1" in labelled:
        labelled = _tried(fp32, req.calib, len(data.samples), req, shaped, labelled, ctx)
    fusion = None
    if ctx.fuse and plan.family == "transformer" and not frozen.consts and \
            not req.quant.exclude and \
            all(p.name == "CPUExecutionProvider" for p in target.providers):
        fused, fusion = fuse_model(shaped.fixed, loaded.path, target, data.held, outputs,
                                   tmp / f"{req.name}.fused.onnx", ctx.log, unfused=fp32,
                                   timer=ctx.timer)
        fp32 = fused or fp32
    guard = _guard(req, shaped, plan, data, outputs, target, ctx, labelled)
    labels_held = (sample_labels(req.calib, len(data.samples), ctx.holdout)
                   if ctx.metric and req.calib is not None else None)
    return Reference(choice, fp32, outputs, labelled, fusion, time_graphs, why_not,
                     no_original, guard, labels_held, evaluated, eval_samples)


def _tried(fp32: Path, source: Path, count: int, req: PartRequest, shaped: Shaped,
           found: dict[str, Any], ctx: BuildContext) -> dict[str, Any]:
    """*found* (a labelled top-1) with the usual alternatives to --preprocess tried beside it."""
    tried = check_alternatives(fp32, source, count, req.preprocess, shaped.inputs, req.labels,
                               found, ctx.log)
    return {**found, "preprocessing": tried} if tried else found


def _evaluated(fp32: Path, req: PartRequest, shaped: Shaped, ctx: BuildContext
               ) -> tuple[dict[str, Any] | None, list[Sample] | None]:
    """FP32's top-1 on --eval's labelled images (never calibrated on) and those images, or
    (None, None) without --eval; a folder without class folders is refused in one line."""
    if ctx.evaluate is None:
        return None, None
    samples = load_samples(ctx.evaluate, inputs=list(shaped.inputs), preprocess=req.preprocess)
    found = labelled_top1(fp32, samples, ctx.evaluate, req.labels)
    if not found or "top1" not in found:
        raise SpecError(f"--eval {ctx.evaluate}: " + (
            found["skipped"] if found else "no images in class folders (eval/cat/1.jpg)"),
            "put the evaluation images in one folder per class, named as --calib's are")
    check_labelled(found, lambda line: ctx.log(line.replace("labels: ", "eval: ", 1)))
    return {**found, "folder": str(ctx.evaluate)}, samples


def _guard(req: PartRequest, shaped: Shaped, plan: PartPlan, data: PartData, outputs: dict,
           target: Target, ctx: BuildContext, labelled: dict | None = None) -> AccuracyBudget:
    """The accuracy budget: the target's (or --min-cosine's), tighter for embeddings; the
    labelled top-1's drop where the samples lie in class folders (*labelled*: FP32's top-1 on
    them); the data's hygiene notes said; a declared task's decoder proven to fit its head
    first."""
    budget = target.min_cosine if ctx.min_cosine is None else ctx.min_cosine
    int8 = plan.requested in ("int8", "auto")
    if ctx.min_cosine is None and data.real and int8 and budget < EMBEDDING_COSINE:
        embeddings = embedding_outputs(outputs)
        if embeddings:
            budget = EMBEDDING_COSINE
            ctx.log(f"budget: output '{embeddings[0]}' is an L2-normalised embedding, compared "
                    f"with other embeddings: cosine >= {budget} to FP32 (--min-cosine sets "
                    "another)")
    if data.real and int8:
        for note in hygiene(data.given, data.held):
            ctx.log(f"warning: {note}")
    suggested = None
    if plan.task is None and req.task is None:
        text = say_suggestion(shaped.simplified, outputs, req.labels, ctx.log)
        suggested = _parsed(text) if text else None
    elif data.real and req.task is not None:   # a declared head the decoder does not read
        # is refused, not trusted (a recognised one is dropped: shape.recognised_fits)
        check_decoder_fits(plan.task, shaped.simplified, outputs,
                           input_size(req.preprocess, shaped.simplified))
    metric = ctx.metric
    found = (sample_truth(data.samples, req.calib, labelled, req.labels, outputs)
             if data.real and int8 and metric is None else None)
    truth, truth_output = found if found else (None, None)
    drop = ctx.max_drop if ctx.max_drop is not None else target.max_accuracy_drop
    boxes = _box_truth(req, plan, data, ctx, drop) if int8 and metric is None else None
    texts = _text_truth(req, plan, data, ctx, drop) if int8 and metric is None else None
    if boxes or texts:
        truth, truth_output = boxes or texts, None
    elif truth:
        where = "by their class folders" if labelled else f"by the labels array of {req.calib}"
        ctx.log(f"budget: the samples are labelled {where}: INT8 may lose at most "
                f"{100 * (0.01 if drop is None else drop):g} point(s) of labelled top-1 "
                f"against FP32 on the same samples (--max-accuracy-drop sets another); "
                "agreement with FP32 is reported beside it")
    return AccuracyBudget(
        min_cosine=budget,
        max_drop=ctx.max_drop if ctx.max_drop is not None else target.max_accuracy_drop,
        metric=metric[0] if metric else None, metric_name=metric[1] if metric else "",
        task=plan.task, keep=ctx.keep,
        class_outputs=class_outputs(shaped.simplified.graph, req.labels),
        feeds_part=ctx.feeds_part, truth=truth, suggested=suggested,
        truth_output=truth_output, states=_states(shaped.simplified, plan.task, ctx.log))


def _states(model: Any, task: dict[str, Any] | None, log: Log) -> tuple[tuple[str, str], ...]:
    """The recurrent state pairs a declared task's frames judge, said in one line."""
    pairs = state_pairs(model) if task_kind(task) != "raw" else ()
    if pairs:
        log(f"budget: {', '.join(f'{o} feeds {i} back' for i, o in pairs)}: each model "
            "streams the held-out samples in order, its own state fed back, and the "
            f"{task_kind(task)} task judges the frames (the state's cosine is reported)")
    return pairs


def _box_truth(req: PartRequest, plan: PartPlan, data: PartData, ctx: BuildContext,
               drop: float | None) -> dict[str, Any] | None:
    """A detect part's labelled boxes (YOLO labels/*.txt beside its calibration images,
    build/box_labels.py), said in the log; None where its images carry none."""
    if not data.real or task_kind(plan.task) != "detect":
        return None
    found = box_truth(data.samples, req.calib, req.preprocess,
                      len(req.labels) if req.labels else None)
    if found is None:
        return None
    truth, count = found
    drop = 0.01 if drop is None else drop
    ctx.log(f"budget: {count} of the {len(data.samples)} images carry YOLO box labels "
            f"(labels/NAME.txt, {sum(len(t) for t in truth.values())} boxes): INT8 may lose at "
            f"most {100 * drop:g} point(s) of labelled box mAP@0.5 against FP32 on the same "
            "samples (--max-accuracy-drop sets another); box recall and precision against "
            "FP32's boxes are reported beside it")
    return truth


def _text_truth(req: PartRequest, plan: PartPlan, data: PartData, ctx: BuildContext,
                drop: float | None) -> dict[str, Any] | None:
    """A ctc part's labelled texts (a labels.txt beside its images, or a labels array of
    strings, build/text_labels.py), said in the log; None where its samples carry none."""
    if not data.real or task_kind(plan.task) != "ctc":
        return None
    found = text_truth(data.samples, req.calib)
    if found is None:
        return None
    truth, where = found
    if not (plan.task or {}).get("alphabet"):
        ctx.log(f"budget: the samples' texts ({where}) are not used: the ctc task names no "
                "alphabet to read the model's answers as text (--task ctc:alphabet=@FILE)")
        return None
    ctx.log(f"budget: {len(truth)} of the {len(data.samples)} samples carry the text they read "
            f"({where}): INT8 may raise the character error rate by at most "
            f"{100 * (0.01 if drop is None else drop):g} point(s) against FP32 on the same "
            "samples (--max-accuracy-drop sets another); agreement with FP32's strings is "
            "reported beside it")
    return truth


def _parsed(text: str) -> tuple[str, dict] | None:
    """(--task text, the task) of a suggestion, or None where it does not parse as given (a
    suggestion that needs the user's alphabet)."""
    try:
        return text, parse_task(text)
    except SpecError:
        return None


def decide_part(req: PartRequest, plan: PartPlan, data: PartData, ref: Reference,
                target: Target, tmp: Path, ctx: BuildContext) -> Decision:
    """The precision decision (quantization/decision.py) over the part's candidates."""
    folder = tmp / f"{req.name}.search"
    folder.mkdir()
    decision = decide(ref.path, folder, target=target, family=plan.family,
                      request=req.quant, calib=data.calib if data.real else [],
                      held=data.held, budget=ref.guard, labels=ref.labels_held,
                      timer=ctx.timer, log=ctx.log, progress=ctx.progress,
                      fp32_outputs=ref.outputs, steps=ctx.steps,
                      provider_pays=provider_pays(target, ref.path, data.held, timer=ctx.timer,
                                              log=ctx.log, wanted=ctx.openvino),
                      require_proof=ctx.require_proof,
                      whole=data.given if data.real else None)
    ctx.clock.lap("search")
    ctx.log(f"accuracy vs {'the model as given' if decision.config.mode == 'given' else 'FP32'}"
            " on held-out samples: " + accuracy_line(accuracy_of(decision, data)))
    return decision


def accuracy_of(decision: Decision, data: PartData) -> dict:
    """The shipped candidate's accuracy record, with the data it was measured on."""
    return {**decision.candidate.accuracy, "data": data.kind}


def providers_part(req: PartRequest, data: PartData, ref: Reference, decision: Decision,
                 target: Target, tmp: Path, ctx: BuildContext) -> ProviderPick:
    """The graphs other providers run (FP16 for CUDA beside INT8 for TensorRT; OpenVINO's own
    where it measured faster)."""
    graphs = provider_graphs(target, decision.config, ref.path, tmp / f"{req.name}.search",
                             data.held, ref.guard, ref.labels_held, ref.outputs, ctx.log,
                             decision.candidates)
    choice = choose_provider(decision, target, ref.path, data.held, ref.guard, ref.labels_held,
                           ref.outputs, timer=ctx.timer, log=ctx.log, wanted=ctx.openvino,
                           original=ref.choice.original, steps=ctx.steps or OFF)
    graphs += provider_graph(choice, decision)
    ctx.clock.lap("providers")
    return ProviderPick(tuple(graphs), choice)


def precision_record(loaded: Loaded, frozen: Frozen, plan: PartPlan, data: PartData,
                     ref: Reference, decision: Decision, target: Target, ctx: BuildContext,
                     started: dict[str, float], seen: dict | None = None) -> Precision:
    """What ships and why, with its speed against the original (timed in the same blocks) and,
    for a PyTorch source, against eager PyTorch at the same threads."""
    config, candidate = decision.config, decision.candidate.path
    calibrated = config.precision == "int8" and config.mode == "static"
    same_run = (decision.record.get("provider_choice") or {}).pop("vs_original", None)
    vs_original = against_original(candidate, ref.choice.original, ref.time_graphs,
                                   ref.why_not or ref.no_original, ref.choice, same_run)
    eager = None
    if loaded.module is not None:   # what the user had: the module in eager PyTorch
        eager = against_eager(candidate, loaded.module, loaded.export, data.feed, target,
                              ref.why_not or "", forward=(list(frozen.inputs),
                                                          dict(frozen.consts)))
    ctx.clock.lap("speed vs original")
    return Precision(config, plan.family, len(data.calib) if calibrated else 0,
                     decision.record, ref.choice.record, vs_original,
                     ctx.clock.since(started),
                     labelled_top1=(seen or {}).get("labelled_top1", ref.labelled),
                     fusion=ref.fusion, profile=(seen or {}).get("profile"),
                     float_nodes=(seen or {}).get("float_nodes"),
                     calibration=calibration_record(data.calib, config.calibration_method)
                     if calibrated else None, vs_eager=eager)
