"""Preprocessing sanity from labelled calibration images: before anything is quantized, the FP32
model's own top-1 on images in class folders (calib/cat/1.jpg). A model that scores about chance
there is fed wrongly (BGR for RGB, no mean/std, 0-255 for 0-1, NHWC for NCHW): the build stops
and says so, instead of shipping a bundle whose every answer is noise."""

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PreprocessSuspect
from ..graph.execute import Sample, run_model
from ..quantization.calibration import class_folders, is_image_source, list_sources, spread

MAX_CHECKED = 200   # labelled images the FP32 model runs on
MIN_CHECKED = 20    # fewer cannot tell a weak model from a wrongly fed one
P_CHANCE = 0.01     # the score must be unlikely (p < 1 %) under guessing among the classes


def folder_labels(source: Path, count: int, batch: int = 1) -> list[str] | None:
    """The class folder of each image in the *count* samples loaded from *source* (*batch*
    consecutive images a sample, the loader's own picks), sample by sample, or None where
    there are no class folders."""
    files = list_sources(source)
    if not is_image_source(files):
        return None
    labels = class_folders(source, files)
    if None in labels or len(set(labels)) < 2:
        return None
    picks = spread(len(labels) // batch)   # as calibration._image_samples picks its samples
    if len(picks) != count:
        return None
    return [labels[p * batch + j] for p in picks for j in range(batch)]


def chance_p_value(hits: int, n: int, p: float) -> float:
    """P(X >= hits) for X ~ Binomial(n, p): how likely guessing scores this well."""
    return float(sum(math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(hits, n + 1)))


def class_output(outputs: dict[str, np.ndarray], labels: Sequence[str] | None,
                 batch: int = 1) -> str | None:
    """The output holding one score per class per image: (samples, batch, C) with C >= 2 (C
    the number of --labels when given)."""
    for name, value in outputs.items():
        if value.ndim == 3 and value.shape[1] == batch and value.shape[2] >= 2 and \
                (labels is None or value.shape[2] == len(labels)):
            return name
    return None


def labelled_top1(model: Path, samples: Sequence[Sample], source: Path | None,
                  labels: Sequence[str] | None) -> dict[str, Any] | None:
    """{"top1", "hits", "n", "classes", "mapping", "p_value", "output"} of *model* on the
    labelled images among *samples*, or {"skipped": why} / None (no class folders)."""
    if source is None:
        return None
    batch = int(next(iter(samples[0].values())).shape[0]) if samples else 1
    found = folder_labels(source, len(samples), batch)
    if found is None:
        return None
    names = sorted(set(found))
    picks = spread(len(samples), max(1, MAX_CHECKED // batch))
    outputs = run_model(model, [samples[i] for i in picks])
    name = class_output(outputs, labels, batch)
    if name is None:
        return {"skipped": "no output holds one score per class"
                + (f" for the {len(labels)} --labels" if labels else "")}
    classes = outputs[name].shape[2]
    index, mapping = class_index(names, classes, labels)
    if index is None:
        return {"skipped": mapping}
    predicted = outputs[name].reshape(len(picks) * batch, classes).argmax(axis=1)
    wanted = [found[i * batch + j] for i in picks for j in range(batch)]
    hits = int(sum(int(p) == index[w] for p, w in zip(predicted, wanted, strict=True)))
    n = len(wanted)
    return {"top1": hits / n, "hits": hits, "n": n, "classes": classes, "mapping": mapping,
            "output": name, "p_value": chance_p_value(hits, n, 1.0 / classes),
            "confusion": confusion(names, index, wanted, predicted)}


def class_index(names: Sequence[str], classes: int, labels: Sequence[str] | None
                ) -> tuple[dict[str, int] | None, str]:
    """({class folder: output number}, how they were matched), or (None, why not)."""
    if labels:
        missing = [n for n in names if n not in labels]
        if missing:
            return None, f"class folder '{missing[0]}' is not among --labels"
        return {label: i for i, label in enumerate(labels)}, "folder names matched to --labels"
    if all(n.isdigit() for n in names) and max(int(n) for n in names) < classes:
        return {label: int(label) for label in names}, "folder names as output numbers"
    if len(names) == classes:   # torchvision's ImageFolder order
        return ({label: i for i, label in enumerate(names)},
                "class folders in sorted order as outputs 0.." + str(classes - 1))
    return None, (f"{len(names)} class folders for {classes} outputs and no --labels to match "
                  "them by name")


def sample_truth(samples: Sequence[Sample], source: Path | None, result: dict[str, Any] | None,
                 labels: Sequence[str] | None, outputs: dict[str, np.ndarray]
                 ) -> tuple[dict[str, int], str] | None:
    """({fingerprint of a sample: its label's output number}, the class-score output) for every
    sample of *samples* (one image or tensor set a sample), or None where they carry no labels:
    the class folders labelled_top1 judged (*result*), or the "labels" array of a single .npz
    of tensors (output numbers, or names matched as class folders are). *outputs*: FP32's on
    the held-out samples, where the class output is found for tensors. The budget's labels,
    wherever a sample is judged (held out, or in a k-fold rotation)."""
    from ..quantization.budget import fingerprint
    from ..quantization.calibration import source_labels

    if source is None or not samples or (result and "skipped" in result):
        return None
    if int(next(iter(samples[0].values())).shape[0]) != 1:
        return None
    found = source_labels(source, len(samples))
    output = result["output"] if result else class_output(outputs, labels)
    if found is None or output is None:
        return None
    names = sorted({str(f) for f in found})
    index, _ = class_index(names, int(outputs[output].shape[-1]), labels)
    if index is None:
        return None
    return {fingerprint(s): index[str(f)] for s, f in zip(samples, found, strict=True)}, output


def confusion(names: Sequence[str], index: dict[str, int], wanted: Sequence[str],
              predicted: Sequence[int]) -> dict[str, Any]:
    """Rows: the class folder; columns: the folder whose output the model picked, then
    "other" (an output no folder is matched to)."""
    column = {i: names.index(label) for label, i in index.items() if label in names}
    matrix = [[0] * (len(names) + 1) for _ in names]
    for want, got in zip(wanted, predicted, strict=True):
        matrix[names.index(want)][column.get(int(got), len(names))] += 1
    return {"classes": list(names), "columns": [*names, "other"], "matrix": matrix}


def check_labelled(result: dict[str, Any] | None, log) -> None:
    """Log the FP32 model's top-1 on the labelled images; stop the build (PreprocessSuspect)
    when it is no better than guessing."""
    if not result:
        return
    if "skipped" in result:
        log(f"labels: preprocessing not checked on the class folders: {result['skipped']}")
        return
    chance = 100.0 / result["classes"]
    text = (f"the FP32 model itself scores {100 * result['top1']:.1f} % top-1 on your "
            f"{result['n']} labelled images ({result['classes']} classes, chance "
            f"{chance:.1f} %; {result['mapping']})")
    if result["n"] >= MIN_CHECKED and result["p_value"] > P_CHANCE:
        raise PreprocessSuspect(text + ": no better than guessing",
                                "check --preprocess (color rgb/bgr, mean/std, scale, layout) "
                                "against how the model was trained"
                                + ("" if "--labels" in result["mapping"] else
                                   ", or pass --labels FILE to match outputs to your folders"))
    log(f"labels: {text}" + ("" if result["n"] >= MIN_CHECKED else
                             f" (under {MIN_CHECKED} images: not judged)"))
