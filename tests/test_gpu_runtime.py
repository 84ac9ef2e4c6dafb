"""GPU bundles under onnxruntime-gpu on a machine where its GPU providers cannot start.

onnxruntime-gpu lists TensorRT and CUDA in every build; on a CPU machine (or a Jetson whose
libnvinfer is missing) they fail to load, which is the fallback path a device meets. The wheel
(about 255 MB, pinned by sha256) goes into a venv of its own in ~/.cache/edgepack/gpu-runtime,
never the repository; without PyPI these tests skip, or fail when EDGEPACK_REQUIRE_GPU_WHEEL=1
(CI). Tests that need a GPU are in test_targets.py, skipped unless a CUDA session really runs.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import PREP
from packager.build.job import build
from packager.device.verify import verify
from packager.source.specs import parse_input

pytestmark = pytest.mark.slow
MODELS = Path(__file__).parent / "torch_models.py"
VERSION = "1.31.1"
WHEELS = {"cp311": "e26c475fe361b2015f45b4b824bd13f0bb20204e59b62814e6f0acd5f3d491a6"}
CACHE = Path(os.environ.get("EDGEPACK_GPU_RUNTIME_CACHE")
             or Path.home() / ".cache" / "edgepack" / "gpu-runtime")
TRT, CUDA = "TensorrtExecutionProvider", "CUDAExecutionProvider"


def _unavailable(why: str):
    if os.environ.get("EDGEPACK_REQUIRE_GPU_WHEEL") == "1":
        pytest.fail(f"onnxruntime-gpu unavailable and EDGEPACK_REQUIRE_GPU_WHEEL=1: {why}")
    pytest.skip(f"onnxruntime-gpu unavailable: {why}")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)


@pytest.fixture(scope="session")
def gpu_python() -> str:
    """A Python whose onnxruntime is onnxruntime-gpu (built once, then cached)."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if tag not in WHEELS:
        _unavailable(f"no pinned onnxruntime-gpu {VERSION} wheel for {tag}")
    venv = CACHE / f"onnxruntime-gpu-{VERSION}-{tag}"
    python = venv / "bin" / "python"
    if (venv / ".ready").is_file():
        return str(python)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=venv.parent, prefix=".wheel-") as tmp:
        got = _run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                    f"onnxruntime-gpu=={VERSION}", "-d", tmp])
        wheels = list(Path(tmp).glob("*.whl"))
        if got.returncode or len(wheels) != 1:
            _unavailable((got.stderr.strip().splitlines() or ["no wheel"])[-1])
        digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
        if digest != WHEELS[tag]:
            pytest.fail(f"{wheels[0].name} has sha256 {digest}, pinned {WHEELS[tag]}")
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheels[0])],
                 [str(python), "-m", "pip", "install", "--quiet", "numpy", "flatbuffers",
                  "packaging", "protobuf"]]
        for step in steps:
            done = _run(step)
            if done.returncode:
                _unavailable(f"{' '.join(step[:4])}: "
                             + (done.stderr.strip().splitlines() or ["failed"])[-1])
    probe = _run([str(python), "-I", "-c", "import onnxruntime as o; "
                  "print(o.__version__, o.get_available_providers())"])
    assert probe.returncode == 0 and VERSION in probe.stdout and CUDA in probe.stdout, probe
    (venv / ".ready").write_text(VERSION + "\n")
    return str(python)


@pytest.fixture(scope="module")
def gpu_bundles(tmp_path_factory, image_dir, gpu_python):
    root = tmp_path_factory.mktemp("gpu")
    image = [parse_input("image:1x3x32x32")]
    for target, precision in (("jetson-orin", None), ("jetson-xavier", None),
                              ("jetson-xavier", "int8")):
        name = target + ("-int8" if precision else "")
        build(f"{MODELS}:cnn", root / name, target=target, calib=image_dir, preprocess=PREP,
              inputs=image, quant={"precision": precision} if precision else {})
    return root


def runner(python: str, bundle: Path, *args: str) -> subprocess.CompletedProcess:
    return _run([python, "-I", "run.py", *args], cwd=bundle)


