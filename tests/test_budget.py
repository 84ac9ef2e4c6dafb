"""Accuracy-aware quantization: budgets, sensitive layers kept in FP32, debug-quant, If models."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import PREP, PREP_TEXT, run_py, write_images
from packager.build.job import build
from packager.errors import PackagerError
from packager.quantization.budget import AccuracyBudget, measure_accuracy, parse_drop
from packager.quantization.calibration import load_samples, split_holdout
from packager.quantization.checked import quantize_checked
from packager.quantization.quantize import QuantConfig, quantize_file
from packager.source.export import export
from packager.source.specs import parse_input
from packager.targets import load_target

MODELS = Path(__file__).parent / "torch_models.py"
IMAGE = [parse_input("image:1x3x32x32")]
X86 = load_target("x86_64-cpu")


@pytest.fixture(scope="module")
def sensitive(tmp_path_factory):
    """The FP32 model with one outlier layer, and 40 real images split as the build does."""
    root = tmp_path_factory.mktemp("sensitive")
    export(f"{MODELS}:sensitive", root / "fp32.onnx", inputs=IMAGE, opset=17)
    images = write_images(root / "images", 40)
    samples = load_samples(images, inputs=[{"name": "image", "shape": [1, 3, 32, 32],
                                            "dtype": "float32"}], preprocess=PREP)
    calib, held = split_holdout(samples, fraction=0.2)
    return root, images, calib, held


def test_without_a_budget_accuracy_collapses_with_one_it_holds(sensitive):
    root, _, calib, held = sensitive
    config = QuantConfig.from_preset(X86.quantization)
    quantize_file(root / "fp32.onnx", root / "plain.onnx", config=config, samples=calib)
    plain = measure_accuracy(root / "plain.onnx", root / "fp32.onnx", held)
    assert plain["cosine_min"] < 0.5
    lines = []
    final, acc, record = quantize_checked(root / "fp32.onnx", root / "guarded.onnx",
                                          config=config, calib=calib, held=held,
                                          budget=AccuracyBudget(min_cosine=0.98),
                                          log=lines.append)
    assert acc["cosine_min"] >= 0.98 and record["passed"]
    assert {"/head/Gemm", "/spike/Gemm"} <= set(record["excluded"])
    first = record["candidates"][0]
    assert first["label"] == "INT8 preset" and not first["meets_budget"]
    assert any(ln.startswith("search: bisecting over") for ln in lines)
    kept = {n.name for n in onnx.load(str(root / "guarded.onnx")).graph.node
            if n.op_type == "Gemm"}
    assert {"/head/Gemm", "/spike/Gemm"} <= kept   # still float Gemm nodes
    assert final.exclude == tuple(record["excluded"])


def test_search_bisects_instead_of_one_node_per_round(sensitive, tmp_path):
    """Ranked sensitivity + bisection: a handful of variants, not one quantization per node."""
    from packager.quantization.search import Search
    from packager.quantization.sensitivity import name_nodes

    root, _, calib, held = sensitive
    fp32 = save_model_named(root / "fp32.onnx", tmp_path / "named.onnx", name_nodes)
    search = Search(fp32, tmp_path, calib=calib, held=held,
                    budget=AccuracyBudget(min_cosine=0.98))
    tried = search.run(QuantConfig.from_preset(X86.quantization), set())
    bisected = [c for c in tried if "most sensitive" in c.label]
    assert any(c.passed for c in bisected)
    assert len(tried) <= 12
    heavy = [c for c in tried if c.label == "INT8 heavy ops only"][0]
    assert heavy.config.op_types == ("Conv", "Gemm")


def save_model_named(src: Path, dst: Path, name_nodes) -> Path:
    onnx.save(name_nodes(onnx.load(str(src))), str(dst))
    return dst


def test_build_meets_the_targets_budget_and_records_it(sensitive, tmp_path):
    _, images, _, _ = sensitive
    r = build(f"{MODELS}:sensitive", tmp_path / "b", target="x86_64-cpu", calib=images,
              preprocess=PREP, inputs=IMAGE, quant={"precision": "int8"})
    assert r.parts[0].accuracy["cosine_min"] >= 0.98
    precision = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0][
        "precision"]
    decision = precision["decision"]
    assert decision["mode"] == "int8" and decision["budget"] == "cosine >= 0.98"
    assert decision["held_out"] == 8 and decision["search_seconds"] > 0
    plain = [c for c in decision["candidates"] if c["label"] == "INT8 preset"][0]
    # the sensitive head is a tiny last layer: every variant keeps it FP32 (search.post_processing)
    assert "/head/Gemm" in plain["exclude"] and plain["meets_budget"]
    assert "/head/Gemm" in precision["exclude"]
    # the device check demands the promised budget, not only the host's figure less a margin
    golden = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0]["golden"]
    assert golden["budget_min_cosine"] == 0.98 and golden["min_cosine"] >= 0.98
    check = run_py(tmp_path / "b", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    calibration = precision["calibration"]
    assert calibration["samples"] == 32 and calibration["method"] == "minmax"
    assert len(calibration["sha256"]) == 64


def test_forced_int8_that_misses_the_budget_is_an_error(sensitive, tmp_path):
    _, images, _, _ = sensitive
    r = subprocess.run([sys.executable, "-m", "packager", "build", f"{MODELS}:sensitive",
                        "--input", "image:1x3x32x32", "--calib", str(images), "--preprocess",
                        PREP_TEXT, "--precision", "int8", "--min-cosine", "1.0",
                        "-o", str(tmp_path / "b")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert "--precision int8 misses the accuracy budget (cosine >= 1.0)" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "b").exists()


def test_default_build_ships_what_keeps_the_promise(sensitive, tmp_path):
    """No --precision: candidates measured, the decision and every candidate recorded."""
    _, images, _, _ = sensitive
    lines = []
    r = build(f"{MODELS}:sensitive", tmp_path / "b", target="x86_64-cpu", calib=images,
              preprocess=PREP, inputs=IMAGE, log=lines.append)
    decision = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0][
        "precision"]["decision"]
    assert decision["mode"] == "auto" and r.parts[0].accuracy["cosine_min"] >= 0.98
    assert decision["candidates"][0]["label"] == "FP32"
    assert decision["candidates"][0]["p50_ms"] > 0   # FP32 is always timed against INT8
    chosen = [c for c in decision["candidates"] if c["precision"] == decision["chosen"]]
    assert chosen and chosen[0]["meets_budget"]
    assert sum(ln.startswith("decision: ") for ln in lines) == 1


def test_debug_quant_ranks_the_sensitive_layer_first(sensitive):
    root, images, calib, _ = sensitive
    quantize_file(root / "fp32.onnx", root / "int8.onnx",
                  config=QuantConfig.from_preset(X86.quantization), samples=calib)
    r = subprocess.run([sys.executable, "-m", "packager", "debug-quant", str(root / "fp32.onnx"),
                        str(root / "int8.onnx"), "--calib", str(images), "--preprocess",
                        PREP_TEXT, "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["layers"][0]["node"] == "/head/Gemm" and data["layers"][0]["damage"] > 0.3
    assert data["would_exclude"][0]["node"] == "/head/Gemm"
    table = subprocess.run([sys.executable, "-m", "packager", "debug-quant",
                            str(root / "fp32.onnx"), str(root / "int8.onnx"), "--calib",
                            str(images), "--preprocess", PREP_TEXT], capture_output=True,
                           text=True, timeout=300).stdout
    assert table.splitlines()[2].startswith("| /head/Gemm | Gemm |")
    assert "would keep in FP32: /head/Gemm" in table


def test_method_auto_tries_three_methods_and_a_user_metric(sensitive, tmp_path):
    root, _, calib, held = sensitive
    metric = tmp_path / "metric.py"
    metric.write_text("import numpy as np\n"
                      "def agreement(outputs, labels):\n"
                      "    assert labels is None or len(labels) > 0\n"
                      "    return float(np.mean(outputs['output'][:, 0, 0] > 0))\n")
    from packager.quantization.budget import load_metric

    fn, name = load_metric(f"{metric}:agreement")
    _, acc, record = quantize_checked(
        root / "fp32.onnx", tmp_path / "q.onnx",
        config=QuantConfig.from_preset(X86.quantization, calibration_method="auto"),
        calib=calib, held=held, budget=AccuracyBudget(max_drop=0.01, metric=fn,
                                                      metric_name=name))
    assert acc["metric"] == "agreement" and "metric_fp32" in acc
    assert acc["drop"] <= 0.01 and record["budget"] == "agreement drop <= 1%"
    assert record["candidates"][0]["precision"].endswith("minmax")   # auto starts at minmax


def test_cli_quantize_with_a_drop_budget(sensitive, tmp_path):
    root, images, _, _ = sensitive
    r = subprocess.run([sys.executable, "-m", "packager", "quantize", str(root / "fp32.onnx"),
                        "--calib", str(images), "--preprocess", PREP_TEXT,
                        "--min-cosine", "0.98", "--max-accuracy-drop", "1%",
                        "-o", str(tmp_path / "q.onnx"), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["budget"]["passed"] and data["accuracy"]["cosine_min"] >= 0.98
    assert "search: bisecting over" in r.stderr
    assert parse_drop("1%") == pytest.approx(0.01) and parse_drop("0.5") == 0.5
    with pytest.raises(PackagerError, match="not a number"):
        parse_drop("lots")
    strict = subprocess.run([sys.executable, "-m", "packager", "quantize",
                             str(root / "fp32.onnx"), "--calib", str(images), "--preprocess",
                             PREP_TEXT, "--min-cosine", "1.0", "-o", str(tmp_path / "q1.onnx")],
                            capture_output=True, text=True, timeout=300)
    assert strict.returncode == 1, strict.stderr
    assert "no INT8 variant keeps the accuracy budget (cosine >= 1.0)" in strict.stderr
    assert not (tmp_path / "q1.onnx").exists()


def if_model(path: Path) -> Path:
    """MatMul -> (sum > 0 ? x2 : x-1) in an If node -> MatMul."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(8, 16)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(size=(16, 4)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    branch = [helper.make_graph([helper.make_node(op, ["h", arg], [out], name=f"{op}_branch")],
                                name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                                         [1, 16])])
              for op, arg, out, name in (("Mul", "two", "t", "then"), ("Sub", "one", "e", "else"))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("ReduceSum", ["h"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], name="branch", then_branch=branch[0],
                              else_branch=branch[1]),
             helper.make_node("MatMul", ["y", "w2"], ["out"], name="mm2")]
    graph = helper.make_graph(nodes, "ifnet",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("quant", [{}, {"mode": "dynamic"}, {"format": "qoperator"}])
def test_model_with_an_if_node_quantizes_to_a_valid_graph(tmp_path, quant):
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(1).normal(size=(30, 1, 8))
             .astype(np.float32))
    r = build(if_model(tmp_path / "if.onnx"), tmp_path / "b", target="x86_64-cpu",
              calib=tmp_path / "x.npz", quant=quant)
    model = onnx.load(str(tmp_path / "b" / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert "If" in {n.op_type for n in model.graph.node}
    assert r.parts[0].accuracy["cosine_min"] >= 0.98
    session = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.ones((1, 8), np.float32)})[0].shape == (1, 4)


