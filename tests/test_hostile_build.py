"""Hostile build-side inputs (issue 23, hostile-cases.md items 14-17, 19, 21, 22 and the
temporaries of 15): --input and --const values, calibration files that are huge, complex,
truncated or declare gigabytes, factories that print, exit, chdir or leave threads, NaN
models, Ctrl-C in the first second, two runs to one -o, and temporaries in the user's folder.

Everything runs for real: the edgepack program in a subprocess where the process itself is
the thing under test (stdout, exit status, signals, threads, locks), CliRunner elsewhere."""

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from conftest import PREP_TEXT
from packager.atomic import atomic_pair, output_lock
from packager.cli import main
from packager.errors import BundleError
from packager.quantization import calibration
from packager.quantization.calibration import load_samples
from packager.quantization.preprocessing import parse_preprocess

EDGEPACK = [sys.executable, "-m", "packager"]
FACTORIES = '''import os, sys, threading, time
import torch.nn as nn

def ok():
    return nn.Linear(4, 4)

def prints():
    print("GARBAGE ON STDOUT")
    os.write(1, b"C-LEVEL GARBAGE\\n")
    return nn.Linear(4, 4)

def exit0():
    sys.exit(0)

def exit7():
    raise SystemExit(7)

def chdir():
    os.chdir(os.environ["ELSEWHERE"])
    return nn.Linear(4, 4)

def thread():
    threading.Thread(target=time.sleep, args=(600,), name="left-behind").start()
    return nn.Linear(4, 4)

def hang():
    print("hanging", file=sys.stderr, flush=True)
    time.sleep(600)

def nan_model():
    m = nn.Linear(4, 4)
    m.weight.data[:] = float("nan")
    return m
'''


def one_line_error(result, code: int = 2) -> str:
    """The run's single `error:` line, after checking exit code and that nothing else went
    wrong (no traceback, no `unexpected`)."""
    err = result.stderr
    assert result.exit_code == code if hasattr(result, "exit_code") else True, err
    assert "Traceback" not in err and "unexpected" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def run(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(EDGEPACK + [str(a) for a in args], capture_output=True, text=True,
                          timeout=kw.pop("timeout", 120), **kw)


@pytest.fixture(scope="module")
def factories(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("factories") / "f.py"
    path.write_text(FACTORIES)
    return path


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> tuple[Path, Path]:
    """two.onnx: x float[1,4] and sr int64[1] (y = x * sr), with a calibration .npz."""
    root = tmp_path_factory.mktemp("two")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "srf"], ["h"]),
         helper.make_node("MatMul", ["h", "w"], ["y"])], "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(root / "two.onnx"))
    rng = np.random.default_rng(0)
    np.savez(root / "calib.npz", x=rng.normal(size=(10, 1, 4)).astype(np.float32),
             sr=np.full((10, 1), 16000, np.int64))
    return root / "two.onnx", root / "calib.npz"


# --------------------------------------------------------------------------- --input


@pytest.mark.parametrize("spec, message", [
    ("x:100000x100000", "limit of 268,435,456 (2**28) elements"),       # E53
    ("x:99999999999999999999x4", "limit of 268,435,456 (2**28) elements"),  # E54
    ("x::float32", "the shape '' is not dimensions joined by x"),
    ("x:scalar:int64", "the shape 'scalar' is not dimensions joined by x"),
])
def test_e53_e54_input_shapes_over_the_limit_or_malformed_are_one_line(factories, tmp_path,
                                                                       spec, message):
    out = tmp_path / "o.onnx"
    r = CliRunner().invoke(main, ["export", f"{factories}:ok", "--input", spec, "-o", str(out)])
    assert message in one_line_error(r)
    assert not out.exists()


# --------------------------------------------------------------------------- --const


@pytest.mark.parametrize("const, message", [
    ("sr=1e999", "NaN or infinity cannot be a int64 value"),                        # E13
    ("sr=16000.5", "not a whole number that fits int64 (the graph would hold 16000)"),  # E14
    ("sr=99999999999999999999999999", "not a int64 value"),                         # E15
    ("sr=9223372036854775808", "not a whole number that fits int64"),   # 2**63 wraps round
])
def test_e13_e14_e15_const_values_int64_cannot_hold_are_refused(two, tmp_path, const, message):
    model, calib = two
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["build", str(model), "--calib", str(calib), "--precision",
                                  "fp32", "--const", const, "-o", str(out)])
    assert message in one_line_error(r)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_e13_e14_manifest_and_graph_hold_the_same_const(two, tmp_path):
    model, calib = two
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["build", str(model), "--calib", str(calib), "--precision",
                                  "fp32", "--const", "sr=16000.0", "-o", str(out)])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    recorded = manifest["parts"][0]["source"]["consts"]["sr"]
    assert recorded == [16000] and isinstance(recorded[0], int)
    import onnxruntime as ort

    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x"]
    y = session.run(None, {"x": np.ones((1, 4), np.float32)})[0]
    assert y.tolist() == [[16000.0] * 4]   # the graph computes with the recorded value


