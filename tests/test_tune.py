"""Session tuning: run.py bench --tune on the device, edgepack build/verify --tune.

Real sessions on the tiny CNN's INT8 bundle. The settings that win depend on the machine, so the
tests check what was tried, that what is kept is what was measured, and where it is used; the
one forced win is a manifest that asks for no graph optimisation on a QDQ model (its Q/DQ pairs
then run as separate float ops, several times slower than the fused integer kernels).
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from conftest import PREP, run_py
from packager._runtimes.runner.manifest import manifest_digest
from packager._runtimes.runner.sessions import TUNED
from packager._runtimes.runner.tuned import TUNE_MARGIN
from packager._runtimes.runner.tuning import tune_threads
from packager.build.job import build

TUNED = TUNED


def copy_with_session(built, tmp_path, session):
    """The built bundle with other session options in its manifest (not in its file table)."""
    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["session"] = session
    path.write_text(json.dumps(manifest, indent=2))
    return bundle


def bench_json(bundle, *args):
    proc = run_py(bundle, "bench", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def slow_session(built, tmp_path_factory):
    """A bundle told to run unoptimised on one thread, tuned once."""
    bundle = copy_with_session(built, tmp_path_factory.mktemp("tune"),
                               {"intra_op_threads": 1, "graph_optimization_level": "disabled"})
    report, _ = bench_json(bundle, "--tune", "--runs", "20", "--warmup", "3")
    return bundle, report


def test_tune_tries_threads_levels_and_modes_and_keeps_the_fastest(slow_session):
    bundle, report = slow_session
    tuning = report["tuning"]
    if tuning["noisy"]:
        pytest.skip(f"the machine was busy while tuning: {tuning['reason']}")
    tried = tuning["tried"]
    threads = {t["session"]["intra_op_threads"] for t in tried if t["stage"] == "threads"}
    assert threads == set(tune_threads(os.cpu_count()))
    levels = {t["session"]["graph_optimization_level"] for t in tried
              if t["stage"] == "optimisation level"}
    assert levels == {"basic", "extended", "all"}
    assert all(t["p50_ms"] > 0 for t in tried)
    if os.cpu_count() > 1:
        assert any(t["session"]["execution_mode"] == "parallel" for t in tried)
    # unoptimised QDQ loses to any level that fuses Q/DQ into integer kernels
    assert tuning["current"]["graph_optimization_level"] == "disabled"
    assert tuning["chosen"]["graph_optimization_level"] != "disabled"
    fastest = min(tried, key=lambda t: t["p50_ms"])["session"]
    assert tuning["chosen"] == fastest == tuning["winner"]
    assert tuning["speedup"] >= 1 + TUNE_MARGIN
    assert tuning["saved"] == TUNED
    # the bench that follows runs the chosen settings
    assert report["session"] == tuning["chosen"]
    assert TUNED in report["session_from"]


def test_the_tuned_settings_are_what_the_device_uses_next(slow_session):
    bundle, report = slow_session
    if report["tuning"]["noisy"]:
        pytest.skip(f"the machine was busy while tuning: {report['tuning']['reason']}")
    saved = json.loads((bundle / TUNED).read_text())
    assert saved["session"] == report["tuning"]["chosen"]
    assert saved["manifest"] == manifest_digest(str(bundle))
    assert saved["tried"] == report["tuning"]["tried"]
    proc = run_py(bundle, "check", "--json")
    assert proc.returncode == 0, proc.stderr
    check = json.loads(proc.stdout)
    assert check["session"] == saved["session"] and TUNED in check["session_from"]
    # the command line still wins over the tuned file
    again, _ = bench_json(bundle, "--runs", "3", "--threads", "1")
    assert again["session"]["intra_op_threads"] == 1
    assert again["session_from"] == "the command line"


def test_tuning_on_a_busy_machine_keeps_the_current_settings_and_says_why(built, tmp_path):
    """Other processes on every core while tuning: the timings cannot be trusted, so the
    current settings stay (even against a clear winner) and the table says why."""
    bundle = copy_with_session(built, tmp_path, {"intra_op_threads": 1,
                                                 "graph_optimization_level": "disabled"})
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(os.cpu_count() or 1)]
    try:
        report, _ = bench_json(bundle, "--tune", "--no-save", "--runs", "20", "--warmup", "3")
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    tuning = report["tuning"]
    assert tuning["load"]["other_share"] > 0.25, tuning["load"]
    assert tuning["noisy"] and tuning["chosen"] == tuning["current"]
    assert tuning["reason"].startswith("the machine was busy while tuning (other processes "
                                       "used") or tuning["reason"] == \
        "the current settings are the fastest tried", tuning["reason"]
    assert not (bundle / TUNED).exists()


def test_a_tuned_file_from_another_bundle_version_is_ignored(built, tmp_path):
    """A tuned file written for this bundle (by hand: a tuning on a busy machine saves none, and
    this test failed there where its siblings skip), then the manifest changed: ignored."""
    import onnxruntime

    bundle = copy_with_session(built, tmp_path, {"intra_op_threads": 1,
                                                 "graph_optimization_level": "disabled"})
    (bundle / TUNED).write_text(json.dumps({
        "manifest": manifest_digest(str(bundle)), "onnxruntime": onnxruntime.__version__,
        "cores": os.cpu_count(),
        "session": {"intra_op_threads": 2, "graph_optimization_level": "all"}}))
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["name"] = "renamed"   # a new manifest: another digest
    path.write_text(json.dumps(manifest))
    report, stderr = bench_json(bundle, "--runs", "3")
    assert report["session_from"] == "the manifest"
    assert report["session"]["graph_optimization_level"] == "disabled"
    assert f"{TUNED} was tuned for another version of this bundle; ignored" in stderr


@pytest.mark.parametrize("content, says", [
    ("{not json", "session.tuned.json: "),
    ('{"manifest": "sha256:%s", "onnxruntime": "1", "cores": 2, "session": {"intra_op_threads": -1}}',
     "session.intra_op_threads must be a thread count"),
    ('{"manifest": "sha256:%s", "onnxruntime": "1", "cores": 2, "session": {"turbo": true}}',
     "turbo"),
])
def test_a_damaged_tuned_file_is_one_line_naming_it(built, tmp_path, content, says):
    bundle = copy_with_session(built, tmp_path, {})
    (bundle / TUNED).write_text(content.replace("%s", "0" * 64))
    proc = run_py(bundle, "check")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "bench --tune" in lines[0]


def test_no_save_writes_nothing_and_tune_refuses_fixed_options(built, tmp_path):
    bundle = copy_with_session(built, tmp_path, {"graph_optimization_level": "disabled"})
    report, _ = bench_json(bundle, "--tune", "--no-save", "--runs", "5", "--warmup", "1")
    assert report["tuning"]["saved"] is None and not (bundle / TUNED).exists()
    assert report["session"] == report["tuning"]["chosen"]
    proc = run_py(bundle, "bench", "--tune", "--threads", "2")
    assert proc.returncode == 2 and "--tune tries the session options itself" in proc.stderr
    proc = run_py(bundle, "bench", "--no-save")
    assert proc.returncode == 2 and "--no-save goes with --tune" in proc.stderr


def test_build_tune_writes_what_it_measured_into_the_manifest(cnn_onnx, image_dir, tmp_path):
    out = tmp_path / "tuned"
    r = build(cnn_onnx, out, target="x86_64-cpu", calib=image_dir, preprocess=PREP,
              quant={"precision": "int8"}, tune=_local_tuner())
    manifest = json.loads((out / "manifest.json").read_text())
    tuning = manifest["tuning"]
    assert manifest["session"] == tuning["chosen"]
    assert tuning["measured_on"] == "this machine" and tuning["tried"]
    assert tuning["chosen"] in [t["session"] for t in tuning["tried"]] + [tuning["current"]]
    assert tuning["onnxruntime"] and tuning["device"]["cores"] == os.cpu_count()
    # the staged run left nothing behind, and the bundle is intact with its new manifest
    assert not (out / TUNED).exists()
    with tarfile.open(r.bundle.archive) as tar:
        assert not [n for n in tar.getnames() if n.endswith(TUNED)]
    assert run_py(out, "check").returncode == 0


def _local_tuner():
    from packager.device.tuning import local_tuner

    return local_tuner(runs=5, warmup=1)


def test_cli_build_tune_for_another_arch_says_to_tune_on_the_device(cnn_onnx, image_dir,
                                                                    tmp_path):
    out = tmp_path / "rpi"
    proc = subprocess.run([sys.executable, "-m", "packager", "build", str(cnn_onnx), "-o",
                           str(out), "--target", "rpi", "--calib", str(image_dir), "--tune"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--tune: rpi is aarch64" in lines[0] and "--time-on" in lines[0]
    assert not out.exists()


def test_verify_tune_reports_the_table(built, tmp_path):
    from packager.device.verify import render_markdown, verify

    bundle = copy_with_session(built, tmp_path, {"graph_optimization_level": "disabled",
                                                 "intra_op_threads": 1})
    report = verify(bundle, runs=10, warmup=2, tune=True)
    assert report["passed"]
    tuning = report["tuning"]
    if tuning["noisy"]:   # (it failed there, where its siblings skip: issue 46 item 3)
        pytest.skip(f"the machine was busy while tuning: {tuning['reason']}")
    assert tuning["chosen"]["graph_optimization_level"] != "disabled"
    assert report["bench"]["session"] == tuning["chosen"]
    text = render_markdown(report)
    assert "## Session tuning" in text and "| threads | inter-op |" in text
    assert f"from {TUNED}, tuned on this device" in text