def test_gpu_providers_that_do_not_load_leave_json_clean_and_say_why(gpu_python, gpu_bundles,
                                                                      tmp_path):
    bundle = gpu_bundles / "jetson-orin"
    sample = tmp_path / "x.npy"
    np.save(sample, np.load(bundle / "golden" / "model.inputs.npz")["image"][0])
    for args in (["check"], ["bench", "--runs", "3"], ["infer", str(sample)]):
        proc = runner(gpu_python, bundle, *args, "--json")
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)   # the whole of stdout is the JSON object
        assert "EP Error" not in proc.stdout + proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("edgepack: model ")]
        assert len(lines) == 1, proc.stderr
        line = lines[0]
        # onnxruntime-gpu lists both; each failed to load, with the loader's own reason
        assert line.startswith("edgepack: model running on CPUExecutionProvider (model.onnx, "
                               "INT8); requested but not running here: "), line
        assert f"{TRT} (lib" in line and f"{CUDA} (lib" in line and "cannot open" in line, line
        assert report["providers"][0] == "CPUExecutionProvider"
    human = runner(gpu_python, bundle, "check")
    assert "check passed (not on the target: this machine is x86_64, jetson-orin is aarch64; " \
           "CPUExecutionProvider ran, jetson-orin runs TensorrtExecutionProvider first)" \
           in human.stdout
    # TensorRT did not run: no engine-build note, no cache folder, no key.json
    assert "building the TensorRT engine" not in proc.stderr
    assert not (bundle / "cache").exists()
    strict = runner(gpu_python, bundle, "check", "--require-provider", CUDA)
    assert strict.returncode == 1
    assert f"required provider {CUDA} is not running (running: CPUExecutionProvider; " \
           f"{CUDA}: lib" in strict.stderr


def test_check_and_bench_report_the_graph_that_ran(gpu_python, gpu_bundles):
    bundle = gpu_bundles / "jetson-orin"
    check = json.loads(runner(gpu_python, bundle, "check", "--json").stdout)
    part = check["parts"]["model"]
    assert (part["graph"], part["precision"]) == ("model.onnx", "int8")
    assert set(part["not_running"]) == {TRT, CUDA}
    bench = json.loads(runner(gpu_python, bundle, "bench", "--runs", "3", "--json").stdout)
    assert bench["parts"]["model"]["graph"] == "model.onnx"


@pytest.mark.parametrize("name", ["jetson-orin", "jetson-xavier", "jetson-xavier-int8"])
def test_edgepack_verify_passes_gpu_bundles_under_onnxruntime_gpu(gpu_python, gpu_bundles, name):
    report = verify(gpu_bundles / name, python=gpu_python, runs=5, warmup=1)
    assert report["passed"], report["checks"]
    # and says that this is not the target's machine nor its provider
    assert not report["on_target"]
    assert "CPUExecutionProvider ran, " + name.replace("-int8", "") + \
        " runs TensorrtExecutionProvider first" in report["target_note"]
    target = [c for c in report["checks"] if c["name"] == "target"]
    assert target and target[0]["skipped"]


def test_int8_gpu_bundles_carry_a_float_graph_for_cuda(gpu_bundles):
    for name in ("jetson-orin", "jetson-xavier-int8"):
        part = json.loads((gpu_bundles / name / "manifest.json").read_text())["parts"][0]
        assert part["precision"]["precision"] == "int8"
        (graph,) = part["graphs"]
        assert graph["providers"] == [CUDA] and graph["precision"] == "fp16"
        assert graph["file"] == "model.fp16.onnx" and graph["accuracy"]["budget"]["passed"]
        assert graph["file"] in json.loads(
            (gpu_bundles / name / "manifest.json").read_text())["files"]
    # an FP32 bundle (xavier's default: TensorRT builds FP16 itself) needs no second graph
    part = json.loads((gpu_bundles / "jetson-xavier" / "manifest.json").read_text())["parts"][0]
    assert part["precision"]["precision"] == "fp32" and "graphs" not in part
