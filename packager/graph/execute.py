"""Run a graph on samples with ONNX Runtime and compare its outputs with a reference's."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

Sample = dict[str, np.ndarray]


def stack(samples: Sequence[Sample]) -> dict[str, np.ndarray]:
    """{input: array (samples, *shape)} from a list of samples."""
    return {k: np.stack([s[k] for s in samples]) for k in samples[0]}


def run_model(model: Path, samples: Sequence[Sample]) -> dict[str, np.ndarray]:
    """Outputs of *model* for every sample, stacked per output name (samples, *shape)."""
    import onnxruntime as ort

    from .._runtimes.runner.sessions import run_samples

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return run_samples(session, stack(samples))


def compare_outputs(candidate: dict[str, np.ndarray],
                    reference: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Per output: cosine (min, mean), max abs error, top-1 agreement for class scores."""
    from .._runtimes.runner.metrics import compare

    return {name: compare(candidate[name], ref) for name, ref in reference.items()}


def scaled_cosine(a: Any, b: Any) -> float:
    """The cosine of two vectors in float64, each scaled by the larger's largest finite
    magnitude first: the squares of outputs near 1e154 overflow (an FP32 model then "missed"
    against itself). 1.0 where both are zero, 0.0 where only one is."""
    a, b = (np.asarray(x, dtype=np.float64).ravel() for x in (a, b))
    finite = [np.abs(x[np.isfinite(x)]) for x in (a, b)]
    scale = max([float(f.max()) for f in finite if f.size] + [0.0]) or 1.0
    a, b = a / scale, b / scale
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norms) if norms > 0 else (1.0 if np.array_equal(a, b) else 0.0)

