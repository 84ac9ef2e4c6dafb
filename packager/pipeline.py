"""build(): every stage in order for one target, driven by the target profile.

A bundle holds one model or several parts (`--part NAME=ATTR_OR_FACTORY`); each part goes
through export (PyTorch sources), fix shapes, simplify, quantize and measure on its own.
"""

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ._runtimes.runner.sessions import describe_session
from .atomic import check_free, check_writable, output_lock
from .bundle.assemble import BundleResult, PartPayload, Tuner, archive_path, bundle
from .errors import CalibrationError, SpecError
from .graph.execute import Sample, run_model
from .graph.freeze import branch_inputs, calibration_consts, const_value, freeze_inputs
from .graph.inspection import check_labels, graph_inputs, io_specs, model_family
from .graph.modelio import load_model
from .graph.shapes import dynamic_tensors, fix_shapes_proto, shapes_from_run
from .hashing import sha256
from .progress import Progress
from .quantization.budget import (
    EMBEDDING_COSINE,
    AccuracyBudget,
    accuracy_line,
    calibration_record,
    class_outputs,
    embedding_outputs,
    hygiene,
)
from .quantization.calibration import (
    CALIB_BYTES,
    activation_bytes,
    check_golden,
    check_holdout,
    fit_memory,
    is_image_source,
    list_sources,
    load_samples,
    sample_labels,
    split_holdout,
)
from .quantization.decision import decide
from .quantization.engine_choice import (
    check_wanted,
    choose_engine,
    engine_graph,
    engine_pays,
    with_engine,
)
from .quantization.fp32_graph import (
    against_original,
    choose_fp32,
    fuse_model,
    graph_timer,
    original_graph,
    simplify_static,
    speed_line,
)
from .quantization.label_check import check_labelled, labelled_top1
from .quantization.part_shapes import check_task_early, shapes_for
from .quantization.preprocessing import check_fits
from .quantization.provider_graphs import provider_graphs
from .quantization.quantize import QuantConfig, check_exclude
from .source.eager_timing import against_eager, eager_line
from .source.export import DEFAULT_TOLERANCE, export_loaded, make_inputs
from .source.specs import TensorSpec
from .source.torchload import LoadedModel, is_torch_source, load_source, select_submodule
from .targets import Target, load_target
from .tasks.fit import check_decoder_fits, input_size
from .tasks.part import recorded_task, say_suggestion, task_for
from .timing import Stages

Log = Callable[[str], None]
RANDOM_SAMPLES = 20   # evaluation samples drawn for a part without calibration data
SINGLE = "model"      # the part name of a one-model bundle


@dataclass(frozen=True)
class PartRequest:
    """What to build for one part: its source and its own inputs, data and settings."""

    name: str
    source: Path | str | LoadedModel    # .onnx file, PyTorch source spec, or a loaded module
    inputs: tuple[TensorSpec, ...] = ()
    calib: Path | None = None
    preprocess: dict[str, Any] | None = None
    quant: Mapping[str, Any] = field(default_factory=dict)
    labels: Sequence[str] | None = None
    consts: Mapping[str, Any] = field(default_factory=dict)   # inputs frozen to values
    task: Mapping[str, Any] | None = None   # its declared task (tasks/declare.py); None: raw


@dataclass(frozen=True)
class PartResult:
    name: str
    nodes_before: int
    nodes_after: int
    simplifier: str
    fallback_reason: str
    family: str
    accuracy: dict[str, Any]
    config: QuantConfig
    calibration_samples: int
    export: dict[str, Any] | None
    consts: tuple[str, ...] = ()
    engine: Any = None   # engine_choice.EngineChoice: a faster provider listed first

    def headline(self) -> str:
        """What ships: the precision, and the faster provider's graph where the build chose one."""
        if self.engine is None:
            return self.config.describe()
        name = self.engine.provider.name.replace("ExecutionProvider", "")
        fast, cpu = self.engine.candidate.config.describe(), self.config.describe()
        if fast == cpu:
            return f"{cpu}, under {name} where the device has it, else the CPU provider"
        return f"{fast} under {name}; {cpu} on the CPU provider where {name} is not installed"

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "nodes_before": self.nodes_before,
                "nodes_after": self.nodes_after, "simplifier": self.simplifier,
                "family": self.family, "precision": self.config.describe(),
                "accuracy": self.accuracy, "calibration_samples": self.calibration_samples,
                "export": self.export, "ships": self.headline()}


