"""build from PyTorch: CNN, transformer encoder, LSTM with state, a two-part model."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import PREP, run_py
from packager.build.job import build
from packager.device.verify import verify
from packager.errors import CalibrationError, SpecError
from packager.source.specs import parse_input

MODELS = Path(__file__).parent / "torch_models.py"


def test_cnn_factory_to_verified_bundle(image_dir, tmp_path):
    lines = []
    r = build(f"{MODELS}:cnn", tmp_path / "cnn", target="x86_64-cpu", calib=image_dir,
              preprocess=PREP, inputs=[parse_input("image:1x3x32x32")], log=lines.append)
    [part] = r.parts
    assert part.family == "default" and part.config.mode == "static"
    assert part.export["validation"]["max_rel"] < 1e-5
    assert part.export["validation"]["calibration"] == 8  # validated on real images too
    assert part.accuracy["cosine_min"] > 0.98
    manifest = json.loads((tmp_path / "cnn" / "manifest.json").read_text())
    source = manifest["parts"][0]["source"]
    assert source["model"].endswith("torch_models.py:cnn()")
    assert source["files"]["torch_models.py"] and source["export"]["opset"] == 20
    # what the user had is the baseline too: the module in eager PyTorch, timed in the same run
    eager = manifest["parts"][0]["precision"]["vs_eager"]
    assert eager["measured"] and eager["eager_p50_ms"] > 0 and eager["bundle_p50_ms"] > 0
    ratio = eager["eager_p50_ms"] / eager["bundle_p50_ms"]
    if eager.get("noisy"):   # noisy twice (a busy machine): a range, never one figure
        low, high = eager["speedup_range"]
        assert eager["speedup"] is None and low <= ratio <= high
    else:
        assert eager["speedup"] == pytest.approx(ratio, rel=0.01)
    # eager at the session's threads and at 1 thread: the faster is the baseline
    tried = eager["eager_p50_ms_by_threads"]
    assert eager["eager_p50_ms"] == min(tried.values()) and "1" in tried
    # at the threads the bundle's session runs with here (its setting 0: one per core)
    assert eager["threads"] >= 1 and eager["intra_op_threads"] == 0
    [said] = [line for line in lines if line.startswith("speed: against eager PyTorch")]
    assert f"{eager['threads']} threads" in said and lines[-3].startswith("bundle: ")
    assert verify(tmp_path / "cnn", runs=5)["passed"]


def test_the_eager_line_says_plainly_when_onnx_runtime_does_not_beat_eager_pytorch():
    from packager.source.eager_timing import eager_line

    record = {"measured": True, "bundle_p50_ms": 2.0, "eager_p50_ms": 1.2, "speedup": 0.6,
              "bundle_p10_p90_ms": [1.9, 2.2], "threads": 2}
    text = eager_line(record)
    assert "0.60x its speed" in text
    assert ("ONNX Runtime does not beat eager PyTorch here: bundle 2.000 ms vs eager 1.200 ms "
            "p50 at 2 threads, slower than the PyTorch you started from") in text
    # eager's p50 inside the bundle's p10-p90: the speed line's rule for "the same speed"
    noise = eager_line({**record, "eager_p50_ms": 2.1, "speedup": 1.05})
    assert "does not beat eager PyTorch here: bundle 2.000 ms vs eager 2.100 ms" in noise
    assert "the same speed within timing noise" in noise
    faster = eager_line({**record, "eager_p50_ms": 4.0, "speedup": 2.0})
    assert "2.00x its speed" in faster and "does not beat" not in faster
    assert "not compared" in eager_line({"measured": False, "why": "a GPU target"})
    # noisy twice (the first-week's 796 ms at load 5-7 printed as "1,450x"): a range, no figure
    noisy = eager_line({**record, "eager_p50_ms": 796.0, "speedup": None, "noisy": "p90 is 3x p10",
                        "speedup_range": [3.5, 1450.0], "eager_p50_ms_by_threads": {
                            "2": 796.0, "1": 900.0}})
    assert "between 3.50x and 1450.00x its speed; NOISY twice (p90 is 3x p10)" in noisy
    assert "the faster of 2 and 1 threads" in noisy


def test_eager_pytorch_gets_the_values_const_froze_and_keeps_its_threads(tmp_path):
    """The bundle lost a --const input; eager forward() still takes it. A forward() that fails
    on the bundle's inputs costs the comparison, not the build."""
    import onnx
    import torch
    from onnx import TensorProto, helper

    from packager.source.eager_timing import against_eager

    class Scale(torch.nn.Module):
        def forward(self, x, k):
            return x * k

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor("k", TensorProto.FLOAT, [], [2.0])])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    loaded, target = type("L", (), {"module": Scale()}), type("T", (), {"session": {
        "intra_op_threads": 1}})
    feed = {"x": np.ones((1, 8), np.float32)}
    before = torch.get_num_threads()
    record = against_eager(path, loaded, None, feed, target, "",
                           forward=(["x", "k"], {"k": np.array(2.0, np.float32)}))
    assert record["measured"] and record["threads"] == 1 and record["eager_p50_ms"] > 0
    assert torch.get_num_threads() == before
    short = against_eager(path, loaded, None, feed, target, "", forward=(["x"], {}))
    assert not short["measured"] and "forward() failed" in short["why"]
    assert torch.get_num_threads() == before
    lost = against_eager(path, loaded, None, feed, target, "", forward=(["x", "k"], {}))
    assert not lost["measured"] and "'k'" in lost["why"]