def test_an_l2_normalised_embedding_gets_a_tighter_default_budget(tmp_path):
    """Embeddings are compared with each other: 0.98 to FP32 moves nearest neighbours, so the
    default budget for an L2-normalised output is 0.995; --min-cosine still decides."""
    from packager.quantization.budget import EMBEDDING_COSINE, embedding_outputs

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(64, 32)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("ReduceL2", ["h"], ["n"], axes=[1], keepdims=1),
             helper.make_node("Div", ["h", "n"], ["e"], name="normalise")]
    graph = helper.make_graph(nodes, "embed", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 64])], [helper.make_tensor_value_info(
            "e", TensorProto.FLOAT, [1, 32])], [w])
    model = tmp_path / "embed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    np.savez(tmp_path / "x.npz", x=rng.normal(size=(40, 1, 64)).astype(np.float32))
    lines = []
    build(model, tmp_path / "b", target="x86_64-cpu", calib=tmp_path / "x.npz", log=lines.append)
    decision = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0][
        "precision"]["decision"]
    assert decision["budget_min_cosine"] == EMBEDDING_COSINE
    assert any("'e' is an L2-normalised embedding" in line for line in lines)
    build(model, tmp_path / "c", target="x86_64-cpu", calib=tmp_path / "x.npz", min_cosine=0.97)
    decision = json.loads((tmp_path / "c" / "manifest.json").read_text())["parts"][0][
        "precision"]["decision"]
    assert decision["budget_min_cosine"] == 0.97
    scores = {"s": np.abs(rng.normal(size=(4, 1, 32))).astype(np.float32)}
    assert embedding_outputs(scores) == []


