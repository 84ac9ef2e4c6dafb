"""Compare a candidate model's outputs with the FP32 reference on the same samples."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .calibration import Sample, stack


def run_model(model: Path, samples: Sequence[Sample]) -> dict[str, np.ndarray]:
    """Outputs of *model* for every sample, stacked per output name (samples, *shape)."""
    import onnxruntime as ort

    from ._runtimes import ort_runner

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return ort_runner.run_samples(session, stack(samples))


def compare_outputs(candidate: dict[str, np.ndarray],
                    reference: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Per output: cosine (min, mean), max abs error, top-1 agreement for class scores."""
    from ._runtimes import ort_runner

    return {name: ort_runner.compare(candidate[name], ref) for name, ref in reference.items()}


def measure_accuracy(candidate: Path, reference: Path, samples: Sequence[Sample],
                     reference_outputs: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Accuracy of *candidate* against *reference* on held-out *samples* (the reference's
    outputs may be given, computed once for many candidates)."""
    if reference_outputs is None:
        reference_outputs = run_model(reference, samples)
    outputs = compare_outputs(run_model(candidate, samples), reference_outputs)
    summary = {"samples": len(samples), "outputs": outputs,
               "cosine_min": min(o["cosine_min"] for o in outputs.values()),
               "cosine_mean": float(np.mean([o["cosine_mean"] for o in outputs.values()])),
               "max_abs": max(o["max_abs"] for o in outputs.values())}
    top1 = [o["top1_agreement"] for o in outputs.values() if "top1_agreement" in o]
    if top1:
        summary["top1_agreement"] = min(top1)
    return summary
