"""The labelled budget's figures beyond class labels: a detector's box mAP@0.5 against its
labelled boxes (build/box_labels.py) and a text recogniser's character error rate against the
texts its samples read (build/text_labels.py), FP32's and a candidate's on the same samples,
the drop between them, and whether the labels' count can show the budget. *keys*: each
held-out sample's label (None where it has none), as budget.AccuracyBudget finds them."""

from collections.abc import Sequence
from typing import Any

import numpy as np


def labelled_boxes(keys: Sequence[Any], task: dict[str, Any] | None, limit: float,
                   reference: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
                   ) -> dict[str, Any] | None:
    """FP32's and the candidate's box mAP@0.5 against the labelled boxes of the held-out
    samples that have them (every detection above MAP_SCORE ranked, the head's own
    decoder and NMS), the drop between them, and whether the labelled boxes can show the
    budget (a 1-point drop: 100 boxes)."""
    from .._runtimes.runner.task_detect import decode_boxes
    from .._runtimes.runner.task_figures import split_samples
    from .._runtimes.runner.task_spec import settings
    from .box_map import MAP_SCORE, map50

    rows = [i for i, k in enumerate(keys) if k is not None]
    if not rows:
        return None
    conf, names = settings(task), list(reference)
    want = [keys[i] for i in rows]
    fp32, cand = (map50(want, [decode_boxes(conf, per[i], score=MAP_SCORE)[:3] for i in rows])
                  for per in (split_samples(reference, names), split_samples(outputs, names)))
    return _figure("box mAP@0.5", "drop", fp32, cand, limit, len(rows),
                   int(sum(len(t) for t in want)), "labelled boxes")


def labelled_texts(keys: Sequence[Any], task: dict[str, Any] | None, limit: float,
                   reference: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
                   ) -> dict[str, Any] | None:
    """FP32's and the candidate's character error rate against the texts the held-out
    samples read (greedy CTC decode, the task's alphabet), the rise between them, and
    whether the labelled characters can show the budget (1 point: 100 characters)."""
    from .._runtimes.runner.task_ctc import ctc_decode, ctc_text, edit_distance
    from .._runtimes.runner.task_figures import split_samples
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

    return _figure("CER", "rise", cer(reference), cer(outputs), limit, len(rows), chars,
                   "labelled characters")


def _figure(metric: str, verb: str, fp32: float, cand: float, limit: float, samples: int,
            n: int, unit: str) -> dict[str, Any]:
    """The labelled figure: FP32's and the candidate's *metric*, the drop (or, where lower is
    better, the rise) between them against *limit*, and whether *n* labelled units (*unit*)
    can show it (a 1-point change: 100 of them)."""
    from .._runtimes.runner.task_figures import needed

    need = needed("expected_drop", limit)   # (an at-most share: one unit is 1/n of it)
    value = fp32 - cand if verb == "drop" else cand - fp32
    passed, shown = value <= limit + 1e-12, n >= need
    text = (f"labelled {metric} {100 * cand:.1f}% against FP32's {100 * fp32:.1f}% on "
            f"{samples} samples ({n} {unit}): a {verb} of {100 * value:.1f} points (needs at "
            f"most {100 * limit:g}" + ("" if shown else f"; {n} {unit} cannot show "
                                       f"{100 * limit:g}: {need} needed") + ")")
    return {"value": value, "fp32": fp32, "candidate": cand, "n": n, "samples": samples,
            "unit": unit, "verb": verb, "keep": limit, "needed": need, "shown": shown,
            "passed": passed, "text": text, "metric": metric, "output": None}