def test_e16_e17_e18_e19_const_files_and_freezing_everything(two, tmp_path):
    model, calib = two
    np.save(tmp_path / "complex.npy", np.array([1 + 2j], np.complex64))
    (tmp_path / "text.npy").write_text("16000\n")
    os.mkfifo(tmp_path / "fifo.npy")
    cases = [
        (["--const", f"sr={tmp_path / 'complex.npy'}"], "complex values, the input is int64"),
        (["--const", "sr=16000", "--const", "x=[[1,2,3,4]]"], "no inputs left"),
        (["--const", f"sr={tmp_path / 'text.npy'}"], "not a .npy file (no NumPy header)"),
        (["--const", f"sr={tmp_path / 'fifo.npy'}"], "not a regular file"),
    ]
    for extra, message in cases:   # E16, E17, E18, E19 in that order
        out = tmp_path / "out" / "b"
        r = run(["build", model, "--calib", calib, "--precision", "fp32", *extra, "-o", out],
                timeout=60)   # the FIFO used to block here for ever
        assert r.returncode == 2, r.stderr
        assert message in one_line_error(r)
        assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- calibration


@pytest.fixture(scope="module")
def linear(tmp_path_factory) -> Path:
    """x float[1,4] -> MatMul -> y float[1,4]."""
    path = tmp_path_factory.mktemp("linear") / "linear.onnx"
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32) * 0.5, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _bomb(path: Path) -> Path:
    """A ~10 MB .npz whose header declares 48 GiB of float32 zeros."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f4", "fortran_order": False, "shape": (3 * 2 ** 30, 1, 4)})
            f.write(b"\0" * 10_000_000)
    return path


def test_e87_e88_e89_bad_npz_files_are_one_line_before_anything_is_inflated(linear, tmp_path):
    np.savez(tmp_path / "complex.npz", x=np.ones((10, 1, 4), np.complex64))
    np.savez(tmp_path / "good.npz", x=np.ones((100, 1, 4), np.float32))
    data = (tmp_path / "good.npz").read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[:len(data) // 2])
    _bomb(tmp_path / "bomb.npz")
    for name, message in (("complex.npz", "holds complex (complex64) values"),      # E87
                          ("truncated.npz", "not a readable .npy/.npz file"),         # E88
                          ("bomb.npz", "declares 48.0 GiB of arrays, over the 1 GiB limit")):
        out = tmp_path / "q.onnx"
        started = time.monotonic()
        r = CliRunner().invoke(main, ["quantize", str(linear), "--calib", str(tmp_path / name),
                                      "-o", str(out)])
        assert message in one_line_error(r), name
        assert not out.exists()
        assert time.monotonic() - started < 30   # E89: refused from the header, not inflated


def test_e72_e73_calibration_uses_at_most_512_samples_evenly_spread(tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(600):   # the value says which file it was: the picks can be checked
        cv2.imwrite(str(folder / f"{i:04d}.png"), np.full((8, 8, 3), i % 256, np.uint8))
    decoded = []
    samples = load_samples(folder, inputs=[{"name": "image", "shape": [1, 3, 8, 8],
                                            "dtype": "float32"}],
                           preprocess=parse_preprocess("size=8x8,scale=1"),
                           progress=lambda done, total: decoded.append(total))
    assert len(samples) == calibration.MAX_SAMPLES == 512
    assert len(decoded) == 512 and set(decoded) == {512}   # only the picks were decoded
    picked = [int(s["image"][0, 0, 0, 0]) for s in samples]
    expected = [int((i + 0.5) * 600 / 512) % 256 for i in range(512)]
    assert picked == expected   # evenly spread, the same ones every run


def test_e72_tensor_calibration_is_capped_and_says_so(linear, tmp_path):
    np.savez(tmp_path / "big.npz", x=np.arange(2000 * 4, dtype=np.float32).reshape(2000, 1, 4))
    r = CliRunner().invoke(main, ["quantize", str(linear), "--calib", str(tmp_path / "big.npz"),
                                  "--precision", "int8", "-o", str(tmp_path / "q.onnx"),
                                  "--json"])
    assert r.exit_code == 0, r.output
    assert "calibration: using 512 of 2,000 samples" in r.stderr
    result = json.loads(r.stdout)
    assert result["calibration_samples"] < 512   # after the hold-out


# --------------------------------------------------------------------------- export / factories


def test_e38_export_of_an_all_nan_model_fails_validation(factories, tmp_path):
    out = tmp_path / "nan.onnx"
    r = run(["export", f"{factories}:nan_model", "--input", "x:1x4", "-o", out])
    assert r.returncode == 1, r.stderr
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert line and "holds NaN or infinity" in line[0], r.stderr
    assert "cosine min 1.000000" not in r.stderr and not out.exists()


def test_e70_export_with_nan_weights_fails_validation(factories, tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"weight": torch.full((4, 4), float("nan")), "bias": torch.zeros(4)},
              str(tmp_path / "nan.safetensors"))
    out = tmp_path / "w.onnx"
    r = run(["export", f"{factories}:ok", "--weights", tmp_path / "nan.safetensors",
             "--input", "x:1x4", "-o", out])
    assert r.returncode == 1, r.stderr
    assert "holds NaN or infinity" in r.stderr and not out.exists()


def test_e30_a_factory_that_prints_leaves_json_stdout_alone(factories, tmp_path):
    r = run(["export", f"{factories}:prints", "--input", "x:1x4", "-o", tmp_path / "o.onnx",
             "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["opset"] > 0   # stdout is the JSON and nothing else
    assert "GARBAGE ON STDOUT" in r.stderr and "C-LEVEL GARBAGE" in r.stderr


@pytest.mark.parametrize("factory, code", [("exit0", 0), ("exit7", 7)])
def test_e31_e32_sys_exit_in_a_factory_is_exit_2_naming_it(factories, tmp_path, factory, code):
    out = tmp_path / "o.onnx"
    r = run(["export", f"{factories}:{factory}", "--input", "x:1x4", "-o", out])
    assert r.returncode == 2, r.stderr
    assert f"called sys.exit({code})" in one_line_error(r)
    assert not out.exists()


def test_e34_a_factory_chdir_does_not_move_a_relative_output(factories, tmp_path):
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    r = run(["export", f"{factories}:chdir", "--input", "x:1x4", "-o", "rel.onnx"], cwd=here,
            env={**os.environ, "ELSEWHERE": str(elsewhere)})
    assert r.returncode == 0, r.stderr
    assert (here / "rel.onnx").is_file() and not list(elsewhere.iterdir())


def test_e36_a_thread_left_by_the_factory_does_not_keep_edgepack_alive(factories, tmp_path):
    out = tmp_path / "o.onnx"
    started = time.monotonic()
    r = run(["export", f"{factories}:thread", "--input", "x:1x4", "-o", out], timeout=90)
    assert r.returncode == 0, r.stderr
    assert out.is_file() and time.monotonic() - started < 90
    assert "not waiting for 1 thread(s)" in r.stderr and "left-behind" in r.stderr


def test_e35_a_hanging_factory_ends_with_ctrl_c(factories, tmp_path):
    """No deadline on user code (a factory may legitimately load for minutes): Ctrl-C is the
    documented way out, and it gives the usual one line and exit 130."""
    out = tmp_path / "o.onnx"
    p = subprocess.Popen(EDGEPACK + ["export", f"{factories}:hang", "--input", "x:1x4", "-o",
                                     str(out)], stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert p.stderr.readline().strip() == "hanging"
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 130
        assert p.stderr.read().strip().splitlines()[-1] == "interrupted: nothing was written"
        assert not out.exists()
    finally:
        p.kill()
        p.wait(timeout=10)


# --------------------------------------------------------------------------- Ctrl-C


def test_e107_e112_ctrl_c_in_the_first_second_exits_130_in_one_line(cnn_onnx, image_dir,
                                                                     tmp_path):
    for delay in (0.3, 0.5, 0.7, 0.9, 1.1):   # Python's own startup (site) is the first ~0.1 s
        out = tmp_path / f"sig{delay}" / "b"
        p = subprocess.Popen(EDGEPACK + ["build", str(cnn_onnx), "--calib", str(image_dir),
                                         "--preprocess", PREP_TEXT, "-o", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        assert "Traceback" not in err and "unexpected" not in err, (delay, err)
        if p.returncode == 0:   # the build was done before the signal: whole and consistent
            assert (out / "manifest.json").is_file()
            continue
        assert p.returncode == 130, (delay, p.returncode, err)
        assert err.strip().splitlines()[-1] == "interrupted: nothing was written", err
        assert not out.exists() and not Path(f"{out}.tar.gz").exists()
        left = list(out.parent.iterdir()) if out.parent.exists() else []
        assert not left, left


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_e_sig_sigterm_during_a_build_exits_143_in_one_line_and_leaves_no_lock(
        cnn_onnx, image_dir, tmp_path, sig, code):
    """E-SIG: SIGTERM used to kill the build by the signal, silently, leaving .NAME.lock files
    beside -o; it now ends as Ctrl-C does (every cleanup runs), with 143. SIGHUP (a closed
    terminal, hostile-cases-turn5 #11) did the same, and now ends the same way, with 129."""
    ended = 0
    for delay in (2.0, 4.0, 6.0):   # past the imports: the command (and its lock) is running
        out = tmp_path / f"term{delay}" / "b"
        p = subprocess.Popen(EDGEPACK + ["build", str(cnn_onnx), "--calib", str(image_dir),
                                         "--preprocess", PREP_TEXT, "-o", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
        assert "Traceback" not in err and "unexpected" not in err, (delay, err)
        left = sorted(x.name for x in out.parent.iterdir()) if out.parent.exists() else []
        if p.returncode == 0:   # the build was done before the signal: whole and consistent
            assert (out / "manifest.json").is_file() and not any(".lock" in n for n in left)
            continue
        ended += 1
        assert p.returncode == code, (delay, p.returncode, err)
        assert err.strip().splitlines()[-1] == "terminated: nothing was written", err
        assert not left, left
    assert ended   # at least one signal landed mid-build


def test_e_sig_a_signal_after_the_outcome_is_decided_cannot_change_the_exit(tmp_path):
    """CI found a SIGHUP landing after a build's last line killing the program by the signal
    (exit -1, the bundle whole): once the outcome is printed, SIGINT, SIGTERM and SIGHUP are
    all ignored, as SIGTERM already was."""
    code = ("import signal, sys\n"
            "sys.argv[0] = 'edgepack'\n"
            "from packager.cli import main\n"
            "try:\n"
            "    main(['targets'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print([signal.getsignal(s) is signal.SIG_IGN\n"
            "       for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.stdout.strip().splitlines()[-1] == "[True, True, True]", (r.stdout, r.stderr)


def test_e107_importing_packager_elsewhere_leaves_sigint_alone():
    """The early Ctrl-C handler is edgepack's own: a process that imports the library keeps
    Python's KeyboardInterrupt."""
    r = subprocess.run([sys.executable, "-c", "import signal, packager; print(signal.getsignal("
                        "signal.SIGINT) is signal.default_int_handler)"], capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == "True", r.stderr


# --------------------------------------------------------------------------- one run per -o


def test_e118_a_second_run_to_a_locked_output_fails_at_once(cnn_onnx, image_dir, tmp_path):
    out = tmp_path / "same" / "b"
    out.parent.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\n"
         "f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX)\n"
         "print('held', flush=True); time.sleep(60)", str(out.parent / ".b.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        r = CliRunner().invoke(main, ["build", str(cnn_onnx), "--calib", str(image_dir),
                                      "--preprocess", PREP_TEXT, "-o", str(out)])
        assert f"another edgepack run is writing -o {out}" in one_line_error(r)
        assert time.monotonic() - started < 10
        assert not out.exists() and not Path(f"{out}.tar.gz").exists()
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_e118_e119_two_concurrent_builds_one_wins_and_its_digest_is_on_disk(cnn_onnx,
                                                                            image_dir, tmp_path):
    out = tmp_path / "same" / "b"
    runs = [subprocess.Popen(EDGEPACK + ["build", str(cnn_onnx), "--calib", str(image_dir),
                                         "--preprocess", PREP_TEXT, "--golden", str(golden),
                                         "-o", str(out), "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for golden in (4, 8)]
    results = [(p, *p.communicate(timeout=180)) for p in runs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [(p.returncode, err) for p, _, err in results]
    winner = next(json.loads(o) for p, o, _ in results if p.returncode == 0)
    loser = next(e for p, _, e in results if p.returncode == 2)
    assert "another edgepack run is writing" in loser or "already exists" in loser, loser
    import hashlib

    assert winner["digest"] == "sha256:" + hashlib.sha256(
        (out / "manifest.json").read_bytes()).hexdigest()
    assert not list(out.parent.glob(".*"))   # no lock file, no temporaries left


def test_e118_publish_never_replaces_an_output_that_appeared_without_force(tmp_path):
    directory, archive = tmp_path / "b", tmp_path / "b.tar.gz"
    with pytest.raises(BundleError, match="appeared while this run wrote it"):
        with atomic_pair(directory, archive) as (tmp_dir, tmp_file):
            (tmp_dir / "manifest.json").write_text("{}")
            directory.mkdir()   # what another writer (not edgepack) put there meanwhile
            (directory / "theirs").write_text("kept")
    assert (directory / "theirs").read_text() == "kept" and not archive.exists()
    with output_lock(directory):   # released: a later run can take it
        pass


# --------------------------------------------------------------------------- temporaries


def test_builds_and_inspect_leave_the_current_folder_unchanged(cnn_onnx, image_dir, tmp_path):
    """Symbolic shape inference that cannot finish (a QOperator model's com.microsoft ops)
    saves sym_shape_infer_temp.onnx and a <uuid> data file into the current folder. (Building
    that model also used to fail: its output lost its shape in fix-shapes.)"""
    work = tmp_path / "cwd"
    work.mkdir()
    static, q = tmp_path / "static.onnx", tmp_path / "qo.onnx"
    r = run(["fix-shapes", cnn_onnx, "--input", "image:1x3x32x32", "-o", static], cwd=work)
    assert r.returncode == 0, r.stderr
    r = run(["quantize", static, "--calib", image_dir, "--preprocess", PREP_TEXT,
             "--format", "qoperator", "-o", q], cwd=work)
    assert r.returncode == 0, r.stderr
    r = run(["inspect", q], cwd=work)
    assert r.returncode == 0, r.stderr
    r = run(["build", q, "--calib", image_dir, "--preprocess", PREP_TEXT,   # already INT8
             "-o", tmp_path / "b"], cwd=work)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "b" / "manifest.json").is_file()
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("option", ["task", "labels", "task-file"])
@pytest.mark.parametrize("special", ["dev-zero", "fifo", "huge"])
def test_n_task_10_n_pipe_10_at_files_are_regular_files_under_a_cap(tmp_path, option, special):
    """N-TASK-10 (N-PIPE-10 in test_cascade): `classify:labels=@/dev/zero` (and a FIFO, and a
    file over the cap) read for ever; now one line naming the option, as --hosts and --const
    do."""
    from packager.cli.base import read_labels
    from packager.errors import SpecError
    from packager.tasks.declare import parse_task

    name = tmp_path / ("task.toml" if option == "task-file" else "list.txt")
    if special == "dev-zero":
        name.symlink_to("/dev/zero")
    elif special == "fifo":
        os.mkfifo(name)
    else:
        with open(name, "wb") as f:
            f.truncate(20 << 20)   # sparse: 20 MB of zeros
    start = time.monotonic()
    with pytest.raises(SpecError) as info:
        if option == "task":
            parse_task(f"classify:labels=@{name}")
        elif option == "labels":
            read_labels(name)
        else:
            parse_task(str(name))
    message = str(info.value)
    assert time.monotonic() - start < 10 and "\n" not in message
    assert ("not a regular file" in message if special != "huge" else "larger than" in message)
    assert ("--labels" in message if option == "labels" else "--task" in message)


def test_a_class_folder_named_in_bytes_that_are_not_utf8_is_refused_before_the_build(
        cnn_onnx, tmp_path):
    """hostile-cases-turn5 #4: a class folder named b'0\\xff\\xfe' reached the page, whose
    writer encoded strictly: exit 3 after the bundle was published (and report, verify and
    deploy exit 3 after it). The folder is refused in one line before anything is written;
    reports never fail on text they cannot encode."""
    import shutil

    from conftest import write_images

    cal = tmp_path / "cal"
    for i, name in enumerate([b"0\xff\xfe", b"1ok", b"2ok", b"3ok"]):
        folder = os.fsencode(cal) + b"/" + name
        os.makedirs(folder)
        for src in write_images(tmp_path / f"src{i}", 4, seed=i).iterdir():
            shutil.copy(src, os.fsdecode(folder) + "/" + src.name)
    out = tmp_path / "pg03"
    r = CliRunner().invoke(main, ["build", str(cnn_onnx), "--calib", str(cal), "--preprocess",
                                  PREP_TEXT, "--precision", "fp32", "--task", "classify",
                                  "-o", str(out)])
    line = one_line_error(r)
    assert r.exit_code == 2 and "class folder '0\ufffd\ufffd'" in line and "UTF-8" in line, \
        r.output
    assert not out.exists() and not Path(f"{out}.tar.gz").exists()
    from packager.device.reports import write_files

    write_files(tmp_path, ["r"], {"x.html": "name \udcff\udcfe"})   # replaced, not a crash
    assert (tmp_path / "r" / "x.html").read_bytes() == b"name ??"
