"""build(): the build job for one target, a straight list of stages: check the request, build
each part (part.py), choose the provider the bundle lists first, write the bundle, say the speed.

A bundle holds one model or several parts (`--part NAME=ATTR_OR_FACTORY`); each part goes
through export (PyTorch sources), fix shapes, simplify, quantize and measure on its own.
"""

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._runtimes.runner.contents import EXTRAS as RUNNER_EXTRAS
from .._runtimes.runner.sessions import describe_session
from ..atomic import check_free, check_writable, output_lock
from ..bundle.assemble import BundleResult, Tuner, archive_path, bundle
from ..device.page import write_page
from ..errors import SpecError
from ..progress import Log, Progress
from ..quantization.calibration import check_golden, check_holdout, list_sources
from ..quantization.request import QuantRequest
from ..source.specs import TensorSpec
from ..targets import Target, load_target
from ..timing import Stages
from .part import PartResult, build_part
from .part_shapes import check_task_early
from .plan import DEFAULT_EXPORT, ExportOptions, PartRequest, input_paths, plan_parts, size_of
from .provider_choice import check_wanted, with_provider
from .records import BuildContext, evidence_line, speed_lines

QUANT = QuantRequest()   # the target's preset as it is


@dataclass(frozen=True)
class BuildResult:
    bundle: BundleResult
    parts: list[PartResult]
    stages: dict[str, float] = field(default_factory=dict)   # seconds per build stage


def build(model: Path | str, output: Path, *, target: Target | str,
          calib: Path | None = None, preprocess: dict[str, Any] | None = None,
          inputs: Sequence[TensorSpec] = (), quant: QuantRequest | Mapping[str, Any] = QUANT,
          holdout: float = 0.2, golden: int | None = None, labels: Sequence[str] | None = None,
          name: str | None = None, force: bool = False,
          consts: Mapping[str, Any] = {},
          parts: Mapping[str, str] = {}, part_calib: Mapping[str, Path] = {},
          part_quant: Mapping[str, QuantRequest | Mapping[str, Any]] = {},
          part_preprocess: Mapping[str, dict[str, Any]] = {}, pipeline: dict | None = None,
          judge: Callable[[Path], dict[str, Any]] | None = None,
          export_options: ExportOptions = DEFAULT_EXPORT, min_cosine: float | None = None,
          max_accuracy_drop: float | None = None, metric: tuple[Any, str] | None = None,
          timer: Any = None, log: Log = lambda _: None,
          progress: Callable[[int, int], None] | None = None, fuse: bool = True,
          tune: Tuner | None = None, steps: Progress | None = None,
          offline: bool = False, openvino: str = "auto",
          tasks: Mapping[str, Mapping[str, Any]] = {},
          keep: Mapping[str, float] | None = None,
          runner_extras: Sequence[str] = RUNNER_EXTRAS, require_proof: bool = False,
          evaluate: Path | None = None,
          open_lengths: Mapping[str, str] = {}) -> BuildResult:
    """Export (PyTorch), fix shapes, simplify, quantize, measure and bundle for *target*.

    *model* is an .onnx file or a PyTorch source (`file.py:factory`, `pkg.mod:factory`,
    TorchScript, .pt2). *parts* maps part names to attribute paths in the PyTorch model (or to
    factories of their own, or .onnx files); their inputs are given as `PART/NAME:shape`,
    their calibration data in *part_calib*, their preprocessing in *part_preprocess* and
    per-part quantization overrides in *part_quant*; *pipeline* is the manifest's section that
    runs them as a cascade (cascade/build.py), *judge* measures it end to end on the staged
    bundle, *open_lengths* maps a part to the input whose axis 1 stays open (build/length.py).
    *quant* (a QuantRequest, or a mapping of its fields) overrides fields of the target's
    quantization preset (precision, mode, format, activation_type, weight_type, per_channel,
    reduce_range, calibration_method, exclude) and bounds the search (search_seconds).
    precision "auto" builds the candidates, times them here (or with *timer*, e.g.
    device.remote_timing.remote_timer on a device) and ships the fastest that keeps *min_cosine*
    (default: the target's budget). *tune* (tuning.local_tuner, or remote_tuner for a device)
    times session options with the finished bundle's runner, the manifest keeping the fastest;
    *offline*: each part also optimised offline where that loads faster (CPU targets,
    offline.py); *openvino*: "auto" lists the target's faster provider (OpenVINO on x86) first
    where it measures faster here, "yes" wherever its graph keeps the budget, "no" never.
    *tasks*: {part: its declared task} (tasks/declare.py: candidates judged and `run.py infer`
    answering in its terms), *keep* (--keep) what each keeps; *runner_extras*: serve, tune,
    profile, or fewer; *require_proof*: INT8 only where the samples can show its budget;
    *evaluate*: --eval's labelled folder, apart from *calib* (check_requests).
    """
    target = checked_target(target, holdout, golden, offline, openvino, timer)
    check_extras(runner_extras, tune)
    # held from the first check to the publish: a second run to this -o fails at once
    with output_lock(output := Path(output), archive_path(output)):
        sources = input_paths(model, calib, part_calib, export_options, parts)
        check_output(output, force, sources)
        requests = plan_parts(model, inputs=inputs, calib=calib, preprocess=preprocess,
                              quant=QuantRequest.of(quant), labels=labels, parts=parts,
                              part_calib=part_calib, export_options=export_options,
                              part_quant={k: QuantRequest.of(v) for k, v in part_quant.items()},
                              part_preprocess=part_preprocess)
        requests = [replace(r, consts=dict(consts), task=tasks.get(r.name), open_length=
                            open_lengths.get(r.name, "")) for r in requests]
        check_requests(requests, tasks, keep, target, evaluate)
        results, payloads = [], []
        with tempfile.TemporaryDirectory(prefix="edgepack-build-") as tmp, Stages() as clock:
            shared = BuildContext(
                holdout=holdout, golden=golden, options=export_options, min_cosine=min_cosine,
                max_drop=max_accuracy_drop, metric=metric, timer=timer, progress=progress,
                clock=clock, steps=steps, fuse=fuse, openvino=openvino, keep=keep,
                require_proof=require_proof, log=log, evaluate=evaluate and Path(evaluate))
            for req in requests:
                payload, result = build_part(req, target, Path(tmp),
                                             part_context(shared, req, requests))
                payloads.append(payload)
                results.append(result)
            target, payloads = with_provider(target, results, payloads, log)
            check_consts_used(consts, results)
            out = bundle(payloads, output, target=target, name=name, force=force, inputs=sources,
                         tune=tune, offline=offline, pipeline=pipeline, judge=judge,
                         extras=runner_extras)
            clock.lap("bundle")
        say_outcome(out, clock, len(requests) > 1, offline, log)
        return BuildResult(out, results, clock.record())


