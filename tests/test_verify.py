import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from packager.device.verify import verify
from packager.errors import BundleError


def test_verify_passes_and_writes_reports(built):
    report = verify(built.bundle.directory, runs=20, warmup=2)
    assert report["passed"], report["checks"]
    names = [c["name"] for c in report["checks"]]
    assert names == ["integrity", "reproduce:scores", "accuracy:scores", "latency"]
    reproduce, accuracy = report["checks"][1:3]
    assert "vs the host's outputs of the shipped model" in reproduce["detail"]
    assert "vs the FP32 reference (the device's floor: " in accuracy["detail"]
    assert report["providers"] == ["CPUExecutionProvider"]
    assert report["bench"]["parts"]["model"]["latency_ms"]["p50"] > 0
    reports = built.bundle.directory / "reports"
    assert json.loads((reports / "report.json").read_text())["passed"] is True
    md = (reports / "report.md").read_text()
    assert "PASSED" in md and "| model | batch | p50 ms | p10-p90 ms |" in md
    assert "others' CPU | noisy |" in md   # how busy the machine was, as run.py bench says
    assert "| reproduce:scores | pass | cosine min 1.00000 >= 0.9" in md


def test_budget_miss_fails(built, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    report = verify(bundle, runs=5, warmup=1, latency_budget_ms=1e-6)
    assert not report["passed"]
    assert [c["name"] for c in report["checks"] if not c["passed"]] == ["latency"]
    miss = next(c for c in report["checks"] if c["name"] == "latency")
    assert " ms > budget 1e-06 ms" in miss["detail"]   # says the miss, not "<="


def test_missing_golden_file_fails_integrity(built, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    (bundle / "golden" / "model.outputs.npz").unlink()
    report = verify(bundle, runs=5)
    assert not report["passed"]
    assert "golden/model.outputs.npz: missing" in report["checks"][0]["detail"]


def test_broken_bundle_is_a_verify_error(tmp_path):
    with pytest.raises(Exception, match="no manifest.json"):
        verify(tmp_path)
    with pytest.raises(BundleError, match="nope: no such bundle folder"):
        verify(tmp_path / "nope")
    (tmp_path / "net.tar.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(BundleError, match=r"net.tar.gz: a file, not a bundle folder \(the "
                                          r"archive\); pass the folder beside it"):
        verify(tmp_path / "net.tar.gz")
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(json.dumps({"schema_version": 2, "name": "x"}))
    # a manifest without the fields the runner reads is unreadable, as on the device (exit 2)
    with pytest.raises(BundleError, match=r"manifest.json: \S+ is (missing|not an? \w+); "
                                          r"rebuild the bundle with edgepack$") as exc:
        verify(bundle)
    assert exc.value.exit_code == 2 and not (bundle / "reports").exists()


def copy_of(built, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    return bundle


def test_a_replaced_run_py_never_runs_on_the_host(built, tmp_path):
    bundle = copy_of(built, tmp_path)
    marker = tmp_path / "ran"
    (bundle / "run.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    report = verify(bundle, runs=3)
    assert not report["passed"] and not marker.exists()
    assert report["checks"] == [{"name": "integrity", "passed": False, "detail":
                                 "run.py: sha256 mismatch (file changed or truncated in transfer)"
                                 "; nothing from the bundle was run"}]
    r = subprocess.run([sys.executable, "-m", "packager", "verify", str(bundle)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and not marker.exists() and "Traceback" not in r.stderr


def test_a_stray_module_beside_run_py_is_refused(built, tmp_path):
    bundle = copy_of(built, tmp_path)
    (bundle / "numpy.py").write_text("raise SystemExit('imported')\n")   # python3 run.py would
    report = verify(bundle, runs=3)
    assert not report["passed"]
    assert report["checks"][0]["detail"].startswith(
        "numpy.py: not part of the bundle, and Python would import it before run.py's own")


@pytest.mark.parametrize("plant, problem", [
    ("numpy/__init__.pyc", "numpy: not part of the bundle, and Python"),
    ("numpy.abi3.so", "numpy.abi3.so: not part of the bundle, and Python would import it"),
    ("runner/__pycache__/cli.cpython-311.pyc", "runner/__pycache__: not part of the runner"),
    ("runner/manifest.cpython-311-x86_64-linux-gnu.so",
     "runner/manifest.cpython-311-x86_64-linux-gnu.so: not part of the runner"),
    ("runner/extra.py", "runner/extra.py: not part of the runner"),
])
def test_planted_code_is_refused_and_never_runs(built, tmp_path, plant, problem):
    """Compiled and package forms beside run.py, and anything in the runner's own folder: the
    host refuses the bundle before running it; the device's run.py refuses before importing."""
    bundle = copy_of(built, tmp_path)
    (bundle / plant).parent.mkdir(parents=True, exist_ok=True)
    (bundle / plant).write_bytes(b"raise SystemExit('imported')\n")
    report = verify(bundle, runs=3)
    assert not report["passed"] and problem in report["checks"][0]["detail"]
    for python in ([sys.executable, "-I"], [sys.executable]):   # with and without -I
        check = subprocess.run([*python, "run.py", "check"], cwd=bundle, capture_output=True,
                               text=True)
        assert check.returncode in (1, 2) and "imported" not in check.stdout + check.stderr
        assert problem.split(":")[0] in check.stdout + check.stderr, check.stdout + check.stderr
        assert "Traceback" not in check.stderr


@pytest.mark.parametrize("edit, problem", [
    (lambda m: m.update(files={}), "manifest: run.py is not in its file table"),
    (lambda m: m["parts"][0]["golden"].update(min_cosine=-1),
     "manifest: parts[0].golden.min_cosine = -1 is not a cosine floor in (0, 1]"),
    (lambda m: m["parts"][0]["model"].update(sha256="0" * 64),
     "manifest: parts[0].model.sha256 differs from the file table"),
    (lambda m: m["files"].update({"../outside": "0" * 64}),
     "manifest: file table entry '../outside' points outside the bundle"),
])
def test_manifest_edits_fail_integrity_and_change_the_digest(built, tmp_path, edit, problem):
    from packager.device.verify import bundle_digest

    bundle = copy_of(built, tmp_path)
    before = bundle_digest(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    report = verify(bundle, runs=3)
    assert not report["passed"] and problem in report["checks"][0]["detail"]
    check = subprocess.run([sys.executable, "-I", "run.py", "check"], cwd=bundle,
                           capture_output=True, text=True)   # the device's own check agrees
    assert check.returncode == 1 and problem in check.stdout
    assert bundle_digest(bundle) != before


def test_expect_digest_holds_verify_to_the_built_bundle(built, tmp_path):
    from packager.device.verify import bundle_digest

    bundle = copy_of(built, tmp_path)
    digest = built.bundle.digest
    assert digest == bundle_digest(bundle) and digest.startswith("sha256:")
    assert verify(bundle, runs=3, expect_digest=digest)["passed"]
    assert verify(bundle, runs=3, expect_digest=digest[7:])["digest"] == digest
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["name"] = "renamed"     # a consistent edit: only the digest tells
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    report = verify(bundle, runs=3, expect_digest=digest)
    assert not report["passed"]
    assert report["checks"][0]["detail"].startswith(
        f"manifest.json: digest {bundle_digest(bundle)} is not the expected {digest}")


def test_reproduction_failure_is_its_own_check(built, tmp_path):

    import numpy as np
    from test_runner import turned

    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    shipped = bundle / "golden" / "model.shipped.npz"
    np.savez(shipped, scores=turned(np.load(shipped)["scores"], 0.95))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["golden/model.shipped.npz"] = hashlib.sha256(shipped.read_bytes()).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    report = verify(bundle, runs=3, warmup=1)
    failed = [c for c in report["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["reproduce:scores"]
    assert failed[0]["detail"].endswith("a kernel computes differently on this device")
    assert "| reproduce:scores | FAIL |" in (bundle / "reports" / "report.md").read_text()


def test_older_bundle_says_reproduction_was_not_checked(built, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    (bundle / manifest["parts"][0]["golden"].pop("shipped")).unlink()
    del manifest["files"]["golden/model.shipped.npz"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    report = verify(bundle, runs=3, warmup=1)
    assert report["passed"], report["checks"]
    rep = next(c for c in report["checks"] if c["name"] == "reproduce:scores")
    assert rep["skipped"] and rep["detail"].startswith("not checked: the bundle has no host")
    assert "| reproduce:scores | not checked |" in (bundle / "reports" / "report.md").read_text()


LEGACY_RUNNER = Path(__file__).parent / "legacy" / "run_py_before_the_split.py.txt"


def test_a_bundle_from_before_the_runner_split_still_verifies(built, tmp_path):
    """Bundles built before the runner became run.py + runner/ hold the whole runner in run.py
    (tests/legacy keeps that run.py as it shipped, edgepack c5320e3): the host's integrity
    check asks them for run.py alone, and their own run.py still checks them on the device."""
    bundle = copy_of(built, tmp_path)
    shutil.rmtree(bundle / "runner")
    shutil.copyfile(LEGACY_RUNNER, bundle / "run.py")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"] = {rel: digest for rel, digest in manifest["files"].items()
                         if not rel.startswith("runner/")}
    manifest["files"]["run.py"] = hashlib.sha256((bundle / "run.py").read_bytes()).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2))
    report = verify(bundle, runs=3)
    assert report["passed"], report["checks"]
    check = subprocess.run([sys.executable, "-I", "run.py", "check"], cwd=bundle,
                           capture_output=True, text=True)
    assert check.returncode == 0 and "check passed" in check.stdout, check.stdout + check.stderr
    # the package form is required once a bundle ships it: a lost module is not an old layout
    shutil.copytree(built.bundle.directory, tmp_path / "new")
    (tmp_path / "new" / "runner" / "serve.py").unlink()
    report = verify(tmp_path / "new", runs=3)
    assert not report["passed"] and "runner/serve.py: missing" in report["checks"][0]["detail"]


def test_an_unlisted_optional_module_planted_in_a_lean_bundle_never_runs(tmp_path, cnn_onnx,
                                                                        image_dir):
    """hostile-cases-turn5 #2 (security): in a bundle built with --runner-extras none, a
    runner/serve.py planted by hand ran while run.py parsed its arguments, before `check`'s
    integrity check. run.py now admits only the runner files the manifest's file table lists,
    before importing anything; and where it cannot read that table, the parser imports no
    optional module."""
    from conftest import PREP
    from packager.build.job import build

    out = tmp_path / "none"
    build(cnn_onnx, out, target="x86_64-cpu", calib=image_dir, preprocess=PREP,
          quant={"precision": "fp32"}, runner_extras=())
    marker = tmp_path / "marker"
    (out / "runner" / "serve.py").write_text(f"open({str(marker)!r}, 'w')\n")
    for command in ("check", "bench", "infer", "serve"):
        r = subprocess.run([sys.executable, str(out / "run.py"), command, "x.npy"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode in (1, 2) and not marker.exists(), (command, r.stderr)
        assert "runner/serve.py: not part of the runner (the manifest's file table does not " \
            "list it)" in r.stderr, r.stderr
    (out / "manifest.json").write_text("{damaged")   # the table unreadable: still never run
    r = subprocess.run([sys.executable, str(out / "run.py"), "serve", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and not marker.exists() and "manifest" in r.stderr, r.stderr


def test_a_lean_bundle_says_what_it_lacks_in_help_and_tune_is_refused_before_a_device(
        tmp_path, cnn_onnx, image_dir):
    """hostile-cases-turn5 #17: run.py --help, infer --help and serve --help in a bundle built
    without those extras described them as available. #14: deploy --tune of a bundle built
    without `tune` copied it to the device first, then failed there; it is refused before any
    device is contacted (verify --tune too)."""
    from click.testing import CliRunner

    from conftest import PREP
    from packager.build.job import build
    from packager.cli import main

    out = tmp_path / "lean"
    build(cnn_onnx, out, target="x86_64-cpu", calib=image_dir, preprocess=PREP,
          quant={"precision": "fp32"}, runner_extras=("infer",))
    said = subprocess.run([sys.executable, str(out / "run.py"), "--help"], capture_output=True,
                          text=True, timeout=60).stdout
    said = " ".join(said.split())
    assert "GET /metadata) (not in this bundle: built without `serve`" in said, said
    assert said.count("not in this bundle") == 1, said   # infer is in it, check always
    bench = subprocess.run([sys.executable, str(out / "run.py"), "bench", "--help"],
                           capture_output=True, text=True, timeout=60).stdout
    assert " ".join(bench.split()).count("not in this bundle: built without") == 3, bench
    r = CliRunner().invoke(main, ["verify", str(out), "--tune"])
    assert r.exit_code == 2 and "built without `tune`" in r.output, r.output
    assert not (out / "reports" / "report.json").exists()
    hosts = tmp_path / "hosts.ini"
    hosts.write_text("d4 ansible_host=127.0.0.1 ansible_port=1 ansible_user=nobody\n")
    r = CliRunner().invoke(main, ["deploy", str(out), "--hosts", str(hosts), "--tune"])
    assert r.exit_code == 2 and "built without `tune`" in r.output, r.output
    assert "127.0.0.1" not in r.output and "d4" not in r.output   # no device was contacted


def test_one_verdict_in_the_same_words_wherever_it_is_said():
    """issue 46 item 4: the page said 'not proven' while verify, deploy and status said 'pass'
    (8 golden samples can never show a 99 % keep). Every surface now says the verdict verify
    gives: 'passed on 8 samples; 100 show 99%'."""
    from packager.device.releases import describe
    from packager.device.rollout import HostResult
    from packager.device.verify import render_markdown, verdict

    thin = {"name": "task:classify", "passed": True, "proven": False,
            "detail": "expected top-1 drop under FP32's probabilities 0% over 8 samples (needs "
                      "at most 1%; 8 samples cannot show 1%: 100 needed)"}
    ok = {"name": "integrity", "passed": True, "detail": "all file hashes match"}
    said = verdict([ok, thin])
    assert said == "passed on 8 samples; 100 show 1%"
    assert verdict([ok]) == "passed" and verdict([ok, {**thin, "passed": False}]) == "failed"
    assert verdict([ok, {**thin, "detail": "no words"}]) == \
        "passed on too few samples to show its budget"
    report = {"bundle": "b", "target": "x86_64-cpu", "passed": True, "verdict": said,
              "precision": "FP32", "providers": ["CPUExecutionProvider"], "checks": [ok, thin],
              "bench": {}, "check": {}}
    assert "**PASSED** on 8 samples; 100 show 1%" in render_markdown(report)
    host = HostResult(host="pi", exit_code=0, report=report)
    assert host.status == "pass" and host.verdict == said and host.to_dict()["verdict"] == said
    assert HostResult(host="pi", exit_code=2, error="down").verdict == "error"
    from datetime import UTC, datetime

    release = {"id": "abc", "present": True, "name": "b",
               "check": {"passed": True, "by": "deploy", "verdict": said}}
    assert f"by deploy: {said}" in describe(release, datetime.now(UTC))
    old = {**release, "check": {"passed": True, "by": "deploy"}}   # a record from before
    assert "by deploy: passed" in describe(old, datetime.now(UTC))
