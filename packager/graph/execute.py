"""Run a graph on samples with ONNX Runtime and compare its outputs with a reference's."""

from collections.abc import Sequence
from pathlib import Path

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
