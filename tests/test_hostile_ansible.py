"""Hostile cases for `deploy --engine ansible`, the standalone edgepack_bundle role and the
inventories both engines read (issue 23, hostile-cases.md items 3, 4, 7, 8, 9, 18, 24, 15, 30).

Real parts only: the real ansible-playbook and ansible-inventory, real sshds on loopback
(tests/fleet.py), real GNU tar on the "device", the role's own files/bundle_info.py. Archives
with device nodes, FIFOs and links are made as tar members only (tarfile.TarInfo): nothing here
creates a device node on disk; the setuid files a test makes are chmod-ed back before it ends.
Each test names the case ids it proves.
"""

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import fleet
import pytest
from fleet import Device, Fleet, require

from packager.device.ansible_engine import inventory_hosts, outcome_name, pack
from packager.device.ansible_role import ROLE, write_role
from packager.device.inventory import InventoryError, parse_host, read_inventory
from packager.errors import PackagerError

BIN = Path(sys.executable).parent
BUNDLE_INFO = ROLE / "files" / "bundle_info.py"


@pytest.fixture(scope="module")
def ready():
    require(fleet.problem(), "EDGEPACK_REQUIRE_SSH")
    require(None if (BIN / "ansible-playbook").is_file() else
            "ansible-playbook is missing: pip install 'edgepack[fleet]'", "EDGEPACK_REQUIRE_SSH")


def cli(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "packager", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, **kw)


def digest_of(folder: Path) -> str:
    import hashlib
    return "sha256:" + hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()


def evil_archive(src: Path, dst: Path, extra) -> Path:
    """*src*'s members (changed by extra(name, info) where it returns a TarInfo) plus the
    (TarInfo, data) pairs extra(None, None) returns."""
    with tarfile.open(src) as t:
        members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]
    with tarfile.open(dst, "w:gz") as out:
        for m, data in members:
            m = extra(m.name, m) or m
            out.addfile(m, io.BytesIO(data) if data is not None else None)
        for info, data in extra(None, None):
            out.addfile(info, io.BytesIO(data) if data is not None else None)
    return dst


def member(name, kind=tarfile.REGTYPE, data=b"", mode=0o644, **kw):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, len(data) if kind == tarfile.REGTYPE else 0
    for k, v in kw.items():
        setattr(info, k, v)
    return info, data if kind == tarfile.REGTYPE else None


def loose_modes(root: Path) -> list[str]:
    """Every path under *root* whose mode is beyond 0755 or that is not a file/folder."""
    bad = []
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) or st.st_mode & 0o7022:
            bad.append(f"{path.relative_to(root)} {stat.filemode(st.st_mode)}")
    return bad


def bundle_info(archive: Path, expected: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BUNDLE_INFO), str(archive), expected],
                          capture_output=True, text=True, timeout=60)


# -- the engine ships what it checked (items 3, 18, 7) ------------------------------------------

