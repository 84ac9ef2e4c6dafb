"""Target profiles: the built-in ones, their presets, provider fallback and TensorRT caches."""

import importlib.util
import json
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import PREP, run_py, save
from packager.errors import BundleError
from packager.export import default_opset
from packager.pipeline import build
from packager.specs import parse_input
from packager.targets import list_targets, load_target

RUNNER = Path(__file__).resolve().parent.parent / "runtimes" / "ort_runner.py"
MODELS = Path(__file__).parent / "torch_models.py"
GPU_PROVIDERS = {"TensorrtExecutionProvider", "CUDAExecutionProvider"}


def runner():
    spec = importlib.util.spec_from_file_location("ort_runner", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_builtin_targets_and_their_choices():
    targets = {t.name: t for t in list_targets()}
    assert set(targets) == {"x86_64-cpu", "rpi", "jetson-orin", "jetson-xavier"}
    x86, rpi, orin, xavier = (targets[n] for n in ("x86_64-cpu", "rpi", "jetson-orin",
                                                   "jetson-xavier"))
    assert (x86.quantization.activation_type, x86.quantization.weight_type) == ("uint8", "int8")
    assert (rpi.quantization.activation_type, rpi.quantization.weight_type) == ("int8", "int8")
    assert orin.quantization.symmetric_activations and not orin.quantization.quantize_bias
    assert [p.name for p in orin.providers] == ["TensorrtExecutionProvider",
                                                "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert xavier.quantization.precision == "fp32"   # TensorRT builds it in FP16
    assert xavier.providers[0].options["trt_fp16_enable"] is True
    assert orin.preset_for("transformer").precision == "fp32"
    assert rpi.preset_for("transformer").mode == "dynamic"
    assert (rpi.arch, rpi.python, orin.python, xavier.python) == ("aarch64", "3.11", "3.10", "3.8")
    # the oldest runtime each names decides the opset the exporter writes
    assert [default_opset(t) for t in (x86, rpi, orin, xavier)] == [20, 20, 20, 19]
    assert "Jetson" in orin.install and "Jetson" in xavier.install


@pytest.fixture(scope="module")
def orin_bundle(tmp_path_factory, image_dir):
    out = tmp_path_factory.mktemp("targets") / "orin"
    build(f"{MODELS}:cnn", out, target="jetson-orin", calib=image_dir, preprocess=PREP,
          inputs=[parse_input("image:1x3x32x32")])
    return out


def test_tensorrt_preset_writes_symmetric_s8_qdq_with_float_bias(orin_bundle):
    model = onnx.load(str(orin_bundle / "model.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    quant = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert quant
    for node in quant:   # activations: int8 zero points, all zero
        zp = onnx.numpy_helper.to_array(inits[node.input[2]])
        assert zp.dtype.name == "int8" and not zp.any()
    assert not [i for i in model.graph.initializer if i.data_type == TensorProto.INT32]
    manifest = json.loads((orin_bundle / "manifest.json").read_text())
    assert "symmetric, float bias" in manifest["parts"][0]["precision"]["description"]
    assert manifest["target"]["runtime_package"] == "onnxruntime-gpu"


def test_gpu_providers_fall_back_to_cpu_loudly(orin_bundle):
    if GPU_PROVIDERS & set(ort.get_available_providers()):
        pytest.skip("this onnxruntime has GPU providers; the fallback is not exercised")
    check = run_py(orin_bundle, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert ("model running on CPUExecutionProvider (requested but not running here: "
            "TensorrtExecutionProvider, CUDAExecutionProvider)") in check.stderr
    strict = run_py(orin_bundle, "check", "--require-provider", "TensorrtExecutionProvider")
    assert strict.returncode == 1
    assert "required provider TensorrtExecutionProvider is not running" in strict.stderr


def test_tensorrt_options_resolve_to_a_keyed_cache(orin_bundle, tmp_path):
    r = runner()
    manifest = json.loads((orin_bundle / "manifest.json").read_text())
    part = manifest["parts"][0]
    bundle = str(tmp_path)   # a scratch copy's folder: the cache is created inside it
    names, options, notes = r.provider_list(
        ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
        bundle, manifest, part)
    assert names == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    trt = options[0]
    cache = Path(trt["trt_engine_cache_path"])
    assert cache.parent == tmp_path / "cache" / "trt" and cache.name.startswith("model-")
    assert trt["trt_timing_cache_path"] == str(cache) and trt["trt_int8_enable"] is True
    key = json.loads((cache / "key.json").read_text())
    assert key["model_sha256"] == part["model"]["sha256"] and key["inputs"] == part["inputs"]
    assert options[1] == {"device_id": 0, "cudnn_conv_algo_search": "HEURISTIC"}
    assert notes and "building the TensorRT engine for model" in notes[0]
    (cache / "TensorrtExecutionProvider_TRTKernel_graph_main_0_0_sm87.engine").write_bytes(b"x")
    assert r.provider_list(["TensorrtExecutionProvider"], bundle, manifest, part)[2] == []
    # CPU-only device: no cache folder, no note
    assert r.provider_list(["CPUExecutionProvider"], bundle, manifest, part)[1:] == ([{}], [])


def test_cache_key_changes_with_model_shape_tensorrt_and_gpu(orin_bundle):
    r = runner()
    part = json.loads((orin_bundle / "manifest.json").read_text())["parts"][0]
    base = r.trt_cache_key(part, "10.3.0", "NVIDIA Jetson AGX Orin")
    other_shape = {**part, "inputs": [{**part["inputs"][0], "shape": [1, 3, 64, 64]}]}
    other_model = {**part, "model": {**part["model"], "sha256": "0" * 64}}
    keys = {base, r.trt_cache_key(part, "8.6.2", "NVIDIA Jetson AGX Orin"),
            r.trt_cache_key(part, "10.3.0", "NVIDIA Jetson Orin Nano"),
            r.trt_cache_key(other_shape, "10.3.0", "NVIDIA Jetson AGX Orin"),
            r.trt_cache_key(other_model, "10.3.0", "NVIDIA Jetson AGX Orin")}
    assert len(keys) == 5 and base == r.trt_cache_key(part, "10.3.0", "NVIDIA Jetson AGX Orin")


@pytest.mark.skipif("TensorrtExecutionProvider" not in ort.get_available_providers(),
                    reason="no TensorRT here: needs onnxruntime-gpu with TensorRT and an "
                           "NVIDIA GPU (a Jetson, or a machine lent by the device tool)")
def test_tensorrt_runs_and_caches_its_engine(orin_bundle):
    first = run_py(orin_bundle, "check", "--require-provider", "TensorrtExecutionProvider")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "building the TensorRT engine" in first.stderr
    assert list((orin_bundle / "cache" / "trt").glob("*/*.engine"))
    second = run_py(orin_bundle, "check", "--require-provider", "TensorrtExecutionProvider")
    assert second.returncode == 0 and "building the TensorRT engine" not in second.stderr


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                    reason="no CUDA here: needs onnxruntime-gpu and an NVIDIA GPU")
def test_cuda_provider_runs(orin_bundle):
    r = run_py(orin_bundle, "bench", "--runs", "20", "--require-provider",
               "CUDAExecutionProvider", "--json")
    assert r.returncode == 0, r.stderr


def test_session_options_from_the_command_line(built):
    r = run_py(built.bundle.directory, "bench", "--runs", "3", "--threads", "1",
               "--opt-level", "basic", "--execution-mode", "parallel", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["session"] == {"intra_op_threads": 1, "graph_optimization_level": "basic",
                                 "execution_mode": "parallel"}
    device = report["device"]
    assert device["arch"] and device["cores"] >= 1 and device["cpu"]
    assert device["available_providers"] and "nvpmodel" not in device   # not a Jetson


def test_op_outside_the_runtime_stops_the_build(tmp_path):
    node = helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [1, 4])],
                              [helper.make_tensor_value_info("y", 1, [1, 4])])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                         helper.make_opsetid("com.example", 1)]),
                 tmp_path / "custom.onnx")
    from packager.compat import fit_to_runtime

    with pytest.raises(BundleError, match="com.example.FancyOp, an operator onnxruntime 1.19 "
                                          "does not implement"):
        fit_to_runtime(onnx.load(str(model)), load_target("rpi").min_onnxruntime)
