"""Outputs whose length depends on the input (issue 37, first step): the core of every
duration-based TTS, 8 frames repeated by predicted durations (length regulation), builds,
keeps per-sample outputs in its golden data without pickles, verifies and answers on the
device; before, stacking the samples' outputs crashed the build (exit 3)."""

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from conftest import save
from packager._runtimes.runner.metrics import compare, from_npz, npz_arrays, stack_or_ragged
from packager.cli import main
from packager.device.verify import verify


def length_regulator(path):
    """x (1, 8) -> 8 frames (Tanh(x W)) each repeated by its predicted duration
    (Ceil(Relu(x V)), 0-3 frames): `frames` is (sum of durations, 8), as a TTS decoder's input."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32) * 0.5
    v = rng.standard_normal((8, 8)).astype(np.float32) * 0.6
    const = [helper.make_tensor("w", TensorProto.FLOAT, [8, 64], w.ravel()),
             helper.make_tensor("v", TensorProto.FLOAT, [8, 8], v.ravel()),
             helper.make_tensor("shape", TensorProto.INT64, [2], [8, 8]),
             helper.make_tensor("three", TensorProto.FLOAT, [], [3.0]),
             helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("one", TensorProto.INT64, [], [1]),
             helper.make_tensor("axis0", TensorProto.INT64, [], [0]),
             helper.make_tensor("ax1", TensorProto.INT64, [1], [1])]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["h"]), n("Tanh", ["h"], ["t"]),
             n("Reshape", ["t", "shape"], ["frames8"]),                       # (8, 8)
             n("MatMul", ["x", "v"], ["dv"]), n("Relu", ["dv"], ["dr"]),
             n("Min", ["dr", "three"], ["dm"]), n("Ceil", ["dm"], ["dc"]),
             n("Cast", ["dc"], ["d2"], to=TensorProto.INT64),
             n("Squeeze", ["d2", "axis1"], ["durations"]),                    # (8,)
             n("CumSum", ["durations", "axis0"], ["ends"]),
             n("ReduceSum", ["durations"], ["total"], keepdims=0),
             n("Range", ["zero", "total", "one"], ["pos"]),                   # (T,)
             n("Unsqueeze", ["pos", "ax1"], ["pos2"]),                        # (T, 1)
             n("GreaterOrEqual", ["pos2", "ends"], ["past"]),                 # (T, 8)
             n("Cast", ["past"], ["pasti"], to=TensorProto.INT64),
             n("ReduceSum", ["pasti", "ax1"], ["idx"], keepdims=0),           # frame of each t
             n("Gather", ["frames8", "idx"], ["frames"], axis=0)]             # (T, 8)
    const.append(helper.make_tensor("axis1", TensorProto.INT64, [1], [0]))
    graph = helper.make_graph(
        nodes, "length_regulator", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("frames", TensorProto.FLOAT, ["T", 8])], const)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("ragged")
    model = length_regulator(root / "regulator.onnx")
    (root / "calib").mkdir()
    np.save(root / "calib" / "x.npy",
            np.random.default_rng(1).standard_normal((30, 1, 8)).astype(np.float32))
    run = CliRunner().invoke(main, ["build", str(model), "--calib", str(root / "calib"),
                                    "-o", str(root / "out")], catch_exceptions=False)
    return root, run


def test_stack_or_ragged_and_its_npz_form_round_trip():
    same = stack_or_ragged([np.zeros((2, 3)), np.ones((2, 3))])
    assert same.shape == (2, 2, 3) and same.dtype == np.float64
    ragged = stack_or_ragged([np.zeros((2, 3)), np.ones((5, 3))])
    assert ragged.dtype == object and [a.shape for a in ragged] == [(2, 3), (5, 3)]
    flat = npz_arrays({"y": ragged, "s": same})
    assert sorted(flat) == ["s", "y.ragged.0", "y.ragged.1"]
    back = from_npz(flat)
    assert back["s"] is same and [a.shape for a in back["y"]] == [(2, 3), (5, 3)]


def test_ragged_outputs_compare_per_sample_and_count_lengths_that_differ():
    rng = np.random.default_rng(0)
    ref = stack_or_ragged([rng.standard_normal(n) for n in (10, 40, 25)])
    assert compare(ref, ref)["cosine_min"] == pytest.approx(1.0)
    assert compare(ref, ref)["length_mismatch"] == 0
    short = stack_or_ragged([ref[0], ref[1][:30], ref[2]])   # a quarter of one sample missing
    result = compare(short, ref)
    assert result["length_mismatch"] == 1 and 0.5 < result["cosine_min"] < 0.99


def test_a_model_whose_output_length_follows_its_input_builds_and_verifies(built):
    root, run = built
    assert run.exit_code == 0, run.output
    manifest = json.loads((root / "out" / "manifest.json").read_text())
    golden = manifest["parts"][0]["golden"]
    with np.load(root / "out" / golden["outputs"], allow_pickle=False) as f:   # no pickles
        keys = f.files
        lengths = {f[k].shape[0] for k in keys}
    assert all(k.startswith("frames.ragged.") for k in keys) and len(keys) == golden["samples"]
    assert len(lengths) > 1, "the samples' lengths should differ"
    report = verify(root / "out", runs=5, warmup=1)
    assert report["passed"], report["checks"]
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["accuracy:frames"]["passed"] and checks["reproduce:frames"]["passed"]


def test_the_device_answers_with_the_length_the_input_asks_for(built, tmp_path):
    root, _ = built
    x = np.random.default_rng(7).standard_normal((1, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([sys.executable, "-I", "run.py", "infer", str(tmp_path / "x.npy"),
                           "--json"], cwd=root / "out", capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    import onnxruntime as ort

    # the graph the bundle ships (FP32, or INT8 where a busy machine timed it faster)
    expected = ort.InferenceSession(str(root / "out" / "model.onnx")).run(None, {"x": x})[0]
    frames = json.loads(proc.stdout)["results"][0]["outputs"]["frames"]
    assert frames["shape"] == list(expected.shape)
    np.testing.assert_allclose(np.array(frames["values"]), expected, rtol=1e-5, atol=1e-6)


def test_serve_answers_each_request_at_its_own_length(built, tmp_path):
    import io
    import urllib.request

    from conftest import start_server

    root, _ = built
    proc, url = start_server(root / "out", tmp_path / "serve.log")
    try:
        shapes = []
        for seed in (3, 4, 5):
            x = np.random.default_rng(seed).standard_normal((1, 8)).astype(np.float32)
            body = io.BytesIO()
            np.save(body, x)
            request = urllib.request.Request(url + "/infer", data=body.getvalue(), headers={
                "Content-Type": "application/octet-stream"})
            with urllib.request.urlopen(request, timeout=30) as answer:
                shapes.append(json.loads(answer.read())["outputs"]["frames"]["shape"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    import onnxruntime as ort

    session = ort.InferenceSession(str(root / "regulator.onnx"))
    assert shapes == [list(session.run(None, {"x": np.random.default_rng(s).standard_normal(
        (1, 8)).astype(np.float32)})[0].shape) for s in (3, 4, 5)]


def test_a_length_two_runs_share_by_chance_stays_dynamic(tmp_path):
    """Two samples whose durations add up alike (8 frames each) gave the frames one size, and
    the graph was given that size as static: a third sample's 24 frames then failed inside
    onnxruntime ("Shape mismatch attempting to re-use buffer"), an exit 3 seen once in a build
    that picked the unsimplified FP32 graph. What a Range (or another op whose output shape
    follows values) makes stays dynamic however the runs at hand agree."""
    import onnx
    import onnxruntime as ort

    from packager.graph.shapes import fix_shapes_proto, shapes_from_run

    model = fix_shapes_proto(onnx.load(str(length_regulator(tmp_path / "lr.onnx"))),
                             {"x": [1, 8]}, batch=1, strict=False)
    rng = np.random.default_rng(3)
    feeds, lengths = [], set()
    while len(feeds) < 3:   # two samples of the same frame count, then one of another
        x = rng.standard_normal((1, 8)).astype(np.float32)
        frames = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        if (len(feeds) < 2 and len(frames) == 8) or (len(feeds) == 2 and len(frames) != 8):
            feeds.append({"x": x})
            lengths.add(len(frames))
    filled, varying = shapes_from_run(model, feeds[:2])
    assert "frames" in varying and len(lengths) == 2
    session = ort.InferenceSession(filled.SerializeToString())
    for feed in feeds:
        session.run(None, feed)   # every frame count runs