def test_a03_a05_a53_engine_reships_the_checked_copy_to_an_ssh_url_host(ready, built, tmp_path):
    """A .tar.gz with a setuid-root tools/id, a 0666 run.py and a 0777 golden/ (A03, A05)
    deployed with --expect-digest to a host given as ssh://user@127.0.0.1:PORT (A53): it passes,
    exit 0 with the host's true outcome, and on the device no file keeps a setuid bit or group/
    world write, and the archive that went there is the engine's own (owner 0, 0644/0755)."""
    src = built.bundle.archive
    idbytes = Path("/usr/bin/id").read_bytes()
    evil = evil_archive(src, tmp_path / "evil-suid.tar.gz", lambda name, info: (
        [member("cnn/tools/id", data=idbytes, mode=0o4755, uid=0, gid=0)] if name is None else
        (setattr(info, "mode", 0o666) if name == "cnn/run.py" else
         setattr(info, "mode", 0o777) if name == "cnn/golden" else None)))
    with Fleet(tmp_path / "fleet", [Device("d1")]) as f:
        ssh_ip = tmp_path / "ssh_ip"
        ssh_ip.write_text(f"Host 127.0.0.1\n  IdentityFile {f.client_key}\n  IdentitiesOnly yes\n"
                          f"  UserKnownHostsFile {f.known_hosts}\n  StrictHostKeyChecking yes\n")
        host = f"ssh://{f.user}@127.0.0.1:{f.port('d1')}"
        remote = f.remote_dir("d1") / "u"
        r = cli("deploy", evil, host, "--engine", "ansible", "--ssh-config", ssh_ip,
                "--remote-dir", remote, "--expect-digest", digest_of(built.bundle.directory),
                "--runs", 1, "--warmup", 0, "--json")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        [h] = json.loads(r.stdout)["hosts"]
        assert h["host"] == host and h["status"] == "pass"
        release = digest_of(built.bundle.directory).split(":")[1][:12]
        assert os.readlink(remote / "current") == f"releases/{release}"
        current = remote / "releases" / release
        assert loose_modes(current) == []
        assert stat.S_IMODE((current / "tools" / "id").stat().st_mode) == 0o644
        assert stat.S_IMODE((current / "run.py").stat().st_mode) == 0o644
        assert stat.S_IMODE((current / "golden").stat().st_mode) == 0o755
        with tarfile.open(remote / "releases" / f"{release}.tar.gz") as t:
            shipped = t.getmembers()
        assert all(m.uid == 0 and m.mode in (0o644, 0o755) and (m.isfile() or m.isdir())
                   for m in shipped)
        assert outcome_name(host) != host and "/" not in outcome_name(host)


def test_a04_a54_pack_normalises_a_folder_and_refuses_an_unsafe_name(ready, built, tmp_path):
    """A bundle folder with a setuid file, a world-writable file and a hard link (A04) is packed
    with 0644 files, 0755 folders, owner 0, each file once; a symlink in it is refused. A
    manifest name that is not one plain path component (A54) is refused with exit 2 before
    anything is written, by the engine and by the role's controller check."""
    folder = tmp_path / "cnn"
    shutil.copytree(built.bundle.directory, folder)
    (folder / "tools").mkdir()
    shutil.copy("/usr/bin/id", folder / "tools" / "id")
    os.chmod(folder / "tools" / "id", 0o4755)
    os.chmod(folder / "run.py", 0o666)
    os.link(folder / "run.py", folder / "tools" / "run-again.py")
    try:
        pack(folder, "cnn", tmp_path / "cnn.tar.gz")
    finally:
        os.chmod(folder / "tools" / "id", 0o755)
    with tarfile.open(tmp_path / "cnn.tar.gz") as t:
        members = {m.name: m for m in t.getmembers()}
    assert members["cnn/tools/id"].mode == 0o644 and members["cnn/run.py"].mode == 0o644
    assert members["cnn/tools/run-again.py"].isfile()   # a file, not a hard link
    assert all(m.uid == 0 and m.uname == "" and m.mode in (0o644, 0o755)
               for m in members.values())
    info = bundle_info(tmp_path / "cnn.tar.gz", digest_of(folder))
    assert info.returncode == 0, info.stderr
    (folder / "tools" / "link").symlink_to("/etc/hostname")
    with pytest.raises(PackagerError, match="tools/link is a symbolic link"):
        pack(folder, "cnn", tmp_path / "again.tar.gz")
    assert not (tmp_path / "again.tar.gz").exists()

    escaped = tmp_path / "escaped"
    named = tmp_path / "named"
    shutil.copytree(built.bundle.directory, named)
    manifest = json.loads((named / "manifest.json").read_text())
    manifest["name"] = f"../../../../../../..{escaped}"
    (named / "manifest.json").write_text(json.dumps(manifest, indent=2))
    r = cli("deploy", named, "nosuchhost", "--engine", "ansible")
    assert r.returncode == 2, r.stderr
    assert "manifest.json: name '../../" in r.stderr and "Traceback" not in r.stderr
    assert not escaped.with_suffix(".tar.gz").exists()
    # the role's own check refuses the same name in an archive (written here by tarfile)
    with tarfile.open(tmp_path / "named.tar.gz", "w:gz") as t:
        t.add(named, "x", filter=lambda i: (setattr(i, "mode", 0o755 if i.isdir() else 0o644)
                                             or i))
    info = bundle_info(tmp_path / "named.tar.gz")
    assert info.returncode == 1 and "name '../../" in info.stderr and "is not a plain name" \
        in info.stderr


