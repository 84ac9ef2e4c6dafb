"""A valid but wrong preprocessing, caught on the labelled images: the FP32 model's top-1 on the
images in class folders under the user's --preprocess and under each usual alternative that
changes one thing (colour order swapped; the ImageNet mean/std added or left out; another resize),
and a warning where one scores markedly higher. A user's BGR and a missing mean/std built
silently at 77 % and 41 % labelled top-1 against 84.5 % (first-week-turn5): above chance, so the
chance check (label_check.check_labelled) let them through."""

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._runtimes.runner.errors import BundleError
from .._runtimes.runner.images import preprocess, read_image
from ..graph.execute import run_model
from ..quantization.calibration import class_folders, list_sources, spread
from .label_check import MAX_CHECKED, MIN_CHECKED, class_index

IMAGENET = {"scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
RESIZES = ("letterbox", "center-crop", "stretch")
MARGIN = 0.05   # points of top-1 another preprocessing must gain to be "markedly" better
MIN_GAIN = 4    # and images


def alternatives(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(what changed, the spec) for each usual alternative that changes one thing."""
    found = []
    if spec.get("color") in ("rgb", "bgr"):
        other = "bgr" if spec["color"] == "rgb" else "rgb"
        found.append((f"color={other}", {**spec, "color": other}))
        if spec.get("mean") is None and spec.get("std") is None:
            found.append(("the ImageNet mean/std (scale=1/255,mean=0.485/0.456/0.406,"
                          "std=0.229/0.224/0.225)", {**spec, **IMAGENET}))
        else:
            found.append(("no mean/std", {**spec, "mean": None, "std": None}))
    for resize in RESIZES:
        if resize != spec.get("resize"):
            found.append((f"resize={resize}", {**spec, "resize": resize}))
    return found


def labelled_files(source: Path, count: int) -> list[tuple[Path, str]] | None:
    """The (image, class folder) pairs labelled_top1 judges: the loader's picks of one image a
    sample, thinned to MAX_CHECKED as it thins them; None where the samples are batched or
    not in class folders."""
    files = list_sources(source)
    labels = class_folders(source, files)
    if None in labels or len(set(labels)) < 2:
        return None
    picks = spread(len(files))
    if len(picks) != count:
        return None
    judged = [picks[i] for i in spread(count, MAX_CHECKED)]
    return [(files[i], str(labels[i])) for i in judged]


def top1(model: Path, pairs: Sequence[tuple[Path, str]], spec: dict[str, Any], name: str,
         dtype: str, index: dict[str, int], output: str) -> float | None:
    """The FP32 model's labelled top-1 on *pairs* decoded under *spec* (None where it cannot
    decode them so)."""
    try:
        samples = [{name: preprocess(read_image(path, spec), spec).astype(dtype)}
                   for path, _ in pairs]
    except (BundleError, ValueError):
        return None
    scores = run_model(model, samples)[output]
    predicted = scores.reshape(len(samples), -1).argmax(axis=1)
    return float(np.mean([int(p) == index[label] for p, (_, label) in
                          zip(predicted, pairs, strict=True)]))


def check_alternatives(model: Path, source: Path, count: int, spec: dict[str, Any],
                       inputs: Sequence[dict[str, Any]], labels: Sequence[str] | None,
                       result: dict[str, Any] | None,
                       log: Callable[[str], None]) -> dict[str, Any] | None:
    """Warn (in the build's log) where a usual alternative to *spec* scores markedly higher
    labelled top-1 than the user's on the same images; the record of what was tried, or None
    where nothing could be (no labelled top-1, too few images, batched samples)."""
    if not result or "top1" not in result or result["n"] < MIN_CHECKED or len(inputs) != 1:
        return None
    pairs = labelled_files(source, count)
    if not pairs or len(pairs) != result["n"]:
        return None
    names = sorted({label for _, label in pairs})
    index, _ = class_index(names, result["classes"], labels)
    if index is None:
        return None
    found = {}
    for what, alt in alternatives(spec):
        score = top1(model, pairs, alt, inputs[0]["name"], inputs[0]["dtype"], index,
                     result["output"])
        if score is not None:
            found[what] = round(score, 4)
    record = {"yours": result["top1"], "n": result["n"], "alternatives": found}
    better = [(score, what) for what, score in found.items()
              if score - result["top1"] >= MARGIN and
              (score - result["top1"]) * result["n"] >= MIN_GAIN]
    if better:
        score, what = max(better)
        record["warning"] = (
            f"preprocessing: with {what} the FP32 model scores {100 * score:.1f} % labelled "
            f"top-1 on your {result['n']} images, against {100 * result['top1']:.1f} % with "
            "yours: check --preprocess against how the model was trained (the bundle ships "
            "yours)")
        log(f"warning: {record['warning']}")
    return record

