"""A pipeline file (`build --pipeline PIPELINE.toml`): the parts of one bundle that run as a
cascade, each with its model, data, preprocessing, task, precision and glue parameters.
Three kinds: "ocr" (below), "face" (MTCNN: steps propose, refine, output; each stage's
preprocess gives its input's size and normalisation, the propose stage's calib the photos) and
"tts" (speech.py: steps encode and vocode, each an .onnx or a part of one PyTorch model).

    kind = "ocr"

    [[stage]]
    part = "det"                  # the part's name in the bundle
    step = "detect"               # detect, direction (optional), recognize
    model = "det.onnx"            # paths are relative to this file
    calib = "photos/"             # images (or .npy/.npz); a crop stage may leave it out: its
                                  # crops then come from the detector on the detect stage's
    preprocess = "size=640x640,resize=letterbox,pad=0,color=bgr,scale=1/255,mean=0.5,std=0.5"
    task = "segment:threshold=0.3"            # --task's forms (KIND:key=value | FILE.toml)
    precision = "auto"            # int8, fp16, fp32 or auto (the part's own decision)
    threshold = 0.3               # glue: runner/cascade_spec.py's STEP_PARAMETERS
"""

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._runtimes.runner.cascade_spec import (
    MAX_FACE_SIDE,
    OPTIONAL_STEPS,
    PIPELINE_KINDS,
    STEP_PARAMETERS,
    STEPS,
    parameter_problem,
)
from ..errors import PackagerError, SpecError
from ..quantization.preprocessing import parse_preprocess
from ..source.specs import TensorSpec, parse_input
from ..source.torchload import is_torch_source
from ..tasks.declare import parse_task
from ..textfile import read_text

PART_KEYS = ("part", "step", "model", "calib", "preprocess", "task", "precision", "batch")
SPEECH_KEYS = ("part", "step", "model", "module", "input", "calib", "task", "precision")
BATCHED_STEPS = ("refine", "output")   # crops of one photo run in batches of `batch`
MAX_BATCH = 256
PRECISIONS = ("int8", "fp16", "fp32", "auto")
MAX_PIPELINE_BYTES = 1_000_000


@dataclass(frozen=True)
class Stage:
    """One stage: its part and what the build needs of it, and its glue parameters."""

    part: str
    step: str
    model: Path
    preprocess: dict[str, Any]
    calib: Path | None = None
    task: dict[str, Any] | None = None
    precision: str | None = None
    glue: Mapping[str, Any] = field(default_factory=dict)
    batch: int = 1   # the part's static batch (a face pipeline's crop stages)
    input: TensorSpec | None = None   # a tts stage's static input (tokens, or frames)
    module: str | None = None         # a tts stage's part of the pipeline's PyTorch model
    why: str = ""                     # why *precision* is what it is, where the build set it


@dataclass(frozen=True)
class PipelineSpec:
    path: Path
    kind: str
    stages: tuple[Stage, ...]
    model: str | None = None     # a tts pipeline's PyTorch model (file.py:factory), its stages
    weights: Path | None = None  # its parts; its weights (.safetensors, .pt)

    def section(self) -> dict[str, Any]:
        """The manifest's `pipeline` section (runner/cascade_spec.py reads it)."""
        return {"kind": self.kind,
                "stages": [{"part": s.part, "step": s.step, **dict(s.glue)} for s in self.stages]}

    def stage(self, step: str) -> Stage | None:
        return next((s for s in self.stages if s.step == step), None)


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def _fail(path: Path, where: str, problem: str, fix: str) -> SpecError:
    return SpecError(f"{path}: {where} {problem}", fix)


def _relative(path: Path, value: Any, where: str, *, folder: bool) -> Path:
    if not isinstance(value, str) or not value:
        raise _fail(path, where, "must be a path", "give a path relative to the pipeline file")
    found = (path.parent / value).resolve()
    if not (found.is_dir() if folder else found.is_file()):
        raise _fail(path, where, f"= {value!r:.80}: no such {'folder' if folder else 'file'} "
                    f"({found})", "give a path relative to the pipeline file")
    return found


