"""Hostile cases for `deploy --engine ssh` and device_probe.py (issue 23, hostile-cases.md).

Against a fleet of two real sshds on loopback (tests/fleet.py), with the real device_probe.py,
rsync, scp and run.py: concurrent deploys to one folder (A39, A40), what the clean-up may delete
(A43, A44), untrusted answers from a device (A31, A32), a stalled copy (A36), `~` in
--remote-dir (A23), hosts and options refused before anything reaches a device (A20, A71-A80,
A26, A29), a device folder that is not what edgepack made (A45, A46), a full device (A48, A49),
the manifest name as a path (A55, A56), a manifest without `target` (A57), the reports folder of
a host named `..` (A30), and stray importable files on the device (A01). Each test names the
case ids it proves. In CI (EDGEPACK_REQUIRE_SSH=1) a missing sshd fails them, elsewhere they
skip with the reason.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import fleet
import pytest
from click.testing import CliRunner
from fleet import Device, Fleet, ours_running, require, wait_until_gone

from packager.cli import main
from packager.device.deploy import DeployOptions, deploy, release_id
from packager.device.inventory import Host, parse_host
from packager.device.verify import bundle_digest
from packager.errors import BundleError, PackagerError

PROBE = Path(__file__).parent.parent / "runtimes" / "device_probe.py"


@pytest.fixture(scope="module")
def devices(tmp_path_factory):
    require(fleet.problem(), "EDGEPACK_REQUIRE_SSH")
    with Fleet(tmp_path_factory.mktemp("hostile-fleet"), [Device("d1"), Device("d2")]) as f:
        yield f


@pytest.fixture(scope="module")
def versions(built, tmp_path_factory):
    """Two versions of the test bundle (their manifests differ only in `name`, so each has its
    own digest and release id) in folders of their own, so reports land there."""
    root = tmp_path_factory.mktemp("versions")
    return variant(built.bundle.directory, root / "a", name="cnn-a"), \
        variant(built.bundle.directory, root / "b", name="cnn-b")


def variant(source: Path, dest: Path, **changes) -> Path:
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("reports"))
    manifest = json.loads((dest / "manifest.json").read_text())
    for key, value in changes.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return dest


def opts(devices, remote, **kw) -> DeployOptions:
    kw.setdefault("runs", 3)
    kw.setdefault("warmup", 0)
    kw.setdefault("timeout", 120)
    return DeployOptions(ssh_config=devices.ssh_config, remote_dir=str(remote), **kw)


def cli(*args) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "packager", "deploy", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def rid(bundle: Path) -> str:
    return release_id(bundle_digest(bundle))


def intact_release(base: Path, link: str) -> str:
    """The release BASE/LINK points at, after checking it exists and is the one its name says."""
    target = base / link
    assert target.is_symlink(), f"{link} is not a link"
    folder = target.resolve()
    assert folder.is_dir(), f"{link} dangles: {os.readlink(target)}"
    digest = hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
    assert digest[:12] == folder.name
    return folder.name


# -- 5: concurrent deploys ------------------------------------------------------------------


def test_a40_a39_two_deploys_at_once_never_leave_current_dangling(devices, versions, tmp_path):
    """Two versions deployed to one device folder at the same time, the faster one with fewer
    runs, twice (each order once): both pass, `current` is the last switch's release and
    `previous` the other one, both intact; nothing of a release in use was deleted."""
    a, b = versions
    for round_, (fast, slow) in enumerate(((a, b), (b, a))):
        base = devices.remote_dir("d1") / f"conc{round_}"
        results: dict[str, object] = {}

        def run(bundle: Path, runs: int, base: Path, results: dict) -> None:
            results[bundle.name] = deploy(bundle, [parse_host("d1")],
                                          options=opts(devices, base, runs=runs))[0]

        threads = [threading.Thread(target=run, args=(fast, 2, base, results)),
                   threading.Thread(target=run, args=(slow, 150, base, results))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert not any(t.is_alive() for t in threads)
        ids = {fast.name: rid(fast), slow.name: rid(slow)}
        for name, r in results.items():
            assert r.exit_code == 0, (name, r.error)
            assert r.release["switched"] and r.release["current"] == ids[name]
        current, previous = intact_release(base, "current"), intact_release(base, "previous")
        assert {current, previous} == {rid(a), rid(b)}
        # the last switch wins: its deploy saw the other release in use before it
        [last] = [n for n, r in results.items() if r.release["previous"] != ""]
        assert current == ids[last] and results[last].release["previous"] == previous
        assert sorted(p.name for p in (base / "releases").iterdir()) == sorted([rid(a), rid(b)])
        assert not list(base.glob(".current.*")) and not list(base.glob(".previous.*"))
        assert not wait_until_gone(str(base), 10), "a hold or copy outlived its deploy"


# -- 6: what the clean-up may delete ---------------------------------------------------------


def test_a43_cleanup_leaves_entries_edgepack_did_not_make(devices, versions, built, tmp_path):
    """A Capistrano-style releases/ with the user's folders and files (one even named like a
    release): three deploys later they are all there; only edgepack's old release went."""
    a, b = versions
    c = variant(built.bundle.directory, tmp_path / "c", name="cnn-c")
    base = devices.remote_dir("d1") / "myapp"
    user = base / "releases" / "20240101-app-v1"
    user.mkdir(parents=True)
    (user / "db.sqlite").write_text("data")
    (base / "releases" / "NOTES.txt").write_text("notes")
    lookalike = base / "releases" / "0123456789ab"   # 12 hex digits, but not a release
    lookalike.mkdir()
    (lookalike / "manifest.json").write_text("{}")
    (base / "releases" / "abcdefabcdef.tar.gz").symlink_to(user / "db.sqlite")
    for bundle in (a, b, c):
        [r] = deploy(bundle, [parse_host("d1")], options=opts(devices, base))
        assert r.exit_code == 0, r.error
    assert (user / "db.sqlite").read_text() == "data"
    assert (base / "releases" / "NOTES.txt").read_text() == "notes"
    assert (lookalike / "manifest.json").read_text() == "{}"
    assert (base / "releases" / "abcdefabcdef.tar.gz").is_symlink()
    assert not (base / "releases" / rid(a)).exists()          # edgepack's own old release
    assert r.release["removed"] == [f"releases/{rid(a)}"]
    assert intact_release(base, "current") == rid(c) and intact_release(base, "previous") == rid(b)


