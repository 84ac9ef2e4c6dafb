"""Hostile cases for verify's reports, the manifest's shape and name, --expect-digest and build
--tune's device answer (hostile-cases.md items 2, 7, 12, 15, 28).

Real parts only: the tiny CNN's bundle verified by its own run.py in a separate process, the
`edgepack` CLI in a subprocess, a real tmpfs filled to the last byte, and a "device" Python
that is a shell script answering `run.py bench --tune` with whatever a lying device would say.
Each test names the case ids it proves.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PREP
from packager.bundle.manifest import name_problem, read_manifest, safe_name
from packager.device.verify import parse_digest, verify, write_reports
from packager.errors import BundleError, VerifyError

TIMEOUT = 120


def edgepack(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packager", *args], capture_output=True,
                          text=True, timeout=TIMEOUT)


def one_line(proc: subprocess.CompletedProcess) -> str:
    """The CLI's single error line (and proof that nothing else, no traceback, was printed)."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture
def bundle(built, tmp_path) -> Path:
    copy = tmp_path / "b"
    shutil.copytree(built.bundle.directory, copy, ignore=shutil.ignore_patterns("reports"))
    return copy


def edit_manifest(bundle: Path, edit) -> None:
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest, indent=2))


# -- item 2: reports never go through a link (B05, B06, B07) -----------------------------------

def test_b05_a_refused_bundle_replaces_a_planted_report_link_and_spares_its_target(
        built, bundle, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (bundle / "reports").mkdir()
    (bundle / "reports" / "report.json").symlink_to(victim)
    (bundle / "reports" / "report.md").symlink_to(victim)
    with open(bundle / "model.onnx", "ab") as f:   # tampered: refused, nothing of it runs
        f.write(b"x")
    proc = edgepack("verify", str(bundle), "--expect-digest", built.bundle.digest)
    assert proc.returncode == 1, proc.stderr
    assert victim.read_text() == "precious\n"
    report = bundle / "reports" / "report.json"
    assert not report.is_symlink() and not (bundle / "reports" / "report.md").is_symlink()
    data = json.loads(report.read_text())        # the user still gets the refusal's report
    assert data["passed"] is False and "model.onnx: sha256 mismatch" in data["checks"][0]["detail"]
    # the report and the bundle's page (which shows the refusal), nothing else
    assert sorted(p.name for p in (bundle / "reports").iterdir()) == \
        ["index.html", "index.json", "report.json", "report.md"]


@pytest.mark.parametrize("plant", ["link", "file"])
def test_b06_a_reports_folder_that_is_a_link_or_a_file_is_refused_before_anything_runs(
        built, bundle, tmp_path, plant):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "report.md").write_text("mine\n")
    if plant == "link":
        (bundle / "reports").symlink_to(elsewhere)
    else:
        (bundle / "reports").write_text("not a folder\n")
    proc = edgepack("verify", str(bundle), "--expect-digest", "sha256:" + "0" * 64)
    assert proc.returncode == 2
    line = one_line(proc)
    assert f"{bundle / 'reports'}: " in line
    assert ("is a symbolic link" in line and f"rm {bundle / 'reports'}" in line
            if plant == "link" else "exists and is not a folder" in line)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["report.md"]
    assert (elsewhere / "report.md").read_text() == "mine\n"


