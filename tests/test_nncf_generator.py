"""NNCF as a second INT8 candidate generator (quantization/nncf_generator.py): real nncf.quantize
on small real models, its place in the decision and in the provider choice, and the build without
it."""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_kfold import fixed_timer, mlp, samples

from packager.build.provider_choice import _graphs
from packager.errors import QuantizationError
from packager.graph.execute import run_model
from packager.quantization import nncf_generator
from packager.quantization.budget import AccuracyBudget
from packager.quantization.decision import Decision, decide
from packager.quantization.quantize import QuantConfig, quantize_file
from packager.quantization.search import Candidate
from packager.targets import load_target

BASE = QuantConfig.from_preset(load_target("x86_64-cpu").quantization, precision="int8")
NNCF = replace(BASE, generator="nncf")


@pytest.fixture(autouse=True)
def needs_nncf():
    why = nncf_generator.unavailable()
    if why:   # `make install` installs the pinned extra; a bare venv skips saying why
        pytest.skip(why)


def _dequantized_inputs(path: Path) -> dict[str, set[str]]:
    graph = onnx.load(str(path)).graph
    dq = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.name: {i for i in n.input if i in dq} for n in graph.node}


def test_nncf_writes_a_qdq_graph_that_keeps_the_outputs_and_leaves_excluded_nodes_float(tmp_path):
    model = mlp(tmp_path / "m.onnx")
    calib, held = samples(32), samples(8, seed=3)
    out = quantize_file(model, tmp_path / "q.onnx", config=NNCF, samples=calib)
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    ref, got = run_model(model, held)["y"], run_model(out, held)["y"]
    cos = (ref * got).sum(-1) / np.linalg.norm(ref, axis=-1) / np.linalg.norm(got, axis=-1)
    assert cos.min() > 0.95   # (random weights, 32 calibration samples)
    assert _dequantized_inputs(out)["fc2"]   # quantized ...
    kept = quantize_file(model, tmp_path / "k.onnx", config=replace(NNCF, exclude=("fc2",)),
                         samples=calib)
    assert not _dequantized_inputs(kept)["fc2"] and _dequantized_inputs(kept)["fc1"]
    assert "by NNCF" in NNCF.describe()


def test_nncf_graphs_quantize_activations_unsigned(tmp_path):
    """NNCF quantizes a signed activation (the MLP's input, its hidden layer) to int8 with zero
    point 0, which OpenVINO runs wrong beside a Split; the generator writes it as uint8 with
    zero point 128 (graph/unsigned.py): weights stay int8."""
    out = quantize_file(mlp(tmp_path / "m.onnx"), tmp_path / "q.onnx", config=NNCF,
                        samples=samples(32))
    graph = onnx.load(str(out)).graph
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    quantizers = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    assert quantizers and all(inits[n.input[2]].dtype == np.uint8 for n in quantizers)
    assert 128 in {int(inits[n.input[2]]) for n in quantizers}   # a signed range, moved
    weights = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert weights and all(inits[n.input[0]].dtype == np.int8 for n in weights)


def test_min_max_ranges_widen_the_activation_ranges_and_an_unknown_estimator_is_refused(
        tmp_path):
    model = mlp(tmp_path / "m.onnx")
    calib = samples(32)
    calib[5] = {"x": calib[5]["x"] * 8}   # one outlier sample: the mean of maxima averages it

    def widest_scale(path: Path) -> float:
        from onnx import numpy_helper
        graph = onnx.load(str(path)).graph
        inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        return max(float(inits[n.input[1]].max()) for n in graph.node
                   if n.op_type == "QuantizeLinear" and n.input[0] not in inits)

    mean = quantize_file(model, tmp_path / "mean.onnx", config=NNCF, samples=calib)
    wide = quantize_file(model, tmp_path / "wide.onnx",
                         config=replace(NNCF, nncf_ranges="minmax"), samples=calib)
    assert widest_scale(wide) > 2 * widest_scale(mean)
    assert "minmax ranges" in replace(NNCF, nncf_ranges="minmax").describe()
    with pytest.raises(QuantizationError, match="unknown NNCF range estimator"):
        quantize_file(model, tmp_path / "q.onnx", config=replace(NNCF, nncf_ranges="median"),
                      samples=calib)


