import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import save
from packager.errors import ModelError
from packager.graph.simplify import simplify


def run(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def padded_model(opset: int) -> onnx.ModelProto:
    """x -> Identity -> Add(Constant node computed from two constants) -> y, plus a dead branch."""
    c1 = helper.make_node("Constant", [], ["c1"], value=numpy_helper.from_array(
        np.full((1, 4), 2.0, np.float32)))
    c2 = (helper.make_node("Constant", [], ["c2"], value_float=3.0) if opset >= 12 else
          helper.make_node("Constant", [], ["c2"], value=numpy_helper.from_array(
              np.array(3.0, np.float32))))
    nodes = [c1, c2, helper.make_node("Mul", ["c1", "c2"], ["c"]),
             helper.make_node("Identity", ["x"], ["xi"]),
             helper.make_node("Add", ["xi", "c"], ["y"]),
             helper.make_node("Relu", ["x"], ["dead"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_onnxsim_folds_constants_and_removes_dead_nodes(tmp_path):
    src = save(padded_model(17), tmp_path / "m.onnx")
    r = simplify(src, tmp_path / "s.onnx")
    assert r.simplifier == "onnxsim" and r.fallback_reason == ""
    assert (r.nodes_before, r.nodes_after) == (6, 1)
    x = np.arange(4, dtype=np.float32)[None]
    np.testing.assert_allclose(run(r.output, x), x + 6.0)


def test_old_opset_is_upgraded_to_13(tmp_path):
    src = save(padded_model(11), tmp_path / "m11.onnx")
    r = simplify(src, tmp_path / "s.onnx")
    assert (r.opset_before, r.opset_after) == (11, 13)
    onnx.checker.check_model(onnx.load(str(r.output)))


def test_external_data_model_simplifies_to_one_file(cnn_onnx, tmp_path):
    model = onnx.load(str(cnn_onnx))
    onnx.save_model(model, str(tmp_path / "ext.onnx"), save_as_external_data=True,
                    location="ext.onnx.data", size_threshold=0)
    r = simplify(tmp_path / "ext.onnx", tmp_path / "s.onnx")
    out = onnx.load(str(r.output), load_external_data=False)
    assert all(t.data_location == TensorProto.DEFAULT for t in out.graph.initializer)
    x = np.random.default_rng(0).normal(size=(1, 3, 32, 32)).astype(np.float32)
    ref = ort.InferenceSession(str(cnn_onnx), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(r.output), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got.run(None, {"image": x})[0], ref.run(None, {"image": x})[0],
                               atol=1e-5)


def test_fallback_to_onnxruntime_when_onnxsim_fails(tmp_path, monkeypatch):
    # onnxsim 0.8.1 simplified every broken-but-runnable model tried here, so its failure is
    # simulated; the fallback optimiser and the resulting model are real.
    import onnxsim

    def broken(*_a, **_k):
        raise RuntimeError("simulated onnxsim crash\nsecond line")

    monkeypatch.setattr(onnxsim, "simplify", broken)
    src = save(padded_model(17), tmp_path / "m.onnx")
    r = simplify(src, tmp_path / "s.onnx")
    assert r.simplifier == "onnxruntime-basic"
    assert r.fallback_reason == "onnxsim failed: simulated onnxsim crash"
    assert r.nodes_after < r.nodes_before
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(run(r.output, x), x + 6.0)


@pytest.mark.parametrize("content", [b"", b"this is not a model\n", b"\x08\x07\x12\x04abc"])
def test_not_onnx_is_a_clear_error(tmp_path, content):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    with pytest.raises(ModelError, match="bad.onnx"):
        simplify(bad, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def test_truncated_model_is_a_clear_error(cnn_onnx, tmp_path):
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(cnn_onnx.read_bytes()[: cnn_onnx.stat().st_size // 2])
    with pytest.raises(ModelError, match="cut.onnx"):
        simplify(bad, tmp_path / "out.onnx")
    assert list(tmp_path.iterdir()) == [bad]


def pad_net_onnx(path):
    """A small audio-style CNN exported by plain torch.onnx.export: explicit asymmetric zero
    Pads before Convs (TF "same" padding ported to PyTorch) and a reflect Pad."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.ZeroPad2d((1, 2, 0, 1)), nn.Conv2d(1, 8, (2, 4)), nn.ReLU(),
                        nn.ReflectionPad2d((1, 1, 1, 1)), nn.Conv2d(8, 8, 3), nn.ReLU(),
                        nn.ZeroPad2d((0, 1, 1, 0)), nn.Conv2d(8, 4, 2)).eval()
    torch.onnx.export(net, (torch.randn(1, 1, 16, 32),), str(path), input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False)
    return path


def test_pads_before_convs_are_kept_apart_when_asked(tmp_path):
    from packager.graph.modelio import load_model
    from packager.graph.simplify import padded_ops, simplify_proto

    src = pad_net_onnx(tmp_path / "pad.onnx")
    folded, _, _ = simplify_proto(load_model(src), src)
    kept, simplifier, _ = simplify_proto(load_model(src), src, fold_pads=False)
    assert simplifier == "onnxsim"
    # onnxsim folds the zero Pads into the Convs' pads; the reflect Pad cannot be folded
    assert padded_ops(folded) == 1 and padded_ops(kept) == 3
    x = np.random.default_rng(0).standard_normal((1, 1, 16, 32)).astype(np.float32)
    for graph in (folded, kept):
        np.testing.assert_allclose(run(save(graph, tmp_path / "g.onnx"), x), run(src, x),
                                   rtol=1e-5, atol=1e-5)


def test_build_keeps_the_fp32_graph_it_timed_fastest_and_records_why(tmp_path):
    import json

    from packager.build.job import build

    src = pad_net_onnx(tmp_path / "pad.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(1)
    np.save(calib / "x.npy", rng.standard_normal((10, 1, 16, 32)).astype(np.float32))
    lines = []
    r = build(src, tmp_path / "b", target="x86_64-cpu", calib=calib, quant={"precision": "fp32"},
              openvino="no", log=lines.append)
    precision = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0][
        "precision"]
    record = precision["fp32_graph"]
    # every graph computed the model; which one ran fastest is the machine's business, but
    # the choice is the fastest one recorded, with the original timed in the same blocks
    timed = {k: v["p50_ms"] for k, v in record["candidates"].items() if "p50_ms" in v}
    assert set(timed) == {"onnxsim", "onnxsim, Pads kept", "unsimplified"}
    assert record["measured"] and record["original_p50_ms"] > 0
    fastest = min(timed, key=timed.get)
    assert record["chosen"] in (fastest, "onnxsim")
    if record["chosen"] != "onnxsim":
        assert timed["onnxsim"] > timed[record["chosen"]]
    assert record["nodes"]["onnxsim"] < record["nodes"]["unsimplified"]
    assert any(line.startswith("fp32 graph: " + record["chosen"]) for line in lines)
    # the shipped FP32 graph computes what the user's file does
    x = rng.standard_normal((1, 1, 16, 32)).astype(np.float32)
    np.testing.assert_allclose(run(tmp_path / "b" / "model.onnx", x), run(src, x),
                               rtol=1e-5, atol=1e-5)
    # the build ends with its stages and its speed against the original, measured in one run
    speed = precision["vs_original"]
    assert speed["measured"] and speed["bundle_p50_ms"] > 0 and speed["original_p50_ms"] > 0
    assert "vs_eager" not in precision   # an .onnx source has no eager PyTorch to time
    assert lines[-5].startswith("stages: ") and "; total " in lines[-5]
    assert lines[-4].startswith("speed: bundle ") and "against the original's" in lines[-4]
    assert lines[-2].startswith("page: ")   # after the digest: the bundle's page
    assert lines[-1].startswith("shipped: ")   # last: what shipped, with its evidence
    assert {"simplify", "fp32 graph", "search", "timing", "bundle"} <= set(r.stages)
    assert set(precision["stage_seconds"]) <= set(r.stages)


def test_an_original_fixed_at_other_shapes_is_timed_at_the_builds(tmp_path):
    import json

    from packager.build.job import build
    from packager.source.specs import parse_input

    src = pad_net_onnx(tmp_path / "pad.onnx")        # exported at 1x1x16x32, no dynamic axes
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(2).standard_normal((10, 1, 1, 24, 40))
            .astype(np.float32))
    lines = []
    build(src, tmp_path / "b", target="x86_64-cpu", calib=calib, inputs=[parse_input(
        "x:1x1x24x40")], quant={"precision": "fp32"}, openvino="no", log=lines.append)
    precision = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0][
        "precision"]
    assert "build's input shapes" in precision["fp32_graph"]["original"]
    assert precision["fp32_graph"]["original_p50_ms"] > 0
    # timed against the original, unless a busy machine timed the original fastest (shipped)
    vs = precision["vs_original"]
    assert vs["measured"] or vs["why"] == "the bundle ships the original file unchanged"
    assert lines[-4].startswith("speed: bundle " if vs["measured"] else "speed: not compared")
