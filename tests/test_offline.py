"""build --offline-optimize: the graph optimised offline by this onnxruntime, shipped where it
starts faster and runs no slower, loaded by the runner under the same onnxruntime family only.

Whether it ships depends on measured load and run times, so the branch that ships is forced by
lowering the bars (offline.MIN_GAIN, RUN_SLACK); everything after that is real: onnxruntime
writes the graph, the runner loads it, check holds it to the host's outputs.
"""

import json
import shutil

import pytest

from conftest import PREP, run_py
from packager.build.job import build
from packager.errors import SpecError
from packager.graph import offline


@pytest.fixture(scope="module")
def shipped(cnn_onnx, image_dir, tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setattr(offline, "MIN_GAIN", -100.0)    # ship whatever loads fastest
    patch.setattr(offline, "RUN_SLACK", 100.0)
    try:
        out = tmp_path_factory.mktemp("offline") / "b"
        build(cnn_onnx, out, target="x86_64-cpu", calib=image_dir, preprocess=PREP,
              quant={"precision": "int8"}, offline=True)
    finally:
        patch.undo()
    return out


def test_the_optimised_graph_ships_hashed_and_is_what_the_cpu_loads(shipped):
    manifest = json.loads((shipped / "manifest.json").read_text())
    record = manifest["parts"][0]["offline"]
    assert record["file"] in ("model.opt.onnx", "model.ort")
    assert manifest["files"][record["file"]] == record["sha256"]
    assert record["family"] == ".".join(record["onnxruntime"].split(".")[:2])
    assert record["level"] == "extended" and record["cosine_min"] >= offline.SAME_COSINE
    assert set(record["load_ms"]) >= {"model.onnx", record["file"]}
    assert set(record["run_p50_ms"]) == set(record["load_ms"])
    others = {"model.opt.onnx", "model.ort"} - {record["file"]}
    assert not any((shipped / name).exists() for name in others)   # the loser is not shipped
    proc = run_py(shipped, "check", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["parts"]["model"]["loaded"] == record["file"]
    assert f"loaded from {record['file']}, optimised offline" in proc.stderr
    bench = run_py(shipped, "bench", "--runs", "5")
    assert bench.returncode == 0 and f"({record['file']}, optimised offline)" in bench.stdout
    # verify's header names the file that really loads (issue 36)
    from packager.device.verify import render_markdown, verify

    report = verify(shipped, runs=3, warmup=1)
    assert report["loaded"] == {"model": record["file"]}
    assert f"loaded from {record['file']} (optimised offline)" in render_markdown(report)


def test_another_onnxruntime_family_loads_the_original_and_says_why(shipped, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(shipped, bundle)
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    record = manifest["parts"][0]["offline"]
    record.update(family="1.0", onnxruntime="1.0.0")
    path.write_text(json.dumps(manifest))
    proc = run_py(bundle, "check", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["parts"]["model"]["loaded"] == "model.onnx"
    assert (f"{record['file']} was optimised offline by onnxruntime 1.0.0 and this is"
            in proc.stderr)


def test_the_optimised_graph_is_part_of_integrity(shipped, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(shipped, bundle)
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    name = manifest["parts"][0]["offline"]["file"]
    (bundle / name).write_bytes((bundle / name).read_bytes()[:-10])
    proc = run_py(bundle, "check")
    assert proc.returncode == 1 and f"{name}: sha256 mismatch" in proc.stdout
    del manifest["files"][name]
    path.write_text(json.dumps(manifest))
    proc = run_py(bundle, "check")
    assert proc.returncode == 1 and f"manifest: {name} is not in its file table" in proc.stdout
    del manifest["parts"][0]["offline"]["family"]
    path.write_text(json.dumps(manifest))
    proc = run_py(bundle, "check")
    assert proc.returncode == 2 and "parts[0].offline.family" in proc.stderr


def test_nothing_extra_ships_when_it_does_not_pay(cnn_onnx, image_dir, tmp_path):
    patch = pytest.MonkeyPatch()
    patch.setattr(offline, "MIN_GAIN", 100.0)    # nothing can load 100x faster
    try:
        out = tmp_path / "b"
        build(cnn_onnx, out, target="x86_64-cpu", calib=image_dir, preprocess=PREP,
              quant={"precision": "int8"}, offline=True)
    finally:
        patch.undo()
    record = json.loads((out / "manifest.json").read_text())["parts"][0]["offline"]
    assert "file" not in record and record["reason"] and record["load_ms"]["model.onnx"] > 0
    assert sorted(p.name for p in out.glob("model*")) == ["model.onnx"]
    assert run_py(out, "check").returncode == 0


def test_gpu_targets_are_refused(cnn_onnx, image_dir, tmp_path):
    with pytest.raises(SpecError, match="--offline-optimize: jetson-orin runs "
                                        "TensorrtExecutionProvider"):
        build(cnn_onnx, tmp_path / "b", target="jetson-orin", calib=image_dir,
              preprocess=PREP, offline=True)
    assert not (tmp_path / "b").exists()