def test_nncf_failure_is_a_quantization_error_not_a_traceback(tmp_path):
    model = mlp(tmp_path / "m.onnx")
    with pytest.raises(QuantizationError, match="NNCF"):
        quantize_file(model, tmp_path / "q.onnx", config=NNCF,
                      samples=[{"not_an_input": np.zeros((1, 64), np.float32)}])


def test_the_decision_builds_nncf_beside_onnxruntime_and_says_so_without_it(tmp_path,
                                                                            monkeypatch):
    model = mlp(tmp_path / "m.onnx")
    kwargs = dict(target=load_target("x86_64-cpu"), family="default", request={},
                  calib=samples(24), held=samples(8, seed=2), timer=fixed_timer,
                  budget=AccuracyBudget(min_cosine=0.95))
    (tmp_path / "with").mkdir()
    record = decide(model, tmp_path / "with", **kwargs).record
    made = [c for c in record["candidates"] if c["label"] == "INT8 NNCF"]
    assert made and "by NNCF" in made[0]["precision"] and made[0]["meets_budget"]
    # within budget already: no second range estimator is tried
    assert not any("min-max ranges" in c["label"] for c in record["candidates"])
    # without NNCF installed: one line says so, and onnxruntime's candidates still decide
    monkeypatch.setitem(sys.modules, "nncf", None)
    lines: list[str] = []
    (tmp_path / "without").mkdir()
    record = decide(model, tmp_path / "without", log=lines.append, **kwargs).record
    assert not any("NNCF" in c["label"] for c in record["candidates"])
    assert any("NNCF's INT8 not tried" in line and "pip install" in line for line in lines)
    assert record["chosen"] != "FP32"


def test_when_nncf_misses_both_range_estimators_are_measured_and_the_better_one_goes_on(
        tmp_path):
    model = mlp(tmp_path / "m.onnx")
    record = decide(model, tmp_path, target=load_target("x86_64-cpu"), family="default",
                    request={}, calib=samples(24), held=samples(8, seed=2), timer=fixed_timer,
                    budget=AccuracyBudget(min_cosine=0.99999)).record   # (INT8 cannot keep it)
    made = {c["label"]: c for c in record["candidates"] if "NNCF" in c["label"]}
    default, wide = made["INT8 NNCF"], made["INT8 NNCF, min-max ranges"]
    assert "minmax ranges" in wide["precision"] and not wide["meets_budget"]
    better = max((default, wide), key=lambda c: c["cosine_min"])
    bisected = [c for label, c in made.items() if "most sensitive" in label]
    assert bisected and all(("minmax ranges" in c["precision"]) == (better is wide)
                            for c in bisected)


def test_nncf_calibrates_on_every_sample_where_memory_thinned_onnxruntime_s(tmp_path):
    """onnxruntime's calibrator holds every tensor of every sample, so a large model's
    calibration is thinned to what memory fits (PP-OCRv4 det at 480x480: 19 of 42); NNCF
    reduces each sample's statistics as it goes and calibrates on the whole set."""
    from packager.quantization.search import Search

    model = mlp(tmp_path / "m.onnx")
    whole = samples(24)
    thinned = whole[::3]
    lines: list[str] = []
    search = Search(model, tmp_path, calib=thinned, held=samples(4, seed=2),
                    budget=AccuracyBudget(min_cosine=0.95), log=lines.append, whole=whole)
    assert len(search._samples(NNCF)) == 24 and len(search._samples(BASE)) == 8
    assert any("NNCF calibrates on all 24 calibration samples" in line and "takes 8" in line
               for line in lines)
    assert NNCF.streams and not BASE.streams
    record = decide(model, tmp_path / "d", target=load_target("x86_64-cpu"), family="default",
                    request={}, calib=thinned, held=samples(8, seed=2), timer=fixed_timer,
                    budget=AccuracyBudget(min_cosine=0.95), log=lines.append, whole=whole).record
    assert any(c["label"] == "INT8 NNCF" for c in record["candidates"])