# -- the standalone role refuses what the device must not unpack (item 4) --------------------

@pytest.mark.parametrize("case, extra, says", [
    ("A09-chr", member("cnn/mem", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=1),
     "'cnn/mem' is a device node"),
    ("A09-symlink", member("cnn/etc", tarfile.SYMTYPE, linkname="/etc"),
     "'cnn/etc' is a symbolic link"),
    ("A09-fifo", member("cnn/fifo", tarfile.FIFOTYPE), "'cnn/fifo' is a FIFO"),
    ("A13-hardlink", member("cnn/host", tarfile.LNKTYPE, linkname="/etc/hostname"),
     "'cnn/host' is a hard link"),
    ("A10-setuid", member("cnn/tools/id", data=b"x", mode=0o4755), "'cnn/tools/id' has mode 4755"),
    ("A10-world-writable", member("cnn/notes.txt", data=b"x", mode=0o666),
     "'cnn/notes.txt' has mode 0666"),
    ("A11-dotdot", member("cnn/other/../../hostile_outside", data=b"x"),
     "'cnn/other/../../hostile_outside' is outside the bundle folder"),
    ("A12-absolute", member("/abs/hostile_member", data=b"x"),
     "'/abs/hostile_member' is outside the bundle folder"),
    ("A11-second-top", member("other/x", data=b"x"), "expected one bundle folder"),
    ("A09-twice", member("cnn/run.py", data=b"print('not the runner')\n"),
     "'cnn/run.py' is in the archive twice"),
])
def test_a09_to_a13_the_roles_controller_check_refuses_every_hostile_member(
        built, tmp_path, case, extra, says):
    """The genuine bundle plus one hostile member, with the genuine digest expected: refused on
    the controller with one line naming the member, before anything is copied."""
    evil = evil_archive(built.bundle.archive, tmp_path / f"{case}.tar.gz",
                        lambda name, info: [extra] if name is None else None)
    r = bundle_info(evil, digest_of(built.bundle.directory))
    assert r.returncode == 1, r.stdout
    assert says in r.stderr and r.stderr.count("\n") == 1 and "nothing was copied" in r.stderr
    assert bundle_info(built.bundle.archive, digest_of(built.bundle.directory)).returncode == 0


