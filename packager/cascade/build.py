"""build_pipeline(): a pipeline file's parts built into one bundle, each with its own precision
decision, the manifest's `pipeline` section telling the runner to run them as a cascade, and
the whole pipeline judged end to end on held-out photos against the original models."""

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._runtimes.runner.errors import BundleError as RunnerError
from ..build.job import BuildResult, build
from ..build.plan import DEFAULT_EXPORT
from ..errors import BudgetMissed, CalibrationError
from ..quantization.request import QuantRequest
from .face_calib import batched_inputs, face_calibration
from .host import crop_calibration, photos
from .judge import end_to_end
from .spec import PipelineSpec, load_pipeline
from .speech import (
    read_sentence,
    sentence_files,
    speech_calibration,
    speech_end_to_end,
    speech_lengths,
    speech_sources,
    stage_of,
)

HELD_OUT_EVERY = 5   # every 5th photo of the detect stage's calib judges the pipeline end to end


def build_pipeline(pipeline: Path | str | PipelineSpec, output: Path, *,
                   log: Callable[[str], None] = lambda _: None,
                   **options: Any) -> tuple[BuildResult, dict[str, Any]]:
    """Build every stage of *pipeline* (a pipeline .toml, spec.py) as a part of one bundle at
    *output*; *options* are build()'s (target, quant, holdout, golden, force, tune...).

    Every 5th photo of the detect stage's calib is held out of every stage's calibration and
    judges the bundle end to end (judge.py: the original's text lines read alike). A bundle
    that misses that budget with a stage below FP32 is built again with every stage at FP32,
    said in one line; one that misses it at FP32 is refused (BudgetMissed), nothing written.
    The figure is the manifest's pipeline.accuracy; the first held-out photos and the
    original's answers on them stay in the bundle (golden/pipeline/) for `run.py check`,
    which judges the device's run of them the same way. A crop stage without calib calibrates on
    the crops the original detector finds in the detect stage's (other) photos. Returns (the
    build, the figure)."""
    spec = pipeline if isinstance(pipeline, PipelineSpec) else load_pipeline(pipeline)
    if spec.kind == "tts":
        try:
            return build_speech(spec, output, log, options)
        except RunnerError as exc:   # the runner's glue refusing what the originals give
            raise CalibrationError(f"{spec.path}: {exc}", "check the pipeline's glue "
                                   "parameters against its models") from None
    detect = spec.stages[0]
    assert detect.calib is not None   # load_pipeline requires it of the detect stage
    found = photos(detect.calib)
    held = found[HELD_OUT_EVERY - 1::HELD_OUT_EVERY] if len(found) >= 2 * HELD_OUT_EVERY else []
    with tempfile.TemporaryDirectory(prefix="edgepack-pipeline-") as tmp:
        if held:
            folder = Path(tmp) / f"{detect.part}-photos"
            folder.mkdir()
            for k, path in enumerate(p for p in found if p not in held):
                shutil.copyfile(path, folder / f"{k:05d}{path.suffix.lower()}")
            spec = replace(spec, stages=(replace(detect, calib=folder), *spec.stages[1:]))
        face = spec.kind == "face"   # every MTCNN stage calibrates on what it sees there
        made = (face_calibration if face else crop_calibration)(spec, Path(tmp))
        for part in made:
            log(f"[{part}] calibration: " + ("the inputs it gets from the original cascade on "
                                             if face else "the crops the original detector "
                                             "finds in ") + str(detect.calib))
        if not held:
            log(f"end to end: not judged: {detect.calib} holds {len(found)} photo(s); "
                f"{2 * HELD_OUT_EVERY} or more let every {HELD_OUT_EVERY}th judge the pipeline")
            return _build(spec, output, made, log, options, None)
        return _judged(spec, output, made, log, options, held, end_to_end)


def build_speech(spec: PipelineSpec, output: Path, log: Callable[[str], None],
                 options: dict[str, Any]) -> tuple[BuildResult, dict[str, Any]]:
    """build_pipeline() of a tts pipeline (speech.py): every 5th sentence of the encode
    stage's calib held out to judge the bundle end to end by how it sounds; both stages
    calibrate on the others (the vocoder on the frames the original encoder makes of them)."""
    encode = stage_of(spec, "encode")
    assert encode.calib is not None   # load_pipeline requires it of the encode stage
    found = sentence_files(encode.calib)
    if not found:
        raise CalibrationError(f"{encode.calib}: no sentences (.npy files of token ids)",
                               "save each sentence's token ids with numpy.save")
    held = found[HELD_OUT_EVERY - 1::HELD_OUT_EVERY] if len(found) >= 2 * HELD_OUT_EVERY else []
    original, opened = speech_lengths(spec, held or found, log)
    if opened:
        options = dict(options, open_lengths={encode.part: opened})
    with tempfile.TemporaryDirectory(prefix="edgepack-pipeline-") as tmp:
        made = speech_calibration(spec, original, [read_sentence(p) for p in found
                                                   if p not in held], Path(tmp))
        log(f"[{spec.stages[1].part}] calibration: the frames the original {encode.part} "
            f"makes of the sentences in {encode.calib}, {original.chunk} at a time")
        if not held:
            log(f"end to end: not judged: {encode.calib} holds {len(found)} sentence(s); "
                f"{2 * HELD_OUT_EVERY} or more let every {HELD_OUT_EVERY}th judge the pipeline")
            return _build(spec, output, made, log, options, None)
        return _judged(spec, output, made, log, options, held, speech_end_to_end)