def _task(path: Path, value: Any, where: str) -> dict[str, Any]:
    """The stage's task from --task's text forms, an @FILE or a .toml relative to *path*."""
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, where, "must be text like --task's (KIND[:key=value,...] or "
                    "FILE.toml)", "e.g. task = \"ctc:alphabet=@chars.txt\"")
    text = value.strip()
    if text.endswith(".toml"):
        text = str(path.parent / text)
    else:   # an @FILE list is read relative to the pipeline file
        text = ",".join(item.split("=", 1)[0] + "=@" + str(path.parent / item.split("=@", 1)[1])
                        if "=@" in item else item for item in text.split(","))
    try:
        return parse_task(text)
    except PackagerError as exc:
        raise _fail(path, where, f"({exc.message})", exc.hint) from None


def _stage(path: Path, i: int, kind: str, raw: Any, torch_model: bool = False) -> Stage:
    where = f"stage[{i}]"
    if not isinstance(raw, dict):
        raise _fail(path, where, "is not a table", "write [[stage]] and its keys under it")
    if kind == "tts":
        return _speech_stage(path, where, raw, torch_model)
    step = raw.get("step")
    if step is None:
        raise _fail(path, f"{where}.step", "is missing: each stage says which step it is",
                    f"add step = \"{STEPS[kind][0]}\" (steps: {', '.join(STEPS[kind])})")
    if step not in STEPS[kind]:
        raise _fail(path, f"{where}.step", f"= {step!r:.40} is not a step of {_a(kind)} pipeline",
                    f"use one of {', '.join(STEPS[kind])}")
    part = raw.get("part")
    if not isinstance(part, str) or not part:
        raise _fail(path, f"{where}.part", "must name the part", f"e.g. part = \"{step[:3]}\"")
    for key in ("model", "preprocess"):
        if key not in raw:
            raise _fail(path, where, f"has no {key}", f"add {key} = ..." + (
                " (an .onnx file)" if key == "model" else
                " (the photo's resize and normalisation for the detector)" if step == "detect"
                else " (the crops' size and normalisation come from it)"))
    model = _relative(path, raw["model"], f"{where}.model", folder=False)
    if model.suffix.lower() != ".onnx":
        raise _fail(path, f"{where}.model", f"= {raw['model']!r:.80} is not an .onnx file",
                    "export the stage's model to ONNX first (edgepack export)")
    if not isinstance(raw["preprocess"], str):
        raise _fail(path, f"{where}.preprocess", "must be text like --preprocess's",
                    "e.g. preprocess = \"size=320x48,color=bgr,scale=1/255,mean=0.5,std=0.5\"")
    try:
        preprocess = parse_preprocess(raw["preprocess"])
    except PackagerError as exc:
        raise _fail(path, f"{where}.preprocess", f"({exc.message})", exc.hint) from None
    least = 12   # P-Net's cell; the runner's summed-area table wants crops of 12 or more
    if kind == "face" and not least <= min(preprocess["size"]) <= max(
            preprocess["size"]) <= MAX_FACE_SIDE:
        raise _fail(path, f"{where}.preprocess", f"size {preprocess['size'][0]}x"
                    f"{preprocess['size'][1]} does not fit a {step} stage",
                    f"give {least} to {MAX_FACE_SIDE} pixels a side" + (
                        " (P-Net's static input: 320x240 suits most photos)"
                        if step == "propose" else ""))
    calib = _relative(path, raw["calib"], f"{where}.calib", folder=True) \
        if "calib" in raw else None
    if calib is None and step == STEPS[kind][0]:
        raise _fail(path, where, "has no calib", "add calib = \"photos/\": the "
                    f"{'proposal net' if kind == 'face' else 'detector'} needs images, and the "
                    "later stages' crops come from them")
    task = _task(path, raw["task"], f"{where}.task") if "task" in raw else None
    precision = _precision(path, where, raw)
    batch = raw.get("batch", 1)
    if "batch" in raw and step not in BATCHED_STEPS:
        raise _fail(path, f"{where}.batch", f"is not a key of a {step} stage",
                    f"only {' and '.join(BATCHED_STEPS)} stages run crops in batches")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise _fail(path, f"{where}.batch", f"= {str(batch)!r:.40} is not a batch size",
                    f"give a whole number from 1 to {MAX_BATCH} (the crops run at a time)")
    glue = _glue(path, where, step, raw, PART_KEYS)
    return Stage(part, step, model, preprocess, calib, task, precision, glue, batch)


