"""Fleet rollouts with both engines against real sshds on loopback (tests/fleet.py): the built-in
SSH fan-out and the real ansible-playbook with the edgepack_bundle role, on the same inventory.

The fleet: two good x86 devices, one that is down, one whose onnxruntime (1.16.3) is older than
the bundle needs, and an aarch64 device under qemu when its userland is built. In CI
(EDGEPACK_REQUIRE_SSH=1) a missing sshd, ansible-core or old onnxruntime fails these tests;
EDGEPACK_REQUIRE_ARM=1 likewise for the aarch64 device. Elsewhere they skip with the reason.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import arm_userland
import fleet
import numpy as np
import pytest
from fleet import Device, Fleet, ours_running, require, wait_until_gone

from conftest import PREP
from packager.build.job import build
from packager.device.ansible_engine import inventory_hosts, pack
from packager.device.deploy import DeployOptions, deploy, summary_table
from packager.device.rollout import Rollout, batches, parse_batch, parse_percent
from packager.errors import PackagerError

BIN = Path(sys.executable).parent
ENGINES = ["ssh", "ansible"]



@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """What every fleet needs: the old onnxruntime and the aarch64 python (None: skipped)."""
    require(fleet.problem(), "EDGEPACK_REQUIRE_SSH")
    require(None if (BIN / "ansible-playbook").is_file() else
            "ansible-playbook is missing: pip install 'edgepack[fleet]'", "EDGEPACK_REQUIRE_SSH")
    old = fleet.old_onnxruntime_python()
    require(old if isinstance(old, str) else None, "EDGEPACK_REQUIRE_SSH")
    arm = None
    reason = arm_userland.problem("py311")
    if reason and os.environ.get("EDGEPACK_REQUIRE_ARM") == "1":
        pytest.fail(reason)
    if not reason:
        arm_userland.build("py311")
        arm = arm_userland.python("py311")
    return old, arm


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, cnn_onnx, image_dir):
    """v1 (INT8) and v2 (FP32) of one model for the Raspberry Pi target, and `bad`: v1 with its
    reference outputs negated (and the manifest re-hashed), which fails its check anywhere."""
    root = tmp_path_factory.mktemp("fleet-bundles")
    out = {}
    for name, precision in (("v1", "int8"), ("v2", "fp32")):
        out[name] = build(cnn_onnx, root / name / "cnn", target="rpi", calib=image_dir,
                          preprocess=PREP, quant={"precision": precision}).bundle.directory
    bad = root / "bad" / "cnn"
    shutil.copytree(out["v1"], bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    rel = manifest["parts"][0]["golden"]["outputs"]
    with np.load(bad / rel) as data:
        arrays = {k: -data[k] for k in data.files}
    np.savez(bad / rel, **arrays)
    manifest["files"][rel] = hashlib.sha256((bad / rel).read_bytes()).hexdigest()
    (bad / "manifest.json").write_text(json.dumps(manifest, indent=2))
    out["bad"] = bad
    for name in list(out):
        pack(out[name], "cnn", out[name].parent / "cnn.tar.gz")
        out[name + ".tar.gz"] = out[name].parent / "cnn.tar.gz"
    return out


def make_fleet(root, parts, *names):
    old, arm = parts
    kinds = {"pi-down": {"down": True}, "pi-old": {"python": old}, "pi-arm": {"python": arm}}
    return Fleet(root, [Device(n, **kinds.get(n, {})) for n in names
                        if n != "pi-arm" or arm])


def cli(*args, timeout=900):
    # the bundles are the Pi's (aarch64) and most "pi" devices are this x86 machine: --force
    args += ("--force",) if args[0] == "deploy" else ()
    return subprocess.run([sys.executable, "-m", "packager", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def opts(**kw):
    return DeployOptions(runs=3, warmup=1, any_arch=True, **kw)


def current(f, name):
    link = f.remote_dir(name) / "current"
    return os.readlink(link).split("/")[-1] if link.is_symlink() else None


def release_of(bundle):
    return hashlib.sha256((Path(bundle) / "manifest.json").read_bytes()).hexdigest()[:12]


@pytest.mark.parametrize("engine", ENGINES)
def test_one_inventory_both_engines_same_outcome(parts, bundles, tmp_path, engine):
    """Deploy to the whole fleet from a YAML inventory, then again after a file on one device
    was changed: per-host outcomes, the table, --json and the exit code; nothing changes on a
    device that already runs the bundle."""
    names = ["pi-01", "pi-02", "pi-down", "pi-old", "pi-arm"]
    with make_fleet(tmp_path / "fleet", parts, *names) as f:
        inventory = f.write_inventory(tmp_path / "fleet.yml", "yaml",
                                      groups={"boards": [n for n in f.names if n != "pi-down"],
                                              "spares": ["pi-down"]})
        r = cli("deploy", bundles["v1.tar.gz"], "--hosts", inventory, "--engine", engine,
                "--runs", 3, "--warmup", 1, "--json")
        assert r.returncode == 2, r.stderr[-3000:]
        data = json.loads(r.stdout)
        status = {h["host"]: h["status"] for h in data["hosts"]}
        assert status == {n: {"pi-down": "error", "pi-old": "error"}.get(n, "pass")
                          for n in f.names}
        errors = {h["host"]: h["error"] for h in data["hosts"]}
        assert "pi-down: unreachable" in errors["pi-down"]
        assert "onnxruntime 1.16.3 is older than 1.19" in errors["pi-old"]
        release = release_of(bundles["v1"])
        for name in f.up:
            assert current(f, name) == (release if name != "pi-old" else None)
        assert not (f.remote_dir("pi-old") / "releases").exists()   # nothing copied
        hosts = {h["host"]: h for h in data["hosts"]}
        assert hosts["pi-01"]["release"]["switched"] is True
        if "pi-arm" in hosts:
            assert hosts["pi-arm"]["device"]["arch"] == "aarch64"
        reports = bundles["v1.tar.gz"].with_name("cnn.reports")
        assert json.loads((reports / "pi-02" / "report.json").read_text())["passed"]

        # a file changed on pi-02 (same size and time); the others already run the bundle
        target = f.remote_dir("pi-02") / "current" / "golden" / "model.shipped.npz"
        stat = target.stat()
        data_bytes = bytearray(target.read_bytes())
        data_bytes[-30] ^= 0xFF
        target.write_bytes(bytes(data_bytes))
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        r = cli("deploy", bundles["v1.tar.gz"], "--hosts", inventory, "--engine", engine,
                "--limit", "boards:!pi-arm:!pi-old", "--runs", 3, "--warmup", 1)
        assert r.returncode == 2, r.stderr[-3000:]
        rows = {line.split("|")[1].strip(): line for line in r.stdout.splitlines()
                if line.startswith("| pi-")}
        assert set(rows) == {"pi-01", "pi-02"}
        assert f"{release} (already) | passed" in rows["pi-01"]
        assert "refused: golden/model.shipped.npz: sha256 mismatch on the device" in rows["pi-02"]
        assert "nothing was run" in rows["pi-02"]
        r = cli("deploy", bundles["v1.tar.gz"], "--hosts", inventory, "--engine", engine,
                "--limit", "pi-02", "--checksum", "--runs", 3, "--warmup", 1)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_failing_canary_stops_the_rollout_with_nothing_changed_elsewhere(parts, bundles,
                                                                           tmp_path, engine):
    with make_fleet(tmp_path / "fleet", parts, "pi-old", "pi-01", "pi-02") as f:
        inventory = f.write_inventory(tmp_path / "fleet.ini")
        r = cli("deploy", bundles["v1"], "--hosts", inventory, "--engine", engine,
                "--canary", 1, "--runs", 3, "--warmup", 1)
        assert r.returncode == 2
        assert "rollout stopped: the canary failed on 1 of 1 host(s); the other 2 host(s) " \
               "were not touched" in r.stderr
        table = r.stdout
        assert "| pi-01 |" in table and "| skipped: the canary failed" in table
        for name in ("pi-01", "pi-02"):
            assert not any(f.remote_dir(name).iterdir()), f"{name} was touched"
        r = cli("deploy", bundles["v1"], "--hosts", inventory, "--engine", engine,
                "--limit", "pi-01,pi-02", "--canary", 1, "--runs", 3, "--warmup", 1)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "rollout: canary 1/2: 1 host(s)" in r.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_max_fail_stops_the_rollout(parts, bundles, tmp_path, engine):
    names = ["pi-01", "pi-down", "pi-02", "pi-03", "pi-04"]
    with make_fleet(tmp_path / "fleet", parts, *names) as f:
        hosts = inventory_hosts([f.write_inventory(tmp_path / "fleet.ini")])
        logs = []
        results = deploy(bundles["v1"], hosts, options=opts(), engine=engine,
                         rollout=Rollout(batch="40%", max_fail=30.0), log=logs.append)
        assert [r.status for r in results] == ["pass", "error", "skipped", "skipped", "skipped"]
        assert any("1 of 2 host(s) failed (50 % > --max-fail 30 %)" in m for m in logs)
        assert current(f, "pi-01") and not any(f.remote_dir("pi-02").iterdir())
        table = summary_table(results)
        assert table.count("| skipped: 1 of 2 host(s) failed") == 3
        results = deploy(bundles["v1"], hosts, options=opts(), engine=engine,
                         rollout=Rollout(batch="2", max_fail=50.0), log=logs.append)
        assert [r.status for r in results] == ["pass", "error", "pass", "pass", "pass"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_release_that_fails_its_check_leaves_the_one_in_use(parts, bundles, tmp_path, engine):
    """v1, then v2 (previous -> v1), then a v3 that fails its check: current stays at v2, and
    older releases than the one before are removed."""
    with make_fleet(tmp_path / "fleet", parts, "pi-01") as f:
        hosts = inventory_hosts([f.write_inventory(tmp_path / "fleet.ini")])
        base = f.remote_dir("pi-01")
        v1, v2, bad = (release_of(bundles[k]) for k in ("v1", "v2", "bad"))
        for key, want in (("v1", v1), ("v2", v2)):
            [r] = deploy(bundles[key], hosts, options=opts(), engine=engine)
            assert r.status == "pass", r.error
            assert r.release["current"] == want and r.release["switched"]
            if engine == "ssh" and key == "v2":   # rsync took the files v1 shares from current
                sent = r.copied["files"]
                assert 0 < sent < sum(1 for p in bundles["v2"].rglob("*") if p.is_file())
        assert os.readlink(base / "current") == f"releases/{v2}"
        assert os.readlink(base / "previous") == f"releases/{v1}"
        [r] = deploy(bundles["bad"], hosts, options=opts(), engine=engine)
        assert r.status == "FAIL" and r.exit_code == 1
        assert r.release["current"] == v2 and not r.release["switched"]
        assert os.readlink(base / "current") == f"releases/{v2}"
        assert os.readlink(base / "previous") == f"releases/{v1}"
        assert any(c["name"].startswith("accuracy") and not c["passed"]
                   for c in r.report["checks"])
        assert f"{v2} (kept)" in summary_table([r])
        [r] = deploy(bundles["v1"], hosts, options=opts(), engine=engine)   # roll back to v1
        assert r.status == "pass" and r.release["switched"]
        assert os.readlink(base / "previous") == f"releases/{v2}"
        kept = {p.name.replace(".tar.gz", "") for p in (base / "releases").iterdir()}
        assert kept == {v1, v2}   # the failed release and its archive are gone


def test_the_role_in_a_users_own_playbook(parts, bundles, tmp_path):
    """`edgepack ansible-role`, then a plain `ansible-playbook site.yml` written by a user:
    deploys, a second run changes nothing and says so, a failing version leaves the one in use."""
    work = tmp_path / "ops"
    r = cli("ansible-role", "-o", work / "roles")
    assert r.returncode == 0 and "wrote" in r.stdout, r.stderr
    r = cli("ansible-role", "-o", work / "roles")
    assert r.returncode == 0 and "nothing changed" in r.stdout
    role = work / "roles" / "edgepack_bundle"
    assert (role / "files" / "device_probe.py").is_file()
    (role / "defaults" / "main.yml").write_text("# edited\n")
    r = cli("ansible-role", "-o", work / "roles")
    assert r.returncode == 2 and "exists and differs" in r.stderr and "--force" in r.stderr
    assert cli("ansible-role", "-o", work / "roles", "--force").returncode == 0
    (work / "site.yml").write_text("""- hosts: boards
  gather_facts: false
  serial: 1
  roles:
    - role: edgepack_bundle
      vars:
        edgepack_runs: 3
        edgepack_warmup: 1
        edgepack_any_arch: true   # the Pi's bundle on x86 "pi" devices
