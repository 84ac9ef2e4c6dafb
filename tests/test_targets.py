"""Target profiles: the built-in ones, their presets, provider fallback and TensorRT caches."""

import json
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import PREP, run_py, save
from packager.build.job import build
from packager.errors import BundleError
from packager.source.export import default_opset
from packager.source.specs import parse_input
from packager.targets import list_targets, load_target

MODELS = Path(__file__).parent / "torch_models.py"
GPU_PROVIDERS = {"TensorrtExecutionProvider", "CUDAExecutionProvider"}


def runner():
    """The runner's sessions module: provider plans."""
    from packager._runtimes.runner import sessions

    return sessions


def tensorrt():
    """The runner's tensorrt module: TensorRT cache keys (shipped with a GPU provider)."""
    from packager._runtimes.runner import tensorrt

    return tensorrt


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
        pytest.skip("this onnxruntime has GPU providers; tests/test_gpu_runtime.py covers them")
    check = run_py(orin_bundle, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert ("model running on CPUExecutionProvider (model.onnx, INT8); requested but not running "
            "here: TensorrtExecutionProvider (not in this onnxruntime build); "
            "CUDAExecutionProvider (not in this onnxruntime build)") in check.stderr
    strict = run_py(orin_bundle, "check", "--require-provider", "TensorrtExecutionProvider")
    assert strict.returncode == 1
    assert "required provider TensorrtExecutionProvider is not running" in strict.stderr
    assert not (orin_bundle / "cache").exists()   # no TensorRT ran: no engine cache, no key


def test_tensorrt_options_resolve_to_a_keyed_cache(orin_bundle, tmp_path):
    r = runner()
    manifest = json.loads((orin_bundle / "manifest.json").read_text())
    part = manifest["parts"][0]
    bundle = str(tmp_path)   # a scratch folder: nothing is created by planning
    plan = r.provider_plan(bundle, manifest, part)
    assert [p["name"] for p in plan] == ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                         "CPUExecutionProvider"]
    trt = plan[0]["options"]
    cache = Path(trt["trt_engine_cache_path"])
    assert cache.parent == tmp_path / "cache" / "trt" and cache.name.startswith("model-")
    assert trt["trt_timing_cache_path"] == str(cache) and trt["trt_int8_enable"] is True
    assert not cache.exists()
    assert plan[1]["options"] == {"device_id": 0, "cudnn_conv_algo_search": "HEURISTIC"}
    # each provider's graph: TensorRT and the CPU the INT8 one, CUDA its FP16 graph
    assert [p["graph"]["file"] for p in plan] == ["model.onnx", "model.fp16.onnx", "model.onnx"]
    assert [p["graph"]["precision"] for p in plan] == ["int8", "fp16", "int8"]
    cache.mkdir(parents=True)
    tensorrt().write_cache_key(str(cache), part, plan[0]["graph"])
    key = json.loads((cache / "key.json").read_text())
    assert key["model_sha256"] == part["model"]["sha256"] and key["inputs"] == part["inputs"]


def test_cache_key_changes_with_model_shape_tensorrt_and_gpu(orin_bundle):
    r = tensorrt()
    part = json.loads((orin_bundle / "manifest.json").read_text())["parts"][0]
    base = r.trt_cache_key(part, "10.3.0", "NVIDIA Jetson AGX Orin")
    other_shape = {**part, "inputs": [{**part["inputs"][0], "shape": [1, 3, 64, 64]}]}
    other_model = {**part, "model": {**part["model"], "sha256": "0" * 64}}
    keys = {base, r.trt_cache_key(part, "8.6.2", "NVIDIA Jetson AGX Orin"),
            r.trt_cache_key(part, "10.3.0", "NVIDIA Jetson Orin Nano"),
            r.trt_cache_key(other_shape, "10.3.0", "NVIDIA Jetson AGX Orin"),
            r.trt_cache_key(other_model, "10.3.0", "NVIDIA Jetson AGX Orin")}
    assert len(keys) == 5 and base == r.trt_cache_key(part, "10.3.0", "NVIDIA Jetson AGX Orin")


def provider_runs(name: str) -> bool:
    """Whether a session on *name* really starts here. get_available_providers() lists TensorRT
    and CUDA in every onnxruntime-gpu build, whether or not their libraries load."""
    if name not in ort.get_available_providers():
        return False
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                                                [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ort.set_default_logger_severity(4)   # a provider that fails to load logs errors: expected
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=[name],
                                       enable_fallback=0)
        return session.get_providers()[0] == name
    except Exception:
        return False
    finally:
        ort.set_default_logger_severity(2)


TENSORRT_RUNS = provider_runs("TensorrtExecutionProvider")
CUDA_RUNS = provider_runs("CUDAExecutionProvider")


@pytest.mark.skipif(not TENSORRT_RUNS,
                    reason="no TensorRT session starts here: needs onnxruntime-gpu with "
                           "TensorRT libraries and an NVIDIA GPU (a Jetson)")