def part_context(shared: BuildContext, req: PartRequest, requests: Sequence[PartRequest]
                 ) -> BuildContext:
    """The build's context for one part: its log lines named where there are several, and
    whether its outputs feed the next part (every part but the last)."""
    if len(requests) == 1:
        return shared
    log = shared.log
    return replace(shared, feeds_part=req is not requests[-1],
                   log=lambda m, n=req.name: log(f"[{n}] {m}"))


def checked_target(target: Target | str, holdout: float, golden: int | None, offline: bool,
                   openvino: str, timer: Any) -> Target:
    """The target profile, once the options that need no model are checked against it."""
    check_holdout(holdout)
    check_golden(golden)
    target = load_target(target) if isinstance(target, str | Path) else target
    if offline and any(p.name != "CPUExecutionProvider" for p in target.providers):
        raise SpecError(f"--offline-optimize: {target.name} runs "
                        f"{target.providers[0].name}, which builds its own graph at load",
                        "use it for CPU targets (x86_64-cpu, rpi) only")
    check_wanted(target, openvino, timer)   # before the slow stages, not after the search
    return target


def check_consts_used(consts: Mapping[str, Any], results: Sequence[PartResult]) -> None:
    """Every --const named an input of some part."""
    unused = set(consts) - {k for r in results for k in r.consts}
    if unused:
        raise SpecError(f"--const {sorted(unused)[0]}: no model input has that name",
                        "see the inputs with `edgepack inspect MODEL`")


def check_extras(extras: Sequence[str], tune: Tuner | None) -> None:
    """The runner's extras asked for are known ones, and tune is among them for --tune (the
    build tunes with the bundle's own `run.py bench --tune`)."""
    for extra in extras:
        if extra not in RUNNER_EXTRAS:
            raise SpecError(f"--runner-extras {extra}: not one of the runner's extras",
                            f"pick from {', '.join(RUNNER_EXTRAS)}, or none")
    if tune is not None and "tune" not in extras:
        raise SpecError("--tune with --runner-extras without tune: the build tunes with the "
                        "bundle's own `run.py bench --tune`",
                        "add tune to --runner-extras, or drop --tune")


def check_output(output: Path, force: bool, sources: Sequence[Path]) -> None:
    """-o and its archive free (or --force), and room for the bundle, its archive and the
    temporary copies: found now, not after the pipeline ran."""
    check_free(output, force=force, inputs=sources)
    check_free(archive_path(output), force=force, inputs=sources)
    check_writable(output, need_bytes=3 * sum(size_of(p) for p in sources) + 10_000_000)


def check_requests(requests: Sequence[PartRequest], tasks: Mapping[str, Any],
                   keep: Mapping[str, float] | None, target: Target,
                   evaluate: Path | None = None) -> None:
    """What can be refused before the slow stages: a --task for no part, an empty data folder,
    a declared task the graph's outputs cannot have, --eval beside several parts or without
    --preprocess."""
    if evaluate is not None and (len(requests) > 1 or requests[0].preprocess is None):
        several = len(requests) > 1
        raise SpecError("--eval: " + ("give it for a one-model build" if several else
                                      "its images need --preprocess"),
                        "drop --eval" if several else "pass --preprocess as for --calib")
    unknown_task = sorted(set(tasks) - {r.name for r in requests})
    if unknown_task:
        raise SpecError(f"--task {unknown_task[0]}=...: no part '{unknown_task[0]}'",
                        f"parts: {', '.join(r.name for r in requests)}")
    for req in requests:
        if req.calib is not None:
            list_sources(req.calib)  # fail before the slow stages when a folder is empty
        check_task_early(req.source, req.task, keep,
                         {s.name: list(s.shape) for s in req.inputs},
                         req.preprocess, req.calib, target.batch)


def say_outcome(out: BundleResult, clock: Stages, several: bool, offline: bool,
                log: Log) -> None:
    """The build's closing lines: offline graphs, tuning, stage times, speed per part (against
    the original, eager PyTorch, and under the faster provider), the bundle's digest and its
    page, written first (reports/index.html)."""
    write_page(out.directory)
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
        for line in speed_lines(part.get("precision", {}), f" of {part['name']}" if several else ""):
            log(line)
    shipped = [evidence_line(part.get("precision", {}), part["name"] if several else "")
               for part in out.manifest["parts"]]
    log(f"bundle: {out.directory} and {out.archive}, digest {out.digest} (verify and deploy "
        "take it as --expect-digest)")
    log(f"page: {out.directory / 'reports' / 'index.html'} (what shipped and why, in one page "
        "to open in a browser; verify and deploy refresh it)")
    log("shipped: " + "; ".join(shipped))
