"""What a model's outputs look like when it declares no task: a suggestion the build says in one
line, never a task it takes on silently (`raw` stays the default)."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._runtimes.runner.tasks import is_distribution

MIN_CLASSES = 2
MIN_BOXES = 100       # a (1, 4 + C, N) head with fewer anchors is more likely something else
MAX_YOLO_CLASSES = 1000


def suggest(outputs: Sequence[Mapping[str, Any]], reference: Mapping[str, np.ndarray],
            labels: Sequence[str] | None) -> tuple[str, str] | None:
    """(task text for --task, why) where the outputs make one task clear, else None.
    *outputs*: the model's {name, shape}; *reference*: FP32's outputs on the held-out samples
    (stacked over samples), which tell a distribution from logits."""
    if len(outputs) == 1:
        shape = [int(d) for d in outputs[0]["shape"]]
        name = outputs[0]["name"]
        values = reference.get(name)
        classes = shape[-1] if shape else 0
        rows = 1
        for d in shape[:-1]:
            rows *= d
        if rows == 1 and classes >= MIN_CLASSES and labels is not None and \
                len(labels) == classes:
            return "classify", (f"output '{name}' holds {classes} scores and --labels names "
                                f"{len(labels)} classes")
        if len(shape) == 3 and shape[0] == 1 and 5 <= shape[1] <= 4 + MAX_YOLO_CLASSES and \
                shape[2] >= MIN_BOXES:
            return "detect:decoder=yolov8", (f"output '{name}' is {_dims(shape)}: boxes (4) and "
                                             f"{shape[1] - 4} class scores for {shape[2]} "
                                             "anchors, YOLOv8's layout")
        if len(shape) == 3 and shape[0] == 1 and shape[1] >= 8 and shape[2] >= 20 and \
                values is not None and is_distribution(values.astype(np.float64)):
            return "ctc:alphabet=@CHARS.txt", (f"output '{name}' is {_dims(shape)}: a "
                                               f"distribution over {shape[2]} symbols at each "
                                               f"of {shape[1]} steps, a CTC recogniser's")
    if len(outputs) in (3, 4):
        shapes = [[int(d) for d in o["shape"]] for o in outputs]
        if all(len(s) == 4 for s in shapes) and shapes[0][1] == 1 and shapes[1][1] == 2 and \
                shapes[2][1] == 2 and len({tuple(s[2:]) for s in shapes}) == 1:
            return "detect:decoder=centernet", (
                "outputs are a 1-channel heatmap, 2-channel scale and offset maps"
                f"{' and landmarks' if len(outputs) == 4 else ''} of one size: CenterNet/"
                "CenterFace's layout")
    return None


def _dims(shape: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"
