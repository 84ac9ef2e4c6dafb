"""Evidence that decides: NaN is a miss, thin held-out splits are rotated (k-fold), and INT8 the
samples cannot prove does not ship on its own say-so."""

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from conftest import save
from packager.quantization.budget import AccuracyBudget
from packager.quantization.decision import decide
from packager.quantization.kfold import folds_of
from packager.targets import load_target
from runtimes.runner.metrics import compare


def mlp(path: Path) -> Path:
    """Two MatMul layers, 64 -> 64 -> 16: INT8-friendly, with 16 class-like scores."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    inits = [numpy_helper.from_array(rng.normal(size=(64, 64)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(64, 16)).astype(np.float32), "w2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 64])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 16])], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def samples(count: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, 64)).astype(np.float32)} for _ in range(count)]


def fixed_timer(paths, feed, threads, rounds, block):
    """The --time-on interface with fixed figures: FP32 1 ms, every INT8 0.5 ms."""
    return ({str(p): {"p50": 1.0 if p.name == "m.onnx" else 0.5, "p90": 1.1} for p in paths},
            {"arch": "test"})


def test_a_nan_figure_is_a_miss_and_the_same_infinity_on_both_sides_agrees(tmp_path):
    model = mlp(tmp_path / "m.onnx")
    held = samples(4)
    from packager.graph.execute import run_model

    reference = run_model(model, held)
    broken = {"y": reference["y"].copy()}
    broken["y"][1, 0, 3] = np.inf   # inf / inf: the cosine itself is NaN
    acc = AccuracyBudget(min_cosine=0.5).evaluate(model, model, held, None, reference, broken)
    assert not acc["budget"]["passed"]
    assert "nan" in acc["budget"]["failures"][0].lower()
    # a log-mel's -inf where FP32 has it too is agreement, not a NaN cosine
    ref = np.array([[1.0, -np.inf, 2.0]])
    assert abs(compare(ref.copy(), ref)["cosine_min"] - 1.0) < 1e-9
    got = np.array([[1.0, 5.0, 2.0]])
    assert not compare(got, ref)["cosine_min"] >= 0.5


def test_folds_cover_every_sample_once():
    folds = folds_of(12)
    assert sorted(i for f in folds for i in f) == list(range(12))
    assert len(folds) == 5 and all(folds)
    assert len(folds_of(3)) == 3


def test_too_few_held_out_samples_are_rotated_so_every_sample_judges(tmp_path):
    """Five samples held two out: too few to decide (FP32 without trying, before). Rotated,
    all five judge, and INT8 within budget ships."""
    model = mlp(tmp_path / "m.onnx")
    (tmp_path / "s").mkdir()
    decision = decide(model, tmp_path / "s", target=load_target("x86_64-cpu"),
                      family="default", request={}, calib=samples(5)[:3],
                      held=samples(5)[3:], budget=AccuracyBudget(min_cosine=0.95),
                      timer=fixed_timer)
    record = decision.record
    assert record["evidence"] == {"method": "k-fold", "samples": 5, "folds": 5}
    assert record["chosen"] != "FP32", record["reason"]
    shipped = next(c for c in record["candidates"] if c["label"] == record["label"])
    assert any("rotation" in n for n in shipped["notes"])


def test_int8_the_samples_cannot_prove_does_not_ship_unless_forced(tmp_path):
    """20 samples cannot show 99 % top-1 (100 needed): INT8 that misses nothing on them is
    'not proven' and FP32 ships, saying how many would prove it; --precision int8 ships it."""
    model = mlp(tmp_path / "m.onnx")
    kwargs = dict(target=load_target("x86_64-cpu"), family="default", calib=samples(16),
                  held=samples(4, seed=2), timer=fixed_timer,
                  budget=AccuracyBudget(min_cosine=0.95, task={"kind": "classify"}))
    (tmp_path / "auto").mkdir()
    auto = decide(model, tmp_path / "auto", request={}, **kwargs).record
    assert auto["chosen"] == "FP32"
    assert "INT8 not proven" in auto["reason"] and "100 needed" in auto["reason"]
    assert auto["evidence"]["method"] == "k-fold" and auto["evidence"]["samples"] == 20
    (tmp_path / "forced").mkdir()
    forced = decide(model, tmp_path / "forced", request={"precision": "int8"}, **kwargs).record
    assert forced["chosen"] != "FP32"