def test_tensorrt_runs_and_caches_its_engine(orin_bundle):
    first = run_py(orin_bundle, "check", "--require-provider", "TensorrtExecutionProvider")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "building the TensorRT engine" in first.stderr
    assert list((orin_bundle / "cache" / "trt").glob("*/*.engine"))
    assert list((orin_bundle / "cache" / "trt").glob("*/key.json"))
    second = run_py(orin_bundle, "check", "--require-provider", "TensorrtExecutionProvider")
    assert second.returncode == 0 and "building the TensorRT engine" not in second.stderr


@pytest.mark.skipif(not CUDA_RUNS or TENSORRT_RUNS,
                    reason="needs a CUDA session that starts (onnxruntime-gpu, its CUDA and cuDNN "
                           "libraries, an NVIDIA GPU) where TensorRT does not")
def test_cuda_runs_its_own_graph_with_the_targets_options(orin_bundle):
    r = run_py(orin_bundle, "bench", "--runs", "20", "--require-provider",
               "CUDAExecutionProvider", "--json")
    assert r.returncode == 0, r.stderr
    part = json.loads(r.stdout)["parts"]["model"]
    assert (part["graph"], part["precision"]) == ("model.fp16.onnx", "fp16")
    # the options survive the fallback from TensorRT (onnxruntime's own retry drops them)
    assert part["provider_options"]["cudnn_conv_algo_search"] == "HEURISTIC"
    assert "TensorrtExecutionProvider" in part["not_running"]
    check = run_py(orin_bundle, "check", "--json")
    assert check.returncode == 0, check.stderr
    report = json.loads(check.stdout)["parts"]["model"]
    assert report["graph"] == "model.fp16.onnx"
    assert not report["outputs"]["output"]["reproduce"]["checked"]   # other kernels by design


def test_session_options_from_the_command_line(built):
    r = run_py(built.bundle.directory, "bench", "--runs", "3", "--threads", "1",
               "--opt-level", "basic", "--execution-mode", "parallel", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["session"] == {"intra_op_threads": 1, "graph_optimization_level": "basic",
                                 "execution_mode": "parallel", "inter_op_threads": 0}
    assert report["session_from"] == "the command line"
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
    from packager.graph.compat import fit_to_runtime

    with pytest.raises(BundleError, match="com.example.FancyOp, an operator onnxruntime 1.19 "
                                          "does not implement"):
        fit_to_runtime(onnx.load(str(model)), load_target("rpi").min_onnxruntime)


def test_the_runner_runs_the_graph_of_the_provider_that_starts(tmp_path, image_dir):
    """A profile whose CPU provider wants FP16 instead of INT8: the bundle carries both graphs,
    the runner picks the FP16 one and checks it against its own floor."""
    profile = (Path(__file__).parent.parent / "targets" / "x86_64-cpu.toml").read_text()
    profile = profile.replace('name = "x86_64-cpu"', 'name = "cpu-float"').replace(
        'name = "CPUExecutionProvider"\n', 'name = "CPUExecutionProvider"\ninstead_of_int8 = "fp16"\n')
    (tmp_path / "cpu-float.toml").write_text(profile)
    out = tmp_path / "bundle"
    build(f"{MODELS}:cnn", out, target=str(tmp_path / "cpu-float.toml"), calib=image_dir,
          preprocess=PREP, inputs=[parse_input("image:1x3x32x32")], quant={"precision": "int8"})
    part = json.loads((out / "manifest.json").read_text())["parts"][0]
    assert part["precision"]["precision"] == "int8"
    assert [(g["file"], g["providers"]) for g in part["graphs"]] == [
        ("model.fp16.onnx", ["CPUExecutionProvider"])]
    onnx.checker.check_model(onnx.load(str(out / "model.fp16.onnx")))   # topologically sorted
    r = run_py(out, "check", "--json")
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout)["parts"]["model"]
    assert (entry["graph"], entry["precision"]) == ("model.fp16.onnx", "fp16")
    assert entry["min_cosine"] == part["graphs"][0]["min_cosine"] >= 0.98
    assert "model.fp16.onnx, FP16" in r.stderr
    assert "the host's outputs are of model.onnx" in \
        entry["outputs"]["output"]["reproduce"]["reason"]
    (out / "model.fp16.onnx").write_bytes(b"tampered")   # the extra graph is hashed too
    assert run_py(out, "check").returncode == 1


def test_fp16_builds_a_valid_graph_that_runs(tmp_path, image_dir):
    out = tmp_path / "fp16"
    build(f"{MODELS}:cnn", out, target="jetson-xavier", calib=image_dir, preprocess=PREP,
          inputs=[parse_input("image:1x3x32x32")], quant={"precision": "fp16"})
    model = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(model)
    assert any(i.data_type == TensorProto.FLOAT16 for i in model.graph.initializer)
    r = run_py(out, "check")
    assert r.returncode == 0, r.stdout + r.stderr
