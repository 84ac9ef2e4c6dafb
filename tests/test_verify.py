import json
import shutil

import pytest

from packager.errors import VerifyError
from packager.verify import verify


def test_verify_passes_and_writes_reports(built):
    report = verify(built.bundle.directory, runs=20, warmup=2)
    assert report["passed"], report["checks"]
    names = [c["name"] for c in report["checks"]]
    assert names == ["integrity", "accuracy:scores", "latency"]
    assert report["providers"] == ["CPUExecutionProvider"]
    assert report["bench"]["parts"]["model"]["latency_ms"]["p50"] > 0
    reports = built.bundle.directory / "reports"
    assert json.loads((reports / "report.json").read_text())["passed"] is True
    md = (reports / "report.md").read_text()
    assert "PASSED" in md and "| model | batch | p50 ms |" in md


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