def test_a44_a_symlinked_releases_is_refused_and_nothing_is_deleted(devices, versions, tmp_path):
    base = devices.remote_dir("d1") / "symrel"
    base.mkdir(parents=True)
    photos = tmp_path / "photos"
    (photos / "2024").mkdir(parents=True)
    (photos / "2024" / "a.jpg").write_text("x")
    (photos / "b.jpg").write_text("y")
    (base / "releases").symlink_to(photos)
    [r] = deploy(versions[0], [parse_host("d1")], options=opts(devices, base))
    assert r.exit_code == 2
    assert f"{base}/releases is a symbolic link" in r.error
    assert sorted(str(p.relative_to(photos)) for p in photos.rglob("*")) == [
        "2024", "2024/a.jpg", "b.jpg"]
    assert sorted(p.name for p in base.iterdir()) == ["releases"]   # nothing written


# -- 8: untrusted answers --------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["{}", '{"garbage'], ids=["A31", "A32"])
def test_a31_a32_a_device_answering_junk_fails_alone(devices, versions, tmp_path, answer):
    """d2's python3 answers `{}` or broken JSON to everything: d2 fails with one line, d1 is
    deployed, and the fleet's result has both (exit 2, not a crash)."""
    wrapper = devices.device_dir("d2") / "bin" / "python3"
    original = wrapper.read_text()
    wrapper.write_text(f"#!/bin/sh\ncat >/dev/null\necho '{answer}'\n")
    try:
        proc = cli(versions[0], "d1", "d2", "--ssh-config", devices.ssh_config, "--remote-dir",
                   tmp_path / "r", "--runs", 2, "--warmup", 0, "--json")
    finally:
        wrapper.write_text(original)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "bug" not in proc.stderr
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert hosts["d1"]["status"] == "pass"
    assert hosts["d2"]["status"] == "error"
    assert "d2: preflight: the device answered with something that is not edgepack's device " \
           "probe" in hosts["d2"]["error"] or "has no 'python' field" in hosts["d2"]["error"]


# -- 9: deadlines ----------------------------------------------------------------------------