def test_transformer_ships_dynamic_int8_not_static(encoder_files, tmp_path):
    weights, tokens = encoder_files
    specs = [parse_input("input_ids:1x32:int64"), parse_input("attention_mask:1x32:int64")]
    common = dict(target="x86_64-cpu", calib=tokens, inputs=specs)
    from packager.build.job import ExportOptions

    opts = ExportOptions(weights=weights)
    r = build(f"{MODELS}:encoder", tmp_path / "enc", export_options=opts, **common)
    [part] = r.parts
    assert part.family == "transformer" and part.config.mode == "dynamic"
    assert part.export["validation"]["max_rel"] < 1e-4
    assert part.accuracy["cosine_min"] >= 0.98   # the target's budget
    check = run_py(tmp_path / "enc", "check", "--json")
    assert check.returncode == 0, check.stderr
    decision = json.loads((tmp_path / "enc" / "manifest.json").read_text())["parts"][0][
        "precision"]["decision"]
    assert decision["candidates"][1]["precision"].startswith("INT8 dynamic")


def test_lstm_with_state_bundle(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "steps.npz", x=rng.standard_normal((30, 10, 20)).astype(np.float32),
             h0=0.5 * rng.standard_normal((30, 1, 32)).astype(np.float32),
             c0=0.5 * rng.standard_normal((30, 1, 32)).astype(np.float32))
    specs = [parse_input(v) for v in ("x:1x10x20", "h0:1x1x32", "c0:1x1x32")]
    r = build(f"{MODELS}:lstm", tmp_path / "lstm", target="x86_64-cpu",
              calib=tmp_path / "steps.npz", inputs=specs)
    [part] = r.parts
    assert part.export["validation"]["max_rel"] < 1e-5 and part.accuracy["cosine_min"] > 0.98
    manifest = json.loads((tmp_path / "lstm" / "manifest.json").read_text())
    assert [i["name"] for i in manifest["parts"][0]["inputs"]] == ["x", "h0", "c0"]
    assert len(manifest["parts"][0]["outputs"]) == 3
    check = run_py(tmp_path / "lstm", "check")
    assert check.returncode == 0, check.stdout + check.stderr


def test_two_part_bundle(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "enc.npz", ids=rng.integers(0, 64, (30, 1, 16)).astype(np.int64))
    out = tmp_path / "tts"
    r = build(f"{MODELS}:two_part", out, target="x86_64-cpu",
              parts={"encoder": "enc", "decoder": "dec"},
              inputs=[parse_input("encoder/ids:1x16:int64"),
                      parse_input("decoder/features:1x32x16")],
              part_calib={"encoder": tmp_path / "enc.npz"},
              part_quant={"encoder": {"precision": "int8"}, "decoder": {"precision": "fp32"}})
    enc, dec = r.parts
    assert enc.config.precision == "int8" and dec.config.precision == "fp32"
    assert dec.accuracy["data"] == "random" and enc.accuracy["data"] == "calibration"
    manifest = json.loads((out / "manifest.json").read_text())
    assert [p["name"] for p in manifest["parts"]] == ["encoder", "decoder"]
    assert {"encoder.onnx", "decoder.onnx", "golden/decoder.outputs.npz"} <= set(manifest["files"])
    assert manifest["parts"][1]["outputs"][0]["shape"] == [1, 16, 16]

    check = run_py(out, "check", "--json")
    assert check.returncode == 0, check.stderr
    assert set(json.loads(check.stdout)["parts"]) == {"encoder", "decoder"}
    bench = json.loads(run_py(out, "bench", "--runs", "5", "--json").stdout)
    assert set(bench["parts"]) == {"encoder", "decoder"}
    one = json.loads(run_py(out, "bench", "--part", "decoder", "--runs", "5", "--json").stdout)
    assert list(one["parts"]) == ["decoder"]
    np.save(tmp_path / "ids.npy", np.arange(16, dtype=np.int64)[None])
    assert run_py(out, "infer", str(tmp_path / "ids.npy")).returncode == 2  # which part?
    infer = run_py(out, "infer", "--part", "encoder", str(tmp_path / "ids.npy"), "--json")
    assert infer.returncode == 0, infer.stderr
    assert json.loads(infer.stdout)["results"][0]["outputs"]["output"]["shape"] == [1, 16, 32]
    assert run_py(out, "check", "--part", "vocoder").returncode == 2
    report = verify(out, runs=5)
    assert report["passed"], report["checks"]
    assert {"accuracy:encoder/output", "accuracy:decoder/output", "latency:decoder"} <= \
        {c["name"] for c in report["checks"]}


