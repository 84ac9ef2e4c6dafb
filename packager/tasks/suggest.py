"""What a model's outputs look like when it declares no task: a suggestion the build says in one
line, never a task it takes on silently (`raw` stays the default)."""

from collections.abc import Mapping, Sequence, Set
from typing import Any

import numpy as np
import onnx

from .._runtimes.runner.tasks import is_distribution

MIN_CLASSES = 2
MIN_BOXES = 100       # a (1, 4 + C, N) head with fewer anchors is more likely something else
MAX_YOLO_CLASSES = 1000
BLANK_SHARE = 0.4     # a CTC recogniser emits blank at most steps: ddddocr's 77% of 20, PP-OCR's more
# ops that move values without changing them: a Sigmoid behind them still feeds the output
RESHAPING = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def sigmoid_outputs(graph: onnx.GraphProto) -> set[str]:
    """The graph's outputs whose values come straight from a Sigmoid (through reshapes only)."""
    producer = {out: node for node in graph.node for out in node.output}
    found = set()
    for output in graph.output:
        node = producer.get(output.name)
        while node is not None and node.op_type in RESHAPING and node.input:
            node = producer.get(node.input[0])
        if node is not None and node.op_type == "Sigmoid":
            found.add(output.name)
    return found


def suggest(outputs: Sequence[Mapping[str, Any]], reference: Mapping[str, np.ndarray],
            labels: Sequence[str] | None, sigmoid: Set[str] = frozenset()
            ) -> tuple[str, str] | None:
    """(task text for --task, why) where the outputs make one task clear, else None.
    *outputs*: the model's {name, shape}; *reference*: FP32's outputs on the held-out samples
    (stacked over samples), which tell a distribution from logits; *sigmoid*: the outputs a
    Sigmoid feeds (sigmoid_outputs)."""
    if any(not isinstance(d, int) for o in outputs for d in o["shape"]):
        return None   # a length that follows the input (a waveform, a token list): no layout
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
        steps = shape[0] * shape[1] if len(shape) == 3 and 1 in shape[:2] else 0
        scores = values.astype(np.float64).reshape(-1, classes) \
            if steps >= 8 and classes >= 20 and values is not None else None
        # before YOLO's layout: PP-OCR's (1, 40, 6625) softmax fits both shapes, but a YOLO
        # head's rows (one per box coordinate or class, over anchors) never sum to 1
        if scores is not None and is_distribution(scores):
            return "ctc:alphabet=@CHARS.txt", (f"output '{name}' is {_dims(shape)}: a "
                                               f"distribution over {classes} symbols at each "
                                               f"of {steps} steps, a CTC recogniser's")
        if len(shape) == 3 and shape[0] == 1 and 5 <= shape[1] <= 4 + MAX_YOLO_CLASSES and \
                shape[2] >= MIN_BOXES:
            return "detect:decoder=yolov8", (f"output '{name}' is {_dims(shape)}: boxes (4) and "
                                             f"{shape[1] - 4} class scores for {shape[2]} "
                                             "anchors, YOLOv8's layout")
        blank = ctc_blank(scores) if scores is not None and name not in sigmoid else None
        if blank is not None:   # (a Sigmoid's posteriorgram is multilabel's, below)
            return ("ctc:alphabet=@CHARS.txt" + (f",blank={blank}" if blank else ""),
                    f"output '{name}' is {_dims(shape)}: scores over {classes} symbols at "
                    f"each of {steps} steps whose best is symbol {blank} at most steps and "
                    "others between, a CTC recogniser's logits with its blank")
    if len(outputs) in (3, 4):
        shapes = [[int(d) for d in o["shape"]] for o in outputs]
        if all(len(s) == 4 for s in shapes) and shapes[0][1] == 1 and shapes[1][1] == 2 and \
                shapes[2][1] == 2 and len({tuple(s[2:]) for s in shapes}) == 1:
            return "detect:decoder=centernet", (
                "outputs are a 1-channel heatmap, 2-channel scale and offset maps"
                f"{' and landmarks' if len(outputs) == 4 else ''} of one size: CenterNet/"
                "CenterFace's layout")
    return multilabel(outputs, sigmoid)


def ctc_blank(rows: np.ndarray) -> int | None:
    """The blank's index where (steps, classes) scores read like a CTC recogniser's logits: the
    first or last symbol is the best at most steps (silence between characters) and several
    others win the rest (the characters). Hidden states or random scores spread their best."""
    best = rows.argmax(axis=1)
    ids, counts = np.unique(best, return_counts=True)
    top = int(ids[counts.argmax()])
    if top not in (0, rows.shape[1] - 1) or counts.max() < BLANK_SHARE * len(best) or \
            len(ids) < 3:
        return None
    return top


def multilabel(outputs: Sequence[Mapping[str, Any]], sigmoid: Set[str]) -> tuple[str, str] | None:
    """multilabel where Sigmoids feed (1, T, C) outputs with C > 1: an independent probability
    per label and frame (a softmax would make it one class a frame; C = 1 is vad's)."""
    shapes = {o["name"]: [int(d) for d in o["shape"]] for o in outputs}
    read = [n for n, s in shapes.items()
            if n in sigmoid and len(s) == 3 and s[0] == 1 and s[2] > 1]
    if not read or any(c in n for n in read for c in ",|="):
        return None
    text = "multilabel" if len(read) == len(outputs) else "multilabel:output=" + "|".join(read)
    listed = ", ".join(f"'{n}' {_dims(shapes[n])}" for n in read)
    return text, (f"output{'s' if len(read) > 1 else ''} {listed} come{'' if len(read) > 1 else 's'}"
                  " from a Sigmoid: an independent probability per label (last axis) and frame,"
                  " a multi-label answer")


def _dims(shape: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"
