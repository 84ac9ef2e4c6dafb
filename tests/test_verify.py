import json
import shutil

import pytest

from packager.errors import VerifyError
from packager.verify import verify


def test_verify_passes_and_writes_reports(built):
    report = verify(built.bundle.directory, runs=20, warmup=2)
    assert report["passed"], report["checks"]
    names = [c["name"] for c in report["checks"]]
    assert names == ["integrity", "reproduce:scores", "accuracy:scores", "latency"]
    reproduce, accuracy = report["checks"][1:3]
    assert "vs the host's outputs of the shipped model" in reproduce["detail"]
    assert "vs the FP32 reference (budget)" in accuracy["detail"]
    assert report["providers"] == ["CPUExecutionProvider"]
    assert report["bench"]["parts"]["model"]["latency_ms"]["p50"] > 0
    reports = built.bundle.directory / "reports"
    assert json.loads((reports / "report.json").read_text())["passed"] is True
    md = (reports / "report.md").read_text()
    assert "PASSED" in md and "| model | batch | p50 ms |" in md
    assert "| reproduce:scores | pass | cosine min 1.00000 >= 0.9" in md


def test_budget_miss_fails(built, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    report = verify(bundle, runs=5, warmup=1, latency_budget_ms=1e-6)
    assert not report["passed"]
    assert [c["name"] for c in report["checks"] if not c["passed"]] == ["latency"]


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
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(json.dumps({"schema_version": 2, "name": "x"}))
    with pytest.raises(VerifyError, match="run.py check failed"):
        verify(bundle)


def test_reproduction_failure_is_its_own_check(built, tmp_path):
    import hashlib

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