def test_a_missed_cosine_names_the_output_that_missed(tmp_path):
    def model(second, path):
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["a"]), helper.make_node(second, ["x"], ["b"])],
            "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 16]) for n in "ab"])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return path

    rng = np.random.default_rng(0)
    held = [{"x": rng.normal(size=(1, 16)).astype(np.float32)} for _ in range(4)]
    acc = AccuracyBudget(min_cosine=0.98).evaluate(
        model("Sin", tmp_path / "c.onnx"), model("Neg", tmp_path / "f.onnx"), held)
    assert not acc["budget"]["passed"]
    assert acc["budget"]["failures"][0].endswith("on output 'b'")


def test_a_few_class_scores_keep_their_top1_instead_of_an_absolute_error():
    """Small outputs (<= 8 values) must stay within 1% of their largest magnitude, but class
    scores (a Softmax feeds them, or --labels count them) are judged by their expected top-1
    drop instead: a 4-class
    head's INT8 logits moved 1.4% with every top-1 the same, and used to fail."""
    import onnx
    from onnx import TensorProto, helper

    from packager.quantization.budget import class_outputs, small_output_failures

    ref = {"scores": np.array([[9.0, 1.0, 0.5, 0.2], [0.1, 8.0, 0.3, 0.2]], np.float32)}
    moved = {"scores": {"max_abs": 0.13, "top1_agreement": 1.0}}
    assert small_output_failures(ref, moved)                       # as a regression output
    assert small_output_failures(ref, moved, frozenset({"scores"})) == []
    # (their flips are judged by the expected drop: test_task_budget's near-tie test)
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["p"]), helper.make_node("Flatten", ["p"], ["probs"]),
         helper.make_node("Relu", ["x"], ["mos"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 3]),
         helper.make_tensor_value_info("mos", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    assert class_outputs(graph, None) == {"probs"}            # a quality model's MOS stays small
    assert class_outputs(graph, ["a", "b", "c"]) == {"probs", "mos"}


def test_the_device_holds_a_few_values_a_sample_to_the_host_s_drift_plus_one_percent():
    """run.py check: a [1, 3] quality head may move on the device no further than the host's
    own max abs plus 1% of its largest value (a cosine of three numbers near 1 cannot tell);
    a damaged host figure is no figure, never a crash."""
    from packager._runtimes.runner.check import small_drift
    from packager._runtimes.runner.metrics import compare

    ref = np.array([[[3.1, 2.5, 4.0]], [[2.0, 1.5, 3.2]]], np.float32)
    golden = {"host": {"mos": {"max_abs": 0.01}}}
    close = compare(ref + 0.04, ref)
    assert close["cosine_min"] > 0.999
    assert small_drift("mos", ref, close, golden)["passed"]            # 0.04 <= 0.01 + 0.04
    far = compare(ref + np.float32([0.0, 0.0, 0.3]), ref)
    assert far["cosine_min"] > 0.99 and not small_drift("mos", ref, far, golden)["passed"]
    for damaged in ({"host": []}, {"host": {"mos": "x"}}, {"host": {"mos": {"max_abs": True}}},
                    {"host": {"mos": {"max_abs": float("nan")}}}, {}):
        assert small_drift("mos", ref, far, damaged) is None
    assert small_drift("big", np.zeros((2, 1, 16), np.float32), far, golden) is None


def test_a_preset_that_pays_but_misses_is_named_as_the_reason(sensitive, tmp_path):
    """When the preset pays (here timed at 2x FP32) but misses the budget and the variants that
    keep more nodes FP32 lose the gain, the decision says the budget kept INT8 out, not 'INT8
    cannot pay on this CPU' about the slower bisected variant alone."""
    from packager.quantization.decision import decide

    root, _, calib, held = sensitive

    def timer(paths, feed, threads, rounds, block):   # the --time-on interface, fixed figures
        return ({str(p): {"p50": 1.0 if p.name == "fp32.onnx" else
                          0.5 if p.name == "variant_00.onnx" else 1.2, "p90": 1.3}
                 for p in paths}, {"arch": "test"})

    (tmp_path / "d").mkdir()
    result = decide(root / "fp32.onnx", tmp_path / "d", timer=timer,
                    target=load_target("x86_64-cpu"), family="default", request={},
                    calib=calib, held=held, budget=AccuracyBudget(min_cosine=0.99999999))
    reason = result.record["reason"]
    assert reason.startswith("FP32: the INT8 that pays misses the budget: INT8 preset runs "
                             "2.00x FP32's speed (0.500 vs 1.000 ms p50) but cosine "), reason
    assert "keeping nodes FP32 to meet it costs the gain" in reason
