"""The labelled budget's figures beyond class labels: a detector's box mAP@0.5 against its
labelled boxes (build/box_labels.py) and a text recogniser's character error rate against the
texts its samples read (build/text_labels.py), FP32's and a candidate's on the same samples,
the drop between them, and whether the labels' count can show the budget. *keys*: each
held-out sample's label (None where it has none), as budget.AccuracyBudget finds them."""

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..graph.execute import Sample


def labelled_boxes(keys: Sequence[Any], task: dict[str, Any] | None, limit: float,
                   held: Sequence[Sample], reference: dict[str, np.ndarray],
                   outputs: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """FP32's and the candidate's box mAP@0.5 against the labelled boxes of the *held*
    samples that have them (every detection above MAP_SCORE ranked, the head's own
    decoder and NMS), the drop between them, and whether the labelled boxes can show the
    budget (a 1-point drop: 100 boxes)."""
    from .._runtimes.runner.task_detect import decode_boxes
    from .._runtimes.runner.task_figures import needed, split_samples
    from .._runtimes.runner.task_spec import settings
    from .box_map import MAP_SCORE, map50

    rows = [i for i, k in enumerate(keys) if k is not None]
    if not rows:
        return None
    conf, names = settings(task), list(reference)
    want = [keys[i] for i in rows]
    fp32, cand = (map50(want, [decode_boxes(conf, per[i], score=MAP_SCORE)[:3] for i in rows])
                  for per in (split_samples(reference, names), split_samples(outputs, names)))
    boxes = int(sum(len(t) for t in want))
    need = needed("expected_drop", limit)
    value = fp32 - cand
    passed, shown = value <= limit + 1e-12, boxes >= need
    text = (f"labelled box mAP@0.5 {100 * cand:.1f}% against FP32's {100 * fp32:.1f}% on "
            f"{len(rows)} samples ({boxes} labelled boxes): a drop of {100 * value:.1f} "
            f"points (needs at most {100 * limit:g}" + (
                "" if shown else f"; {boxes} labelled boxes cannot show {100 * limit:g}: "
                f"{need} needed") + ")")
    return {"value": value, "fp32": fp32, "candidate": cand, "n": boxes,
            "samples": len(rows), "unit": "labelled boxes", "keep": limit,
            "needed": need, "shown": shown, "passed": passed, "text": text,
            "metric": "box mAP@0.5", "output": None}


def labelled_texts(keys: Sequence[Any], task: dict[str, Any] | None, limit: float,
                   held: Sequence[Sample], reference: dict[str, np.ndarray],
                   outputs: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """FP32's and the candidate's character error rate against the texts the *held*
    samples read (greedy CTC decode, the task's alphabet), the rise between them, and
    whether the labelled characters can show the budget (1 point: 100 characters)."""
    from .._runtimes.runner.task_ctc import ctc_decode, ctc_text, edit_distance
    from .._runtimes.runner.task_figures import needed, split_samples
    from .._runtimes.runner.task_spec import settings

    rows = [i for i, k in enumerate(keys) if k is not None]
    conf = settings(task)
    if not rows or not conf.get("alphabet"):
        return None
    names, texts = list(reference), [keys[i] for i in rows]
    chars = sum(len(t) for t in texts)

    def cer(stacked: dict[str, np.ndarray]) -> float:
        per = split_samples(stacked, names)
        errors = sum(edit_distance(ctc_text(conf, ctc_decode(conf, per[i])[0]), t)
                     for i, t in zip(rows, texts, strict=True))
        return errors / max(chars, 1)

    fp32, cand = cer(reference), cer(outputs)
    need = needed("expected_drop", limit)
    value = cand - fp32
    passed, shown = value <= limit + 1e-12, chars >= need
    text = (f"labelled CER {100 * cand:.1f}% against FP32's {100 * fp32:.1f}% on "
            f"{len(rows)} samples ({chars} labelled characters): a rise of "
            f"{100 * value:.1f} points (needs at most {100 * limit:g}" + (
                "" if shown else f"; {chars} labelled characters cannot show "
                f"{100 * limit:g}: {need} needed") + ")")
    return {"value": value, "fp32": fp32, "candidate": cand, "n": chars,
            "samples": len(rows), "unit": "labelled characters", "keep": limit,
            "needed": need, "shown": shown, "passed": passed, "text": text,
            "metric": "CER", "output": None}

