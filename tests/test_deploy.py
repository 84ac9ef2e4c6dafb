"""edgepack deploy against a real sshd on 127.0.0.1: copy, preflight, verify, reports, fleets.

In CI (EDGEPACK_REQUIRE_SSH=1, set by .ci/run) a missing sshd/rsync fails these tests;
elsewhere they skip with the reason.
"""

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import arm_userland
import numpy as np
import pytest
import sshd_server

from conftest import PREP
from packager.build.job import build
from packager.device.deploy import DeployOptions, deploy, summary_table
from packager.device.inventory import InventoryError, parse_host, read_inventory
from packager.errors import BundleError, PackagerError
from packager.progress import Progress
from packager.source.specs import parse_input

MODELS = Path(__file__).parent / "torch_models.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    reason = sshd_server.problem()
    if reason:
        if os.environ.get("EDGEPACK_REQUIRE_SSH") == "1":
            pytest.fail(f"deploy tests are required here (EDGEPACK_REQUIRE_SSH=1): {reason}")
        pytest.skip(reason)
    arm = None if arm_userland.problem("py311") else arm_userland.python("py311")
    if arm:
        arm_userland.build("py311")
    srv = sshd_server.Server(tmp_path_factory.mktemp("sshd"), arm_python=arm)
    yield srv
    srv.stop()


def options(server, tmp_path, **kw):
    """Deploy options for the test server: the venv's Python stands in for the device's."""
    return DeployOptions(ssh_config=server.config, python=kw.pop("python", sys.executable),
                         remote_dir=kw.pop("remote_dir", str(tmp_path / "device")),
                         runs=5, warmup=1, **kw)


def host(name):
    return parse_host(name)


def test_deploy_then_redeploy_copies_nothing(server, built, tmp_path):
    bundle = tmp_path / "cnn"
    shutil.copytree(built.bundle.directory, bundle)
    [first] = deploy(bundle, [host("device1")], options=options(server, tmp_path))
    assert first.exit_code == 0, first.error
    shipped = len(built.bundle.manifest["files"]) + 1   # every file in the table + manifest.json
    on_disk = sum(1 for p in built.bundle.directory.rglob("*") if p.is_file()
                  and p.relative_to(built.bundle.directory).parts[0] != "reports")
    assert first.copied["method"] == "rsync" and first.copied["files"] == shipped == on_disk
    assert first.device["arch"] and first.device["onnxruntime"]
    report = json.loads((bundle / "reports" / "device1" / "report.json").read_text())
    assert report["passed"] and report["host"] == "device1"
    # the bundle's page now holds the device's figures, as its report does
    from page_check import check_figures

    data, _ = check_figures(bundle)
    [row] = [d for d in data["devices"] if d["device"] == "device1"]
    assert row["this_version"] and row["parts"]["model"]["p50_ms"] == \
        report["bench"]["parts"]["model"]["latency_ms"]["p50"]
    assert (tmp_path / "device" / "current" / "run.py").is_file()
    assert first.release["switched"] and first.release["current"] == first.release["release"]
    [again] = deploy(bundle, [host("device1")], options=options(server, tmp_path))
    assert again.exit_code == 0 and again.copied["files"] == 0


def test_tampered_file_on_the_device_is_refused(server, built, tmp_path):
    opts = options(server, tmp_path)
    assert deploy(built.bundle.directory, [host("device1")], options=opts)[0].exit_code == 0
    target = tmp_path / "device" / "current" / "golden" / "model.outputs.npz"
    stat = target.stat()
    data = bytearray(target.read_bytes())
    data[-30] ^= 0xFF                      # same size, same mtime: rsync's quick check misses it
    target.write_bytes(bytes(data))
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    [r] = deploy(built.bundle.directory, [host("device1")], options=opts)
    assert r.exit_code == 2 and not r.report
    assert "refused: golden/model.outputs.npz: sha256 mismatch on the device" in r.error
    assert "--checksum" in r.error
    fixed = deploy(built.bundle.directory, [host("device1")],
                   options=options(server, tmp_path, checksum=True))
    assert fixed[0].exit_code == 0 and fixed[0].copied["files"] == 1