def test_b07_a30_host_report_folders_are_plain_names_and_never_links(tmp_path):
    """deploy writes reports/HOST (or ARCHIVE.reports/HOST) through write_reports."""
    report = {"bundle": "b", "target": "t", "precision": "int8", "passed": False,
              "providers": [], "checks": [{"name": "integrity", "passed": False, "detail": "x"}]}
    base = tmp_path / "b"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (base / "reports").mkdir(parents=True)
    (base / "reports" / "d1").symlink_to(elsewhere)
    with pytest.raises(BundleError, match=r"reports/d1: is a symbolic link"):
        write_reports(base / "reports" / "d1", report)
    with pytest.raises(BundleError, match=r"'\.\.' is not a single folder name"):
        write_reports(base / "reports" / "..", report)            # A30: host alias '..'
    for host in ("..", ".", "", "a/b", "../../x"):
        with pytest.raises(BundleError, match="is not a single folder name"):
            write_reports(base / "reports", report, host=host)
    (base / "reports" / "a").symlink_to(elsewhere)     # a label with a '/' passed as a path
    with pytest.raises(BundleError, match=r"'a/b' is not a single folder name"):
        write_reports(base / "reports" / "a" / "b", report)
    assert list(elsewhere.iterdir()) == [] and not (base / "report.json").exists()
    # the layouts deploy uses are written, and what is written is complete JSON
    for out in (base / "reports" / "d2", tmp_path / "b.reports" / "d1"):
        assert write_reports(out, report) == out
        assert json.loads((out / "report.json").read_text())["bundle"] == "b"
        assert "# Verification: b (t)" in (out / "report.md").read_text()
    assert write_reports(base / "reports", report, host="d3") == base / "reports" / "d3"
    # an existing report is replaced, not appended to or followed
    (base / "reports" / "d2" / "report.md").unlink()
    (base / "reports" / "d2" / "report.md").symlink_to(elsewhere / "planted.md")
    write_reports(base / "reports" / "d2", report)
    assert not (elsewhere / "planted.md").exists()
    assert not (base / "reports" / "d2" / "report.md").is_symlink()


# -- E95: a full filesystem -------------------------------------------------------------------

