"""The pipeline run here on the original models, with the runner's own cascade code: the
reference a pipeline bundle is judged against, and the crops that calibrate its later stages."""

from pathlib import Path
from typing import Any

import numpy as np

from .._runtimes.runner.cascade import Cascade
from .._runtimes.runner.cascade_ocr import crop_quad, fit_crop, rotate180
from .._runtimes.runner.images import IMAGE_SUFFIXES, read_image
from ..errors import CalibrationError
from .spec import PipelineSpec

MAX_CROPS = 2000   # calibration crops kept a stage (the quantizer holds them all at once)


def original_parts(spec: PipelineSpec) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(manifest-like parts of the original models, {part name: session}) for the cascade."""
    import onnxruntime as ort

    parts, sessions = [], {}
    for stage in spec.stages:
        session = ort.InferenceSession(str(stage.model), providers=["CPUExecutionProvider"])
        first = session.get_inputs()[0]
        width, height = stage.preprocess["size"]
        nchw = stage.preprocess.get("layout", "nchw") == "nchw"
        parts.append({"name": stage.part, "preprocess": stage.preprocess,
                      "inputs": [{"name": first.name, "shape": [1, 3, height, width] if nchw
                                  else [1, height, width, 3]}],
                      "outputs": [{"name": o.name} for o in session.get_outputs()],
                      **({"task": stage.task} if stage.task else {})})
        sessions[stage.part] = session
    return parts, sessions


def original_cascade(spec: PipelineSpec) -> Cascade:
    """The runner's Cascade over onnxruntime sessions on the pipeline's original models."""
    parts, sessions = original_parts(spec)

    def run_part(part: dict[str, Any], feed: dict[str, Any]) -> list[Any]:
        return sessions[part["name"]].run([o["name"] for o in part["outputs"]], feed)

    return Cascade({"parts": parts, "pipeline": spec.section()}, run_part)


def photos(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def crop_calibration(spec: PipelineSpec, folder: Path) -> dict[str, Path]:
    """{part: folder of one .npz} for each crop stage without calib: the crops the original
    detector finds in the detect stage's images, as that stage's tensors (the direction
    classifier's also turned 180 degrees, so both its classes calibrate)."""
    wanting = [s for s in spec.stages[1:] if s.calib is None]
    if not wanting:
        return {}
    detect = spec.stages[0]
    cascade = original_cascade(spec)
    pieces = []
    for path in photos(detect.calib):
        image = read_image(path, detect.preprocess)
        quads, _ = cascade.detect(image, {})
        pieces += [p for p in (crop_quad(image, quad) for quad in quads) if p is not None]
    if not pieces:
        raise CalibrationError(f"{detect.calib}: the detector finds no text in its images, so "
                               "the later stages have no crops to calibrate on",
                               "add photos with text, or give each stage its own calib")
    step = max(1, len(pieces) // MAX_CROPS)
    pieces = pieces[::step][:MAX_CROPS]
    out = {}
    for stage in wanting:
        chosen = pieces
        if stage.step == "direction":
            chosen = [p for piece in pieces for p in (piece, rotate180(piece))][:MAX_CROPS]
        name = next(p for p in cascade.parts() if p["name"] == stage.part)["inputs"][0]["name"]
        target = folder / f"{stage.part}-crops"
        target.mkdir(parents=True)
        np.savez(target / "crops.npz",
                 **{name: np.concatenate([fit_crop(p, stage.preprocess) for p in chosen])})
        out[stage.part] = target
    return out
