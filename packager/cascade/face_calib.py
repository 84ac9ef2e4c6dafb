"""Calibration for a face (MTCNN) pipeline's parts: what each stage really sees when the original
models run the runner's cascade on the propose stage's photos (P-Net: the packed pyramid-level
inputs, R-Net: the 24x24 crops P-Net proposes, O-Net: the 48x48 crops R-Net keeps)."""

from pathlib import Path
from typing import Any

import numpy as np

from .._runtimes.runner.cascade import Cascade
from .._runtimes.runner.errors import BundleError
from .._runtimes.runner.images import read_image
from ..errors import CalibrationError
from ..source.specs import TensorSpec
from .host import original_parts, photos
from .spec import PipelineSpec

MAX_INPUTS = {"propose": 64, "refine": 2000, "output": 2000}   # samples kept a stage (the
# quantizer holds them all at once: 64 P-Net inputs of 320x240 are 59 MB)


def face_calibration(spec: PipelineSpec, folder: Path) -> dict[str, Path]:
    """{part: folder of one .npz} for every stage without its own calib and for the propose
    stage (its photos become the pyramid-level inputs P-Net runs on): each part's inputs as the
    original models' cascade feeds them on the propose stage's photos, spread evenly over
    them when there are more than MAX_INPUTS."""
    parts, sessions = original_parts(spec)
    seen: dict[str, list[np.ndarray]] = {p["name"]: [] for p in parts}

    def run_part(part: dict[str, Any], feed: dict[str, Any]) -> list[Any]:
        seen[part["name"]].append(next(iter(feed.values())))
        return sessions[part["name"]].run([o["name"] for o in part["outputs"]], feed)

    cascade = Cascade({"parts": parts, "pipeline": spec.section()}, run_part)
    propose = spec.stages[0]
    assert propose.calib is not None   # load_pipeline requires it of the first stage
    for path in photos(propose.calib):
        try:
            cascade.read(read_image(path, propose.preprocess))
        except BundleError as exc:   # a photo the runner cannot read: the user's to fix
            raise CalibrationError(f"{propose.calib}: {exc}",
                                   "convert or remove that photo") from None
    out = {}
    for stage in spec.stages:
        if stage.calib is not None and stage is not propose:
            continue
        tensors = seen[stage.part]
        if not tensors:
            raise CalibrationError(
                f"{propose.calib}: the original models send no input to the {stage.step} "
                f"stage ({stage.part}) on these photos (no face proposed)",
                "add photos with faces, or give the stage its own calib")
        step = max(1, -(-len(tensors) // MAX_INPUTS[stage.step]))
        chosen = np.concatenate(tensors[::step])
        if stage.batch > 1:   # samples of the part's static batch, the last filled from the first
            count = -(-len(chosen) // stage.batch) * stage.batch
            chosen = chosen[np.arange(count) % len(chosen)].reshape(
                (-1, stage.batch) + chosen.shape[1:])
        name = next(p for p in parts if p["name"] == stage.part)["inputs"][0]["name"]
        target = folder / f"{stage.part}-inputs"
        target.mkdir(parents=True)
        np.savez(target / "inputs.npz", **{name: chosen})
        out[stage.part] = target
    return out


def batched_inputs(spec: PipelineSpec) -> list[TensorSpec]:
    """build()'s part inputs for the stages that run crops in batches: (batch, C, H, W) or
    (batch, H, W, C) per the stage's preprocess, named as the model names its input."""
    import onnx

    out = []
    for stage in spec.stages:
        if stage.batch > 1:
            name = onnx.load(str(stage.model), load_external_data=False).graph.input[0].name
            width, height = stage.preprocess["size"]
            shape = (stage.batch, 3, height, width) if stage.preprocess.get(
                "layout", "nchw") == "nchw" else (stage.batch, height, width, 3)
            out.append(TensorSpec(name, shape, part=stage.part))
    return out