def test_a36_a_stalled_copy_ends_at_the_deadline_with_its_processes(devices, versions, tmp_path):
    """The device's rsync never answers: the deploy fails at --timeout naming the copy, and no
    rsync, ssh or hold of this deploy is left running."""
    stall = devices.device_dir("d2") / "bin" / "rsync"
    stall.write_text("#!/bin/sh\nexec sleep 40\n")
    stall.chmod(0o755)
    base = tmp_path / f"stalled-{uuid.uuid4().hex[:6]}"
    try:
        start = time.monotonic()
        [r] = deploy(versions[0], [parse_host("d2")], options=opts(devices, base, timeout=12))
        took = time.monotonic() - start
    finally:
        stall.unlink()
    assert r.exit_code == 2 and "d2: copy (rsync): no answer in 12 s; ended it" in r.error
    assert took < 12 + 30
    assert not wait_until_gone(str(base), 15), "a process of the deploy outlived it"
    assert not (base / "current").exists()


def test_a36_a_hold_that_never_answers_ends_at_the_deadline(devices, versions, tmp_path):
    """The device's python hangs when started for the hold (python3 -c ...): the host fails at
    --timeout naming the hold step, before anything is copied, and the hold's ssh is ended."""
    wrapper = devices.device_dir("d2") / "bin" / "python3"
    original = wrapper.read_text()
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec sleep 30; fi\n'
                       f'exec {sys.executable} "$@"\n')
    base = tmp_path / f"hung-hold-{uuid.uuid4().hex[:6]}"
    try:
        [r] = deploy(versions[0], [parse_host("d2")], options=opts(devices, base, timeout=10))
    finally:
        wrapper.write_text(original)
    assert r.exit_code == 2 and "d2: hold: no answer in 10 s; ended it" in r.error
    assert not r.copied and not list((base / "releases").rglob("*.onnx"))
    assert not wait_until_gone(str(base), 15), "the hold's ssh outlived the deploy"


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["ctrl-c", "sigterm"])
def test_a36_ctrl_c_or_sigterm_mid_copy_leaves_no_rsync_behind(devices, versions, tmp_path, sig,
                                                                code):
    """Ctrl-C (SIGINT to edgepack alone, as a terminal sends it to the foreground group) or
    SIGTERM while the copy waits on the device: edgepack exits 130 / 143 and ends its rsync,
    rsync's ssh and the hold, which run in process groups of their own."""
    stall = devices.device_dir("d2") / "bin" / "rsync"
    stall.write_text("#!/bin/sh\nexec sleep 40\n")
    stall.chmod(0o755)
    base = tmp_path / f"killed-{uuid.uuid4().hex[:6]}"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "packager", "deploy", str(versions[0]),
                                 "d2", "--ssh-config", str(devices.ssh_config), "--remote-dir",
                                 str(base), "--timeout", "120"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not [c for c in ours_running(str(base)) if c.startswith("rsync")]:
            assert time.monotonic() < deadline and proc.poll() is None, "no copy started"
            time.sleep(0.2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        stall.unlink()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert not wait_until_gone(str(base), 15), "a process of the deploy outlived it"


# -- 20, 24, 27, 28: input refused or handled before anything reaches a device ---------------


def test_a23_tilde_in_remote_dir_is_the_login_home(devices, versions):
    name = f"edgepack-hostile-{uuid.uuid4().hex[:8]}"
    home = Path.home()
    try:
        [r] = deploy(versions[0], [parse_host("d1")], options=opts(devices, f"~/{name}"))
        assert r.exit_code == 0, r.error
        assert intact_release(home / name, "current") == rid(versions[0])
        assert r.release["dir"] == str(home / name)
        assert not (home / "~").exists()
    finally:
        shutil.rmtree(home / name, ignore_errors=True)


def test_a20_a_host_or_user_starting_with_dash_never_reaches_ssh(devices, versions, tmp_path):
    marker = tmp_path / "PWNED"
    proc = cli(versions[0], f"ssh://-oProxyCommand=touch {marker}@127.0.0.1:22",
               "--ssh-config", devices.ssh_config, "--remote-dir", tmp_path / "r")
    assert proc.returncode == 2 and "is not a host" in proc.stderr
    for destination in (f"-oProxyCommand=touch {marker}", f"-oProxyCommand=touch {marker}@h"):
        with pytest.raises(PackagerError, match="would be read as an option"):
            deploy(versions[0], [Host("evil", destination)], options=opts(devices, tmp_path))
    assert not marker.exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("option,value,message", [
    ("--runs", "0", "--runs 0: not a number of runs"),                       # A71
    ("--runs", "-5", "--runs -5: not a number of runs"),                     # A72
    ("--warmup", "-1", "--warmup -1: not a number of warm-up runs"),         # A73
    ("--timeout", "0", "--timeout 0.0: not a number of seconds"),            # A74
    ("--timeout", "-1", "--timeout -1.0: not a number of seconds"),          # A75
    ("--bwlimit", "-1", "--bwlimit -1: not a bandwidth"),                    # A76
    ("--port", "99999", "--port 99999: not a TCP port"),                     # A77
    ("--port", "-1", "--port -1: not a TCP port"),                           # A78
    ("--latency-budget-ms", "-1", "--latency-budget-ms -1.0: not a latency"),  # A79
    ("--latency-budget-ms", "nan", "--latency-budget-ms nan: not a latency"),  # A80
    ("--remote-dir", "bad\nname", "holds a newline"),                        # A26
    ("--remote-dir", "-hostile-dash", "write it as ./-hostile-dash"),        # A29
])
def test_a71_to_a80_a26_a29_bad_options_exit_2_before_any_device(devices, versions, tmp_path,
                                                                 option, value, message):
    remote = tmp_path / "never"
    args = ["deploy", str(versions[0]), "d1", "--ssh-config", str(devices.ssh_config),
            "--remote-dir", str(remote), option, value]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not remote.exists() and not list(devices.remote_dir("d1").glob("*hostile*"))


def test_a45_a46_a_device_folder_edgepack_did_not_make_is_refused_clearly(devices, versions,
                                                                          tmp_path):
    """`current` a real folder (user data) or `releases` a file: one clear line, nothing
    copied or changed, no `.current.PID` litter, no "the copy resumes"."""
    base = tmp_path / "cur"
    (base / "current").mkdir(parents=True)
    (base / "current" / "mine.txt").write_text("mine")
    [r] = deploy(versions[0], [parse_host("d1")], options=opts(devices, base))
    assert r.exit_code == 2 and f"{base}/current is a real folder, not the link" in r.error
    assert "resumes" not in r.error and not r.copied
    assert (base / "current" / "mine.txt").read_text() == "mine"
    assert sorted(p.name for p in base.iterdir()) == ["current"]
    base = tmp_path / "relfile"
    base.mkdir()
    (base / "releases").write_text("a file")
    [r] = deploy(versions[0], [parse_host("d1")], options=opts(devices, base))
    assert r.exit_code == 2 and f"{base}/releases is not a folder" in r.error
    assert "resumes" not in r.error and (base / "releases").read_text() == "a file"


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs with few inodes (root only; skipped where mount is not allowed)."""
    where = tmp_path / "small"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=20", "tmpfs",
                           str(where)], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()[:100]}")
    yield where
    subprocess.run(["umount", "-l", str(where)], timeout=30)


def test_a48_out_of_inodes_during_the_copy_says_so(devices, versions, small_fs):
    [r] = deploy(versions[0], [parse_host("d1")], options=opts(devices, small_fs / "app"))
    assert r.exit_code == 2
    assert "d1: copy (rsync): no space left on the device" in r.error
    assert "free some space (blocks and inodes)" in r.error
    assert not (small_fs / "app" / "current").exists()


def test_a49_out_of_inodes_at_the_switch_keeps_current_and_says_so(small_fs):
    """device_probe switch on a full file system: one line naming it, current unchanged, no
    `.current.PID` left behind."""
    base = small_fs / "app"

    def release(tag: str) -> str:
        text = json.dumps({"files": {}, "tag": tag})
        name = hashlib.sha256(text.encode()).hexdigest()[:12]
        (base / "releases" / name).mkdir(parents=True)
        (base / "releases" / name / "manifest.json").write_text(text)
        return name

    def switch(name: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run([sys.executable, str(PROBE), "switch", str(base), name],
                              capture_output=True, text=True, timeout=60)

    first = release("1")
    assert switch(first).returncode == 0
    second = release("2")
    filler = small_fs / "filler"
    filler.mkdir()
    for i in range(100):
        try:
            (filler / str(i)).touch()
        except OSError:
            break
    proc = switch(second)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no space left on the device" in json.loads(proc.stdout)["error"]
    assert os.readlink(base / "current") == f"releases/{first}"
    assert not (base / "previous").exists()     # both links as they were
    assert not list(base.glob(".current.*")) and not list(base.glob(".previous.*"))


# -- 7, 15, 29: the manifest and the host name as paths --------------------------------------


@pytest.mark.parametrize("name", ["../../../../../tmp/escaped", "", ".."],
                         ids=["A55", "A56", "dots"])
def test_a55_a56_the_manifest_name_cannot_move_the_default_folder(devices, versions, tmp_path,
                                                                  name):
    """The default remote folder is ~/edgepack/NAME: a name that is not one plain folder name
    is refused (exit 2) before anything reaches the device."""
    bundle = variant(versions[0], tmp_path / "m", name=name)
    escaped = Path("/tmp/escaped")
    existed = escaped.exists()
    with pytest.raises(BundleError, match=r"manifest.json: name '[./a-z]*' "):
        deploy(bundle, [parse_host("d1")], options=DeployOptions(ssh_config=devices.ssh_config))
    assert escaped.exists() == existed
    result = CliRunner().invoke(main, ["deploy", str(bundle), "d1", "--ssh-config",
                                       str(devices.ssh_config)])
    assert result.exit_code == 2 and "manifest.json: name" in result.output


def test_a57_a_manifest_without_target_exits_2_naming_it(devices, versions, tmp_path):
    bundle = variant(versions[0], tmp_path / "n1", target=None)
    proc = cli(bundle, "d1", "--ssh-config", devices.ssh_config, "--remote-dir", tmp_path / "r")
    assert proc.returncode == 2, proc.stderr
    assert "target" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_a30_a_host_named_dotdot_gets_a_reports_folder_of_its_own(devices, versions, tmp_path):
    config = tmp_path / "ssh_config"
    text = devices.ssh_config.read_text()
    d1 = text[text.index("Host d1\n"):].split("Host ", 2)[1]
    config.write_text(text + "Host .." + d1[len("d1"):])
    bundle = variant(versions[0], tmp_path / "b", name="cnn-a")
    [r] = deploy(bundle, [parse_host("..")], options=DeployOptions(
        ssh_config=config, remote_dir=str(tmp_path / "r"), runs=2, warmup=0))
    assert r.exit_code == 0, r.error
    assert Path(r.reports_dir) == bundle / "reports" / "__"
    assert (bundle / "reports" / "__" / "report.json").is_file()
    assert not (bundle / "report.json").exists() and not (bundle / "report.md").exists()


# -- 1: stray importable files on the device ------------------------------------------------


STRAYS = ["numpy/__init__.pyc", "json/__init__.cpython-311-x86_64-linux-gnu.so", "evil.pth",
          "onnxruntime/__init__.abi3.so", "cv2/data/evil.so", "golden/evil.py",
          "runner/__init__.pyc", "runner/__pycache__/x.pyc"]


def test_a01_stray_modules_planted_on_the_device_are_refused(devices, versions, tmp_path):
    """The A01 reproduction end to end: a planted package whose __init__ is .pyc or .so, a
    namespace package, a module in a bundle folder, a .pth, or anything extra in runner/, in
    the release on the device, is refused by the device's own integrity check (scp leaves
    extra files in place; rsync removes them, see the next test) and nothing runs; the bundle
    with it is refused here first."""
    base = tmp_path / "a01"
    [first] = deploy(versions[0], [parse_host("d1")], options=opts(devices, base))
    assert first.exit_code == 0, first.error
    release = base / "releases" / rid(versions[0])
    proof = tmp_path / "PWNED"
    code = f"open({str(proof)!r}, 'w').write('ran')\n"
    for rel in STRAYS:
        path = release / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
        [r] = deploy(versions[0], [parse_host("d1")], options=opts(
            devices, base, expect_digest=bundle_digest(versions[0]), transfer="scp"))
        assert r.exit_code == 2 and "on the device" in r.error and "nothing was run" in r.error
        parts = rel.split("/")
        named = "/".join(parts[:2]) if parts[0] == "runner" else parts[0]
        assert named + ": not part of the" in r.error, (rel, r.error)
        assert not r.report and not proof.exists()
        path.unlink()
        while path.parent != release and not any(path.parent.iterdir()):
            path = path.parent
            path.rmdir()
    planted = variant(versions[0], tmp_path / "planted", name="cnn-a")
    (planted / "numpy").mkdir()
    (planted / "numpy" / "__init__.pyc").write_text(code)
    with pytest.raises(BundleError, match="numpy: not part of the bundle"):
        deploy(planted, [parse_host("d1")], options=opts(devices, tmp_path / "never"))
    assert not (tmp_path / "never").exists() and not proof.exists()


def test_n1_a_redeploy_with_rsync_removes_what_was_planted_in_the_release(devices, versions,
                                                                         tmp_path):
    """A release folder holding a planted package (left by a refused copy, or put there by
    someone on the device): the next rsync deploy of the genuine bundle removes it (--delete,
    the device's reports and tuning protected) and passes, instead of being refused forever."""
    base = tmp_path / "n1"
    [first] = deploy(versions[0], [parse_host("d1")], options=opts(devices, base))
    assert first.exit_code == 0, first.error
    release = base / "releases" / rid(versions[0])
    (release / "numpy").mkdir()
    (release / "numpy" / "__init__.pyc").write_text("raise SystemExit('planted')\n")
    (release / "cache").mkdir()
    (release / "cache" / "engine.bin").write_text("x")   # the device's own: excluded, kept
    [again] = deploy(versions[0], [parse_host("d1")], options=opts(devices, base))
    assert again.exit_code == 0, again.error
    assert not (release / "numpy").exists()
    assert (release / "cache" / "engine.bin").read_text() == "x"


# -- build --time-on: the device's timings are untrusted input too ---------------------------


@pytest.mark.parametrize("answer", ['{"timings": {}}', '{"timings": {"m.onnx": {"p50": -1, '
                                    '"p90": "x"}}, "device": {}}', "not json"])
def test_time_on_a_device_answering_junk_names_the_host(devices, cnn_onnx, tmp_path, answer):
    """build --time-on: a device whose python prints timings that are not time_models.py's
    (missing, negative, text) fails with one line naming the host; the scratch folder goes."""
    from dataclasses import replace

    from packager.device.remote import DeviceError
    from packager.device.remote_timing import remote_timer

    liar = tmp_path / "python3"
    liar.write_text(f"#!/bin/sh\necho '{answer}'\n")
    liar.chmod(0o755)
    device = replace(parse_host("d1"), python=str(liar))
    timer = remote_timer(device, ssh_config=devices.ssh_config, python=str(liar), timeout=60)
    before = set(Path.home().glob("edgepack/.auto-*"))
    model = tmp_path / "m.onnx"
    shutil.copyfile(cnn_onnx, model)
    feed = {"image": __import__("numpy").zeros((1, 3, 32, 32), "float32")}
    with pytest.raises(DeviceError, match=r"d1: time-on: the device's answer is not what "
                                          r"time_models.py prints"):
        timer([model], feed, 1, 1, 1)
    assert set(Path.home().glob("edgepack/.auto-*")) == before


def test_a39_a_switch_waits_for_the_lock_then_says_who_holds_it(tmp_path):
    """device_probe switch while another deploy holds BASE/.edgepack.lock: it waits WAIT
    seconds, then fails with one line naming the lock, and changes nothing."""
    import fcntl

    base = tmp_path / "app"
    text = json.dumps({"files": {}})
    name = hashlib.sha256(text.encode()).hexdigest()[:12]
    (base / "releases" / name).mkdir(parents=True)
    (base / "releases" / name / "manifest.json").write_text(text)
    with open(base / ".edgepack.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(PROBE), "switch", str(base), name, "1"],
                              capture_output=True, text=True, timeout=60)
        took = time.monotonic() - start
    assert proc.returncode == 1 and 1 <= took < 30
    assert json.loads(proc.stdout)["error"].startswith(
        f"another deploy holds the lock on {base}/.edgepack.lock for more than 1 s")
    assert not (base / "current").exists()
    proc = subprocess.run([sys.executable, str(PROBE), "switch", str(base), name, "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and os.readlink(base / "current") == f"releases/{name}"
