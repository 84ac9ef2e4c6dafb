"""What to try when INT8 does not ship: the best candidate's miss, and the option that would
change the decision (quantization/advice.py)."""

from dataclasses import replace

import numpy as np
from test_task_budget import scored

from packager.quantization.advice import what_to_try
from packager.quantization.budget import AccuracyBudget
from packager.quantization.quantize import QuantConfig
from packager.quantization.search import Candidate
from packager.targets import load_target


def test_a_miss_only_the_cosine_rule_made_names_the_task_to_try(tmp_path):
    """Every top-1 answer kept, cosine 0.99x under a 0.999 floor: the advice judges the best
    candidate under the suggested --task classify and names it; a candidate that flips a
    confident answer is told it still misses."""
    n = 20
    held = [{"x": np.eye(n, dtype=np.float32)[i:i + 1]} for i in range(n)]
    rng = np.random.default_rng(0)
    logits = np.tile([6.0, 0.0, 0.0, 0.0], (n, 1))
    fp32 = scored(tmp_path / "fp32.onnx", logits)
    int8 = replace(QuantConfig.from_preset(load_target("x86_64-cpu").quantization),
                   precision="int8")
    budget = AccuracyBudget(min_cosine=0.999, suggested=("classify", {"kind": "classify"}))
    moved = scored(tmp_path / "moved.onnx", logits + rng.normal(scale=0.2, size=logits.shape))
    cand = Candidate("INT8 preset", int8, moved, budget.evaluate(moved, fp32, held))
    assert cand.accuracy["budget"]["failures"][0].startswith("cosine 0.99")
    advice = what_to_try([cand], budget, fp32, held, None)
    assert advice.startswith("INT8 preset missed cosine 0.99") and \
        "only the cosine rule refused it: under --task classify its answers keep the task's " \
        "budget (expected top-1 drop" in advice and advice.endswith("try --task classify")
    flipped = logits.copy()
    flipped[3] = [0.0, 6.0, 0.0, 0.0]
    far = scored(tmp_path / "far.onnx", flipped)
    bad = Candidate("INT8 preset", int8, far, budget.evaluate(far, fp32, held))
    assert "under --task classify it still misses (expected top-1 drop" in \
        what_to_try([bad], budget, fp32, held, None)
    # no task to suggest: the floor that would admit it, or what to keep float
    plain = replace(budget, suggested=None)
    assert "--min-cosine 0.99" in what_to_try([cand], plain, fp32, held, None)
    assert what_to_try([], plain, fp32, held, None) == ""