def test_a10_a11_role_refuses_hostile_archive_and_cleans_a_failed_unpack(ready, built, tmp_path):
    """ansible-playbook with the written role: an archive with a device node, a symlink to /etc,
    a FIFO and a setuid file (A10) fails on the controller naming the member, and nothing reaches
    the device. Then a genuine archive whose unpack fails on the device (its tar exits 2 after
    writing the files): the host fails naming the step, no release folder and no half-unpacked
    folder is left, and `current` is untouched (A11)."""
    work = tmp_path / "ops"
    assert cli("ansible-role", "-o", work / "roles").returncode == 0
    (work / "site.yml").write_text("- hosts: all\n  gather_facts: false\n  roles: "
                                   "[edgepack_bundle]\n")
    evil = evil_archive(built.bundle.archive, tmp_path / "evil-dev.tar.gz", lambda name, info: [
        member("cnn/mem", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=1),
        member("cnn/etc", tarfile.SYMTYPE, linkname="/etc"), member("cnn/fifo", tarfile.FIFOTYPE),
        member("cnn/tools/id", data=b"x", mode=0o4755)] if name is None else None)
    with Fleet(tmp_path / "fleet", [Device("d3")]) as f:
        inventory = f.write_inventory(work / "hosts.ini")
        env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PIPELINING": "1"}

        def play(bundle):
            return subprocess.run([BIN / "ansible-playbook", "-i", inventory, "site.yml", "-e",
                                   f"edgepack_bundle={bundle}", "-e", "edgepack_runs=1",
                                   "-e", "edgepack_warmup=0", "-e",
                                   f"edgepack_expect_digest={digest_of(built.bundle.directory)}"],
                                  cwd=work, env=env, capture_output=True, text=True, timeout=300)

        r = play(evil)
        assert r.returncode == 2, r.stdout[-3000:]
        assert "'cnn/mem' is a device node" in r.stdout
        base = f.remote_dir("d3")
        assert not any(base.iterdir())   # nothing copied, nothing unpacked

        gtar = f.device_dir("d3") / "bin" / "gtar"   # found before tar by the unarchive module
        gtar.write_text('#!/bin/sh\n/usr/bin/tar "$@"; rc=$?\n'   # fails after extracting
                        'case " $* " in *" --extract "*) exit 2;; esac\nexit $rc\n')
        gtar.chmod(0o755)
        try:
            r = play(built.bundle.archive)
        finally:
            gtar.unlink()
        assert r.returncode == 2, r.stdout[-3000:]
        assert "Unpack the archive: " in r.stdout and "nothing was run" in r.stdout
        releases = base / "releases"
        assert [p.name for p in releases.iterdir()] == [
            digest_of(built.bundle.directory).split(":")[1][:12] + ".tar.gz"]
        assert not (base / "current").exists()
        assert not list(base.glob(".edgepack-hold-*"))   # the hold ended with the play
        r = play(built.bundle.archive)   # the same archive unpacks once tar works
        assert r.returncode == 0, r.stdout[-3000:]
        assert loose_modes((base / "current").resolve()) == []


# -- hangs and lying devices, one host error each (items 9, 8) --------------------------------

def test_a35_a33_a32_a44_hung_or_lying_devices_are_host_errors_within_the_timeout(
        ready, built, tmp_path):
    """--engine ansible --timeout 8 over five devices: d2's python3 prints `{}` (A33), d3's
    prints `{"garbage` (A32), d4's hangs (A35), d5's releases/ is a link to a photos folder
    (A44 through the role). d1 passes and is switched; the other four are one host error each
    (exit 2, no "bug"), the hung one names the step and its limit, nothing is copied into the
    photos, and the whole deploy ends well within 240 s."""
    lies = {"d2": 'echo "{}"', "d3": "echo '{\"garbage'", "d4": "exec sleep 120"}
    with Fleet(tmp_path / "fleet", [Device(n) for n in ("d1", "d2", "d3", "d4", "d5")]) as f:
        inventory = f.write_inventory(tmp_path / "hosts.ini")
        for name, body in lies.items():
            (f.device_dir(name) / "bin" / "python3").write_text(
                f"#!/bin/sh\ncat >/dev/null &\n{body}\n")
        photos = tmp_path / "photos"
        (photos / "2024").mkdir(parents=True)
        (photos / "2024" / "a.jpg").write_text("x")
        (f.remote_dir("d5") / "releases").symlink_to(photos)
        start = time.monotonic()
        r = cli("deploy", built.bundle.directory, "--hosts", inventory, "--engine", "ansible",
                "--timeout", 8, "--runs", 1, "--warmup", 0, "--json", timeout=240)
        took = time.monotonic() - start
        assert r.returncode == 2, r.stderr[-3000:]
        assert "bug" not in r.stderr and "Traceback" not in r.stderr
        hosts = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
        assert hosts["d1"]["status"] == "pass"
        assert f.remote_dir("d1").joinpath("current").is_symlink()
        for name in [*lies, "d5"]:
            assert hosts[name]["status"] == "error"
            assert not (f.remote_dir(name) / "current").exists()
        assert "is a symbolic link" in hosts["d5"]["error"]
        assert "nothing was copied" in hosts["d5"]["error"]
        assert sorted(p.name for p in photos.rglob("*")) == ["2024", "a.jpg"]
        assert "preflight failed: the device probe's answer is not what device_probe.py " \
               "prints ({})" in hosts["d2"]["error"]
        assert "preflight failed: the device probe's answer is not JSON ({\"garbage)" \
            in hosts["d3"]["error"]
        assert "Preflight" in hosts["d4"]["error"] and "no answer in 8 s" in hosts["d4"]["error"]
        assert took < 150, took


