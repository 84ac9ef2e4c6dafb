"""The real CLI, end to end, and every bad-input case: one line, non-zero exit, nothing written."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import PREP_TEXT, write_images
from packager.bundle.manifest import read_manifest
from packager.cli import main

ROOT = Path(__file__).resolve().parent.parent


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_every_command_has_help_and_a_readme_entry():
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    for name, command in main.commands.items():
        assert command.help and "Example" in command.help, name
        assert f"edgepack {name}" in docs, name
        assert invoke(name, "--help").exit_code == 0


def test_build_then_verify_end_to_end(cnn_onnx, image_dir, tmp_path):
    out = tmp_path / "out" / "cnn"
    r = invoke("build", cnn_onnx, "--target", "x86_64-cpu", "--calib", image_dir,
               "--preprocess", PREP_TEXT, "--precision", "int8", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    [part] = data["parts"]
    assert part["accuracy"]["cosine_min"] > 0.98 and part["calibration_samples"] == 16
    manifest = read_manifest(out)
    assert manifest["parts"][0]["precision"]["description"].startswith("INT8 static QDQ U8S8")
    v = invoke("verify", out, "--runs", "10", "--json")
    assert v.exit_code == 0, v.output
    assert json.loads(v.stdout)["passed"] is True
    fail = invoke("verify", out, "--runs", "3", "--latency-budget-ms", "0.000001")
    assert fail.exit_code == 1 and "verification failed" in fail.stderr


def test_stages_one_by_one(cnn_onnx, image_dir, tmp_path):
    assert json.loads(invoke("inspect", cnn_onnx, "--json").stdout)["opset"] == 17
    assert invoke("simplify", cnn_onnx, "-o", tmp_path / "s.onnx").exit_code == 0
    r = invoke("fix-shapes", tmp_path / "s.onnx", "--input", "image:2x3x32x32",
               "-o", tmp_path / "f.onnx", "--json")
    assert json.loads(r.stdout)["outputs"] == {"scores": [2, 10]}
    r = invoke("fix-shapes", tmp_path / "s.onnx", "-o", tmp_path / "f1.onnx")
    assert r.exit_code == 0
    r = invoke("quantize", tmp_path / "f1.onnx", "--calib", image_dir, "--preprocess", PREP_TEXT,
               "--method", "percentile", "-o", tmp_path / "q.onnx", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["accuracy"]["cosine_min"] > 0.9
    (tmp_path / "labels.txt").write_text("\n".join(f"c{i}" for i in range(10)))
    r = invoke("bundle", tmp_path / "q.onnx", "--reference", tmp_path / "f1.onnx", "--calib",
               image_dir, "--preprocess", PREP_TEXT, "--labels", tmp_path / "labels.txt",
               "-o", tmp_path / "b")
    assert r.exit_code == 0, r.output
    part = read_manifest(tmp_path / "b")["parts"][0]
    assert part["labels"][3] == "c3" and part["golden"]["reference"] == "fp32"
    assert "no FP32 reference" not in r.stderr
    targets = json.loads(invoke("targets", "--json").stdout)
    assert "x86_64-cpu" in [t["name"] for t in targets]


def test_bundle_without_reference_promises_reproduction_only(cnn_onnx, image_dir, tmp_path):
    invoke("fix-shapes", cnn_onnx, "-o", tmp_path / "f.onnx")
    r = invoke("bundle", tmp_path / "f.onnx", "--calib", image_dir, "--preprocess", PREP_TEXT,
               "-o", tmp_path / "b")
    assert r.exit_code == 0, r.output
    assert "no FP32 reference: the bundle promises to reproduce this host's outputs only" in r.stderr
    assert "--reference FP32.onnx" in r.stderr
    manifest = read_manifest(tmp_path / "b")
    golden = manifest["parts"][0]["golden"]
    assert golden["reference"] == "shipped" and "outputs" not in golden
    assert golden["reproduce_min_cosine"] == 0.9999   # FP32: honest kernels agree to 1e-10
    assert manifest["parts"][0]["accuracy"] == {}
    assert "golden/model.shipped.npz" in manifest["files"]
    assert not any("outputs.npz" in rel for rel in manifest["files"])
    v = invoke("verify", tmp_path / "b", "--runs", "3", "--json")
    assert v.exit_code == 0, v.output
    checks = {c["name"]: c for c in json.loads(v.stdout)["checks"]}
    assert checks["reproduce:scores"]["passed"] and not checks["reproduce:scores"].get("skipped")
    assert "no FP32 reference" in checks["accuracy:scores"]["detail"]
    assert not any("vs the FP32" in c["detail"] or "golden FP32" in c["detail"]
                   for c in checks.values())
    check = subprocess.run([sys.executable, "run.py", "check"], cwd=tmp_path / "b",
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "reproduces the host's FP32 outputs" in check.stdout
    assert "vs FP32" not in check.stdout


def bad_cases(tmp: Path, cnn: Path, images: Path):
    (tmp / "text.onnx").write_text("hello, not a model")
    (tmp / "cut.onnx").write_bytes(cnn.read_bytes()[:500])
    (tmp / "empty").mkdir()
    write_images(tmp / "corrupt", 3)
    (tmp / "corrupt" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    (tmp / "exists").mkdir()
    base = ["--calib", images, "--preprocess", PREP_TEXT]
    return {
        "corrupt model": (tmp / "cut.onnx", base, "cut.onnx"),
        "not onnx": (tmp / "text.onnx", base, "text.onnx"),
        "missing model": (tmp / "nope.onnx", base, "nope.onnx: no such file"),
        "empty calib": (cnn, ["--calib", tmp / "empty", "--preprocess", PREP_TEXT],
                        "no calibration data"),
        "unreadable image": (cnn, ["--calib", tmp / "corrupt", "--preprocess", PREP_TEXT],
                             "x.png: not a readable image"),
        "spec misfit": (cnn, ["--calib", images, "--preprocess", "size=64x64"],
                        "use size=32x32"),
        "bad spec": (cnn, ["--calib", images, "--preprocess", "size=32x32,colour=rgb"],
                     "unknown preprocess key 'colour'"),
        "unknown target": (cnn, [*base, "--target", "pdp-11"], "unknown target 'pdp-11'"),
        "output exists": (cnn, base, "is a folder that is not an edgepack bundle"),
    }


@pytest.mark.parametrize("case", ["corrupt model", "not onnx", "missing model", "empty calib",
                                  "unreadable image", "spec misfit", "bad spec",
                                  "unknown target", "output exists"])
def test_bad_input_one_line_no_traceback_nothing_written(case, cnn_onnx, image_dir, tmp_path):
    model, args, message = bad_cases(tmp_path, cnn_onnx, image_dir)[case]
    out = tmp_path / ("exists" if case == "output exists" else "out")
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = subprocess.run([sys.executable, "-m", "packager", "build", str(model), "-o", str(out),
                           *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and proc.stderr.strip().endswith(errors[0]), proc.stderr
    assert message in errors[0]
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing new, no .part left
    if case == "output exists":
        assert list(out.iterdir()) == []


def test_ctrl_c_during_build_leaves_nothing(cnn_onnx, tmp_path):
    images = write_images(tmp_path / "many", 300, size=(200, 160))
    out = tmp_path / "dest"
    proc = subprocess.Popen([sys.executable, "-m", "packager", "build", str(cnn_onnx), "-o",
                             str(out), "--calib", str(images), "--preprocess", PREP_TEXT,
                             "--method", "entropy"], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # interrupt as soon as the build is under way: calibrating 240
        if line.startswith("shapes:"):   # images with entropy takes seconds more, so the
            break                          # signal cannot come after the build has finished
    os.kill(proc.pid, signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, rest
    assert "interrupted" in rest and "Traceback" not in rest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many"]


def test_fix_shapes_leaves_data_dependent_tensors_dynamic_and_quantize_upgrades_opset_11(
        image_dir, tmp_path):
    """fix-shapes on a simplified graph whose box count depends on the data (NonZero) writes the
    file and names the tensors that stay dynamic (it used to say "simplify first" after
    simplify); quantize on an opset-11 model upgrades it to 13 first (it used to fail every
    variant with INVALID_GRAPH)."""
    import onnx
    import torch
    from onnx import TensorProto, helper

    from conftest import save, tiny_cnn

    graph = helper.make_graph(
        [helper.make_node("Greater", ["x", "zero"], ["on"]),
         helper.make_node("NonZero", ["on"], ["where"]),
         helper.make_node("Relu", ["x"], ["y"])], "boxes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("where", TensorProto.INT64, [2, "boxes"]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                 tmp_path / "boxes.onnx")
    r = invoke("fix-shapes", model, "-o", tmp_path / "boxes.static.onnx")
    assert r.exit_code == 0, r.output
    assert "1 tensor(s) have data-dependent shapes and stay dynamic (where)" in r.stdout
    fixed = onnx.load(str(tmp_path / "boxes.static.onnx"))
    assert [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim] == [1, 8]
    old = tmp_path / "op11.onnx"
    torch.onnx.export(tiny_cnn(), (torch.zeros(1, 3, 32, 32),), str(old), input_names=["image"],
                      output_names=["scores"], opset_version=11, dynamo=False)
    r = invoke("quantize", old, "--calib", image_dir, "--preprocess", PREP_TEXT,
               "-o", tmp_path / "q11.onnx", "--min-cosine", "0.9")
    assert r.exit_code == 0, r.output
    assert "is opset 11; it is upgraded to opset 13 first" in r.output
    assert onnx.load(str(tmp_path / "q11.onnx")).opset_import[0].version >= 13


def test_bundle_holds_a_prebuilt_model_to_the_target_s_budget(cnn_onnx, image_dir, tmp_path):
    """bundle --reference without --min-cosine keeps the target's budget (0.98): a model below
    it is refused (exit 1) instead of getting a floor lowered to what it reaches."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    invoke("fix-shapes", cnn_onnx, "-o", tmp_path / "f.onnx")
    model = onnx.load(str(tmp_path / "f.onnx"))
    rng = np.random.default_rng(0)
    for init in model.graph.initializer:
        value = numpy_helper.to_array(init)
        if value.ndim >= 2:   # every weight off by ~100 %: far from the reference
            noisy = value * (1 + rng.standard_normal(value.shape)).astype(value.dtype)
            init.CopyFrom(numpy_helper.from_array(noisy, init.name))
    onnx.save(model, str(tmp_path / "off.onnx"))
    args = ["bundle", tmp_path / "off.onnx", "--reference", tmp_path / "f.onnx", "--calib",
            image_dir, "--preprocess", PREP_TEXT]
    r = invoke(*args, "-o", tmp_path / "b")
    errors = [line for line in r.output.splitlines() if line.startswith("error: ")]
    assert r.exit_code == 1 and len(errors) == 1, r.output
    assert "below the budget 0.98 (x86_64-cpu's)" in errors[0] and "--min-cosine" in errors[0]
    assert not (tmp_path / "b").exists()
    cosine = float(errors[0].split("keeps cosine ")[1].split(" ")[0])
    r = invoke(*args, "--min-cosine", f"{cosine - 0.01:.4f}", "-o", tmp_path / "b")
    assert r.exit_code == 0, r.output
    golden = read_manifest(tmp_path / "b")["parts"][0]["golden"]
    assert golden["budget_min_cosine"] == pytest.approx(cosine - 0.01, abs=1e-4)
    assert golden["min_cosine"] >= golden["budget_min_cosine"]
