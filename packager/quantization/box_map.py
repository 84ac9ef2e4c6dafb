"""Box mAP@0.5 against labelled boxes: the detector's metric where the samples carry labels
(YOLO-format `labels/*.txt`, build/box_labels.py), so that a candidate is judged by the boxes
it loses against the truth, not against FP32's own boxes.

Per class, every detection of the class over all samples, best score first, is a hit when it
overlaps an unmatched labelled box of that class in its own sample at IoU >= 0.5; AP is the
area under the precision envelope of the recall/precision curve (all points, as VOC 2010+ and
Ultralytics compute it); mAP is the mean over the classes that have labelled boxes.
"""

from collections.abc import Sequence

import numpy as np

from .._runtimes.runner.task_detect import iou_matrix

IOU = 0.5
MAP_SCORE = 0.001   # detections this sure and above are ranked (Ultralytics' val default)


def average_precision(hits: np.ndarray, truths: int) -> float:
    """AP of detections in score order (*hits*: 1 a hit, 0 a false box) over *truths* boxes."""
    if truths == 0:
        return 0.0
    tp = np.cumsum(hits)
    recall = np.concatenate([[0.0], tp / truths, [1.0]])
    precision = np.concatenate([[1.0], tp / np.arange(1, len(hits) + 1), [0.0]])
    envelope = np.flip(np.maximum.accumulate(np.flip(precision)))
    steps = np.nonzero(recall[1:] != recall[:-1])[0]
    return float(np.sum((recall[steps + 1] - recall[steps]) * envelope[steps + 1]))


def map50(truth: Sequence[np.ndarray], found: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]
          ) -> float:
    """mAP@0.5 of *found* ((boxes x1 y1 x2 y2, scores, classes) per sample) against *truth*
    ((k, 5) class x1 y1 x2 y2 per sample, in the same pixels)."""
    classes = sorted({int(c) for t in truth for c in t[:, 0]})
    if not classes:
        return 0.0
    aps = []
    for c in classes:
        scores, hits = [], []
        for want, (boxes, score, cls) in zip(truth, found, strict=True):
            mine = want[want[:, 0] == c][:, 1:]
            pick = np.nonzero(np.asarray(cls) == c)[0]
            pick = pick[np.argsort(-np.asarray(score)[pick], kind="stable")]
            iou = iou_matrix(np.asarray(boxes)[pick], mine) if len(pick) and len(mine) else \
                np.zeros((len(pick), len(mine)))
            used: set[int] = set()
            for row in range(len(pick)):
                order = [j for j in np.argsort(-iou[row], kind="stable")
                         if iou[row, j] >= IOU and int(j) not in used] if len(mine) else []
                hits.append(1.0 if order else 0.0)
                if order:
                    used.add(int(order[0]))
                scores.append(float(np.asarray(score)[pick[row]]))
        order = np.argsort(-np.asarray(scores), kind="stable")
        aps.append(average_precision(np.asarray(hits)[order], sum(
            int((t[:, 0] == c).sum()) for t in truth)))
    return float(np.mean(aps))
