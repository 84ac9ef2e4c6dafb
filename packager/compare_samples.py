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
    """Cosine (min over samples and outputs) and top-1 agreement of class scores; outputs of
    different lengths (speech that follows the text) compare zero-padded to the longer."""
    cosines, top1 = [], []
    for g_out, r_out in zip(got, ref, strict=True):
        for g, r in zip(g_out, r_out, strict=True):
            a = np.asarray(g, np.float64).reshape(len(g), -1)
            b = np.asarray(r, np.float64).reshape(len(r), -1)
            if a.shape != b.shape:   # a length that follows the input: zero-padded to the longer
                width = max(a.shape[1], b.shape[1])
                a, b = (np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in (a, b))
            norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
            cosines += list(np.where(norms > 0, (a * b).sum(1) / np.maximum(norms, 1e-30), 1.0))
            if b.shape[1] >= 2 and np.asarray(r).ndim == 2:
                top1 += list(a.argmax(1) == b.argmax(1))
    result = {"cosine_min": float(min(cosines))}
    if top1:
        result["top1"] = float(np.mean(top1))
    return result
