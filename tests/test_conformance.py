"""A peer's conformance suite: the backend reference models the onnx wheel ships, each built by
edgepack at FP32 and compared with its expected outputs (tests/conformance.py), and built again
at the default precision where it has float inputs (INT8 where it keeps the budget, else FP32).

Each model reproduces, or is refused in one line naming the cause (REFUSED holds those causes);
never "a bug in edgepack", a false budget miss, exit 3 or a hang (hostile-cases-turn5 #19-#21).
The quick tier builds a fixed sample (QUICK); the full tier builds every model."""

from __future__ import annotations

import conformance
import pytest

CASES = {case.name: case for case in conformance.cases()}

# Refused, and why (a substring of the one line): models edgepack cannot ship as they are
STRINGS = "holds strings; edgepack builds models whose inputs are numeric tensors"
REFUSED: dict[str, str] = {
    "simple/test_gradient_of_add": "uses ai.onnx.preview.training:Gradient, an op ONNX Runtime "
                                   "has no kernel for",
    "simple/test_gradient_of_add_and_mul": "uses ai.onnx.preview.training:Gradient",
    "simple/test_sequence_model8": "'X' has shape [4, 0], the model input is [1]",   # empty
    **{f"simple/test_strnorm_model_{n}": STRINGS for n in (
        "monday_casesensintive_lower", "monday_casesensintive_nochangecase",
        "monday_casesensintive_upper", "monday_empty_output",
        "monday_insensintive_upper_twodim", "nostopwords_nochangecase")}}
# built at the default precision too: every model with float inputs but the light CNNs whose
# FP32 build alone takes 5-90 s here (squeezenet and shufflenet stand for them)
HEAVY = ("light/bvlc_alexnet", "light/densenet121", "light/inception_v1", "light/inception_v2",
         "light/resnet50", "light/vgg19", "light/zfnet512")


def _float_inputs(name: str) -> bool:
    feeds = conformance.reference_inputs(CASES[name])
    return not isinstance(feeds, str) and any(v.dtype.kind == "f" for v in feeds.values())


AUTO = tuple(n for n in CASES if n not in HEAVY and n not in REFUSED and _float_inputs(n))
AUTO_QUICK = ("pytorch-converted/test_Conv2d_depthwise",)
# the fixed sample `make test` builds: one of each defect fixed, a CNN, and a refusal
QUICK = ("light/squeezenet", "pytorch-converted/test_Softsign",
         "pytorch-converted/test_PReLU_2d_multiparam",
         "pytorch-operator/test_operator_add_broadcast", "pytorch-converted/test_Conv2d",
         "pytorch-operator/test_operator_chunk")
FULL = tuple(name for name in CASES if name not in QUICK)


def _judged(name: str, tmp_path, precision: str = "fp32") -> None:
    result = conformance.judge(CASES[name], tmp_path, precision=precision)
    if name in REFUSED:
        assert result.outcome == "refuses" and REFUSED[name] in result.detail, result
        assert "\n" not in result.detail and "bug in edgepack" not in result.detail
    else:
        assert result.outcome == ("reproduces" if precision == "fp32" else "builds"), result


def test_the_suite_is_there_and_its_counts_hold():
    """The onnx wheel ships the suite (149 models in onnx 1.16-1.20); 140 or more of them
    reproduce and every other one is refused for a cause REFUSED names."""
    assert len(CASES) >= 140, len(CASES)
    assert set(QUICK) <= set(CASES)
    assert len(CASES) - len(set(REFUSED) & set(CASES)) >= 140
    assert len(AUTO) >= 120, len(AUTO)


@pytest.mark.parametrize("name", [n for n in QUICK if n in CASES])
def test_a_fixed_sample_of_the_reference_models_reproduces(name, tmp_path):
    _judged(name, tmp_path)


@pytest.mark.parametrize("name", FULL)
def test_every_reference_model_reproduces_or_is_refused_naming_the_cause(name, tmp_path):
    _judged(name, tmp_path)


@pytest.mark.parametrize("name", [n for n in AUTO_QUICK if n in CASES])
def test_a_reference_model_builds_at_the_default_precision(name, tmp_path):
    _judged(name, tmp_path, precision="auto")


@pytest.mark.parametrize("name", [n for n in AUTO if n not in AUTO_QUICK])
def test_every_float_reference_model_builds_at_the_default_precision(name, tmp_path):
    """INT8 where it keeps the budget, else FP32, as the build decides: exit 0 each time."""
    _judged(name, tmp_path, precision="auto")