# -- inventories (items 24, 15, 30) and the role writer (A101) ------------------------------

def test_a21_a22_a20_a_dash_address_or_login_is_refused_by_both_readers(ready, tmp_path):
    """ansible_host / ansible_user values that ssh would read as options are refused as a host
    error, by ansible-inventory's reading (both engines when ansible-core is there) and by
    edgepack's own INI reader (the SSH engine without it); so is ssh://-o...@host."""
    for key in ("ansible_host", "ansible_user"):
        path = tmp_path / f"{key}.ini"
        address = "" if key == "ansible_host" else "ansible_host=127.0.0.1 "
        path.write_text(f"[g]\nh1 {address}ansible_port=22 "
                        f"{key}='-oProxyCommand=touch {tmp_path}/X'\n")
        with pytest.raises(InventoryError, match=f"host h1: {key}='-oProxyCommand"):
            inventory_hosts([path])
        with pytest.raises(InventoryError, match=f"{key}='-oProxyCommand"):
            read_inventory(path)
        r = cli("deploy", tmp_path, "--hosts", path, "--engine", "ssh")
        assert r.returncode == 2 and f"{key}='-oProxyCommand" in r.stderr, r.stderr
    with pytest.raises(InventoryError, match="is not a host"):
        parse_host(f"ssh://-oProxyCommand=touch {tmp_path}/X@127.0.0.1:22")
    assert not (tmp_path / "X").exists()