def test_a_tampered_bundle_is_refused_before_anything_is_copied(server, built, tmp_path):
    bundle = tmp_path / "cnn"
    shutil.copytree(built.bundle.directory, bundle)
    with (bundle / "run.py").open("a") as f:
        f.write("# changed\n")
    with pytest.raises(BundleError, match=r"refused: run.py: sha256 mismatch .*; nothing was "
                                          r"copied; build the bundle again"):
        deploy(bundle, [host("device1")], options=options(server, tmp_path))
    assert not (tmp_path / "device").exists()
    with pytest.raises(BundleError, match="is not the expected sha256:"):
        deploy(built.bundle.directory, [host("device1")],
               options=options(server, tmp_path, expect_digest="sha256:" + "0" * 64))


def test_a_manifest_changed_on_the_device_is_refused(server, built, tmp_path):
    opts = options(server, tmp_path, expect_digest=built.bundle.digest)
    [first] = deploy(built.bundle.directory, [host("device1")], options=opts)
    assert first.exit_code == 0, first.error
    assert first.report["digest"] == built.bundle.digest
    target = tmp_path / "device" / "current" / "manifest.json"
    stat = target.stat()
    text = target.read_text()
    edited = text.replace('"min_cosine": 0.9', '"min_cosine": 0.1', 1)
    assert edited != text and len(edited) == len(text)
    target.write_text(edited)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))   # rsync's quick check misses it
    [r] = deploy(built.bundle.directory, [host("device1")], options=opts)
    assert r.exit_code == 2 and not r.report
    assert f"refused: manifest.json differs from the one deployed ({built.bundle.digest})" \
        in r.error


