"""INT8 from NNCF's post-training quantizer: a second candidate generator beside onnxruntime's.

onnxruntime's quantize_static puts a Q/DQ pair on every input of every op it knows and takes
each tensor's range from one calibration method. NNCF (OpenVINO's Neural Network Compression
Framework, ONNX backend) places quantizers where OpenVINO fuses them (none around HardSwish,
HardSigmoid or an SE block's multiply), picks ranges per tensor by its own estimators, corrects
the biases that quantized weights shift (fast bias correction) and, for transformers, moves
activation outliers into the weights (SmoothQuant). On the zoo's PP-LCNet (orientation) its
default kept cosine 0.96 where onnxruntime's best variant reached 0.83, and its graph ran 1.71x
FP32 under OpenVINO where onnxruntime's ran 1.00x (measured here; on the CPU provider both are
slower than FP32: which graph is best depends on the provider, and the build times each under
each). Its signed activations are rewritten unsigned (graph/unsigned.py: the same numbers,
which OpenVINO runs right).

NNCF is an optional, pinned extra (`pip install 'edgepack[nncf]'`, `make install` installs it):
without it the search is onnxruntime's alone and the build says so once.
"""

import contextlib
import io
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import QuantizationError
from ..graph.execute import Sample
from ..graph.unsigned import unsigned_activations

VERSION = "3.4.0"   # pinned: NNCF's placement and defaults change between releases


def unavailable() -> str:
    """Why NNCF cannot generate candidates here ('' when it can)."""
    try:
        with _quiet():
            import nncf  # noqa: F401
            import nncf.onnx  # noqa: F401
    except Exception as exc:  # an optional extra: any import failure means "not here"
        return (f"NNCF is not installed ({type(exc).__name__}: {str(exc)[:80]}); "
                f"pip install 'nncf=={VERSION}' adds its INT8 candidates")
    return ""


@contextlib.contextmanager
def _quiet():
    """NNCF logs INFO lines and draws progress bars: neither belongs in the build's output.
    And its telemetry stays off: imported unset, NNCF 3.4 sends usage events to Google
    Analytics (openvino_telemetry, with no opt-in asked) from a thread pool that outlived the
    build; NNCF_CI, set before its first import, is NNCF's own switch to its stub."""
    os.environ.setdefault("NNCF_CI", "1")
    logger = logging.getLogger("nncf")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


RANGES = ("default", "minmax")


def nncf_quantize(src: Path, dst: Path, *, samples: Sequence[Sample], exclude: Sequence[str] = (),
                  transformer: bool = False, ranges: str = "default") -> None:
    """Quantize *src* into *dst* with nncf.quantize (default preset, fast bias correction; the
    transformer model type adds SmoothQuant); *exclude*: node names kept in float; *ranges*:
    each activation's range by NNCF's default estimator (the mean over samples of each sample's
    min and max: an outlier sample is averaged away) or "minmax" (the global min and max over
    every sample: nothing clips, at a coarser step)."""
    import onnx

    from ..graph.modelio import load_model, save_model

    if not samples:
        raise QuantizationError("NNCF's static INT8 needs calibration data", "pass --calib")
    why = unavailable()
    if why:
        raise QuantizationError(why, f"pip install 'nncf=={VERSION}'")
    with _quiet():
        import nncf

        scope = nncf.IgnoredScope(names=list(exclude), validate=False) if exclude else None
        advanced = None
        if ranges == "minmax":
            from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters
            from nncf.quantization.range_estimator import RangeEstimatorParametersSet
            advanced = AdvancedQuantizationParameters(
                activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX)
        elif ranges != "default":
            raise QuantizationError(f"unknown NNCF range estimator {ranges!r}",
                                    f"use one of {', '.join(RANGES)}")
        try:
            made = nncf.quantize(
                load_model(src), nncf.Dataset(list(samples)), subset_size=len(samples),
                fast_bias_correction=True, ignored_scope=scope,
                model_type=nncf.ModelType.TRANSFORMER if transformer else None,
                advanced_parameters=advanced)
        except Exception as exc:  # NNCF's own errors: the variant fails, the search goes on
            raise QuantizationError(f"NNCF could not quantize the model: {type(exc).__name__}: "
                                    f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}",
                                    "the onnxruntime candidates are still built") from None
    if not isinstance(made, onnx.ModelProto):
        raise QuantizationError("NNCF returned no ONNX model", "the onnxruntime candidates "
                                "are still built")
    # signed activations run wrong under OpenVINO; unsigned ones hold the same numbers
    unsigned_activations(made)
    save_model(made, dst)   # (with external data above 2 GiB)