""")
    with make_fleet(tmp_path / "fleet", parts, "pi-01", "pi-02") as f:
        inventory = f.write_inventory(work / "inventory.ini", groups={"boards": f.names})
        env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PIPELINING": "1"}

        def play(bundle):
            return subprocess.run([BIN / "ansible-playbook", "-i", inventory, "site.yml", "-e",
                                   f"edgepack_bundle={bundle}"], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=900)

        first = play(bundles["v1.tar.gz"])
        assert first.returncode == 0, first.stdout[-3000:]
        assert "pi-01                      : ok=" in first.stdout
        for name in f.names:
            assert current(f, name) == release_of(bundles["v1"])
        again = play(bundles["v1.tar.gz"])
        assert again.returncode == 0, again.stdout[-3000:]
        recap = again.stdout.split("PLAY RECAP")[1]
        assert recap.count("changed=0") == 2 and "failed=0" in recap
        assert again.stdout.count("already in use; nothing changed") == 2
        failing = play(bundles["bad.tar.gz"])
        assert failing.returncode == 2
        assert "failed its check on the device; current still points at " \
               f"{release_of(bundles['v1'])}" in failing.stdout
        assert "pi-02" not in failing.stdout.split("PLAY RECAP")[1]   # serial 1: stopped there
        assert current(f, "pi-01") == current(f, "pi-02") == release_of(bundles["v1"])


def test_rollout_plans():
    hosts = list(range(10))
    assert batches(hosts, Rollout()) == [hosts]
    assert batches(hosts, Rollout(canary=2, batch="3")) == [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]
    assert batches(hosts, Rollout(batch="25%")) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert batches(hosts, Rollout(canary=20)) == [hosts]
    assert parse_batch("10%") == "10%" and parse_percent("12.5%", "--max-fail") == 12.5
    for bad in ("0", "x", "150%", "-1"):
        with pytest.raises(PackagerError, match="--batch"):
            parse_batch(bad)
    with pytest.raises(PackagerError, match="--max-fail 101"):
        parse_percent("101", "--max-fail")


def test_ansible_engine_with_hosts_on_the_command_line_and_tune(parts, bundles, tmp_path):
    """No inventory: ssh_config aliases on the command line, as with the built-in engine; and
    --tune runs run.py bench --tune on the device through the role."""
    with make_fleet(tmp_path / "fleet", parts, "pi-01") as f:   # (one: --remote-dir is shared)
        r = cli("deploy", bundles["v1"], "pi-01", "--engine", "ansible", "--ssh-config",
                f.ssh_config, "--remote-dir", tmp_path / "boards", "--runs", 5, "--warmup", 1,
                "--tune", "--json")
        assert r.returncode == 0, r.stderr[-3000:]
        hosts = json.loads(r.stdout)["hosts"]
        assert [h["status"] for h in hosts] == ["pass"]
        assert all(h["engine"] == "ansible" for h in hosts)
        tuning = hosts[0]["report"]["tuning"]
        assert tuning["tried"] and all(t["p50_ms"] > 0 for t in tuning["tried"])
        assert os.readlink(tmp_path / "boards" / "current") == f"releases/{release_of(bundles['v1'])}"


# -- a provider listed for speed (docs/openvino.md, "On the device") ----------------------------

def listing_openvino(bundle: Path, dst: Path, *, faster: bool) -> Path:
    """A copy of the x86 *bundle* whose manifest lists OpenVINO first, as `build` writes it when
    OpenVINO measured faster (Target.with_provider: its package and install line, the CPU
    provider after it with its own graph); *faster* False: without "when", a required provider.
    The file table is unchanged (manifest.json is not in it); the digest is this manifest's."""
    from packager import ort_builds

    shutil.copytree(bundle, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["providers"] = [{"name": ort_builds.OPENVINO, "options": ort_builds.OPENVINO_OPTIONS,
                              **({"when": "faster"} if faster else {})},
                             *manifest["providers"]]
    manifest["target"].update(runtime_package=ort_builds.OPENVINO_PACKAGE,
                              install=ort_builds.OPENVINO_INSTALL)
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dst


@pytest.fixture()
def loopback():
    require(fleet.problem(), "EDGEPACK_REQUIRE_SSH")
    require(None if (BIN / "ansible-playbook").is_file() else
            "ansible-playbook is missing: pip install 'edgepack[fleet]'", "EDGEPACK_REQUIRE_SSH")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_faster_provider_the_device_lacks_is_a_note_a_required_one_a_refusal(
        loopback, built, tmp_path, engine, monkeypatch):
    """Issue 33 item 2: a default x86 bundle lists OpenVINO first with "when": "faster". A
    device whose Python has plain onnxruntime passes preflight with both engines, runs the CPU
    provider's graph and each engine says so (the role too, in its own output); OpenVINO listed
    without "when" is refused by both, nothing copied."""
    monkeypatch.setenv("EDGEPACK_ANSIBLE_OUTPUT", "1")   # the playbook's output into the log
    faster = listing_openvino(built.bundle.directory, tmp_path / "faster" / "cnn", faster=True)
    required = listing_openvino(built.bundle.directory, tmp_path / "required" / "cnn",
                                faster=False)
    graph = built.bundle.manifest["parts"][0]["model"]["file"]
    with Fleet(tmp_path / "fleet", [Device("box-01")]) as f:
        hosts = inventory_hosts([f.write_inventory(tmp_path / "fleet.ini")])
        logs: list[str] = []
        [r] = deploy(faster, hosts, options=DeployOptions(runs=3, warmup=1), engine=engine,
                     log=logs.append)
        assert r.status == "pass", r.error
        assert "OpenVINOExecutionProvider" not in r.device["providers"]
        assert r.report["providers"][0] == "CPUExecutionProvider"
        assert current(f, "box-01") == release_of(faster)
        [note] = r.notes
        assert note.startswith("OpenVINOExecutionProvider (measured faster at build) is not in "
                               "the device's onnxruntime, so the device runs "
                               f"CPUExecutionProvider's graph ({graph}, INT8)"), note
        assert "pip install 'onnxruntime-openvino>=" in note
        assert f"[box-01] note: {note}" in logs
        if engine == "ansible":   # the role's own note, for a playbook of the user's
            assert any(f'"msg": "note: {note}"' in line for line in logs), logs
        assert f"note: box-01: {note}" in summary_table([r])

        [r] = deploy(required, hosts, options=DeployOptions(runs=3, warmup=1), engine=engine)
        assert r.exit_code == 2 and "preflight failed" in r.error, r.error
        assert "has no OpenVINOExecutionProvider" in r.error and not r.notes
        assert not (f.remote_dir("box-01") / "releases" / release_of(required)).exists()
        assert current(f, "box-01") == release_of(faster)


def test_both_engines_need_what_one_rule_says(built, tmp_path):
    """The role's controller script (files/bundle_info.py, run as Ansible runs it) and deploy
    --engine ssh's preflight ask the device for the same things: not a provider listed for speed,
    a required one always."""
    import ast

    from packager.device.ansible_role import ROLE
    from packager.device.deploy import optional_providers_missing, preflight_needs

    for script in ("bundle_needs.py", "bundle_info.py"):   # any controller's Python 3.8+
        path = ROLE / "files" / script
        ast.parse(path.read_text(), str(path), feature_version=(3, 8))
    for faster, wanted in ((True, ["CPUExecutionProvider"]),
                           (False, ["OpenVINOExecutionProvider", "CPUExecutionProvider"])):
        folder = listing_openvino(built.bundle.directory, tmp_path / str(faster) / "cnn",
                                  faster=faster)
        pack(folder, "cnn", folder.parent / "cnn.tar.gz")
        r = subprocess.run([sys.executable, ROLE / "files" / "bundle_info.py",
                            folder.parent / "cnn.tar.gz"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout)
        role = info["needs"]
        manifest = json.loads((folder / "manifest.json").read_text())
        ssh = preflight_needs(manifest, 1)
        assert role["providers"] == ssh["providers"] == wanted
        assert {k: v for k, v in role.items() if k != "need_mb"} == \
            {k: v for k, v in ssh.items() if k != "need_mb"}
        plain = {"providers": ["AzureExecutionProvider", "CPUExecutionProvider"]}
        assert list(info["notes_if_missing"].values()) == \
            optional_providers_missing(plain, manifest) == ([] if not faster else [
                "OpenVINOExecutionProvider (measured faster at build) is not in the device's "
                "onnxruntime, so the device runs CPUExecutionProvider's graph "
                f"({manifest['parts'][0]['model']['file']}, INT8); for OpenVINO's measured "
                "speed there: " + manifest["target"]["install"]])


def ansible_deploy(bundle: Path, inventory: Path) -> subprocess.Popen:
    """`edgepack deploy --engine ansible` of *bundle* to *inventory*, started, output piped."""
    return subprocess.Popen([sys.executable, "-m", "packager", "deploy", str(bundle), "--hosts",
                             str(inventory), "--engine", "ansible", "--force", "--runs", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a33_a_device_that_never_answers_ends_with_the_signal_and_leaves_nothing_running(
        parts, bundles, tmp_path, sig, code):
    """A33: a device whose python3 reads its stdin for ever kept `deploy --engine ansible`
    waiting; SIGTERM was ignored for over 40 s and Ctrl-C left ansible-playbook, its ssh and
    the device's command running. Now either signal ends the play on both sides."""
    import signal
    import time

    stub = tmp_path / "never.sh"
    stub.write_text("#!/bin/sh\n# edgepack-a33-stub\ncat >/dev/null\nsleep 600\necho '{}'\n")
    stub.chmod(0o755)
    with Fleet(tmp_path / "fleet", [Device("pi-01", python=["/bin/sh", str(stub)])]) as f:
        inventory = f.write_inventory(tmp_path / "fleet.ini")
        proc = ansible_deploy(bundles["v1"], inventory)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not ours_running("never.sh"):
                time.sleep(0.5)   # until the device's command runs (ansible waits on it)
            assert ours_running("ansible-playbook"), "the play did not start"
            proc.send_signal(getattr(signal, sig))
            start = time.monotonic()
            _, err = proc.communicate(timeout=60)
            assert time.monotonic() - start < 20, "the signal was not acted on at once"
            assert proc.returncode == code, (proc.returncode, err[-2000:])
            assert "Traceback" not in err
            # (the device's sshd ends the session's command once ssh is gone)
            assert not wait_until_gone("ansible-playbook", 3), "ansible-playbook left running"
            assert not wait_until_gone("never.sh", 3), "the device's command left running"
        finally:
            proc.kill()
            proc.wait(timeout=10)


def test_a33_a_signal_after_the_hold_started_ends_the_hold_on_the_device(
        parts, bundles, tmp_path):
    """A33: a SIGTERM that cut an Ansible play off after the device's release was marked busy
    (`device_probe.py hold`, an async job with a sleep bounded by the deploy's longest time,
    ~2.3 h by default) left that sleep, its pid and answer files on the device. deploy now ends
    the hold itself (the role's end_hold.yml, from the host's record on the controller): exit
    143, no hold process, no `.edgepack-hold-*` file, no async job file left."""
    import signal
    import time

    stub = tmp_path / "slow-run.sh"   # the device's python3: run.py never answers, all else runs
    stub.write_text("#!/bin/sh\n# edgepack-a33-hold-stub\nif [ \"$1\" = run.py ]; then "
                    f"sleep 600; fi\nexec {sys.executable} \"$@\"\n")
    stub.chmod(0o755)
    with Fleet(tmp_path / "fleet", [Device("pi-01", python=["/bin/sh", str(stub)])]) as f:
        inventory = f.write_inventory(tmp_path / "fleet.ini")
        jobs = Path.home() / ".ansible_async"
        before = set(jobs.iterdir()) if jobs.is_dir() else set()
        proc = ansible_deploy(bundles["v1"], inventory)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not ours_running("slow-run.sh run.py"):
                time.sleep(0.5)   # until run.py check runs (the hold started before the copy)
            assert ours_running("edgepack-hold"), "the hold did not start"
            assert list(f.remote_dir("pi-01").glob(".edgepack-hold-*"))
            proc.send_signal(signal.SIGTERM)
            start = time.monotonic()
            _, err = proc.communicate(timeout=90)
            assert time.monotonic() - start < 45, "the clean-up was not bounded"
            assert proc.returncode == 143, (proc.returncode, err[-2000:])
            assert "Traceback" not in err
            assert "ending the hold on the release of 1 host(s)" in err
            assert not wait_until_gone("edgepack-hold", 5), "the hold left running"
            assert not list(f.remote_dir("pi-01").glob(".edgepack-hold-*"))
            after = set(jobs.iterdir()) if jobs.is_dir() else set()
            assert not [j for j in after - before
                        if str(f.remote_dir("pi-01")).encode() in j.read_bytes()]
        finally:
            proc.kill()
            proc.wait(timeout=10)