def test_interrupted_copy_resumes(server, built, tmp_path):
    """Cut a slow copy off half-way; the next deploy sends only what is missing."""
    bundle = tmp_path / "big"
    shutil.copytree(built.bundle.directory, bundle)
    blob = np.random.default_rng(0).integers(0, 255, 24_000_000, dtype=np.uint8).tobytes()
    (bundle / "extra.bin").write_bytes(blob)           # a large file listed in the manifest
    manifest = json.loads((bundle / "manifest.json").read_text())
    import hashlib

    manifest["files"]["extra.bin"] = hashlib.sha256(blob).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    remote = tmp_path / "device"
    cmd = [sys.executable, "-m", "packager", "deploy", str(bundle), "device1", "--ssh-config",
           str(server.config), "--python", sys.executable, "--remote-dir", str(remote),
           "--bwlimit", "4000", "--runs", "3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    from packager.device.deploy import release_id
    from packager.device.verify import bundle_digest

    release = remote / "releases" / release_id(bundle_digest(bundle))
    partial = release / "extra.bin"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:   # wait until a part of the big file has arrived
        parts = [p for p in release.glob(".extra.bin.*")] + ([partial] if partial.exists() else [])
        if parts and max(p.stat().st_size for p in parts) > 4_000_000:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    kept = partial.stat().st_size if partial.exists() else 0
    assert 0 < kept < len(blob), "the interrupted copy should leave a partial file"
    [r] = deploy(bundle, [host("device1")], options=options(server, tmp_path))
    assert r.exit_code == 0, r.error
    assert partial.stat().st_size == len(blob)
    assert r.copied["bytes_sent"] < len(blob) - kept / 2   # the kept part was not sent again


def test_device_without_onnxruntime_fails_preflight(server, built, tmp_path):
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if not system_python or subprocess.run([system_python, "-c", "import onnxruntime"],
                                           capture_output=True).returncode == 0:
        pytest.skip("needs a python3 without onnxruntime at /usr/bin")
    [r] = deploy(built.bundle.directory, [host("device1")],
                 options=options(server, tmp_path, python=system_python))
    assert r.exit_code == 2 and "preflight failed" in r.error
    assert "onnxruntime is missing" in r.error
    assert "install it: python3 -m venv ~/ort && ~/ort/bin/pip install 'onnxruntime>=1.17' " \
        "numpy" in r.error
    assert "--python ~/ort/bin/python" in r.error   # a venv's Python, as the install makes
    assert not (tmp_path / "device").exists()   # nothing was copied


def test_missing_gpu_providers_fail_preflight_unless_fallback_allowed(server, tmp_path,
                                                                      image_dir):
    out = tmp_path / "orin"
    build(f"{MODELS}:cnn", out, target="jetson-orin", calib=image_dir, preprocess=PREP,
          inputs=[parse_input("image:1x3x32x32")], quant={"precision": "fp32"})
    [r] = deploy(out, [host("device1")], options=options(server, tmp_path))
    assert r.exit_code == 2 and "has no TensorrtExecutionProvider, CUDAExecutionProvider" in r.error
    assert "NVIDIA's Jetson builds" in r.error
    [ok] = deploy(out, [host("device1")], options=options(server, tmp_path, allow_fallback=True,
                                                          any_arch=True))   # an x86 "Orin"
    assert ok.exit_code == 0 and ok.report["providers"] == ["CPUExecutionProvider"]


def test_unreachable_host_and_wrong_host_key(server, built, tmp_path):
    [down] = deploy(built.bundle.directory, [host("down")], options=options(server, tmp_path))
    assert down.exit_code == 2 and "down: unreachable" in down.error
    [bad] = deploy(built.bundle.directory, [host("badkey")], options=options(server, tmp_path))
    assert bad.exit_code == 2 and "refused: the host key" in bad.error
    assert not (tmp_path / "device").exists()


def test_two_hosts_at_once_from_an_inventory(server, built, tmp_path):
    inventory = tmp_path / "devices.ini"
    inventory.write_text(f"""# two boards and one that is off
[boards]
device1 edgepack_remote_dir={tmp_path / 'd1'}
device2 edgepack_remote_dir={tmp_path / 'd2'}

[spares]
down

[all:vars]
ansible_python_interpreter={sys.executable}
""")
    hosts = read_inventory(inventory)
    assert [h.name for h in hosts] == ["device1", "device2", "down"]
    screen = io.StringIO()   # a terminal's status line: the hosts done, and the time left
    results = deploy(built.bundle.directory, hosts,
                     options=DeployOptions(ssh_config=server.config, runs=5, warmup=1),
                     parallel=3, steps=Progress("deploy", stream=screen, enabled=True))
    assert [r.exit_code for r in results] == [0, 0, 2]   # one failing host stops no other
    drawn = screen.getvalue()
    assert "deploy: hosts done: step 3/3 (" in drawn and "down: failed)" in drawn
    assert drawn.endswith("\r"), "the status line is cleared at the end"
    assert (tmp_path / "d1" / "current" / "run.py").is_file()
    assert (tmp_path / "d2" / "current" / "run.py").is_file()
    table = summary_table(results)
    assert table.count("| passed") == 2 and "| down |" in table and "unreachable" in table
    # latency as run.py bench measures it: threads, p50, p10-p90, other processes' CPU share
    assert "| threads | p50 ms | p10-p90 ms | p99 ms | others' CPU |" in table
    row = next(line for line in table.splitlines() if line.startswith("| device1 |"))
    assert re.search(r"\| \d+\.\d\d-\d+\.\d\d \|", row) and re.search(r"\| \d+%( NOISY)? \|", row)
    reports = built.bundle.directory / "reports"
    assert (reports / "device1" / "report.md").is_file()
    assert (reports / "device2" / "report.md").is_file()


def test_cli_deploy_archive_with_scp(server, built, tmp_path):
    r = subprocess.run([sys.executable, "-m", "packager", "deploy", str(built.bundle.archive),
                        "device2", "--ssh-config", str(server.config), "--python",
                        sys.executable, "--remote-dir", str(tmp_path / "dev"), "--transfer",
                        "scp", "--runs", "3", "--json"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["passed"] and data["hosts"][0]["copied"]["method"] == "scp"
    archive_reports = built.bundle.archive.with_name("cnn.reports")
    assert (archive_reports / "device2" / "report.json").is_file()
    assert "[device2] copying with scp" in r.stderr and "[device2] bench:" in r.stderr


def test_arm_device_over_ssh(server, tmp_path, image_dir):
    reason = arm_userland.problem("py311")
    if reason:
        if os.environ.get("EDGEPACK_REQUIRE_ARM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    out = tmp_path / "rpi"
    build(f"{MODELS}:cnn", out, target="rpi", calib=image_dir, preprocess=PREP,
          inputs=[parse_input("image:1x3x32x32")])
    [r] = deploy(out, [host("arm")], options=DeployOptions(
        ssh_config=server.config, remote_dir=str(tmp_path / "pi"), runs=3, warmup=1))
    assert r.exit_code == 0, r.error
    assert r.device["arch"] == "aarch64" and r.device["python"].startswith("3.11")
    assert r.report["bench"]["device"]["arch"] == "aarch64"


def test_inventory_formats_and_errors(tmp_path):
    plain = tmp_path / "hosts.txt"
    plain.write_text("pi@raspberrypi.local\njetson  # an ssh config alias\n\nssh://me@10.0.0.7:2222\n")
    hosts = read_inventory(plain)
    assert [(h.destination, h.port) for h in hosts] == [
        ("pi@raspberrypi.local", None), ("jetson", None), ("me@10.0.0.7", 2222)]
    ini = tmp_path / "inv.ini"
    ini.write_text("[pis]\npi4 ansible_host=10.0.0.4 ansible_user=pi ansible_port=2200 "
                   "ansible_ssh_private_key_file=~/.ssh/pi\n[pis:vars]\nansible_user=admin\n"
                   "ansible_python_interpreter=/usr/bin/python3.11\n")
    [pi] = read_inventory(ini)
    assert (pi.name, pi.port, pi.python) == ("pi4", 2200, "/usr/bin/python3.11")
    assert pi.identity == Path("~/.ssh/pi").expanduser() and pi.destination.endswith("@10.0.0.4")
    # edgepack_python (docs/deploy.md) is run.py's Python, over ansible_python_interpreter
    ini.write_text("pi4 ansible_python_interpreter=/usr/bin/python3 edgepack_python=~/ort/bin/python\n")
    assert read_inventory(ini)[0].python == "~/ort/bin/python"
    from packager.device.ansible_engine import ansible_tool, inventory_hosts
    try:
        ansible_tool("ansible-inventory")
    except PackagerError:
        pass   # (the fleet tests need ansible-core; this reader is edgepack's own)
    else:      # ... and as Ansible reads the same inventory: both engines agree
        assert inventory_hosts([ini], None)[0].python == "~/ort/bin/python"
    for text, message in (("pi4 ansible_port=x\n", "not a number"),
                          ("pi4 colour=red\n", "unknown variable 'colour'"),
                          ("web[01:10]\n", "host ranges"), ("# nothing\n", "no hosts")):
        ini.write_text(text)
        with pytest.raises(InventoryError, match=message):
            read_inventory(ini)
    with pytest.raises(PackagerError, match="no hosts given"):
        deploy(tmp_path, [])


def test_precision_auto_timed_on_a_device(server, image_dir, tmp_path):
    from dataclasses import replace

    from packager.device.remote_timing import remote_timer

    device = replace(host("device1"), python=sys.executable)
    r = build(f"{MODELS}:conv_heavy", tmp_path / "b", target="x86_64-cpu", calib=image_dir,
              preprocess={**PREP, "size": [64, 64]}, inputs=[parse_input("image:1x3x64x64")],
              timer=remote_timer(device, ssh_config=server.config, python=sys.executable))
    decision = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0][
        "precision"]["decision"]
    where = decision["timing"]["measured_on"]
    assert where["host"] == "device1" and where["onnxruntime"]
    timed = [c for c in decision["candidates"] if c["p50_ms"] is not None]
    assert timed[0]["label"] == "FP32" and len(timed) >= 2 and all(c["p50_ms"] > 0 for c in timed)
    assert r.parts[0].config.precision in ("int8", "fp32")
    assert not list(Path.home().glob("edgepack/.auto-*"))   # the scratch folder is gone


def test_a_gpu_target_is_timed_under_the_providers_that_start_on_the_device(server, image_dir,
                                                                             tmp_path):
    """--time-on for a Jetson: the candidates run on the target's providers, first that starts
    (here the CPU: this device's onnxruntime has no GPU), and the decision says which."""
    from dataclasses import replace

    from packager.device.remote_timing import remote_timer
    from packager.targets import load_target

    device = replace(host("device1"), python=sys.executable)
    timer = remote_timer(device, ssh_config=server.config, python=sys.executable,
                         providers=load_target("jetson-orin").providers)
    build(f"{MODELS}:conv_heavy", tmp_path / "b", target="jetson-orin", calib=image_dir,
          preprocess={**PREP, "size": [64, 64]}, inputs=[parse_input("image:1x3x64x64")],
          timer=timer)
    decision = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0][
        "precision"]["decision"]
    assert decision["timing"]["measured"] is True
    assert decision["timing"]["measured_on"]["providers"] == ["CPUExecutionProvider"]
    assert "timed on device1 under CPUExecutionProvider" in decision["reason"]


def test_deploy_tune_tunes_on_the_device_not_with_the_hosts_file(server, built, tmp_path):
    """deploy --tune runs bench --tune on the device; a session.tuned.json measured on this
    machine is never copied there (it describes this machine, not the device)."""
    bundle = tmp_path / "cnn"
    shutil.copytree(built.bundle.directory, bundle)
    mine = {"manifest": "sha256:" + "0" * 64, "onnxruntime": "0", "cores": 1,
            "session": {"intra_op_threads": 1}, "tuned": "on the host"}
    (bundle / "session.tuned.json").write_text(json.dumps(mine))
    [result] = deploy(bundle, [host("device1")], options=options(server, tmp_path, tune=True))
    assert result.exit_code == 0, result.error
    tuning = result.report["tuning"]
    assert tuning["tried"] and all(t["p50_ms"] > 0 for t in tuning["tried"])
    device = tmp_path / "device" / "current" / "session.tuned.json"
    if device.exists():   # written by the device's tuning only when it beat the manifest
        saved = json.loads(device.read_text())
        assert saved.get("tuned") != "on the host" and saved["session"] == tuning["chosen"]
    else:
        assert tuning["saved"] is None
    assert result.report["bench"]["session"] == tuning["chosen"]
    text = (bundle / "reports" / "device1" / "report.md").read_text()
    assert "## Session tuning" in text


def test_build_tune_on_a_device(server, cnn_onnx, image_dir, tmp_path):
    from dataclasses import replace

    from packager.device.tuning import remote_tuner

    device = replace(host("device1"), python=sys.executable)
    build(cnn_onnx, tmp_path / "b", target="x86_64-cpu", calib=image_dir, preprocess=PREP,
          quant={"precision": "int8"},
          tune=remote_tuner(device, ssh_config=server.config, python=sys.executable, runs=5,
                            warmup=1))
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["tuning"]["measured_on"] == "device1"
    assert manifest["session"] == manifest["tuning"]["chosen"]
    assert not list(Path.home().glob("edgepack/.tune-*"))   # the scratch folder is gone


def test_the_summary_says_which_host_timed_noisily():
    """A host whose run.py bench marked its timing NOISY gets it in its row and under the
    table, with the reason; a quiet host shows its others' share only."""
    from packager.device.deploy import HostResult

    def host(name, share, noisy):
        part = {"latency_ms": {"p10": 1.0, "p50": 1.1, "p90": 1.3, "p99": 1.5},
                "load": {"other_share": share, "cores": 4}, "noisy": noisy}
        return HostResult(name, 0, device={"arch": "aarch64"}, report={
            "bench": {"session": {"intra_op_threads": 4}, "parts": {"model": part}},
            "providers": ["CPUExecutionProvider"]}, release={})

    table = summary_table([host("pi-01", 0.02, ""),
                           host("pi-02", 0.61, "other processes used 61% of the 4 cores")])
    rows = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| pi")}
    assert "| 4 | 1.10 | 1.00-1.30 | 1.50 | 2% |" in rows["pi-01"]
    assert "| 61% NOISY |" in rows["pi-02"]
    assert table.endswith("NOISY latency (measure again on a quieter device): "
                          "pi-02: other processes used 61% of the 4 cores")