def _judged(spec: PipelineSpec, output: Path, made: dict[str, Path],
            log: Callable[[str], None], options: dict[str, Any], held: list[Path],
            figure_of: Callable[[PipelineSpec, Path, list[Path]], dict[str, Any]]
            ) -> tuple[BuildResult, dict[str, Any]]:
    """The bundle built and judged end to end on *held* (figure_of); one that misses with a
    stage below FP32 is built again with the stage that breaks it at FP32 (the figure's
    `blame`, a tts pipeline's), the others kept, and with every stage at FP32 where that
    misses too; each said in one line, each part's precision saying why."""
    lower = [s.part for s in spec.stages if s.precision != "fp32"]
    try:
        return _build(spec, output, made, log, options,
                      _judge(spec, held, log, bool(lower), figure_of))
    except Missed as missed:
        below = missed.figure.get("below", lower)   # the bundle's parts below FP32
        blamed = missed.figure.get("blame") or below
        why = f"end to end, the held-out speech missed its budget with {{}} below FP32 " \
            f"(worst {missed.figure.get('worst_mel_db', 0.0):.2f} dB)" if spec.kind == "tts" \
            else "end to end, the held-out photos missed their budget with {} below FP32"
    if len(blamed) < len(below):
        log(f"end to end: the budget is missed; {', '.join(blamed)} breaks it (the original "
            f"in its place keeps it): building {', '.join(blamed)} again at FP32, "
            f"{', '.join(p for p in below if p not in blamed)} kept")
        again = _at_fp32(spec, blamed, why.format(", ".join(blamed)))
        try:
            return _build(again, output, made, log, options,
                          _judge(again, held, log, True, figure_of))
        except Missed:
            log(f"end to end: the budget is missed again; building {', '.join(lower)} at FP32")
    else:
        log(f"end to end: the budget is missed; building {', '.join(lower)} again at FP32")
    spec = _at_fp32(spec, lower, why.format(", ".join(lower)))
    return _build(spec, output, made, log, options, _judge(spec, held, log, False, figure_of))


def _at_fp32(spec: PipelineSpec, parts: list[str], why: str) -> PipelineSpec:
    return replace(spec, stages=tuple(replace(s, precision="fp32", why=why) if s.part in parts
                                      else s for s in spec.stages))


class Missed(BudgetMissed):
    """The staged bundle misses its end-to-end budget with a stage below FP32: built again."""

    def __init__(self, message: str, figure: dict[str, Any]) -> None:
        super().__init__(message)
        self.figure = figure


def _judge(spec: PipelineSpec, held: list[Path], log: Callable[[str], None], retry: bool,
           figure_of: Callable[[PipelineSpec, Path, list[Path]], dict[str, Any]] = end_to_end
           ) -> Callable[[Path], dict[str, Any]]:
    """bundle()'s judge: the staged bundle end to end on *held*, its figure logged; a miss
    raises (nothing is published): Missed when *retry* (a stage is below FP32), else
    BudgetMissed."""
    def judge(staged: Path) -> dict[str, Any]:
        figure = figure_of(spec, staged, held)
        log(figure["text"])
        if not figure["passed"]:
            if retry:
                raise Missed(figure["text"], figure)
            raise BudgetMissed(f"{spec.path}: the pipeline misses its end-to-end budget with "
                               f"every stage at FP32 ({figure['text']})",
                               "check the glue parameters against the models' own pipeline")
        golden = figure.get("golden")
        if golden and spec.kind == "tts":
            log(f"end to end: {golden['count']} of the held-out sentences and the original's "
                "speech kept in golden/pipeline/ for `run.py check`")
        elif golden:
            log(f"end to end: {golden['count']} of the held-out photos and the original's "
                f"answers ({golden['wanted']} to find) kept in golden/pipeline/ for `run.py check`"
                + ("" if golden["wanted"] else ": the original finds nothing on them at "
                   "their kept size, so the device's check has nothing to judge; add held-out "
                   "photos where it does"))
        return figure
    return judge


def _build(spec: PipelineSpec, output: Path, made: dict[str, Path], log: Callable[[str], None],
           options: dict[str, Any], judge: Callable[[Path], dict[str, Any]] | None
           ) -> tuple[BuildResult, dict[str, Any]]:
    if spec.kind == "tts":   # each stage's static input given; no images to preprocess
        sources = speech_sources(spec)
        inputs = [s.input for s in spec.stages if s.input is not None]
    else:
        sources = {"source": spec.path, "parts": {s.part: str(s.model) for s in spec.stages}}
        inputs = batched_inputs(spec)
    source, weights = sources.pop("source"), sources.pop("weights", None)
    if weights is not None:   # a tts pipeline's PyTorch weights, for both of its parts
        options = dict(options, export_options=replace(
            options.get("export_options", DEFAULT_EXPORT), weights=weights))
    result = build(source, output, **sources, inputs=inputs,
                   part_calib={s.part: made.get(s.part) or s.calib for s in spec.stages},
                   part_preprocess={s.part: s.preprocess for s in spec.stages if s.preprocess},
                   part_quant={s.part: QuantRequest(precision=s.precision, why=s.why or None)
                               for s in spec.stages if s.precision},
                   tasks={s.part: s.task for s in spec.stages if s.task},
                   pipeline=spec.section(), judge=judge, log=log, **options)
    return result, result.bundle.manifest["pipeline"].get("accuracy", {"photos": 0})