@pytest.mark.parametrize("case, name, text, says", [
    ("A91", "i.ini", "[g]\nh ansible_host=127.0.0.1 ansible_port=notaport\n",
     "host h: ansible_port='notaport' is not a port number"),
    ("A92", "i.yml", "all:\n  hosts:\n    h:\n      ansible_port: [1, 2]\n",
     "host h: ansible_port=[1, 2] is not a port number"),
    ("A93", "q.yml", 'all:\n  hosts:\n    h:\n      ansible_ssh_common_args: "-o \\"x"\n',
     "host h: ansible_ssh_common_args: No closing quotation"),
    ("A94", "r.yml", "all:\n  hosts:\n    h:\n      edgepack_remote_dir: 42\n",
     "host h: edgepack_remote_dir is int 42, not text"),
])
def test_a91_to_a94_bad_inventory_values_exit_2_naming_host_and_variable(ready, built, tmp_path,
                                                                        case, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    r = cli("deploy", built.bundle.directory, "--hosts", path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "bug" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a88_a89_hosts_fifo_or_device_is_refused_at_once(ready, built, tmp_path):
    fifo = tmp_path / "hosts.fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        start = time.monotonic()
        r = cli("deploy", built.bundle.directory, "--hosts", path, timeout=60)
        assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
        assert time.monotonic() - start < 30
    big = tmp_path / "huge.ini"
    with open(big, "wb") as f:
        f.truncate(5 << 20)   # a sparse 5 MB file: over the bound, refused without parsing
    with pytest.raises(InventoryError, match="larger than 4 MB"):
        inventory_hosts([big])


def test_a101_ansible_role_over_a_symlink_never_deletes_through_it(tmp_path):
    """roles/edgepack_bundle is a symbolic link to a folder of the user's: without --force the
    command refuses naming the link; with --force the link is replaced by the role and the
    folder it pointed to is left as it was."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    roles = tmp_path / "roles"
    roles.mkdir()
    (roles / "edgepack_bundle").symlink_to(theirs)
    r = cli("ansible-role", "-o", roles)
    assert r.returncode == 2 and "is a symbolic link" in r.stderr and "--force" in r.stderr
    r = cli("ansible-role", "-o", roles, "--force")
    assert r.returncode == 0, r.stderr
    dest = roles / "edgepack_bundle"
    assert not dest.is_symlink() and (dest / "tasks" / "main.yml").is_file()
    assert [p.name for p in theirs.iterdir()] == ["keep.txt"]
    assert write_role(roles) == (dest, False)


# -- two deploys at once (item 5, through the role) -------------------------------------------

def test_a40_a39_two_ansible_deploys_to_one_folder_both_pass_and_current_never_dangles(
        ready, built, tmp_path):
    """Two `deploy --engine ansible` runs to one device folder at once: the first is slowed in
    its bench (its python sleeps 8 s before `run.py bench`), the second switches meanwhile. The
    role's hold keeps the first's release from the second's clean-up, so both pass, `current`
    is the last switched release and `previous` the other, both on disk; afterwards no hold is
    left (both busy locks can be taken) and no hold file remains."""
    import fcntl

    other = tmp_path / "cnn2"
    shutil.copytree(built.bundle.directory, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["name"] = "cnn2"   # another digest: another release in the same folder
    (other / "manifest.json").write_text(json.dumps(manifest, indent=2))
    slow, fast = (digest_of(b).split(":")[1][:12] for b in (built.bundle.directory, other))
    with Fleet(tmp_path / "fleet", [Device("d1")]) as f:
        py = f.device_dir("d1") / "bin" / "slowpy"
        py.write_text('#!/bin/sh\ncase " $* " in *" bench "*) sleep 8;; esac\nexec python3 "$@"\n')
        py.chmod(0o755)
        base = tmp_path / "shared"
        common = ["d1", "--engine", "ansible", "--ssh-config", f.ssh_config, "--remote-dir",
                  base, "--runs", 1, "--warmup", 0]

        def start(bundle, *extra):
            return subprocess.Popen([sys.executable, "-m", "packager", "deploy", str(bundle),
                                     *map(str, common), *extra], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)

        first = start(built.bundle.directory, "--python", "slowpy")
        time.sleep(1.5)
        second = start(other)
        try:
            outs = [p.communicate(timeout=240) for p in (second, first)]
        finally:
            for p in (first, second):
                if p.poll() is None:
                    p.kill()
                    p.wait()
        assert second.returncode == 0, outs[0][1][-3000:]
        assert first.returncode == 0, outs[1][1][-3000:]
        assert os.readlink(base / "current") == f"releases/{slow}"
        assert os.readlink(base / "previous") == f"releases/{fast}"
        assert (base / "current" / "manifest.json").is_file()
        assert (base / "previous" / "manifest.json").is_file()
        assert not list(base.glob(".edgepack-hold-*"))
        jobs = Path.home() / ".ansible_async"   # the holds' async job files are removed
        assert not [j for j in (jobs.iterdir() if jobs.is_dir() else [])
                    if str(base).encode() in j.read_bytes()]
        deadline = time.monotonic() + 10
        for rid in (slow, fast):
            fd = os.open(base / ".edgepack-busy" / f"{rid}.lock", os.O_RDWR)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError:
                        assert time.monotonic() < deadline, f"{rid} is still held"
                        time.sleep(0.2)
            finally:
                os.close(fd)


def test_a35_every_role_task_that_can_wait_has_a_timeout():
    """Every task of the role that runs a module on the device or the controller (all but
    set_fact, fail, assert and debug, which only template, and include_tasks, whose tasks are
    walked too) has a `timeout:`, so no step of the role can hang a deploy."""
    import yaml

    untimed = []

    def walk(tasks):
        for task in tasks:
            for key in ("block", "rescue", "always"):
                walk(task.get(key, []))
            modules = [k for k in task if k.startswith("ansible.builtin.")
                       and k.rsplit(".", 1)[1] not in ("set_fact", "fail", "assert", "debug",
                                                       "include_tasks")]
            if modules and "timeout" not in task:
                untimed.append(task["name"])

    tasks = sorted((ROLE / "tasks").glob("*.yml"))
    assert [p.name for p in tasks] == ["end_hold.yml", "main.yml"]
    for path in tasks:
        walk(yaml.safe_load(path.read_text()))
    assert untimed == []
