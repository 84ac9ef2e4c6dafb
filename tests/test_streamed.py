"""A recurrent state judged through the frames it produces, streamed (issue 44, item 3): each
model runs the held-out samples as one stream, its own state fed back, and the vad task judges
the frames; the state output's cosine is reported, not gated."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from conftest import save
from packager.graph.execute import run_model
from packager.quantization import kfold
from packager.quantization.budget import AccuracyBudget
from packager.quantization.streamed import run_streamed, state_pairs

VAD = {"kind": "vad"}


def cell(path: Path, *, reads_state: float, flip_state: bool = False) -> Path:
    """A recurrent speech detector: stateN = tanh(x W + state U); output = sigmoid(x v +
    reads_state * state u). *flip_state*: the state output negated (a broken state)."""
    rng = np.random.default_rng(5)
    w = (rng.normal(size=(16, 8)) / 4).astype(np.float32)
    u = (rng.normal(size=(8, 8)) / 4).astype(np.float32)
    v = (rng.normal(size=(16, 1)) * 2).astype(np.float32)
    s = (rng.normal(size=(8, 1)) * reads_state).astype(np.float32)
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["xw"]), n("MatMul", ["state", "u"], ["su"]),
             n("Add", ["xw", "su"], ["pre"]), n("Tanh", ["pre"], ["h"]),
             n("MatMul", ["x", "v"], ["xv"]), n("MatMul", ["state", "s"], ["ss"]),
             n("Add", ["xv", "ss"], ["logit"]), n("Sigmoid", ["logit"], ["output"])]
    nodes.append(n("Neg", ["h"], ["stateN"]) if flip_state else n("Identity", ["h"], ["stateN"]))
    graph = helper.make_graph(
        nodes, "cell",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(a, k) for a, k in ((w, "w"), (u, "u"), (v, "v"), (s, "s"))])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def stream(model: Path, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """*count* chunks, each with the state FP32 had there (as a VAD's calibration records)."""
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(count, 1, 16)).astype(np.float32)
    out = run_streamed(model, [{"x": x, "state": np.zeros((1, 8), np.float32)} for x in xs],
                       [("state", "stateN")])
    states = [np.zeros((1, 8), np.float32)] + list(out["stateN"][:-1])
    return [{"x": x, "state": s.astype(np.float32)} for x, s in zip(xs, states, strict=True)]


def test_state_pairs_and_a_stream_feed_each_state_back(tmp_path):
    model = cell(tmp_path / "m.onnx", reads_state=0.5)
    assert state_pairs(model) == (("state", "stateN"),)
    samples = stream(model, 6)
    streamed = run_streamed(model, samples, state_pairs(model))
    # by hand: the first sample's state as given, then each output state fed to the next
    state, probs = samples[0]["state"], []
    for sample in samples:
        out = run_model(model, [{"x": sample["x"], "state": state}])
        probs.append(out["output"][0])
        state = out["stateN"][0]
    assert np.allclose(streamed["output"], np.stack(probs), atol=1e-6)
    assert streamed["output"].shape == (6, 1, 1)
    # the name alone is no pair: an output 'stateN' of another shape is not the state
    graph = helper.make_graph(
        [helper.make_node("Slice", ["state", "zero", "four", "one"], ["stateN"])], "slice",
        [helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array([v]), k)
         for v, k in ((0, "zero"), (4, "four"), (1, "one"))])
    assert state_pairs(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)])) == ()


def test_a_state_the_frames_barely_read_is_judged_by_the_frames_streamed(tmp_path):
    """Sample by sample, a state output that is wrong (negated: cosine -1) fails the budget
    although every frame agrees; streamed, the frames judge it: they agree, it passes, the
    state's cosine reported. Where the frames read the state, the same broken state flips
    them when streamed, and it fails."""
    fp32 = cell(tmp_path / "fp32.onnx", reads_state=0.05)
    broken = cell(tmp_path / "broken.onnx", reads_state=0.05, flip_state=True)
    held = stream(fp32, 120)
    forced = AccuracyBudget(min_cosine=0.98, task=VAD).evaluate(broken, fp32, held)
    assert not forced["budget"]["passed"]
    assert any("stateN" in f for f in forced["budget"]["failures"]), forced["budget"]
    budget = AccuracyBudget(min_cosine=0.98, task=VAD, states=(("state", "stateN"),))
    acc = budget.evaluate(broken, fp32, held)
    assert acc["budget"]["passed"], acc["budget"]
    assert acc["streamed"] == {"states": [["state", "stateN"]], "samples": 120}
    assert "stateN" in acc["cosine_reported"] and acc["outputs"]["stateN"]["cosine_min"] < 0
    assert acc["task"]["figures"]["frame_drop"]["value"] <= 0.01
    # frames that read the state: the broken state, streamed, moves them
    loud = cell(tmp_path / "loud.onnx", reads_state=4.0)
    loud_broken = cell(tmp_path / "loud_broken.onnx", reads_state=4.0, flip_state=True)
    held = stream(loud, 120)
    acc = budget.evaluate(loud_broken, loud, held)
    assert not acc["budget"]["passed"]
    assert acc["task"]["figures"]["frame_drop"]["value"] > 0.01, acc["task"]


def test_the_rotation_streams_each_fold(tmp_path):
    """By k-fold rotation each fold runs as one stream; another provider's outputs, gathered
    sample by sample, are judged against FP32's sample by sample (Rotation.sampled)."""
    fp32 = cell(tmp_path / "fp32.onnx", reads_state=0.5)
    pool = stream(fp32, 20)
    rotation = kfold.Rotation(fp32, pool, states=(("state", "stateN"),))
    by_fold = [run_streamed(fp32, [pool[i] for i in fold], (("state", "stateN"),))
               for fold in rotation.folds]
    assert np.allclose(rotation.reference["output"],
                       np.concatenate([f["output"] for f in by_fold]))
    assert np.allclose(rotation.sampled["output"], run_model(fp32, rotation.order)["output"])
    assert not np.allclose(rotation.reference["output"], rotation.sampled["output"])


def test_a_vad_build_streams_its_state_and_says_so(tmp_path):
    """The build of a stateful VAD says the state is streamed, and its candidates' records
    carry the streamed figures (the frames judge, the state's cosine is reported)."""
    model = cell(tmp_path / "vad.onnx", reads_state=0.5)
    samples = stream(model, 60, seed=3)
    np.savez(tmp_path / "chunks.npz", x=np.stack([s["x"] for s in samples]),
             state=np.stack([s["state"] for s in samples]))
    run = subprocess.run([sys.executable, "-m", "packager", "build", str(model), "--target",
                          "x86_64-cpu", "--calib", str(tmp_path / "chunks.npz"), "--input",
                          "x:1x16", "--input", "state:1x8", "--task", "vad", "-o",
                          str(tmp_path / "out"), "--openvino", "no"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "budget: stateN feeds state back: each model streams the held-out samples" \
        in run.stderr, run.stderr[-3000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    decision = manifest["parts"][0]["precision"]["decision"]
    assert "expected frame drop" in decision["budget"] or "frame_drop" in json.dumps(decision)