@dataclass(frozen=True)
class BuildResult:
    bundle: BundleResult
    parts: list[PartResult]
    stages: dict[str, float] = field(default_factory=dict)   # seconds per build stage


@dataclass(frozen=True)
class ExportOptions:
    """PyTorch sources only: how the model is loaded and exported."""

    weights: Path | None = None
    factory_args: Mapping[str, Any] = field(default_factory=dict)
    submodule: str | None = None
    opset: int | None = None
    tolerance: float = DEFAULT_TOLERANCE
    output_names: Sequence[str] = ()


def build(model: Path | str, output: Path, *, target: Target | str,
          calib: Path | None = None, preprocess: dict[str, Any] | None = None,
          inputs: Sequence[TensorSpec] = (), quant: Mapping[str, Any] = {},
          holdout: float = 0.2, golden: int = 8, labels: Sequence[str] | None = None,
          name: str | None = None, force: bool = False,
          consts: Mapping[str, Any] = {},
          parts: Mapping[str, str] = {}, part_calib: Mapping[str, Path] = {},
          part_quant: Mapping[str, Mapping[str, Any]] = {},
          part_preprocess: Mapping[str, dict[str, Any]] = {}, pipeline: dict | None = None,
          judge: Callable[[Path], dict[str, Any]] | None = None,
          export_options: ExportOptions = ExportOptions(), min_cosine: float | None = None,
          max_accuracy_drop: float | None = None, metric: tuple[Any, str] | None = None,
          timer: Any = None, log: Log = lambda _: None,
          progress: Callable[[int, int], None] | None = None, fuse: bool = True,
          tune: Tuner | None = None, steps: Progress | None = None,
          offline: bool = False, openvino: str = "auto",
          tasks: Mapping[str, Mapping[str, Any]] = {},
          keep: Mapping[str, float] | None = None) -> BuildResult:
    """Export (PyTorch), fix shapes, simplify, quantize, measure and bundle for *target*.

    *model* is an .onnx file or a PyTorch source (`file.py:factory`, `pkg.mod:factory`,
    TorchScript, .pt2). *parts* maps part names to attribute paths in the PyTorch model (or to
    factories of their own, or .onnx files); their inputs are given as `PART/NAME:shape`,
    their calibration data in *part_calib*, their preprocessing in *part_preprocess* and
    per-part quantization overrides in *part_quant*; *pipeline* is the manifest's section that
    runs them as a cascade (cascade/build.py), and *judge* measures it end to end on the
    staged bundle.
    *quant* overrides fields of the target's quantization preset (precision, mode, format,
    activation_type, weight_type, per_channel, reduce_range, calibration_method, exclude).
    precision "auto" builds the candidates, times them here (or with *timer*, e.g.
    device.remote_timing.remote_timer on a device) and ships the fastest that keeps *min_cosine*
    (default: the target's budget). *tune* (tuning.local_tuner, or remote_tuner for a device)
    times session options with the finished bundle's runner; the manifest keeps the fastest.
    *offline* ships each part also optimised offline by this onnxruntime where that loads
    faster (CPU targets; see offline.py). *openvino*: "auto" lists the target's faster provider
    (OpenVINO on x86) first where it measures faster here, "yes" wherever its graph keeps the
    budget, "no" never (quantization/engine_choice.py).
    *tasks* maps part names to their declared tasks (tasks/declare.py: the candidates are also
    judged in the task's terms, and the device's `run.py infer` answers in them); *keep*
    (--keep) overrides what each task keeps.
    """
    check_holdout(holdout)
    check_golden(golden)
    target = load_target(target) if isinstance(target, str | Path) else target
    if offline and any(p.name != "CPUExecutionProvider" for p in target.providers):
        raise SpecError(f"--offline-optimize: {target.name} runs "
                        f"{target.providers[0].name}, which builds its own graph at load",
                        "use it for CPU targets (x86_64-cpu, rpi) only")
    check_wanted(target, openvino, timer)   # before the slow stages, not after the search
    output = Path(output)
    # held from the first check to the publish: a second run to this -o fails at once
    with output_lock(output, archive_path(output)):
        sources = input_paths(model, calib, part_calib, export_options, parts)
        check_free(output, force=force, inputs=sources)
        check_free(archive_path(output), force=force, inputs=sources)
        # the bundle, its archive and the temporary copies: found now, not after the pipeline ran
        check_writable(output, need_bytes=3 * sum(_size(p) for p in sources) + 10_000_000)
        requests = plan_parts(model, inputs=inputs, calib=calib, preprocess=preprocess, quant=quant,
                              labels=labels, parts=parts, part_calib=part_calib,
                              part_quant=part_quant, export_options=export_options,
                              part_preprocess=part_preprocess)
        requests = [replace(r, consts=dict(consts), task=tasks.get(r.name)) for r in requests]
        unknown_task = sorted(set(tasks) - {r.name for r in requests})
        if unknown_task:
            raise SpecError(f"--task {unknown_task[0]}=...: no part '{unknown_task[0]}'",
                            f"parts: {', '.join(r.name for r in requests)}")
        for req in requests:
            if req.calib is not None:
                list_sources(req.calib)  # fail before the slow stages when a folder is empty
            check_task_early(req.source, req.task, keep, {s.name: list(s.shape) for s in
                                                          req.inputs},
                             req.preprocess, req.calib, target.batch)
        several = len(requests) > 1
        results, payloads = [], []
        with tempfile.TemporaryDirectory(prefix="edgepack-build-") as tmp, Stages() as clock:
            for req in requests:
                part_log = (lambda m, n=req.name: log(f"[{n}] {m}")) if several else log
                payload, result = _build_part(req, target, Path(tmp), holdout=holdout, golden=golden,
                                              options=export_options, min_cosine=min_cosine,
                                              max_drop=max_accuracy_drop, metric=metric,
                                              timer=timer, log=part_log, progress=progress,
                                              steps=steps,
                                              fuse=fuse, openvino=openvino, clock=clock,
                                              keep=keep)
                payloads.append(payload)
                results.append(result)
            target, payloads = with_engine(target, results, payloads, log)
            unused = set(consts) - {k for r in results for k in r.consts}
            if unused:
                raise SpecError(f"--const {sorted(unused)[0]}: no model input has that name",
                                "see the inputs with `edgepack inspect MODEL`")
            out = bundle(payloads, output, target=target, name=name, force=force, inputs=sources,
                         tune=tune, offline=offline, pipeline=pipeline, judge=judge)
            clock.lap("bundle")
        for entry in out.manifest["parts"] if offline else ():
            log(f"offline optimisation{' of ' + entry['name'] if several else ''}: "
                f"{'ships ' + entry['offline']['file'] + ': ' if entry['offline'].get('file') else ''}"
                f"{entry['offline']['reason']}")
        tuning = out.manifest.get("tuning")
        if tuning:
            log(f"tune ({tuning['measured_on']}, {len(tuning['tried'])} settings): "
                f"session {describe_session(tuning['chosen'])}: {tuning['reason']}")
        log(f"stages: {clock.line()}")
        for part in out.manifest["parts"]:
            speed = part.get("precision", {}).get("vs_original")
            if speed:
                log(f"speed{' of ' + part['name'] if several else ''}: {speed_line(speed)}")
            eager = part.get("precision", {}).get("vs_eager")
            if eager:
                log(f"speed{' of ' + part['name'] if several else ''}: {eager_line(eager)}")
            engine = part.get("precision", {}).get("decision", {}).get("engine", {})
            if engine.get("chosen") and engine.get("original_p50_ms"):
                log(f"speed{' of ' + part['name'] if several else ''} under "
                    f"{engine['provider'].replace('ExecutionProvider', '')}: bundle "
                    f"{engine['p50_ms']:.3f} ms p50 against the original's "
                    f"{engine['original_p50_ms']:.3f} ms on the CPU provider: "
                    f"{engine['original_p50_ms'] / engine['p50_ms']:.2f}x its speed (one run, "
                    f"onnxruntime {engine.get('measured_on', {}).get('onnxruntime', '?')})")
        log(f"bundle: {out.directory} and {out.archive}, digest {out.digest} (verify and deploy "
            "take it as --expect-digest)")
        return BuildResult(out, results, clock.record())


