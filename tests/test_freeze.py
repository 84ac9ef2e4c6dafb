"""Models onnxruntime runs are not refused: frozen inputs (--const), If nodes that fold away,
shapes that only a real run can tell, int64 scalar inputs."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import save
from packager.build.job import build
from packager.errors import SpecError
from packager.graph.freeze import exact_array, freeze_inputs
from packager.graph.shapes import dynamic_tensors, fix_shapes_proto, shapes_from_run


def vad_like(path: Path) -> Path:
    """Like silero VAD: audio [1, 64] float, sr int64 scalar, state [2, 1, 8] float.

    If sr == 16000 the audio goes through one MatMul ([1, 8]), else through another and a
    Reshape ([2, 8]): the branches disagree, so shape inference cannot tell the If's output
    shape; only a run can. Outputs: prob and the new state (state + features).
    """
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(64, 8)).astype(np.float32), "w16"),
             numpy_helper.from_array(rng.normal(size=(64, 16)).astype(np.float32), "w8"),
             numpy_helper.from_array(rng.normal(size=(8, 1)).astype(np.float32), "head"),
             numpy_helper.from_array(np.array([2, 8], np.int64), "two_by_eight"),
             numpy_helper.from_array(np.array(16000, np.int64), "sixteen_k")]
    out_info = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None, None])
                for o in ("f16", "f8")]
    branches = [helper.make_graph([helper.make_node("MatMul", ["audio", "w16"], ["f16"],
                                                    name="mm_w16")], "b16", [], [out_info[0]]),
                helper.make_graph([helper.make_node("MatMul", ["audio", "w8"], ["f8wide"],
                                                    name="mm_w8"),
                                   helper.make_node("Reshape", ["f8wide", "two_by_eight"], ["f8"],
                                                    name="fold8")], "b8", [], [out_info[1]])]
    nodes = [helper.make_node("Equal", ["sr", "sixteen_k"], ["is16k"], name="eq"),
             helper.make_node("If", ["is16k"], ["feat"], name="by_rate", then_branch=branches[0],
                              else_branch=branches[1]),
             helper.make_node("Tanh", ["feat"], ["h"], name="tanh"),
             helper.make_node("Add", ["h", "state"], ["new_state"], name="mix"),
             helper.make_node("MatMul", ["h", "head"], ["logit"], name="head_mm"),
             helper.make_node("Sigmoid", ["logit"], ["prob"], name="sig")]
    graph = helper.make_graph(
        nodes, "vad",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 64]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, []),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, 8])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [None, None]),
         helper.make_tensor_value_info("new_state", TensorProto.FLOAT, [None, None, None])],
        inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture(scope="module")
def vad(tmp_path_factory):
    root = tmp_path_factory.mktemp("vad")
    rng = np.random.default_rng(3)
    np.savez(root / "audio.npz", audio=rng.normal(size=(40, 1, 64)).astype(np.float32),
             sr=np.full(40, 16000, np.int64),   # a 1-D array: one int64 scalar per sample
             state=0.1 * rng.normal(size=(40, 2, 1, 8)).astype(np.float32))
    return vad_like(root / "vad.onnx"), root / "audio.npz"


def test_output_shapes_only_a_run_can_tell_are_not_refused(vad):
    model, _ = vad
    fixed = fix_shapes_proto(onnx.load(str(model)), {}, strict=False)
    assert {"prob", "feat"} <= {name for name, _, _ in dynamic_tensors(fixed)}
    feed = {"audio": np.ones((1, 64), np.float32), "sr": np.array(16000, np.int64),
            "state": np.zeros((2, 1, 8), np.float32)}
    resolved, varying = shapes_from_run(fixed, [feed])
    assert not dynamic_tensors(resolved) and not varying
    outputs = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim]
               for o in resolved.graph.output}
    assert outputs == {"prob": [1, 1], "new_state": [2, 1, 8]}


def test_int64_scalar_input_and_if_nodes_build(vad, tmp_path):
    model, data = vad
    r = build(model, tmp_path / "b", target="x86_64-cpu", calib=data)
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    names = [i["name"] for i in manifest["parts"][0]["inputs"]]
    # sr is 16000 in every calibration sample and decides the If: frozen (test_export_args.py)
    assert names == ["audio", "state"]
    assert manifest["parts"][0]["source"]["consts"] == {"sr": 16000}
    assert r.parts[0].accuracy["cosine_min"] >= 0.98


def test_const_freezes_an_input_and_folds_the_if(vad, tmp_path):
    model, data = vad
    r = subprocess.run([sys.executable, "-m", "packager", "build", str(model), "--calib",
                        str(data), "--const", "sr=16000", "-o", str(tmp_path / "b"), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "const: sr=16000 frozen into the graph" in r.stderr
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    part = manifest["parts"][0]
    assert [i["name"] for i in part["inputs"]] == ["audio", "state"]
    assert part["source"]["consts"] == {"sr": 16000}
    shipped = onnx.load(str(tmp_path / "b" / "model.onnx"))
    assert "If" not in {n.op_type for n in shipped.graph.node}
    # the folded graph computes what the original does at sr=16000
    feed = {"audio": np.linspace(-1, 1, 64, dtype=np.float32)[None],
            "state": np.zeros((2, 1, 8), np.float32)}
    original = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    fp32_ref = original.run(["prob"], {**feed, "sr": np.array(16000, np.int64)})[0]
    got = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"),
                               providers=["CPUExecutionProvider"]).run(["prob"], feed)[0]
    assert got.shape == (1, 1) and abs(float(got[0, 0]) - float(fp32_ref[0, 0])) < 0.05


@pytest.mark.parametrize("values, match", [
    ({"rate": 16000}, "the model has no input 'rate'"),
    ({"state": [1, 2, 3]}, "does not fit the input's shape"),
    ({"sr": "fast"}, "not a int64 value"),
])
def test_const_mistakes_are_one_line(vad, values, match):
    model, _ = vad
    with pytest.raises(SpecError, match=match):
        freeze_inputs(onnx.load(str(model)), values)


def test_const_cli_mistakes_leave_nothing(vad, tmp_path):
    model, data = vad
    for arg, message in (("sr=sixteen", "is not a number, list or .npy file"),
                         ("rate=16000", "no input 'rate'")):
        r = subprocess.run([sys.executable, "-m", "packager", "build", str(model), "--calib",
                            str(data), "--const", arg, "-o", str(tmp_path / "b")],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and message in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and not (tmp_path / "b").exists()


@pytest.mark.parametrize("value, dtype, expected", [
    (16000, "int64", 16000), (16000.0, "int64", 16000), (True, "int64", 1),
    (0.1, "float32", np.float32(0.1)),   # rounding to the nearest float is what a float does
    (255, "uint8", 255), (0, "bool", False),
])
def test_e13_e14_const_values_a_dtype_holds_are_kept(value, dtype, expected):
    assert exact_array("c", value, np.dtype(dtype)).tolist() == np.asarray(expected).tolist()


@pytest.mark.parametrize("value, dtype, match", [
    (1e999, "int64", "NaN or infinity"), (16000.5, "int64", "would hold 16000"),
    (2 ** 63, "int64", "fits int64"), (10 ** 26, "int64", "not a int64 value"),
    (300, "uint8", "would hold 44"), (-1, "uint8", "would hold 255"), (2, "bool", "fits bool"),
    (1e300, "float32", "not a finite float32"), (1 + 2j, "float32", "complex values"),
])
def test_e13_e14_e15_e16_const_values_a_dtype_cannot_hold_are_refused(value, dtype, match):
    with pytest.raises(SpecError, match=match):
        exact_array("c", value, np.dtype(dtype))
