import hashlib
import json

import onnx
import pytest

from conftest import PREP
from packager.errors import BundleError, CalibrationError, PreprocessError, TargetError
from packager.pipeline import build


def test_manifest_contract(built):
    d = built.bundle.directory
    m = json.loads((d / "manifest.json").read_text())
    assert m["schema_version"] == 2 and m["target"]["name"] == "x86_64-cpu"
    for rel, digest in m["files"].items():
        assert hashlib.sha256((d / rel).read_bytes()).hexdigest() == digest
    assert set(m["files"]) == {"model.onnx", "run.py", "requirements.txt", "README.md",
                               "golden/model.inputs.npz", "golden/model.outputs.npz"}
    [part] = m["parts"]
    assert part["name"] == "model" and part["model"]["sha256"] == m["files"]["model.onnx"]
    assert part["inputs"] == [{"name": "image", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert part["outputs"] == [{"name": "scores", "shape": [1, 10], "dtype": "float32"}]
    assert part["preprocess"] == PREP and part["labels"][0] == "class0"
    assert part["precision"]["activation_type"] == "uint8" and part["precision"]["format"] == "qdq"
    assert part["precision"]["calibration_samples"] == 16 and part["precision"]["family"] == "default"
    assert part["accuracy"]["samples"] == 4 and part["accuracy"]["cosine_min"] > 0.98
    assert part["golden"]["samples"] == 4 and part["source"]["file"] == "cnn.onnx"
    assert m["providers"] == [{"name": "CPUExecutionProvider", "options": {}}]
    assert {"edgepack", "onnx", "onnxruntime", "onnxsim", "numpy"} <= set(m["tools"])
    assert m["target"]["min_onnxruntime"] == "1.17"
    model = onnx.load(str(d / "model.onnx"))
    assert model.ir_version <= 9  # loadable by onnxruntime 1.17
    assert "onnxruntime>=1.17" in (d / "requirements.txt").read_text()
    assert "python3 run.py check" in (d / "README.md").read_text()


def test_existing_output_needs_force(built, cnn_onnx, image_dir):
    with pytest.raises(BundleError, match="already exists.*--force"):
        build(cnn_onnx, built.bundle.directory, target="x86_64-cpu", calib=image_dir,
              preprocess=PREP)


def test_force_replaces(cnn_onnx, image_dir, tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    build(cnn_onnx, out, target="x86_64-cpu", calib=image_dir, preprocess=PREP, force=True,
          quant={"precision": "fp32"})
    assert not (out / "stale.txt").exists() and (out / "manifest.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "b.tar.gz"]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"target": "jetson-nano-9000"}, TargetError, "unknown target"),
    ({"preprocess": {**PREP, "size": [64, 64]}}, PreprocessError, "use size=32x32"),
    ({"calib": None, "quant": {"precision": "int8"}}, CalibrationError,
     "needs calibration data"),
    ({"calib": None}, CalibrationError, "no calibration or evaluation samples"),
])
def test_bad_input_leaves_nothing(cnn_onnx, image_dir, tmp_path, kwargs, error, match):
    args = {"target": "x86_64-cpu", "calib": image_dir, "preprocess": PREP, **kwargs}
    with pytest.raises(error, match=match):
        build(cnn_onnx, tmp_path / "out", **args)
    assert list(tmp_path.iterdir()) == []


def test_bad_target_profile_names_file_and_key(tmp_path):
    from packager.targets import load_target

    bad = tmp_path / "mine.toml"
    bad.write_text('name = "mine"\narch = "aarch64"\n[runtime]\npackage = "onnxruntime"\n'
                   'min_version = "1.19"\n[[providers]]\nname = "TensorRT"\n')
    with pytest.raises(TargetError, match=r"mine.toml: providers\[0\]: unknown provider 'TensorRT'"):
        load_target(bad)