def input_paths(model: Path | str, calib: Path | None, part_calib: Mapping[str, Path],
                export_options: ExportOptions, parts: Mapping[str, str] = {}) -> list[Path]:
    """The files and folders a build reads, which its output must not replace or lie in."""
    text = str(model)
    path = Path(text.rsplit(":", 1)[0]) if is_torch_source(text) and ".py:" in text else \
        Path(text)
    found = [path, calib, *part_calib.values(), export_options.weights,
             *(ref for ref in parts.values() if _is_onnx(ref))]
    return [Path(p) for p in found if p is not None and Path(p).exists()]


def _is_onnx(ref: Any) -> bool:
    return str(ref).lower().endswith(".onnx")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def plan_parts(model: Path | str, *, inputs: Sequence[TensorSpec], calib: Path | None,
               preprocess: dict[str, Any] | None, quant: Mapping[str, Any],
               labels: Sequence[str] | None, parts: Mapping[str, str],
               part_calib: Mapping[str, Path], part_quant: Mapping[str, Mapping[str, Any]],
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
    # .onnx parts come from a pipeline file (cascade/build.py), which is the model given
    if not is_torch_source(model) and not (str(model).endswith(".toml") and
                                           all(map(_is_onnx, parts.values()))):
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
    root = None
    requests = []
    for part, ref in parts.items():
        loaded: Path | LoadedModel
        if _is_onnx(ref):
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
                                    {**quant, **part_quant.get(part, {})},
                                    labels if len(parts) == 1 else None))
    return requests


