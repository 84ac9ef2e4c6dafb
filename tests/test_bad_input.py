"""Bad input through the real CLI: one `error:` line naming the file or option, exit 2, no
traceback, no `unexpected`, nothing written at -o. One case per way a tester broke it."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from conftest import PREP_TEXT
from packager.cli import main
from packager.graph.shapes import fix_shapes
from packager.targets import builtin_dir

TORCH_MODELS = Path(__file__).resolve().parent / "torch_models.py"


def gap_model(path: Path, size: int, *, names: tuple[str, str] = ("image", "y"),
              opset: int = 17) -> Path:
    """One GlobalAveragePool over a 1x3xSIZExSIZE image."""
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", [names[0]], [names[1]], name="gap")], "gap",
        [helper.make_tensor_value_info(names[0], TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info(names[1], TensorProto.FLOAT, [1, 3, 1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory, cnn_onnx, image_dir):
    """Every bad file once: models, calibration data, specs, profiles, labels, inventories."""
    d = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(0)
    static = fix_shapes(cnn_onnx, d / "static.onnx", shapes={}).output
    proto = onnx.load(str(static))
    proto.opset_import[0].version = 99
    onnx.save(proto, str(d / "opset99.onnx"))
    onnx.save_model(onnx.load(str(static)), str(d / "ext.onnx"), save_as_external_data=True,
                    location="ext.onnx.data", size_threshold=0)
    (d / "ext.onnx.data").unlink()
    gap_model(d / "huge.onnx", 1_000_000)
    gap_model(d / "gap64.onnx", 64)
    gap_model(d / "gap32.onnx", 32, names=("image", "pooled"))
    (d / "nan").mkdir()
    np.save(d / "nan" / "s.npy", np.full((4, 1, 3, 32, 32), np.nan, np.float32))
    arr = rng.random((4, 1, 3, 32, 32)).astype(np.float32)
    arr[2, 0, 1, 5, 5] = np.inf
    np.savez(d / "inf.npz", image=arr)
    np.save(d / "text.npy", np.array(["a", "b"]))
    (d / "binary.toml").write_bytes(bytes(rng.integers(128, 256, 200, dtype=np.uint8)))
    (d / "notable.toml").write_text("preprocess = 5\n")
    profile = (builtin_dir() / "x86_64-cpu.toml").read_text()
    (d / "cos5.toml").write_text(re.sub(r"(?m)^min_cosine = .*$", "min_cosine = 5.0", profile))
    (d / "lat.toml").write_text(re.sub(r"(?m)^latency_p90_ms = .*$", "latency_p90_ms = -3.0",
                                       profile))
    (d / "metric.py").write_text("def boom(outputs, labels):\n    raise RuntimeError('kaput')\n\n"
                                 "def word(outputs, labels):\n    return 'high'\n")
    (d / "binary.txt").write_bytes(b"\x8f\xff\x00\x01" + bytes(range(128, 256)))
    (d / "two.txt").write_text("cat\ndog\n")
    (d / "blank.txt").write_text("\n  \n")
    return d


def cases(d: Path, cnn: Path, images: Path, out: Path) -> dict:
    """name -> (argv, exit code, text the one error line must hold)."""
    prep = ["--calib", images, "--preprocess", PREP_TEXT]
    build = ["build", cnn, "-o", out, *prep]
    quant = ["quantize", d / "static.onnx", "-o", out, *prep]
    return {
        # model bytes
        "opset 99": (["quantize", d / "opset99.onnx", "-o", out, *prep], 2,
                     "opset99.onnx: opset 99 is newer than"),
        "opset 99 build": (["build", d / "opset99.onnx", "-o", out, *prep], 2, "(opsets 7 to"),
        "external data missing": (["simplify", d / "ext.onnx", "-o", out], 2,
                                  "external data file missing (ext.onnx.data)"),
        "huge declared input": (["build", d / "huge.onnx", "-o", out, "--calib", images,
                                 "--preprocess", "size=1000000x1000000"], 2,
                                "size=1000000x1000000 is larger than 16384x16384"),
        "quantize dynamic model": (["quantize", cnn, "-o", out, *prep], 2,
                                   "input 'image' is dynamic (batchx3x32x32)"),
        "debug-quant dynamic": (["debug-quant", cnn, d / "static.onnx", *prep], 2,
                                "--input image:1x3x32x32"),
        "debug-quant sizes differ": (["debug-quant", d / "static.onnx", d / "gap64.onnx", *prep],
                                     2, "gap64.onnx takes image 1x3x64x64 float32"),
        "debug-quant unrelated": (["debug-quant", d / "static.onnx", d / "gap32.onnx", *prep], 2,
                                  "share no tensor names"),
        "debug-quant two FP32": (["debug-quant", d / "static.onnx", d / "static.onnx", *prep], 2,
                                 "static.onnx has no quantized op: nothing to compare with"),
        # calibration data
        "nan calibration": (["quantize", d / "static.onnx", "-o", out, "--calib", d / "nan"], 2,
                            "s.npy: 'image' holds NaN or Inf (12288 of 12288 values)"),
        "inf calibration": (["quantize", d / "static.onnx", "-o", out, "--calib", d / "inf.npz"],
                            2, "inf.npz: 'image' holds NaN or Inf (1 of"),
        "string calibration": (["quantize", d / "static.onnx", "-o", out, "--calib",
                                d / "text.npy"], 2, "text.npy: 'image' holds <U1 values"),
        # preprocessing specs
        "pad 999": ([*build[:-1], PREP_TEXT + ",pad=999"], 2, "pad='999' is not a pixel value"),
        "binary toml": ([*build[:-1], d / "binary.toml"], 2, "binary.toml: not a text file"),
        "toml not a table": ([*build[:-1], d / "notable.toml"], 2,
                             "notable.toml: 'preprocess' is not a table"),
        "scale 1e400": ([*quant[:-1], "size=32x32,scale=1e400"], 2,
                        "scale='1e400' is not a finite number"),
        "mean nan": ([*quant[:-1], "size=32x32,mean=nan"], 2, "mean='nan' is not a finite"),
        "std inf": ([*build[:-1], "size=32x32,std=inf"], 2, "std='inf' is not a finite"),
        "quantize spec misfit": ([*quant[:-1], "size=64x64"], 2, "use size=32x32"),
        # target profiles
        "profile min_cosine 5": ([*build, "--target", d / "cos5.toml"], 2,
                                 "cos5.toml: budget: min_cosine = 5.0 is not a cosine"),
        "profile latency -3": (["targets", "--target", d / "lat.toml"], 2,
                               "lat.toml: budget: latency_p90_ms = -3.0"),
        # options
        "holdout nan": ([*build, "--holdout", "nan"], 2, "--holdout nan is not a fraction"),
        "holdout -1": ([*quant, "--holdout", "-1"], 2, "--holdout -1 is not a fraction"),
        "holdout 1": ([*build, "--holdout", "1"], 2,
                      "--holdout 1 holds out every sample and leaves none to calibrate"),
        "holdout 0.99": ([*quant, "--holdout", "0.99"], 2,
                         "--holdout 0.99 holds out all 20 samples"),
        "golden 0": ([*build, "--golden", "0"], 2, "--golden 0: the bundle needs at least 1"),
        "golden -5": (["bundle", d / "static.onnx", "-o", out, *prep, "--golden", "-5"], 2,
                      "--golden -5"),
        "min-cosine 2": ([*build, "--min-cosine", "2"], 2, "--min-cosine 2 is not a cosine"),
        "min-cosine nan": ([*quant, "--min-cosine", "nan"], 2, "--min-cosine nan"),
        "search-seconds 0": ([*build, "--search-seconds", "0"], 2,
                             "--search-seconds: 0 is not a number of seconds above 0"),
        "search-seconds nan": ([*quant, "--search-seconds", "nan"], 2,
                               "--search-seconds: nan is not a number of seconds above 0"),
        "exclude unknown (quantize)": ([*quant, "--exclude", "nope"], 2,
                                       f"--exclude nope: {d / 'static.onnx'} has no node of "
                                       "that name"),
        "exclude unknown (build)": ([*build, "--exclude", "nope"], 2,
                                    f"--exclude nope: {cnn} has no node"),
        "metric raises": ([*build, "--metric", f"{d / 'metric.py'}:boom",
                           "--max-accuracy-drop", "1%"], 2,
                          "--metric boom raised RuntimeError on the FP32 model's outputs: kaput"),
        "metric returns a string": ([*quant, "--metric", f"{d / 'metric.py'}:word",
                                     "--max-accuracy-drop", "1%"], 2,
                                    "--metric word returned 'high' (str)"),
        "export opset 21": (["export", f"{TORCH_MODELS}:cnn", "--input", "image:1x3x32x32",
                             "--opset", "21", "-o", out], 2,
                            "--opset 21: the TorchScript exporter writes opsets 7 to 20; pick one "
                            "in that range (default: 20)"),
        "chart svg": (["compare", d / "static.onnx", "--chart", out.with_suffix(".svg")], 2,
                      "the chart is a PNG image, not .svg"),
        # labels and inventories
        "binary labels": ([*build, "--labels", d / "binary.txt"], 2,
                          "--labels " + str(d / "binary.txt") + ": not a text file"),
        "blank labels": ([*build, "--labels", d / "blank.txt"], 2, "no class names"),
        "labels count (bundle)": (["bundle", d / "static.onnx", "-o", out, *prep, "--labels",
                                   d / "two.txt"], 2, "has 2 labels but"),
        "labels count (build)": ([*build, "--labels", d / "two.txt"], 2,
                                 f"has 2 labels but {cnn}'s output 'scores' scores 10 classes"),
        "binary inventory": (["deploy", out, "--hosts", d / "binary.txt"], 2,
                             "--hosts " + str(d / "binary.txt") + ": not a text file"),
        # rollouts and the Ansible role
        "deploy batch": (["deploy", out, "pi", "--batch", "half"], 2,
                         "--batch half: not a number of hosts or a percentage"),
        "deploy max-fail": (["deploy", out, "pi", "--max-fail", "200%"], 2,
                            "--max-fail 200%: not a percentage from 0 to 100"),
        "deploy canary": (["deploy", out, "pi", "--canary", "-1"], 2,
                          "--canary -1: not a number of hosts"),
        "deploy limit alone": (["deploy", out, "pi", "--limit", "pis"], 2,
                               "--limit selects hosts of an inventory; add --hosts INVENTORY"),
        "ansible transfer": (["deploy", out, "pi", "--engine", "ansible", "--transfer", "scp"],
                             2, "--transfer is for --engine ssh"),
        "ansible-role onto a file": (["ansible-role", "-o", d / "binary.txt"], 2,
                                     "-o " + str(d / "binary.txt") + ": not a folder"),
    }


CASES = list(cases(Path("d"), Path("m"), Path("i"), Path("o")))


def one_error(text: str) -> str:
    errors = [ln for ln in text.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, text
    assert "Traceback" not in text and "unexpected" not in text, text
    return errors[0]


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case, files, cnn_onnx, image_dir, tmp_path):
    out = tmp_path / "out"
    args, code, message = cases(files, cnn_onnx, image_dir, out)[case]
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == code, r.output
    assert message in one_error(r.stderr), r.stderr
    assert list(tmp_path.iterdir()) == [], "something was written"


def test_holdout_one_does_not_say_pass_calib(files, image_dir, tmp_path):
    """--calib was given: the message is about the fraction, not about missing data."""
    r = CliRunner().invoke(main, ["quantize", str(files / "static.onnx"), "-o",
                                  str(tmp_path / "q.onnx"), "--calib", str(image_dir),
                                  "--preprocess", PREP_TEXT, "--holdout", "1"])
    assert r.exit_code == 2 and "pass --calib" not in r.stderr, r.stderr


@pytest.mark.parametrize("case", ["huge declared input", "binary toml", "debug-quant sizes differ"])
def test_bad_input_in_a_real_process(case, files, cnn_onnx, image_dir, tmp_path):
    """The same through `python -m packager`: what a user's shell sees."""
    out = tmp_path / "out"
    args, code, message = cases(files, cnn_onnx, image_dir, out)[case]
    proc = subprocess.run([sys.executable, "-m", "packager", *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert message in one_error(proc.stderr) and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_json_errors_are_json_on_stdout(files, cnn_onnx, image_dir, tmp_path):
    r = CliRunner().invoke(main, ["build", str(cnn_onnx), "-o", str(tmp_path / "o"), "--calib",
                                  str(image_dir), "--preprocess", PREP_TEXT, "--golden", "0",
                                  "--json"])
    assert r.exit_code == 2
    data = json.loads(r.stdout)
    assert data == {"error": "--golden 0: the bundle needs at least 1 golden sample",
                    "hint": data["hint"], "exit_code": 2} and "--golden 8" in data["hint"]
    assert one_error(r.stderr).startswith("error: --golden 0")


def test_unexpected_error_says_it_is_a_bug(files, tmp_path, monkeypatch):
    """A bug reaches the user as one line with exit 3 that asks for a report."""
    import packager.graph.inspection

    def broken(model):
        raise KeyError("multi\nline")

    monkeypatch.setattr(packager.graph.inspection, "inspect_model", broken)
    r = CliRunner().invoke(main, ["inspect", str(files / "static.onnx"), "--json"])
    assert r.exit_code == 3
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(line) == 1 and "unexpected KeyError" in line[0]
    assert "this is a bug in edgepack: please report it with the command line" in line[0]
    assert json.loads(r.stdout)["exit_code"] == 3


def test_quantize_warns_about_a_small_calibration_set_like_build(files, image_dir, tmp_path):
    r = CliRunner().invoke(main, ["quantize", str(files / "static.onnx"), "-o",
                                  str(tmp_path / "q.onnx"), "--calib", str(image_dir),
                                  "--preprocess", PREP_TEXT])
    assert r.exit_code == 0, r.output
    assert "warning: only 16 calibration samples; 32 or more" in r.stderr


def test_inspect_lists_the_node_names_exclude_takes(files):
    r = CliRunner().invoke(main, ["inspect", str(files / "static.onnx"), "--nodes", "--json"])
    names = [n["name"] for n in json.loads(r.stdout)["node_list"]]
    assert "/0/Conv" in names


def test_export_prints_its_validation_once(tmp_path):
    r = CliRunner().invoke(main, ["export", f"{TORCH_MODELS}:cnn", "--input", "image:1x3x32x32",
                                  "-o", str(tmp_path / "c.onnx")])
    assert r.exit_code == 0, r.output
    assert r.output.count("validation vs PyTorch") == 1, r.output


def test_targets_checks_one_profile():
    r = CliRunner().invoke(main, ["targets", "--target", "x86_64-cpu", "--json"])
    assert r.exit_code == 0 and [t["name"] for t in json.loads(r.stdout)] == ["x86_64-cpu"]


@pytest.mark.parametrize("args, option", [
    (["compare", "{model}", "--batch", "0"], "--batch"),
    (["compare", "{model}", "--batch", "-2"], "--batch"),
    (["compare", "{model}", "--rounds", "0"], "--rounds"),
    (["compare", "{model}", "--threads", "-1"], "--threads"),
    (["fix-shapes", "{model}", "-o", "{out}", "--batch", "-4"], "--batch"),
    (["fix-shapes", "{model}", "-o", "{out}", "--batch", "0"], "--batch"),
])
def test_counts_below_one_are_refused_by_name(args, option, cnn_onnx, tmp_path):
    """A batch, round, run or thread count below 1 (or a negative budget) is exit 2 naming the
    option; compare's --batch 0 was a ZeroDivisionError (exit 3), fix-shapes --batch -4 wrote a
    -4x3x32x32 model with exit 0."""
    out = tmp_path / "out"
    r = CliRunner().invoke(main, [a.format(model=cnn_onnx, out=out) for a in args])
    assert r.exit_code == 2, r.output
    assert f"Invalid value for '{option}'" in r.output and "Traceback" not in r.output
    assert not out.exists()


@pytest.mark.parametrize("args, said", [
    (["--runs", "0"], "--runs 0: not a number of runs; give 1 or more"),
    (["--warmup", "-1"], "--warmup -1: not a number of warm-up runs; give 0 or more"),
    (["--threads", "-3"], "--threads -3: not a number of threads; give 1 or more"),
    (["--latency-budget-ms", "-1"], "--latency-budget-ms -1.0: not a latency"),
])
def test_verify_refuses_bad_counts_as_deploy_does(args, said, built):
    """verify --runs 0 ran the bundle and blamed it ('run.py bench failed ... rebuild'); it is
    the option: exit 2 before anything runs, with deploy's words."""
    r = CliRunner().invoke(main, ["verify", str(built.bundle.directory), *args])
    assert r.exit_code == 2, r.output
    assert said in one_error(r.stderr), r.stderr


def test_the_library_refuses_a_batch_below_one_too(cnn_onnx, tmp_path):
    from packager.compare import compare
    from packager.errors import PackagerError
    from packager.graph.shapes import fix_shapes

    with pytest.raises(PackagerError, match="--batch 0: a batch holds at least one sample"):
        fix_shapes(cnn_onnx, tmp_path / "f.onnx", shapes={}, batch=0)
    with pytest.raises(PackagerError, match="--rounds 0: must be 1 or more"):
        compare(cnn_onnx, rounds=0)
    assert list(tmp_path.iterdir()) == []


def test_debug_quant_with_its_models_swapped_says_which_goes_first(files, image_dir, tmp_path):
    """The INT8 model first and the FP32 one second is exit 2 with the order to use, not a
    table of damage followed by "nothing to keep in FP32" (it was exit 0)."""
    prep = ["--calib", str(image_dir), "--preprocess", PREP_TEXT]
    q = tmp_path / "q.onnx"
    r = CliRunner().invoke(main, ["quantize", str(files / "static.onnx"), "-o", str(q), *prep,
                                  "--precision", "int8"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["debug-quant", str(q), str(files / "static.onnx"), *prep])
    assert r.exit_code == 2
    assert "q.onnx is the quantized one (" in one_error(r.stderr)
    assert f"pass the FP32 model first: debug-quant {files / 'static.onnx'} {q}" in r.stderr