def _precision(path: Path, where: str, raw: dict[str, Any]) -> str | None:
    precision = raw.get("precision")
    if precision is not None and precision not in PRECISIONS:
        raise _fail(path, f"{where}.precision", f"= {precision!r:.40} is not a precision",
                    f"use one of {', '.join(PRECISIONS)}")
    return precision


def _glue(path: Path, where: str, step: str, raw: dict[str, Any], keys: tuple[str, ...]
          ) -> dict[str, Any]:
    """The stage's glue parameters: its keys that are not *keys*, each checked."""
    glue = {k: v for k, v in raw.items() if k not in keys}
    for key, value in glue.items():
        problem = parameter_problem(step, key, value)
        if problem:
            raise _fail(path, f"{where}.{key}", problem, f"{step} stages take "
                        f"{', '.join(list(keys) + sorted(STEP_PARAMETERS[step]))}")
    return glue


def _speech_stage(path: Path, where: str, raw: dict[str, Any], torch_model: bool) -> Stage:
    """A tts stage: its part, step, model (an .onnx) or module (a part of the pipeline's
    PyTorch model), static input, calib (the encode stage's: .npy files of token ids)."""
    step, part = raw.get("step"), raw.get("part")
    if step not in STEPS["tts"]:
        raise _fail(path, f"{where}.step", f"= {step!r:.40} is not a step of a tts pipeline",
                    "use encode, then vocode")
    if not isinstance(part, str) or not part:
        raise _fail(path, f"{where}.part", "must name the part", f"e.g. part = \"{step[:3]}\"")
    unknown = [k for k in raw if k not in SPEECH_KEYS and k not in STEP_PARAMETERS[step]]
    if unknown:
        raise _fail(path, f"{where}.{unknown[0][:40]}", f"is not a key of a {step} stage",
                    f"its keys: {', '.join(list(SPEECH_KEYS) + sorted(STEP_PARAMETERS[step]))}")
    if torch_model == ("model" in raw) or torch_model != ("module" in raw):
        raise _fail(path, where, "needs either its own model (an .onnx) or, under the "
                    "pipeline's PyTorch model, a module", "e.g. model = \"encoder.onnx\", or "
                    "model = \"tts.py:make\" at the top and module = \"encoder\" here")
    model = _relative(path, raw["model"], f"{where}.model", folder=False) \
        if "model" in raw else path
    if "model" in raw and model.suffix.lower() != ".onnx":
        raise _fail(path, f"{where}.model", f"= {raw['model']!r:.80} is not an .onnx file",
                    "export it first, or name the PyTorch model at the top (model = ...)")
    if not isinstance(raw.get("input"), str):
        raise _fail(path, f"{where}.input", "must give the static input, like --input's",
                    "e.g. input = \"tokens:1x32:int64\" (encode) or \"frames:1x16x192\" "
                    "(vocode: 16 frames at a time)")
    try:
        spec = parse_input(raw["input"])
    except PackagerError as exc:
        raise _fail(path, f"{where}.input", f"({exc.message})", exc.hint) from None
    calib = _relative(path, raw["calib"], f"{where}.calib", folder=True) \
        if "calib" in raw else None
    if (calib is None) == (step == "encode"):
        raise _fail(path, f"{where}.calib", "is missing" if calib is None else
                    "is not a key of a vocode stage", "give the encode stage calib = "
                    "\"sentences/\" (.npy files of token ids); the vocoder calibrates on "
                    "the frames the original encoder makes of them")
    precision = _precision(path, where, raw)
    glue = _glue(path, where, step, raw, SPEECH_KEYS)
    chunk = spec.shape[1] if step == "vocode" and len(spec.shape) == 3 else None
    if chunk is not None and 2 * int(glue.get("context", 0)) >= chunk:
        raise _fail(path, f"{where}.context", f"= {glue['context']} leaves nothing of a "
                    f"{chunk}-frame chunk between its two overlaps",
                    f"give context below half the chunk (at most {(chunk - 1) // 2}), or a "
                    "longer chunk in input")
    task = _task(path, raw["task"], f"{where}.task") if "task" in raw else None
    return Stage(part, step, model, {}, calib, task, precision, glue,
                 input=TensorSpec(spec.name, spec.shape, spec.dtype, part=part),
                 module=raw.get("module") if isinstance(raw.get("module"), str) else None)


