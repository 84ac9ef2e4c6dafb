"""compare's sample handling: batch-1 samples joined into batches, and how alike two
variants' outputs are (cosine, top-1 of class scores)."""

from collections.abc import Sequence

import numpy as np

from .graph.execute import Sample


def batched(samples: Sequence[Sample], batch: int, count: int | None = None) -> list[Sample]:
    """Concatenate consecutive batch-1 samples into batches (cycling when there are too few)."""
    if not samples:
        return []
    groups = max(1, len(samples) // batch) if count is None else count
    out = []
    for g in range(groups):
        picks = [samples[(g * batch + i) % len(samples)] for i in range(batch)]
        out.append({k: np.concatenate([p[k] for p in picks], axis=0) for k in picks[0]})
    return out


def agreement(got: Sequence[Sequence[np.ndarray]], ref: Sequence[Sequence[np.ndarray]]) -> dict:
    """Cosine (min over samples and outputs) and top-1 agreement of class scores, each sample
    of a batch judged on its own exactly as build's accuracy figures judge it
    (runner/metrics.compare: a near-silent sample by range, the same non-finite value on both
    sides agrees, outputs of different lengths zero-padded to the longer)."""
    from ._runtimes.runner.metrics import compare, stack_or_ragged

    def samples(feeds: Sequence[Sequence[np.ndarray]], j: int) -> np.ndarray:
        arrays = [np.asarray(feed[j]) for feed in feeds]
        return stack_or_ragged([x[i:i + 1] for x in arrays for i in range(len(x))]
                               if all(x.ndim for x in arrays) else arrays)

    cosines, top1 = [], []
    for j in range(len(ref[0]) if ref else 0):
        figures = compare(samples(got, j), samples(ref, j))
        cosines.append(figures["cosine_min"])
        if "top1_agreement" in figures:
            top1.append(figures["top1_agreement"])
    result = {"cosine_min": float(min(cosines))}
    if top1:
        result["top1"] = float(min(top1))
    return result
