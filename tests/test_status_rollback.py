"""edgepack status and rollback, and deploy's arch check, against real sshds on loopback
(tests/fleet.py) with both engines: the built-in SSH fan-out and the real ansible-playbook.

In CI (EDGEPACK_REQUIRE_SSH=1) a missing sshd or ansible-core fails these tests; elsewhere
they skip with the reason.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fleet
import pytest
from fleet import Device, Fleet, require

from conftest import PREP
from packager.build.job import build
from packager.device.release_probe import RECORD

BIN = Path(sys.executable).parent
ENGINES = ["ssh", "ansible"]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, built, cnn_onnx, image_dir):
    """v1: the session's x86 INT8 bundle; v2: the same with another build time (so another
    manifest, digest and release); rpi: the model built for the Raspberry Pi (aarch64), FP32."""
    require(fleet.problem(), "EDGEPACK_REQUIRE_SSH")
    root = tmp_path_factory.mktemp("status-bundles")
    v1 = root / "v1" / "cnn"
    shutil.copytree(built.bundle.directory, v1, ignore=shutil.ignore_patterns("reports"))
    v2 = root / "v2" / "cnn"
    shutil.copytree(v1, v2)
    manifest = json.loads((v2 / "manifest.json").read_text())
    manifest["created"] = "2000-01-01T00:00:00+00:00"
    (v2 / "manifest.json").write_text(json.dumps(manifest, indent=2))
    rpi = build(cnn_onnx, root / "rpi" / "cnn", target="rpi", calib=image_dir, preprocess=PREP,
                quant={"precision": "fp32"}).bundle.directory
    return {"v1": v1, "v2": v2, "rpi": rpi}


def engine_ready(engine):
    if engine == "ansible":
        require(None if (BIN / "ansible-playbook").is_file() else
                "ansible-playbook is missing: pip install -e '.[fleet]'", "EDGEPACK_REQUIRE_SSH")


def cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "packager", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def release_of(bundle):
    import hashlib

    return hashlib.sha256((Path(bundle) / "manifest.json").read_bytes()).hexdigest()[:12]


def links(f, name):
    base = f.remote_dir(name)
    return tuple(os.readlink(base / n).split("/")[-1] if (base / n).is_symlink() else None
                 for n in ("current", "previous"))


def status_of(inventory, engine, *extra):
    r = cli("status", "--hosts", inventory, "--engine", engine, "--json", *extra)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return {h["host"]: h for h in json.loads(r.stdout)["hosts"]}


@pytest.mark.parametrize("engine", ENGINES)
def test_status_and_rollback_after_two_deploys(bundles, tmp_path, engine):
    """Nothing deployed; v1 (no previous: rollback refused); v2 (status: v2 in use, v1
    previous, both checked); rollback to v1 (status shows it, the links moved); deploying v2
    again is a rollback too, and says so."""
    engine_ready(engine)
    v1, v2 = release_of(bundles["v1"]), release_of(bundles["v2"])
    with Fleet(tmp_path / "fleet", [Device("pi-01")]) as f:
        inventory = f.write_inventory(tmp_path / "fleet.ini")
        base = str(f.remote_dir("pi-01"))

        state = status_of(inventory, engine)["pi-01"]
        assert state["status"] == "ok" and state["bundles"][0]["current"] is None
        r = cli("status", "--hosts", inventory, "--engine", engine)
        assert r.returncode == 0 and "pi-01:" in r.stdout and "current none" in r.stdout

        r = cli("deploy", bundles["v1"], "--hosts", inventory, "--engine", engine,
                "--runs", 3, "--warmup", 1)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"{v1} (new) | passed" in r.stdout
        r = cli("rollback", "--hosts", inventory, "--engine", engine, "--runs", 3, "--warmup", 1)
        assert r.returncode == 2
        assert f"pi-01: error: {base} has no previous release to roll back to " \
               f"(current: {v1})" in r.stdout
        assert links(f, "pi-01") == (v1, None)

        r = cli("deploy", bundles["v2"], "--hosts", inventory, "--engine", engine,
                "--runs", 3, "--warmup", 1)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"{v2} (new) | passed" in r.stdout
        [folder] = status_of(inventory, engine)["pi-01"]["bundles"]
        assert folder["dir"] == base
        assert (folder["current"]["id"], folder["previous"]["id"]) == (v2, v1)
        for which in ("current", "previous"):
            assert folder[which]["name"] == "cnn" and folder[which]["arch"] == "x86_64"
            assert folder[which]["precision"] == "int8" and folder[which]["target"] == "x86_64-cpu"
            assert folder[which]["check"]["passed"] is True
            assert folder[which]["check"]["by"] == "deploy"
        r = cli("status", "--hosts", inventory, "--engine", engine)
        [line] = r.stdout.splitlines()
        assert line.startswith(f"pi-01: {base}: current {v2} cnn (")
        assert f"previous {v1} cnn (" in line and "by deploy: pass" in line

        r = cli("rollback", "--hosts", inventory, "--engine", engine, "--runs", 3, "--warmup", 1)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        assert f"pi-01: rolled back to {v1} (was {v2}) in {base}" in r.stdout
        assert links(f, "pi-01") == (v1, v2)
        [folder] = status_of(inventory, engine)["pi-01"]["bundles"]
        assert (folder["current"]["id"], folder["previous"]["id"]) == (v1, v2)
        assert folder["current"]["check"]["by"] == "rollback"
        assert (f.remote_dir("pi-01") / "releases" / v1 / RECORD).is_file()

        # v2 again: it was `previous`, so this deploy is a rollback, and the table says so
        r = cli("deploy", bundles["v2"], "--hosts", inventory, "--engine", engine,
                "--runs", 3, "--warmup", 1)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"{v2} (rolled back) | passed" in r.stdout
        assert links(f, "pi-01") == (v2, v1)


def test_rollback_checks_the_previous_release_first(bundles, tmp_path):
    """A previous release that fails its check (a latency budget no run meets) is not put in
    use (exit 1); one changed on the device is refused before anything of it runs (exit 2);
    either way the one in use stays, and the API's answer says why."""
    from packager.device.deploy import DeployOptions, deploy
    from packager.device.releases import rollback

    with Fleet(tmp_path / "fleet", [Device("pi-01")]) as f:
        inventory = f.write_inventory(tmp_path / "fleet.ini")
        opts = DeployOptions(runs=3, warmup=1)
        from packager.device.ansible_engine import inventory_hosts

        hosts = inventory_hosts([inventory])
        for v in ("v1", "v2"):
            [r] = deploy(bundles[v], hosts, options=opts)
            assert r.exit_code == 0, r.error
        v1, v2 = release_of(bundles["v1"]), release_of(bundles["v2"])
        # a budget no run meets: the previous release fails its check, current stays
        [r] = rollback(hosts, options=DeployOptions(runs=3, warmup=1, latency_budget_ms=1e-6))
        assert r.exit_code == 1 and r.report["passed"] is False
        assert f"releases/{v1} (previous) failed its check on the device; current still " \
               f"points at {v2}" in r.error
        assert links(f, "pi-01") == (v2, v1)
        record = json.loads((f.remote_dir("pi-01") / "releases" / v1 / RECORD).read_text())
        assert record["by"] == "rollback" and record["passed"] is False

        golden = f.remote_dir("pi-01") / "releases" / v1 / "golden" / "model.shipped.npz"
        golden.write_bytes(golden.read_bytes()[:-10] + b"0123456789")
        [r] = rollback(hosts, options=opts)
        assert r.exit_code == 2
        assert "golden/model.shipped.npz: sha256 mismatch" in r.error and "nothing was run" in r.error
        assert links(f, "pi-01") == (v2, v1)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_bundle_for_another_arch_is_refused_unless_forced(bundles, tmp_path, engine):
    """The Pi's (aarch64) bundle on an x86 device: one line naming the host, the bundle's arch
    and the device's uname -m, exit 2, nothing copied; --force deploys it."""
    engine_ready(engine)
    with Fleet(tmp_path / "fleet", [Device("pi-01")]) as f:
        inventory = f.write_inventory(tmp_path / "fleet.ini")
        r = cli("deploy", bundles["rpi"], "--hosts", inventory, "--engine", engine,
                "--runs", 3, "--warmup", 1)
        assert r.returncode == 2, r.stdout[-2000:]
        assert "Traceback" not in r.stderr
        [row] = [ln for ln in r.stdout.splitlines() if ln.startswith("| pi-01 |")]
        assert "pi-01: preflight failed: the bundle is for aarch64 (target rpi) but the device " \
               f"is {os.uname().machine} (uname -m)" in row
        assert "--force" in row
        if engine == "ssh":   # no install on the device mends another arch (first-week-turn5)
            assert "install what is missing" not in row and "edgepack targets" in row, row
        assert not (f.remote_dir("pi-01") / "releases").exists()   # nothing copied
        r = cli("deploy", bundles["rpi"], "--hosts", inventory, "--engine", engine,
                "--runs", 3, "--warmup", 1, "--force")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        assert links(f, "pi-01") == (release_of(bundles["rpi"]), None)