def test_a_transformer_family_still_gets_nncf_s_static_graph(tmp_path):
    """A transformer family's preset is dynamic INT8, and NNCF's static graph (SmoothQuant)
    was never made for it (PP-OCRv4 rec, an SVTR); it is, with calibration data, unless the
    user pinned --mode dynamic."""
    model = mlp(tmp_path / "m.onnx")
    kwargs = dict(target=load_target("x86_64-cpu"), family="transformer", calib=samples(24),
                  held=samples(8, seed=2), timer=fixed_timer,
                  budget=AccuracyBudget(min_cosine=0.95))
    (tmp_path / "a").mkdir()
    made = [c for c in decide(model, tmp_path / "a", request={}, **kwargs).record["candidates"]
            if "NNCF" in c["label"]]
    assert made and made[0]["precision"].startswith("INT8 static QDQ by NNCF (transformer)")
    (tmp_path / "b").mkdir()
    pinned = decide(model, tmp_path / "b", request={"mode": "dynamic"}, **kwargs).record
    assert not any("NNCF" in c["label"] for c in pinned["candidates"])


def test_a_search_that_used_its_whole_limit_still_leaves_nncf_its_own_window(tmp_path):
    model = mlp(tmp_path / "m.onnx")
    lines: list[str] = []
    record = decide(model, tmp_path, target=load_target("x86_64-cpu"), family="default",
                    request={"search_seconds": 0.01}, calib=samples(24),
                    held=samples(8, seed=2), timer=fixed_timer, log=lines.append,
                    budget=AccuracyBudget(min_cosine=0.99999)).record
    assert any("at its 0 s limit" in line for line in lines)   # onnxruntime's search stopped
    assert "INT8 NNCF" in [c["label"] for c in record["candidates"]]   # NNCF's turn came
    # ... within its window (1.5 x 0.01 s): no bisection fits, and the line says so
    assert any(line.startswith("search: NNCF's sensitivity bisection not tried") or
               line.startswith("search: NNCF's min-max ranges not tried") for line in lines)


def test_the_provider_choice_tries_the_best_graph_of_each_generator(tmp_path):
    def cand(label, config, int8, passed=True):
        c = Candidate(label, config, tmp_path / f"{label}.onnx",
                      accuracy={"budget": {"passed": passed}, "cosine_min": 0.99},
                      int8_nodes=int8)
        return c

    fp32 = cand("FP32", replace(BASE, precision="fp32"), 0)
    ort = cand("INT8 preset", BASE, 30)
    ort_less = cand("INT8, 3 most sensitive nodes FP32", BASE, 27)
    nncf = cand("INT8 NNCF", NNCF, 25)
    nncf_miss = cand("INT8 NNCF, miss", NNCF, 29, passed=False)
    decision = Decision(fp32, {}, (fp32, ort, ort_less, nncf_miss, nncf))
    assert [c.label for c in _graphs(decision)] == ["FP32", "INT8 preset", "INT8 NNCF"]


def test_nncf_sends_no_telemetry_from_a_build():
    """Imported the way the build imports it, outside pytest (where NNCF stubs it anyway),
    NNCF's telemetry is its stub: no usage events to Google Analytics, no sender threads."""
    import os
    import subprocess
    import sys

    code = ("import threading\n"
            "from packager.quantization.nncf_generator import unavailable\n"
            "assert unavailable() == '', unavailable()\n"
            "import nncf.telemetry.wrapper as w\n"
            "print(type(w.telemetry).__name__, "
            "sum(t.name.startswith('ThreadPoolExecutor') for t in threading.enumerate()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items()
                                            if k != "NNCF_CI"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["MagicMock", "0"]   # NNCF's stub (NNCFTelemetryStub)