def _build_part(req: PartRequest, target: Target, tmp: Path, *, holdout: float, golden: int,
                options: ExportOptions, min_cosine: float | None, max_drop: float | None,
                metric: tuple[Any, str] | None, timer: Any, log: Log,
                progress: Callable[[int, int], None] | None,
                fuse: bool = True, steps: Progress | None = None, openvino: str = "auto",
                clock: Stages | None = None, keep: Mapping[str, float] | None = None
                ) -> tuple[PartPayload, PartResult]:
    clock = clock or Stages()
    started = dict(clock.seconds)
    loaded = req.source if isinstance(req.source, LoadedModel) else None
    if loaded is None and is_torch_source(req.source):
        loaded = load_source(str(req.source), factory_args=options.factory_args,
                             weights=options.weights, submodule=options.submodule)
    samples: list[Sample] | None = None
    export_info = None
    if loaded is not None:
        specs = list(req.inputs) or loaded.example_inputs
        if req.calib is not None and specs:
            samples = load_samples(req.calib, inputs=[_as_io(s) for s in specs],
                                   preprocess=req.preprocess, progress=progress)
        exported = export_loaded(loaded, tmp / f"{req.name}.exported.onnx", inputs=specs,
                                 consts=req.consts, other_consts=req.name != SINGLE,
                                 opset=options.opset, target=target,
                                 output_names=options.output_names if req.name == SINGLE else (),
                                 samples=samples or (), tolerance=options.tolerance, log=log)
        export_info = {"source": exported.source, "exporter": exported.exporter,
                       "opset": exported.opset, "validation": exported.validation,
                       "weights": exported.weights, "warnings": exported.warnings,
                       "consts": exported.consts}
        source = {"model": loaded.description,
                  "files": {p.name: sha256(p) for p in loaded.files if p.is_file()},
                  "export": export_info}
        model_path = exported.path
    else:
        model_path = Path(req.source)
        source = {"file": model_path.name,
                  "sha256": sha256(model_path) if model_path.is_file() else ""}
    clock.lap("load/export")

    proto = load_model(model_path)
    before = len(proto.graph.node)
    names = [i.name for i in graph_inputs(proto)]
    # forward() arguments a PyTorch export fixed are constants already (source.export)
    argued = {k: c["value"] for k, c in (export_info or {}).get("consts", {}).items()}
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
        consts = {**consts, **calibration_consts(proto, seen, decided, log=log)}
    if consts:
        # the manifest records the very arrays the graph holds (const_value refuses a value
        # the input's dtype cannot hold)
        consts = {k: const_value(proto, k, v) for k, v in consts.items()}
        proto = freeze_inputs(proto, consts)
        log("const: " + ", ".join(f"{k}={_short(v)}" for k, v in consts.items())
            + " frozen into the graph (no longer inputs)")
        if samples:
            samples = [{k: v for k, v in s.items() if k not in consts} for s in samples]
        source["consts"] = {k: v.tolist() for k, v in consts.items()}
    if argued:
        source["consts"] = {**argued, **source.get("consts", {})}
    shapes = {s.name: list(s.shape) for s in req.inputs}
    if req.preprocess:  # before fixing shapes, so a misfit reads as a preprocessing error
        first = io_specs(graph_inputs(proto))[0]
        check_fits(req.preprocess, first["name"], shapes.get(first["name"], first["shape"]),
                   first["dtype"])
    fixed = fix_shapes_proto(proto, shapes_for(proto, shapes, req.preprocess, req.calib,
                                                target.batch), batch=target.batch, strict=False)
    clock.lap("shapes")
    # what stays open after this is resolved from a real run once the samples are loaded
    simplified, simplifier, reason = simplify_static(fixed, model_path, batch=target.batch,
                                                     frozen=bool(consts))
    clock.lap("simplify")
    log(f"simplify: {before} -> {len(simplified.graph.node)} nodes ({simplifier})")
    if reason:
        log(f"simplify: onnxsim not used, fell back to onnxruntime basic optimisation ({reason})")
    inputs = io_specs(graph_inputs(simplified))
    log("shapes: " + ", ".join(f"{i['name']} {'x'.join(map(str, i['shape']))}" for i in inputs))
    if req.preprocess:
        check_fits(req.preprocess, inputs[0]["name"], inputs[0]["shape"], inputs[0]["dtype"])

    if req.labels:
        check_labels(req.labels, simplified, model_path if loaded is None else "the model")
    task = task_for(req.task, keep, simplified, model_path if loaded is None else "the model")
    family = model_family(simplified)
    preset = target.preset_for(family)
    if family != "default" and family in target.family_quantization:
        log(f"{family} model: using the target's {family} preset")
    requested = req.quant.get("precision") or (
        preset.precision if preset.precision in ("fp32", "fp16") else "auto")
    # only a forced static INT8 cannot do without calibration data (auto falls back to dynamic)
    needs_calib = requested == "int8" and req.quant.get("mode", preset.mode) == "static"
    if samples is None and req.calib is not None:
        samples = load_samples(req.calib, inputs=inputs, preprocess=req.preprocess,
                               progress=progress)
    clock.lap("calibration data")
    data = "calibration"
    if not samples:
        if needs_calib:
            raise CalibrationError(f"{_part_label(req)}static INT8 needs calibration data",
                                   "pass --calib DIR (images or .npy/.npz)"
                                   + (f", e.g. --calib {req.name}=DIR" if req.name != SINGLE
                                      else "") + ", or --mode dynamic / --precision fp32")
        if loaded is None:
            raise CalibrationError("no calibration or evaluation samples",
                                   "pass --calib DIR: samples are needed for golden data and "
                                   "accuracy")
        specs = [TensorSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in inputs]
        samples = [dict(zip([s.name for s in specs], make_inputs(specs, loaded.module, seed=s),
                            strict=True)) for s in range(RANDOM_SAMPLES)]
        data = "random"
        log(f"no calibration data: golden data and accuracy use {RANDOM_SAMPLES} random inputs")
    if dynamic_tensors(simplified):
        open_count = len(dynamic_tensors(simplified))
        simplified, varying = shapes_from_run(simplified, samples[:2])
        log(f"shapes: {open_count - len(varying)} tensor shape(s) that shape inference could not "
            "resolve came from a run at the static input shapes")
        if varying:
            log(f"shapes: {len(varying)} tensor(s) have data-dependent shapes and stay dynamic "
                f"({', '.join(varying[:3])})")
    calib_set, held_out = split_holdout(samples, fraction=holdout)
    given = calib_set   # the user's set: its size and spread are what the hygiene notes judge
    if data != "random":
        log(f"calibration: {len(calib_set)} samples, {len(held_out)} held out for accuracy")
        per_sample = activation_bytes(simplified)
        fitted = fit_memory(calib_set, per_sample)
        if len(fitted) < len(calib_set):
            log(f"calibration: {len(fitted)} of the {len(calib_set)} samples (evenly spread) "
                f"calibrate: the quantizer holds every tensor of every sample at once, "
                f"{per_sample / 1e6:.0f} MB each here, and {CALIB_BYTES / 2 ** 30:.0f} GiB is "
                "its share")
            calib_set = fitted

    clock.lap("shapes")
    feed = (held_out or samples)[0]
    time_graphs, why_not = graph_timer(target, timer, feed)
    original, no_original = original_graph(model_path, feed)
    choice = choose_fp32(fixed, simplified, simplifier, model_path, original, target=target,
                         frozen=bool(consts), samples=held_out or samples,
                         time_graphs=time_graphs, why_not=why_not, folder=tmp, name=req.name,
                         log=log)
    fp32 = choice.path
    clock.lap("fp32 graph")
    check_exclude(req.quant.get("exclude") or (), simplified.graph,
                  model_path if loaded is None else f"the export of {loaded.description}")
    budget = target.min_cosine if min_cosine is None else min_cosine
    fp32_outputs = run_model(fp32, held_out)   # once: the decision measures against them too
    labelled = (labelled_top1(fp32, samples, req.calib, req.labels)
                if data != "random" and req.preprocess and req.calib is not None else None)
    check_labelled(labelled, log)   # a model fed wrongly stops here, before any search
    fusion = None
    if fuse and family == "transformer" and not consts and not req.quant.get("exclude") and \
            all(p.name == "CPUExecutionProvider" for p in target.providers):
        fused, fusion = fuse_model(fixed, model_path, target, held_out, fp32_outputs,
                              tmp / f"{req.name}.fused.onnx", log, unfused=fp32, timer=timer)
        fp32 = fused or fp32
    if min_cosine is None and data != "random" and requested in ("int8", "auto") and \
            budget < EMBEDDING_COSINE:
        embeddings = embedding_outputs(fp32_outputs)
        if embeddings:
            budget = EMBEDDING_COSINE
            log(f"budget: output '{embeddings[0]}' is an L2-normalised embedding, compared with "
                f"other embeddings: cosine >= {budget} to FP32 (--min-cosine sets another)")
    if data != "random" and requested in ("int8", "auto"):
        for note in hygiene(given, held_out):
            log(f"warning: {note}")
    drop = max_drop if max_drop is not None else target.max_accuracy_drop
    if task is None and req.task is None:
        say_suggestion(simplified, fp32_outputs, req.labels, log)
    elif data != "random":   # a head the decoder does not read is refused, not trusted
        check_decoder_fits(task, simplified, fp32_outputs, input_size(req.preprocess, simplified))
    guard = AccuracyBudget(min_cosine=budget, max_drop=drop,
                           metric=metric[0] if metric else None,
                           metric_name=metric[1] if metric else "", task=task, keep=keep,
                           class_outputs=class_outputs(simplified.graph, req.labels))
    labels_held = (sample_labels(req.calib, len(samples), holdout)
                   if metric and req.calib is not None else None)
    folder = tmp / f"{req.name}.search"
    folder.mkdir()
    decision = decide(fp32, folder, target=target, family=family, overrides=dict(req.quant),
                      calib=calib_set if data != "random" else [], held=held_out,
                      budget=guard, labels=labels_held, timer=timer, log=log, progress=progress,
                      fp32_outputs=fp32_outputs, steps=steps,
                      engine_pays=engine_pays(target, fp32, held_out, timer=timer, log=log,
                                              wanted=openvino))
    config, candidate = decision.config, decision.candidate.path
    clock.lap("search")
    needs_calib = config.precision == "int8" and config.mode == "static"
    accuracy = {**decision.candidate.accuracy, "data": data}
    log(f"accuracy vs {'the model as given' if config.mode == 'given' else 'FP32'} on held-out "
        "samples: " + accuracy_line(accuracy))
    precision = {**config.__dict__, "exclude": list(config.exclude), "family": family,
                 "description": config.describe(),
                 "calibration_samples": len(calib_set) if needs_calib else 0}
    precision["decision"] = decision.record
    if labelled:
        precision["labelled_top1"] = labelled
    if fusion:
        precision["fusion"] = fusion
    if needs_calib:
        precision["calibration"] = calibration_record(calib_set, config.calibration_method)
    graphs = provider_graphs(target, config, fp32, folder, held_out, guard, labels_held,
                             fp32_outputs, log, decision.candidates)
    engine = choose_engine(decision, target, fp32, held_out, guard, labels_held, fp32_outputs,
                           timer=timer, log=log, wanted=openvino, original=choice.original)
    graphs += engine_graph(engine, decision)
    clock.lap("engines")
    precision["fp32_graph"] = choice.record
    same_run = (decision.record.get("engine") or {}).pop("vs_original", None)
    precision["vs_original"] = against_original(candidate, choice.original, time_graphs,
                                                why_not or no_original, choice, same_run)
    if loaded is not None:   # what the user had: the module in eager PyTorch, fed as exported
        precision["vs_eager"] = against_eager(candidate, loaded, export_info, feed, target,
                                              why_not or "", forward=(names, consts))
    clock.lap("speed vs original")
    precision["stage_seconds"] = clock.since(started)
    # a model quantized already has no FP32 to judge against: the device reproduces it
    reference = None if config.mode == "given" else fp32
    payload = PartPayload(req.name, candidate, reference, held_out[:golden], precision, accuracy,
                          req.preprocess, req.labels, source, graphs,
                          recorded_task(task, keep))
    result = PartResult(req.name, before, len(simplified.graph.node), simplifier, reason, family,
                        accuracy, config, len(calib_set) if needs_calib else 0, export_info,
                        (*consts, *argued), engine)
    return payload, result


def _short(value: Any) -> str:
    text = repr(value.tolist() if hasattr(value, "tolist") else value)
    return text if len(text) <= 40 else text[:37] + "..."


def _as_io(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype}


def _part_label(req: PartRequest) -> str:
    return "" if req.name == SINGLE else f"part {req.name}: "
