"""Whether a declared detect head fits the model before its figures judge anything.

A decoder that does not understand a head still decodes something: the yolov8 decoder on a
PP-PicoDet layout model (scores and box distributions, not centre/size rows) read tiny boxes at
the image's corner with wrong classes, and the build then reported "box recall 100 %" comparing
that garbage with itself and judged INT8 by it. So before the search, the declared decoder reads
FP32's own outputs on the held-out samples, and the build refuses the task when what it reads is
not boxes: most of them under 2 pixels or far outside the input, or a class count that disagrees
with the class names the ONNX file carries (Ultralytics' `names`, PaddlePaddle's `character`).
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from .._runtimes.runner.task_detect import decode_boxes
from .._runtimes.runner.task_figures import split_samples
from .._runtimes.runner.task_spec import settings, task_kind
from .._runtimes.runner.tasks import pick
from ..errors import SpecError
from ..graph.metadata import class_names

TINY = 2.0        # input pixels: a box narrower or lower than this is no object
OUTSIDE = 0.25    # a box reaching this share of the input beyond its edges is not in the image
MOST = 0.5        # the share of odd boxes that says the decoder reads something else
FIX = ("name the head's format (--task detect:decoder=yolov8|yolov5|centernet|db), or judge the "
       "candidates by your own decoding: --metric FILE.py:FUNCTION (docs/tasks.md)")


def check_decoder_fits(task: Mapping[str, Any] | None, graph: onnx.ModelProto,
                       reference: Mapping[str, np.ndarray], size: Sequence[int] | None) -> None:
    """SpecError naming --task when the declared detect decoder does not read boxes from
    FP32's outputs (*reference*: stacked over the held-out samples) on an input of *size*
    (width, height), or disagrees with the model's own class names."""
    if task_kind(task) != "detect":
        return
    conf = settings(task)
    said = f"--task detect: the {conf['decoder']} decoder does not fit this model's head"
    samples = split_samples(dict(reference))
    names = _metadata_classes(graph)
    classes = _decoder_classes(conf, samples[0]) if samples else None
    if names is not None and classes is not None and names != classes:
        raise SpecError(f"{said}: it reads {classes} classes where the model's own metadata "
                        f"names {names}", FIX)
    if size is None:
        return
    width, height = float(size[0]), float(size[1])
    boxes = [b for sample in samples for b in decode_boxes(conf, sample)[0]]
    if not boxes:
        return   # nothing to judge here; the figures say so themselves
    boxes = np.asarray(boxes, np.float64)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    tiny = (w < TINY) | (h < TINY)
    outside = ((boxes[:, 0] < -OUTSIDE * width) | (boxes[:, 1] < -OUTSIDE * height)
               | (boxes[:, 2] > (1 + OUTSIDE) * width) | (boxes[:, 3] > (1 + OUTSIDE) * height))
    odd = tiny | outside
    if odd.mean() >= MOST:
        what = "under 2 pixels wide or tall" if tiny.sum() >= outside.sum() else \
            "far outside the input"
        raise SpecError(f"{said}: {100 * odd.mean():.0f}% of the {len(boxes)} boxes it reads "
                        f"from FP32's own outputs on the held-out samples are {what} "
                        f"({int(width)}x{int(height)} input)", FIX)


def _decoder_classes(conf: Mapping[str, Any], first: Mapping[str, np.ndarray]) -> int | None:
    """The class count a YOLO decoder reads from the head's shape in one sample's outputs
    (None: centernet, a DB text map, or not known)."""
    if conf["decoder"] in ("centernet", "db"):
        return None
    try:
        pred = np.asarray(pick(first, conf["output"]))
    except (IndexError, KeyError, ValueError):
        return None
    if pred.ndim < 2:
        return None
    rows, cols = pred.shape[-2:]
    if conf["decoder"] == "yolov8":
        return min(rows, cols) - 4
    return cols - 5


def _metadata_classes(graph: onnx.ModelProto) -> int | None:
    """How many class names the ONNX file's metadata holds (graph/metadata.py), else None."""
    found = class_names(graph)
    return len(found[0]) if found else None


def input_size(preprocess: Mapping[str, Any] | None, graph: onnx.ModelProto
               ) -> tuple[int, int] | None:
    """(width, height) of the image the head's boxes are measured in: the preprocessing size,
    else the first 4-D input's spatial dims (NCHW, or NHWC with 1, 3 or 4 channels last)."""
    if preprocess and preprocess.get("size"):
        return int(preprocess["size"][0]), int(preprocess["size"][1])
    inits = {i.name for i in graph.graph.initializer}
    for inp in graph.graph.input:
        if inp.name in inits:
            continue
        dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        if len(dims) == 4 and all(dims):
            if dims[1] not in (1, 3, 4) and dims[3] in (1, 3, 4):   # NHWC
                return dims[2], dims[1]
            return dims[3], dims[2]
    return None