def test_e95_verify_on_a_full_filesystem_is_one_line_and_leaves_no_empty_report(bundle,
                                                                                tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()) + (1 << 20)
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        full = mnt / "b"
        shutil.copytree(bundle, full)
        (full / "reports").mkdir()
        (full / "reports" / "report.json").write_text('{"old": true}\n')
        with open(mnt / "filler", "wb", buffering=0) as f:   # fill it: at most `size` bytes
            try:
                for _ in range(size // 4096 + 2):
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        with pytest.raises(BundleError) as exc:
            verify(full, runs=2, warmup=0)
        assert exc.value.exit_code == 2
        assert f"{full / 'reports' / 'report.json'}: cannot be written (No space left" in str(
            exc.value)
        proc = edgepack("verify", str(full), "--runs", "2", "--warmup", "0")
        assert proc.returncode == 2
        assert str(full / "reports" / "report.json") in one_line(proc)
        # the old report is whole, and no empty or temporary file was left beside it
        assert (full / "reports" / "report.json").read_text() == '{"old": true}\n'
        assert sorted(p.name for p in (full / "reports").iterdir()) == ["report.json"]
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


# -- B37: the manifest's shape ----------------------------------------------------------------

@pytest.mark.parametrize("edit, field", [
    (lambda m: m.pop("target"), r"target is (missing|not an object)"),
    (lambda m: m.update(target="x86_64-cpu"), r"target is not an object"),
    (lambda m: m["target"].pop("name"), r"target\.name is (missing|not)"),
    (lambda m: m.pop("name"), r"name (is missing|None is not)"),
    (lambda m: m.update(name=7), r"name 7 is not"),
    (lambda m: m.update(parts=[]), r"parts is empty"),
    (lambda m: m["parts"][0]["precision"].update(decision=5), r"parts\[0\]\.precision\.decision"),
    (lambda m: m["parts"][0]["precision"].update(decision={
        "chosen": "int8", "reason": "r", "candidates": [{"precision": "int8"}]}),
     r"parts\[0\]\.precision\.decision"),
    (lambda m: m["budget"].update(latency_p90_ms="fast"), r"budget\.latency_p90_ms is not"),
])
def test_b37_a_manifest_missing_a_field_is_exit_2_naming_it_in_verify_and_deploy(
        bundle, edit, field):
    """The host's check names the field (the runner's shape check first, then what the host
    reads besides), in verify and in deploy, before anything is run or copied."""
    edit_manifest(bundle, edit)
    with pytest.raises(BundleError, match="manifest.json: " + field):
        read_manifest(bundle)
    for args in (["verify", str(bundle)],
                 ["deploy", str(bundle), "nobody@127.0.0.1", "--runs", "1"]):
        proc = edgepack(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        line = one_line(proc)
        assert re.search(field, line) and "rebuild the bundle" in line, line
    assert not (bundle / "reports").exists()


def test_b37_a_manifest_that_is_not_an_object_or_too_big_is_exit_2(bundle):
    (bundle / "manifest.json").write_text("[1, 2]")
    with pytest.raises(BundleError, match="not a JSON object"):
        read_manifest(bundle)
    (bundle / "manifest.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(BundleError, match="not valid JSON"):
        read_manifest(bundle)
    (bundle / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BundleError, match="not valid JSON|not a JSON object"):
        read_manifest(bundle)


# -- item 7: the bundle name is one safe path component (A54, A55, A56) ------------------------

def test_a54_a55_a56_names_are_one_safe_path_component():
    for good in ("cnn", "cnn-int8", "Model_2.v1", "a" * 100):
        assert name_problem(good) is None
    for bad in ("", ".", "..", "../../../tmp/x", "a/b", ".hidden", "-rf", "a b", "x\n",
                "a" * 101, None, 3):
        assert name_problem(bad), bad
    assert safe_name("my bundle (v2)") == "my-bundle-v2"
    assert safe_name("..") == "" and safe_name("../../etc") == "etc"


@pytest.mark.parametrize("name", ["../../../../tmp/escaped", "", ".."])
def test_a54_a55_a56_verify_and_deploy_refuse_a_manifest_name_that_is_a_path(bundle, tmp_path,
                                                                            name):
    edit_manifest(bundle, lambda m: m.update(name=name))
    for args in (["verify", str(bundle)],
                 ["deploy", str(bundle), "nobody@127.0.0.1", "--engine", "ansible"]):
        proc = edgepack(*args)
        assert proc.returncode == 2, proc.stderr
        assert f"name {name!r} is not" in one_line(proc)
    assert not list(tmp_path.rglob("escaped*"))


def test_item7_build_makes_a_safe_default_name_and_refuses_an_unsafe_one(cnn_onnx, image_dir,
                                                                         tmp_path):
    from packager.build.job import build

    with pytest.raises(BundleError, match=r"bundle name '\.\./x' is not .*; use 1-100"):
        build(cnn_onnx, tmp_path / "named", target="x86_64-cpu", calib=image_dir,
              preprocess=PREP, quant={"precision": "fp32"}, name="../x")
    assert not list(tmp_path.iterdir())
    out = tmp_path / "my bundle (v2)"
    r = build(cnn_onnx, out, target="x86_64-cpu", calib=image_dir, preprocess=PREP,
              quant={"precision": "fp32"})
    assert r.bundle.manifest["name"] == "my-bundle-v2"
    assert read_manifest(out)["name"] == "my-bundle-v2"


# -- B47: --expect-digest ---------------------------------------------------------------------

def test_b47_expect_digest_in_upper_case_or_with_spaces_is_accepted(built, bundle):
    digest = built.bundle.digest
    hexes = digest.split(":")[1]
    for given in (digest, "SHA256:" + hexes.upper(), f"  {digest}\n", hexes.upper()):
        assert parse_digest(given) == digest
    proc = edgepack("verify", str(bundle), "--runs", "2", "--warmup", "0", "--expect-digest",
                    f" SHA256:{hexes.upper()} ")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("given", ["sha256:abc", "md5:" + "0" * 64, "sha256:" + "g" * 64, "",
                                   "sha256:" + "0" * 65])
def test_b47_b48_a_malformed_expect_digest_is_exit_2_saying_the_form(bundle, given):
    with pytest.raises(VerifyError, match="not a bundle digest"):
        parse_digest(given)
    for args in (["verify", str(bundle)], ["deploy", str(bundle), "nobody@127.0.0.1"]):
        proc = edgepack(*args, "--expect-digest", given)
        assert proc.returncode == 2, proc.stderr
        line = one_line(proc)
        assert "not a bundle digest" in line and "64 hex digits" in line
    assert not (bundle / "reports").exists()


# -- item 12: build --tune's device answer is checked (A87) -----------------------------------

def lying_python(tmp_path: Path, answer: dict, when: str = "bench --tune") -> str:
    """A device Python that answers `run.py WHEN...` with *answer* (and runs the real Python
    for anything else)."""
    script = tmp_path / "python3"
    script.write_text(f"#!/bin/sh\ncase \"$*\" in *\"run.py {when}\"*) cat <<'EOF'\n"
                      + json.dumps(answer) + "\nEOF\nexit 0;; esac\nexec "
                      + sys.executable + ' "$@"\n')
    script.chmod(0o755)
    return str(script)


def device_answer(chosen, **tuning) -> dict:
    return {"tuning": {"runs": 5, "warmup": 1, "cores": 4, "tried": [], "current": {},
                       "chosen": chosen, "reason": "device says so", "margin": 0.03, **tuning},
            "device": {}, "onnxruntime": "1.32.0", "providers": ["CPUExecutionProvider"]}


def test_a87_build_tune_refuses_a_device_answer_outside_the_session_schema(cnn_onnx, image_dir,
                                                                           tmp_path):
    from packager.build.job import build
    from packager.device.tuning import local_tuner

    python = lying_python(tmp_path, device_answer(
        {"intra_op_threads": "lots", "graph_optimization_level": "bogus", "evil": "x"}))
    out = tmp_path / "tl"
    with pytest.raises(VerifyError) as exc:
        build(cnn_onnx, out, target="x86_64-cpu", calib=image_dir, preprocess=PREP,
              quant={"precision": "fp32"}, tune=local_tuner(python=python, runs=2, warmup=0))
    assert exc.value.exit_code == 2
    assert str(exc.value).startswith("tuning in this machine: the answer of its run.py bench "
                                     "--tune has tuning.chosen.intra_op_threads = \"lots\"")
    assert not out.exists() and not (tmp_path / "tl.tar.gz").exists()   # nothing published


@pytest.mark.parametrize("answer, says", [
    (device_answer({"intra_op_threads": 4096}), "tuning.chosen.intra_op_threads = 4096, not a "
                                                "thread count from 0 (auto) to the device's 4"),
    (device_answer({"intra_op_threads": 8}), "intra_op_threads = 8"),      # > its 4 cores
    (device_answer({"inter_op_threads": True}), "tuning.chosen.inter_op_threads = true"),
    (device_answer({"intra_op_threads": -1}), "intra_op_threads = -1"),
    (device_answer({"graph_optimization_level": "bogus"}),
     "tuning.chosen.graph_optimization_level = \"bogus\", not one of disabled, basic"),
    (device_answer({"execution_mode": "turbo"}), "execution_mode = \"turbo\""),
    (device_answer({"evil": "x"}), "tuning.chosen.'evil', not a session option"),
    (device_answer([1, 2]), "tuning.chosen that is not an object"),
    (device_answer({}, cores="4"), "tuning.cores = \"4\", not a core count"),
    (device_answer({}, cores=0), "tuning.cores = 0"),
    (device_answer({}, tried=[{"stage": "threads", "session": {"x": 1}, "p50_ms": 1.0}]),
     "tuning.tried[0].session.'x', not a session option"),
    (device_answer({}, tried="all"), "tuning.tried that is not a list"),
    (device_answer({}, reason=["no"]), "tuning.reason = [\"no\"], not a text"),
    (device_answer({}, speedup="fast"), "tuning.speedup = \"fast\", not a number"),
    (dict(device_answer({}), device="pi"), "device that is not an object"),
])
def test_a87_b14_each_field_of_a_lying_device_answer_is_named(tmp_path, answer, says):
    from packager.device.tuning import record
    from packager.device.verify import local_runner

    execute = local_runner(tmp_path, python=lying_python(tmp_path, answer), timeout=TIMEOUT)
    with pytest.raises(VerifyError, match=re.escape(says)) as exc:
        record(execute, 2, 0, "pi-07", {})
    assert str(exc.value).startswith("tuning in pi-07: the answer of its run.py bench --tune "
                                     "has ")


def test_a87_a_sound_device_answer_is_kept_as_the_session(tmp_path):
    from packager.device.tuning import record
    from packager.device.verify import local_runner

    chosen = {"intra_op_threads": 4, "inter_op_threads": 0, "graph_optimization_level": "all",
              "execution_mode": "sequential"}
    for answer, own in ((device_answer(chosen), {}),
                        # the target's own 8 threads kept on a 4-core device: the target asked
                        (device_answer(dict(chosen, intra_op_threads=8)),
                         {"intra_op_threads": 8})):
        execute = local_runner(tmp_path, python=lying_python(tmp_path, answer), timeout=TIMEOUT)
        kept = record(execute, 2, 0, "pi-07", own)
        assert kept["chosen"] == answer["tuning"]["chosen"] and kept["measured_on"] == "pi-07"


@pytest.mark.parametrize("answer", [
    {"parts": {"model": {"outputs": 5}}},
    {"parts": {"model": {"min_cosine": 0.9, "outputs": {"scores": {"cosine_min": "1"}}}}},
    {"parts": []},
])
def test_a31_odd_json_from_a_device_check_is_a_verify_error_not_a_crash(bundle, tmp_path,
                                                                         answer):
    with pytest.raises(VerifyError, match=r"run.py in .* answered JSON without the fields this "
                                          r"edgepack reads \((TypeError|AttributeError|"
                                          r"ValueError|KeyError)") as exc:
        verify(bundle, python=lying_python(tmp_path, answer, "check"), runs=2, warmup=0)
    assert exc.value.exit_code == 2


# -- the same through real devices: deploy's per-host reports, build --tune --time-on ---------

BAD_CHOICE = {"intra_op_threads": "lots", "graph_optimization_level": "bogus", "evil": "x"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two loopback devices (real sshds): d1, and `liar`, whose python3 answers
    `run.py bench --tune` with BAD_CHOICE."""
    from fleet import Device, Fleet, problem, require

    require(problem(), "EDGEPACK_REQUIRE_SSH")
    root = tmp_path_factory.mktemp("fleet")
    liar = lying_python(tmp_path_factory.mktemp("liar"), device_answer(BAD_CHOICE))
    with Fleet(root, [Device("d1"), Device("liar", python=["/bin/sh", liar])]) as f:
        yield f


def test_b07_deploy_never_writes_a_host_report_through_a_link(fleet, bundle, tmp_path):
    from packager.device.deploy import DeployOptions, deploy
    from packager.device.inventory import parse_host

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (bundle / "reports").mkdir()
    (bundle / "reports" / "d1").symlink_to(elsewhere)
    target = fleet.remote_dir("d1") / "b07"
    options = DeployOptions(ssh_config=fleet.ssh_config, remote_dir=str(target),
                            runs=2, warmup=0, timeout=TIMEOUT)
    from packager.errors import BundleError

    with pytest.raises(BundleError) as refused:   # before anything reaches the device
        deploy(bundle, [parse_host("d1")], options=options)
    assert f"{bundle / 'reports' / 'd1'}: is a symbolic link" in str(refused.value)
    assert "nothing was copied" in str(refused.value)
    assert not target.exists()
    assert list(elsewhere.iterdir()) == []
    assert not (bundle / "reports" / "report.json").exists()


def test_a87_build_tune_time_on_a_lying_device_names_the_host_and_the_field(fleet, cnn_onnx,
                                                                            image_dir, tmp_path):
    from conftest import PREP_TEXT

    out = tmp_path / "tl"
    scratch = Path.home() / "edgepack"        # the devices' login home is this user's
    before = set(scratch.glob(".tune-*"))
    proc = edgepack("build", str(cnn_onnx), "-o", str(out), "--target", "x86_64-cpu", "--calib",
                    str(image_dir), "--preprocess", PREP_TEXT, "--precision", "fp32", "--tune",
                    "--time-on", "liar", "--ssh-config", str(fleet.ssh_config))
    assert set(scratch.glob(".tune-*")) == before     # the scratch copy was removed
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "tuning in liar: the answer of its run.py bench --tune has " \
           "tuning.chosen.intra_op_threads = \"lots\"" in last and "Traceback" not in proc.stderr
    assert not out.exists() and not (tmp_path / "tl.tar.gz").exists()
