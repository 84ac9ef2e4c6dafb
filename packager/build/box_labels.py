"""Labelled boxes beside detection images, in the YOLO format every labelling tool exports: for
`DIR/images/NAME.jpg` the file `DIR/labels/NAME.txt` (Ultralytics' layout), or `NAME.txt` beside
the image; one line per box, `class cx cy w h`, the centre and size as shares of the image's
width and height; an empty file is an image with nothing to find.

Read into the model's input pixels (the calibration preprocessing's resize undone the other way:
stretch, letterbox or center-crop), keyed by each sample's fingerprint, they make the budget a
detector's box mAP@0.5 drop against FP32 on the same samples (quantization/box_map.py).
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CalibrationError
from ..graph.execute import Sample
from ..quantization.calibration import is_image_source, list_sources, picked


def label_file(image: Path) -> Path | None:
    """The YOLO label file of *image*: images/ -> labels/ (Ultralytics), else beside it."""
    parts = list(image.parts)
    if "images" in parts[:-1]:
        k = len(parts) - 1 - parts[::-1].index("images")
        sibling = Path(*parts[:k], "labels", *parts[k + 1:-1], image.stem + ".txt")
        if sibling.is_file():
            return sibling
    beside = image.with_suffix(".txt")
    return beside if beside.is_file() else None


def read_labels(path: Path, classes: int | None = None) -> np.ndarray:
    """(k, 5) class cx cy w h of a YOLO label file; a CalibrationError naming the file and
    line where one is not five numbers, a class out of range or a box outside 0..1."""
    rows = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            values = [float(v) for v in line.split()]
        except ValueError:
            values = []
        bad = len(values) != 5 or not float(values[0]).is_integer() or values[0] < 0 or \
            (classes is not None and values[0] >= classes) or \
            not all(0.0 <= v <= 1.0 for v in values[1:]) or values[3] <= 0 or values[4] <= 0
        if bad:
            raise CalibrationError(
                f"{path}:{n}: '{line.strip()[:60]}' is not a YOLO box (class cx cy w h, the "
                "centre and size as shares of the image, 0..1"
                + (f", class below {classes}" if classes is not None else "") + ")",
                "fix or remove that line (an image with no boxes has an empty file)")
        rows.append(values)
    return np.asarray(rows, np.float64).reshape(-1, 5)


def image_to_input(spec: dict[str, Any], size: tuple[int, int]):
    """A function taking (x, y) in an image of *size* (w, h) to the model's input pixels, as
    *spec*'s resize places it (runner task_detect's input_to_image, the other way)."""
    from .._runtimes.runner.task_detect import placement

    w, h = size
    nw, nh, left, top = placement(spec, size)
    return lambda x, y: (np.asarray(x) * nw / w + left, np.asarray(y) * nh / h + top)


def box_truth(samples: Sequence[Sample], source: Path | None, spec: dict[str, Any] | None,
              classes: int | None = None) -> tuple[dict[str, np.ndarray], int] | None:
    """({fingerprint of a sample: its labelled boxes (k, 5) class x1 y1 x2 y2 in input pixels},
    how many images had a label file) where the images of *source* carry YOLO labels; None
    where none does. An image without a label file is left unlabelled (not judged by them)."""
    import cv2

    from ..quantization.budget import fingerprint

    if source is None or spec is None or not samples or \
            int(next(iter(samples[0].values())).shape[0]) != 1:
        return None
    files = list_sources(source)
    files = picked(files, len(samples)) if is_image_source(files) else None
    if files is None:
        return None
    truth: dict[str, np.ndarray] = {}
    for image, sample in zip(files, samples, strict=True):
        found = label_file(image)
        if found is None:
            continue
        boxes = read_labels(found, classes)
        shape = cv2.imread(str(image), cv2.IMREAD_COLOR).shape
        to_input = image_to_input(spec, (shape[1], shape[0]))
        cx, cy = boxes[:, 1] * shape[1], boxes[:, 2] * shape[0]
        bw, bh = boxes[:, 3] * shape[1], boxes[:, 4] * shape[0]
        x1, y1 = to_input(cx - bw / 2, cy - bh / 2)
        x2, y2 = to_input(cx + bw / 2, cy + bh / 2)
        truth[fingerprint(sample)] = np.stack([boxes[:, 0], x1, y1, x2, y2], axis=1)
    return (truth, len(truth)) if truth else None