def _torch_model(path: Path, data: dict[str, Any]) -> tuple[str | None, Path | None]:
    """A tts pipeline file's PyTorch model (file.py:factory, its file relative to *path*)
    and weights, or (None, None)."""
    if "model" not in data:
        if "weights" in data:
            raise _fail(path, "weights", "needs the PyTorch model they are for",
                        "add model = \"tts.py:make_tts\"")
        return None, None
    text = data["model"]
    if not isinstance(text, str) or not is_torch_source(text):
        raise _fail(path, "model", f"= {str(text)!r:.80} is not a PyTorch model",
                    "give file.py:factory (its stages then name their module)")
    file, _, factory = text.rpartition(":")
    if file.endswith(".py"):
        text = f"{_relative(path, file, 'model', folder=False)}:{factory}"
    weights = _relative(path, data["weights"], "weights", folder=False) \
        if "weights" in data else None
    return text, weights


def load_pipeline(path: Path | str) -> PipelineSpec:
    """The pipeline file at *path*, checked: SpecError naming the file and key."""
    path = Path(path)
    text = read_text(path, cap=MAX_PIPELINE_BYTES, where="--pipeline",
                     fix="pass a pipeline .toml (docs/pipelines.md)")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"--pipeline {path}: cannot read it ({exc})",
                        "fix the TOML (kind = \"ocr\", then one [[stage]] table a part)") from None
    kind = data.get("kind")
    if kind not in PIPELINE_KINDS:
        raise _fail(path, "kind", f"= {kind!r:.40} is not a pipeline kind",
                    f"use one of {', '.join(PIPELINE_KINDS)}")
    unknown = sorted(set(data) - {"kind", "stage"} - ({"model", "weights"} if kind == "tts"
                                                      else set()))
    if unknown:
        raise _fail(path, unknown[0][:40], "is not a key of a pipeline file",
                    "its keys: kind and [[stage]] tables" + (
                        ", and a tts pipeline's model and weights" if kind == "tts" else ""))
    raw = data.get("stage")
    if not isinstance(raw, list) or not raw:
        raise _fail(path, "stage", "is missing", "add one [[stage]] table per part")
    model, weights = _torch_model(path, data) if kind == "tts" else (None, None)
    stages = tuple(_stage(path, i, kind, s, model is not None) for i, s in enumerate(raw))
    steps = [s.step for s in stages]
    wanted = [s for s in STEPS[kind] if s in steps or s not in OPTIONAL_STEPS[kind]]
    if steps != wanted:
        raise _fail(path, "stage", f"steps are {', '.join(steps)}",
                    f"{_a(kind)} pipeline runs {', '.join(STEPS[kind])} in this order" +
                    (f" ({', '.join(OPTIONAL_STEPS[kind])} optional)" if OPTIONAL_STEPS[kind]
                     else ""))
    names = [s.part for s in stages]
    if len(set(names)) != len(names):
        raise _fail(path, "stage", "names a part twice", "give each stage its own part name")
    rec = stages[-1]
    if kind == "ocr" and (not rec.task or rec.task.get("kind") != "ctc" or
                          not rec.task.get("alphabet")):
        raise _fail(path, f"stage[{len(stages) - 1}].task", "must be a ctc task with its "
                    "alphabet (the text comes from it)", "e.g. task = \"ctc:alphabet=@chars.txt\"")
    return PipelineSpec(path, kind, stages, model, weights)