def test_status_and_rollback_refuse_bad_input_in_one_line():
    for args, said in ((["status"], "no hosts given"), (["rollback"], "no hosts given"),
                       (["rollback", "h", "--name", "../x"], "--name '../x': not a bundle name"),
                       (["status", "h", "--limit", "x"], "--limit selects hosts of an inventory"),
                       (["status", "nosuchhost.invalid"], "the name does not resolve")):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr
        [line] = (r.stderr + r.stdout).strip().splitlines()
        assert said in line


def test_release_probe_runs_on_python_38():
    """release_probe.py runs on the device's Python: 3.8 syntax, nothing newer (vermin)."""
    import ast

    import packager.device.release_probe as probe

    path = Path(probe.__file__)
    ast.parse(path.read_text(), str(path), feature_version=(3, 8))
    r = subprocess.run([str(BIN / "vermin"), "--no-tips", "--violations", "-t=3.8-", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    tree = ast.parse(path.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names} | {n.module.split(".")[0] for n in ast.walk(tree)
                                     if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names), imported


def test_state_without_a_folder_lists_every_bundle_under_home(tmp_path):
    """release_probe.py state with no folder: every ~/edgepack/NAME holding releases/, read
    from the manifests there; links that are not edgepack's are not followed."""
    import hashlib

    import packager.device.release_probe as probe

    home = tmp_path / "home"
    for name in ("net", "asr"):
        base = home / "edgepack" / name
        staging = base / "releases" / "new"
        staging.mkdir(parents=True)
        text = json.dumps({"name": name, "target": {"name": "rpi", "arch": "aarch64"},
                           "parts": [{"precision": {"precision": "int8"}}]})
        (staging / "manifest.json").write_text(text)
        rid = hashlib.sha256(text.encode()).hexdigest()[:12]
        staging.rename(base / "releases" / rid)
        if name == "net":
            (base / "current").symlink_to(f"releases/{rid}")
            (base / "previous").symlink_to("/etc")   # not edgepack's: not followed
    (home / "edgepack" / "notes").mkdir()           # no releases/: not a bundle folder
    r = subprocess.run([sys.executable, "-", "state"], input=Path(probe.__file__).read_text(),
                       capture_output=True, text=True, env={**os.environ, "HOME": str(home)},
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    by_dir = {Path(b["dir"]).name: b for b in data["bundles"]}
    assert sorted(by_dir) == ["asr", "net"] and data["searched"] == str(home / "edgepack")
    net = by_dir["net"]
    assert net["current"]["name"] == "net" and net["current"]["arch"] == "aarch64"
    assert net["current"]["precision"] == "int8"
    assert net["current"]["intact"] is True and net["current"]["check"] is None
    assert net["previous"] is None and by_dir["asr"]["current"] is None


def test_a_host_with_nothing_under_the_default_folder_is_told_where_else_to_look():
    """first-week-turn5: `status HOST --ssh-config` without --remote-dir said only 'nothing
    deployed under ~/edgepack', for a bundle its inventory had put elsewhere."""
    from packager.device.releases import HostState, status_lines

    [line] = status_lines([HostState("pi-02", searched="~/edgepack")])
    assert line.startswith("pi-02: nothing deployed under ~/edgepack") and \
        "--remote-dir DIR" in line and "--hosts FILE" in line