@pytest.mark.parametrize("kwargs, error, match", [
    ({"inputs": [parse_input("ids:1x16:int64")]}, SpecError, "which part is it for"),
    ({"part_calib": {"vocoder": Path("x.npz")}}, SpecError, "part 'vocoder' is not declared"),
    ({"calib": Path("x.npz")}, SpecError, "ambiguous with several parts"),
    ({"inputs": [parse_input("encoder/ids:1x16:int64"),
                 parse_input("decoder/features:1x32x16")],
      "part_quant": {"encoder": {"precision": "int8"}}},
     CalibrationError, "part encoder: static INT8 needs calibration data"),
])
def test_part_mistakes(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        build(f"{MODELS}:two_part", tmp_path / "out", target="x86_64-cpu",
              parts={"encoder": "enc", "decoder": "dec"}, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_cli_build_two_parts_from_pytorch(tmp_path):
    from click.testing import CliRunner

    from packager.cli import main

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "enc.npz", ids=rng.integers(0, 64, (20, 1, 16)).astype(np.int64))
    np.savez(tmp_path / "dec.npz", features=rng.standard_normal((20, 1, 32, 16)).astype(np.float32))
    out = tmp_path / "tts"
    r = CliRunner().invoke(main, [
        "build", f"{MODELS}:two_part", "--part", "encoder=enc", "--part", "decoder=dec",
        "--input", "encoder/ids:1x16:int64", "--input", "decoder/features:1x32x16",
        "--calib", f"encoder={tmp_path / 'enc.npz'}", "--calib", f"decoder={tmp_path / 'dec.npz'}",
        "--part-precision", "encoder=fp32", "--part-precision", "decoder=int8",
        "--min-cosine", "0.9", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    parts = {p["name"]: p for p in json.loads(r.stdout)["parts"]}
    assert parts["encoder"]["precision"] == "FP32"
    # (onnxruntime's or NNCF's graph, whichever the CPU provider ran faster)
    assert parts["decoder"]["precision"].startswith("INT8 static QDQ")
    assert parts["decoder"]["calibration_samples"] == 16
    assert parts["decoder"]["export"]["validation"]["calibration"] == 8
    bad = CliRunner().invoke(main, ["build", f"{MODELS}:two_part", "--part", "encoder=enc",
                                    "--input", "encoder/ids:1x16:int64", "--dynamic", "ids:1=t",
                                    "-o", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "No such option '--dynamic'" in bad.stderr


def test_models_above_the_protobuf_limit_keep_external_data(tmp_path, monkeypatch, image_dir):
    """The >2 GiB path, with the limit lowered: one .onnx.data file beside the model, carried
    into the bundle, hashed, and loaded by the runner."""
    import packager.graph.modelio as modelio
    from packager.source.export import export

    monkeypatch.setattr(modelio, "PROTOBUF_LIMIT", 10_000)
    r = export(f"{MODELS}:cnn", tmp_path / "big.onnx", inputs=[parse_input("image:1x3x32x32")])
    assert (tmp_path / "big.onnx.data").stat().st_size > 10_000
    assert r.path.stat().st_size < 10_000
    build(tmp_path / "big.onnx", tmp_path / "b", target="x86_64-cpu", calib=image_dir,
          preprocess=PREP)   # static INT8: the quantizer writes external data too
    files = json.loads((tmp_path / "b" / "manifest.json").read_text())["files"]
    assert "model.onnx.data" in files
    check = run_py(tmp_path / "b", "check")
    assert check.returncode == 0, check.stdout + check.stderr
