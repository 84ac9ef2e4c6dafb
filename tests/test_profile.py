"""Per-op profiles of FP32 and INT8 graphs, the HardSwish rewrite, and run.py bench --profile."""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from conftest import run_py, save
from packager.cli import main
from packager.graph.hard_activations import fuse_hard_activations, rewrite
from packager.quantization.profile import (
    family,
    float_islands,
    losses,
    profile_model,
    profile_pair,
    table,
)
from packager.quantization.quantize import QuantConfig, quantize_file


def paddle_hardswish(path: Path, *, clip_max: float = 6.0, opset: int = 13) -> Path:
    """Conv -> x * clip(x + 3, 0, 6) / 6 (paddle2onnx's HardSwish) -> Conv, and clip / 6 alone."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(size=(8, 8, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(3.0, np.float32), "three"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(clip_max, np.float32), "top"),
             numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "three"], ["a"], name="add"),
             helper.make_node("Clip", ["a", "zero", "top"], ["cl"], name="clip"),
             helper.make_node("Mul", ["c1", "cl"], ["m"], name="mul"),
             helper.make_node("Div", ["m", "six"], ["hs"], name="div"),
             helper.make_node("Conv", ["hs", "w2"], ["c2"], name="conv2"),
             helper.make_node("Add", ["c2", "three"], ["a2"], name="add2"),
             helper.make_node("Clip", ["a2", "zero", "top"], ["cl2"], name="clip2"),
             helper.make_node("Div", ["cl2", "six"], ["y"], name="div2")]
    graph = helper.make_graph(
        nodes, "hardswish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)


def outputs(path: Path, feed):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


def test_hardswish_chains_become_single_ops_with_the_same_outputs(tmp_path):
    src = paddle_hardswish(tmp_path / "paddle.onnx")
    made = fuse_hard_activations(src, tmp_path / "fused.onnx")
    assert made == {"HardSwish": 1, "HardSigmoid": 1}
    model = onnx.load(str(tmp_path / "fused.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Conv", "HardSwish", "Conv", "HardSigmoid"]
    assert model.opset_import[0].version == 14   # HardSwish needs 14; 13's ops mean the same
    onnx.checker.check_model(model, full_check=True)
    feed = {"x": np.random.default_rng(1).normal(size=(1, 3, 16, 16)).astype(np.float32) * 4}
    for a, b in zip(outputs(src, feed), outputs(tmp_path / "fused.onnx", feed), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_other_clips_and_old_opsets_are_left_alone(tmp_path):
    relu6 = onnx.load(str(paddle_hardswish(tmp_path / "a.onnx", clip_max=5.0)))
    assert rewrite(relu6) == {"HardSwish": 0, "HardSigmoid": 0}
    assert len(relu6.graph.node) == 9
    old = onnx.load(str(paddle_hardswish(tmp_path / "b.onnx", opset=11)))
    assert rewrite(old) == {"HardSwish": 0, "HardSigmoid": 0}
    assert old.opset_import[0].version == 11


def quantized_pair(tmp_path: Path, cnn_onnx: Path):
    from packager.graph.shapes import fix_shapes

    fixed = tmp_path / "fixed.onnx"
    fix_shapes(cnn_onnx, fixed, shapes={"image": [1, 3, 32, 32]})
    rng = np.random.default_rng(0)
    samples = [{"image": rng.normal(size=(1, 3, 32, 32)).astype(np.float32)} for _ in range(4)]
    int8 = quantize_file(fixed, tmp_path / "int8.onnx", config=QuantConfig(), samples=samples)
    return fixed, int8, samples[0]


def test_profile_of_fp32_and_int8_lines_up_by_op_family(tmp_path, cnn_onnx):
    fp32, int8, feed = quantized_pair(tmp_path, cnn_onnx)
    a, b = profile_pair(fp32, int8, feed, threads=1, runs=4)
    assert a.by_family().get("Conv", 0) > 0 and b.by_family().get("Conv", 0) > 0
    assert any(op.startswith("QLinear") or op == "QuantizeLinear" for op in b.by_op)
    assert not any(op.startswith("QLinear") for op in a.by_op)
    assert b.qdq_ms > 0 and a.qdq_ms == 0
    text = table(a, b)
    assert "| Conv |" in text and "Q/DQ" in text
    assert losses(a, b).startswith("profile: INT8 ")
    assert family("QLinearConv") == family("FusedConv") == "Conv"
    assert family("DequantizeLinear") == "Q/DQ"


def test_a_float_op_between_dequantize_and_quantize_is_an_island(tmp_path):
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    zero = numpy_helper.from_array(np.array(128, np.uint8), "z")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q0"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq0"),
             helper.make_node("Sigmoid", ["d"], ["f"], name="sig"),
             helper.make_node("Neg", ["f"], ["g"], name="neg"),
             helper.make_node("QuantizeLinear", ["g", "s", "z"], ["q2"], name="q1"),
             helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["y"], name="dq1")]
    graph = helper.make_graph(nodes, "island",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [scale, zero])
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                tmp_path / "island.onnx")
    assert float_islands(path) == [{"sig", "neg"}]
    prof = profile_model(path, {"x": np.ones(4, np.float32)}, threads=1, runs=3)
    assert prof.islands == 1 and prof.counts.get("QuantizeLinear", 0) >= 1
    assert prof.runs == 3 and prof.as_dict()["runs"] == 3
    # bounded in seconds (a 1.4 s TTS model's 13 profiled calls took 50 s): one run at least
    bounded = profile_model(path, {"x": np.ones(4, np.float32)}, threads=1, runs=10, seconds=0.0)
    assert bounded.runs == 1 and bounded.counts.get("QuantizeLinear", 0) >= 1


def test_debug_quant_profile_prints_where_int8_loses_time(tmp_path, cnn_onnx):
    fp32, int8, feed = quantized_pair(tmp_path, cnn_onnx)
    np.savez(tmp_path / "calib.npz", image=np.concatenate([feed["image"]] * 2))
    r = CliRunner().invoke(main, ["debug-quant", str(fp32), str(int8), "--calib",
                                  str(tmp_path / "calib.npz"), "--samples", "1", "--profile",
                                  "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    prof = json.loads(r.output)["profile"]
    assert prof["int8"]["qdq_ms"] > 0
    assert {row["family"] for row in prof["families"]} >= {"Conv", "Q/DQ"}
    r = CliRunner().invoke(main, ["debug-quant", str(fp32), str(int8), "--calib",
                                  str(tmp_path / "calib.npz"), "--profile", "--threads", "-1"])
    assert r.exit_code == 2 and "--threads" in r.output


def test_bench_profile_prints_each_op_type_on_the_device(built):
    r = run_py(built.bundle.directory, "bench", "--runs", "3", "--warmup", "1", "--profile")
    assert r.returncode == 0, r.stderr
    assert "per-op profile of" in r.stdout and "ms in kernels per call" in r.stdout
    r = run_py(built.bundle.directory, "bench", "--runs", "3", "--warmup", "1", "--profile",
               "--json")
    assert r.returncode == 0, r.stderr
    part = next(iter(json.loads(r.stdout)["parts"].values()))
    ops = {row["op"] for row in part["profile"]["ops"]}
    assert ops & {"QLinearConv", "Conv", "FusedConv", "QuantizeLinear"}
    assert abs(sum(row["share"] for row in part["profile"]["ops"]) - 1.0) < 1e-6
