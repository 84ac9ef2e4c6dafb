"""Hostile cases against the runner (run.py, runner/) and the integrity rules it shares with
`edgepack verify`: planted importable code (B01, B03, B04), roofline and provider paths
(B34-B36, B38), session.tuned.json bounds (B14-B16), the manifest's name and target (A54-A56
on read, B37), `serve` under slow and many clients, big bodies and signals (S23, S24, S26, S27,
S47-S49, S70-S72, S84, S85, S93), `infer` inputs and outputs (R01, R05-R07), `bench --tune`
(item 12's runner half, E96). Real run.py subprocesses, real sockets, real onnxruntime.
"""

import hashlib
import io
import json
import os
import py_compile
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import raw_http, read_to_end, run_py, start_server

EDGEPACK = str(Path(sys.executable).with_name("edgepack"))


def copy_bundle(built, dest: Path) -> Path:
    shutil.copytree(built.bundle.directory, dest, symlinks=True,
                    ignore=shutil.ignore_patterns("reports", "session.tuned.json*", "cache"))
    return dest


def digest(bundle: Path) -> str:
    return "sha256:" + hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()


def edit_manifest(bundle: Path, change) -> None:
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest, indent=2))


def evil_source(proof: Path) -> str:
    return f"open({str(proof)!r}, 'w').write('ran from ' + __file__)\n"


def plant(bundle: Path, rel: str, proof: Path) -> None:
    """Put *rel* in *bundle*: real code that writes *proof* when it runs (a compiled .pyc for
    .pyc names, source for .py and .pth), a file by that name for a .so."""
    path = bundle / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / "evil_src.py"
    if rel.endswith(".pyc"):
        src.write_text(evil_source(proof))
        py_compile.compile(str(src), cfile=str(path), doraise=True)
        src.unlink()
    elif rel.endswith(".pth"):
        path.write_text("import os; " + evil_source(proof))
    elif rel.endswith(".py"):
        path.write_text(evil_source(proof))
    else:   # a shared object: its name alone must be refused
        path.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))


PLANTED = [
    ("B01", "numpy/__init__.pyc"),
    ("B04", "numpy/__init__.cpython-311-x86_64-linux-gnu.so"),
    ("B01-namespace", "ns/mod.py"),
    ("B03", "json/__init__.pyc"),
    ("B01-pth", "x.pth"),
    ("B04-abi3", "numpy.abi3.so"),
    ("B01-runner", "runner/__init__.pyc"),
    ("B01-runner-cache", "runner/__pycache__/cli.cpython-311.pyc"),
    ("B04-runner", "runner/errors.cpython-311-x86_64-linux-gnu.so"),
    ("B01-runner-namespace", "runner/ns/mod.py"),
    ("B01-runner-pth", "runner/x.pth"),
    ("B04-runner-abi3", "runner/numpy.abi3.so"),
]


@pytest.mark.parametrize("case, rel", PLANTED, ids=[c for c, _ in PLANTED])
def test_b01_b03_b04_planted_code_is_refused_by_verify_and_check_and_never_runs(
        built, tmp_path, case, rel):
    bundle = copy_bundle(built, tmp_path / "b")
    expected = digest(bundle)
    proof = tmp_path / "PWNED"
    plant(bundle, rel, proof)
    top = rel.split("/")[0] if not rel.startswith("runner/") else "/".join(rel.split("/")[:2])

    r = subprocess.run([EDGEPACK, "verify", str(bundle), "--expect-digest", expected, "--json",
                        "--runs", "1", "--warmup", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    report = json.JSONDecoder().raw_decode(r.stdout)[0]   # then the one-line error, as JSON
    integrity = next(c for c in report["checks"] if c["name"] == "integrity")
    assert not integrity["passed"] and top in integrity["detail"], integrity
    assert "nothing from the bundle was run" in integrity["detail"]

    for isolated in (True, False):   # `python3 run.py` puts the bundle first on sys.path
        r = run_py(bundle, "check", "--json") if isolated else subprocess.run(
            [sys.executable, "run.py", "check", "--json"], cwd=bundle, capture_output=True,
            text=True, timeout=300)
        assert r.returncode == 1, r.stderr
        problems = json.loads(r.stdout)["integrity"]
        assert any(top in p for p in problems), problems
        assert "Traceback" not in r.stderr
        assert not proof.exists(), proof.read_text()


def test_b01_control_the_planted_pyc_would_run_if_imported(tmp_path):
    """The .pyc the test above plants is real code: imported from its folder, it runs."""
    proof = tmp_path / "PWNED"
    plant(tmp_path, "numpy/__init__.pyc", proof)
    subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, '.'); "
                    "import numpy"], cwd=tmp_path, capture_output=True, timeout=60)
    assert proof.exists()


def test_b01_folders_no_import_can_name_are_not_strays(built, tmp_path):
    """A virtualenv or a data folder beside run.py ('.venv', 'my-data') holds .py files that no
    import statement can reach: the bundle stays intact."""
    bundle = copy_bundle(built, tmp_path / "b")
    for rel in (".venv/lib/python3.11/site-packages/numpy/__init__.py", "my-data/x.py"):
        (bundle / rel).parent.mkdir(parents=True)
        (bundle / rel).write_text("raise SystemExit('imported')\n")
    r = run_py(bundle, "check", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["integrity"] == [], r.stdout[-500:]


# --- manifest paths, name and target -------------------------------------------------------

def test_b34_roofline_outside_the_bundle_is_refused(built, tmp_path):
    bundle = copy_bundle(built, tmp_path / "b")
    shutil.copy(bundle / json.loads((bundle / "manifest.json").read_text())["roofline"]["fp32"],
                tmp_path / "evil_roof.onnx")
    edit_manifest(bundle, lambda m: m["roofline"].update(fp32="../evil_roof.onnx"))
    r = run_py(bundle, "bench", "--roofline", "--runs", "1", "--warmup", "0")
    assert r.returncode == 2 and "roofline.fp32 = '../evil_roof.onnx' is not in its file " \
        "table" in r.stderr.splitlines()[-1], r.stderr
    r = run_py(bundle, "check", "--json")
    assert r.returncode == 1 and any("roofline.fp32" in p for p in json.loads(r.stdout)["integrity"])


@pytest.mark.parametrize("case", ["B35-dev-zero", "B36-fifo", "B36-fifo-in-table"])
def test_b35_b36_roofline_special_files_exit_2_without_hanging(built, tmp_path, case):
    bundle = copy_bundle(built, tmp_path / "b")
    if case == "B35-dev-zero":
        edit_manifest(bundle, lambda m: m["roofline"].update(fp32="/dev/zero"))
    else:
        os.mkfifo(bundle / "roofline" / "fifo.onnx")

        def change(m):
            m["roofline"]["fp32"] = "roofline/fifo.onnx"
            if case.endswith("in-table"):
                m["files"]["roofline/fifo.onnx"] = "0" * 64
        edit_manifest(bundle, change)
    start = time.monotonic()
    r = run_py(bundle, "bench", "--roofline", "--runs", "1", "--warmup", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.splitlines()[-1]
    assert line.startswith("error: integrity check failed: ") and (
        "not a regular file" in line if case.endswith("in-table") else "roofline.fp32" in line)
    assert time.monotonic() - start < 30


def test_b38_provider_path_outside_the_bundle_is_refused_and_nothing_is_created(built, tmp_path):
    bundle = copy_bundle(built, tmp_path / "deep" / "b")
    edit_manifest(bundle, lambda m: m["providers"][0].setdefault("options", {}).update(
        x_path="{bundle}/../../escaped"))
    r = run_py(bundle, "check", "--json")
    assert r.returncode == 1
    assert any("providers[0].options.x_path = '{bundle}/../../escaped' is not a file or "
               "folder in the bundle" in p for p in json.loads(r.stdout)["integrity"])
    r = run_py(bundle, "infer", str(bundle / "golden" / "model.inputs.npz"))
    assert r.returncode == 2 and "x_path" in r.stderr
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("key, value", [
    ("cache_dir", "ABS"),                 # N-OV-09: OpenVINO's cache folder, an absolute path
    ("cache_dir", "relative_cache"),      # ... relative: the device's current folder
    ("load_config", "ABS"),               # OpenVINO's config file
    ("trt_ep_context_file_path", "{bundle}/../x"),
    ("some_option", "ABS")])              # any value that looks like a path
def test_n_ov_09_every_provider_option_that_names_a_place_stays_in_the_bundle(
        built, tmp_path, key, value):
    bundle = copy_bundle(built, tmp_path / "deep" / "b")
    outside = tmp_path / "outside"
    value = str(outside) if value == "ABS" else value
    edit_manifest(bundle, lambda m: m["providers"][0].setdefault("options", {}).update(
        {key: value}))
    r = run_py(bundle, "check", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert any(f"providers[0].options.{key} = " in p and "is not a file or folder in the bundle" in p
               for p in json.loads(r.stdout)["integrity"])
    r = run_py(bundle, "infer", str(bundle / "golden" / "model.inputs.npz"))
    assert r.returncode == 2 and key in r.stderr.splitlines()[-1]
    assert not outside.exists() and not (bundle / "relative_cache").exists()
    assert not (tmp_path / "deep" / "relative_cache").exists()


def test_n_ov_09_options_that_name_no_place_and_bundle_folders_still_pass(built, tmp_path):
    bundle = copy_bundle(built, tmp_path / "b")
    edit_manifest(bundle, lambda m: m["providers"][0].setdefault("options", {}).update(
        {"device_type": "CPU", "num_of_threads": "2", "cache_dir": "{bundle}/cache/ov"}))
    r = run_py(bundle, "check", "--json")
    assert not any("options" in p for p in json.loads(r.stdout)["integrity"]), r.stdout


def test_b37_a_manifest_without_target_exits_2_naming_the_field(built, tmp_path):
    bundle = copy_bundle(built, tmp_path / "b")
    edit_manifest(bundle, lambda m: m.pop("target"))
    r = run_py(bundle, "check")
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        "error: manifest.json: target is not an object; rebuild the bundle with edgepack")


@pytest.mark.parametrize("case, name", [("A54", "../../../../tmp/x/escaped"), ("A56", ""),
                                        ("A55", "a/b"), ("dot", ".hidden"), ("dash", "-rf")])
def test_a54_a56_a_name_that_is_not_one_safe_component_is_a_broken_bundle(
        built, tmp_path, case, name):
    bundle = copy_bundle(built, tmp_path / "b")
    edit_manifest(bundle, lambda m: m.update(name=name))
    r = run_py(bundle, "check")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1].startswith(f"error: manifest.json: name {name!r} is not "
                                                "one safe file name")


# --- session.tuned.json and bench --tune ---------------------------------------------------

def write_tuned(bundle: Path, session: dict, **extra) -> None:
    import onnxruntime

    (bundle / "session.tuned.json").write_text(json.dumps(dict({
        "manifest": digest(bundle), "onnxruntime": onnxruntime.__version__,
        "cores": os.cpu_count(), "session": session}, **extra)))


@pytest.mark.parametrize("case, session, message", [
    ("B14", {"intra_op_threads": 4096, "inter_op_threads": 4096, "execution_mode": "parallel",
             "graph_optimization_level": "disabled"}, "session.inter_op_threads must be"),
    ("B15", {"intra_op_threads": 4096}, "session.intra_op_threads must be"),
    ("B16", {"inter_op_threads": 4096, "execution_mode": "parallel"},
     "session.inter_op_threads must be"),
    ("B16-level", {"graph_optimization_level": "bogus"}, "session.graph_optimization_level"),
])
def test_b14_b16_tuned_threads_over_the_cores_are_refused_at_once(built, tmp_path, case, session,
                                                                  message):
    bundle = copy_bundle(built, tmp_path / "b")
    write_tuned(bundle, session)
    start = time.monotonic()
    r = run_py(bundle, "check")
    assert time.monotonic() - start < 30
    line = r.stderr.splitlines()[-1]
    assert r.returncode == 2 and line.startswith("error: session.tuned.json: " + message), line
    if "threads" in message:
        assert f"a thread count from 0 to {os.cpu_count()}, got 4096" in line


def test_b14_tuned_threads_up_to_the_cores_are_used_and_other_fields_checked(built, tmp_path):
    bundle = copy_bundle(built, tmp_path / "b")
    write_tuned(bundle, {"intra_op_threads": os.cpu_count(), "inter_op_threads": 1})
    r = run_py(bundle, "check", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["session"]["intra_op_threads"] == os.cpu_count()
    write_tuned(bundle, {"intra_op_threads": 1}, evil="x")
    r = run_py(bundle, "check")
    assert r.returncode == 2 and "session.tuned.json: unknown field 'evil'" in r.stderr


def test_item12_bench_tune_only_chooses_what_its_schema_accepts(built, tmp_path):
    """A target asking for more threads than this device has: tune tries and keeps bounded
    settings only, and the file it writes loads again."""
    from packager._runtimes.runner.tuned import session_problem, tuned_problem

    bundle = copy_bundle(built, tmp_path / "b")
    edit_manifest(bundle, lambda m: m.setdefault("session", {}).update(intra_op_threads=64))
    r = run_py(bundle, "bench", "--tune", "--runs", "2", "--warmup", "0", "--json")
    assert r.returncode == 0, r.stderr
    tuning = json.loads(r.stdout)["tuning"]
    assert session_problem(tuning["chosen"], os.cpu_count()) == ""
    assert all(t["session"]["intra_op_threads"] <= os.cpu_count() for t in tuning["tried"])
    saved = json.loads((bundle / "session.tuned.json").read_text())
    assert tuned_problem(saved) == ""
    assert run_py(bundle, "check").returncode == 0


def test_e96_bench_tune_on_a_full_disk_names_the_file_and_leaves_no_tmp(built, tmp_path):
    mount = tmp_path / "full"
    mount.mkdir()
    size = sum(f.stat().st_size for f in Path(built.bundle.directory).rglob("*") if f.is_file())
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size + (1 << 20)}", "tmpfs",
                       str(mount)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        bundle = copy_bundle(built, mount / "b")
        # a target asking for 64 threads: tune keeps a bounded setting, so it always writes
        edit_manifest(bundle, lambda m: m.setdefault("session", {}).update(intra_op_threads=64))
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        for block in (1 << 16, 1 << 12, 1):   # to the last byte
            try:
                while True:
                    os.write(fd, bytes(block))
            except OSError:
                pass
        os.close(fd)
        r = run_py(bundle, "bench", "--tune", "--runs", "1", "--warmup", "0")
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines()[-1] == (
            f"error: {bundle / 'session.tuned.json'}: cannot write it (No space left on device); "
            "free some space or make the bundle writable, or pass --no-save")
        assert not (bundle / "session.tuned.json.tmp").exists()
        assert not (bundle / "session.tuned.json").exists()
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


# --- infer ---------------------------------------------------------------------------------

def test_r01_r05_infer_out_keeps_every_result_even_with_odd_names(built, tmp_path):
    bundle = built.bundle.directory
    rng = np.random.default_rng(0)
    files = []
    for folder in ("a", "b", "\udcff\udcfe"):
        (tmp_path / folder).mkdir()
        files.append(tmp_path / folder / "x.npy")
        np.save(files[-1], rng.random((1, 3, 32, 32), dtype=np.float32))
    odd = tmp_path / "\udcff\udcfe.npy"
    np.save(odd, rng.random((1, 3, 32, 32), dtype=np.float32))
    out = tmp_path / "r.npz"
    r = run_py(bundle, "infer", *map(str, files), str(odd), str(files[0]), "--out", str(out))
    assert r.returncode == 0, r.stderr
    with np.load(out) as result:
        keys = sorted(result.files)
        assert len(keys) == 5, keys   # a/x.npy, b/x.npy, the odd folder's, the odd file, a again
        values = [result[k] for k in keys]
    assert f"{tmp_path / 'a' / 'x.npy'}/scores" in keys and f"{tmp_path / 'b' / 'x.npy'}/scores" \
        in keys and f"{tmp_path / 'a' / 'x.npy'}#2/scores" in keys
    assert "\ufffd\ufffd.npy/scores" in keys
    assert not np.allclose(result_of(keys, values, "/a/x.npy/"), result_of(keys, values, "/b/"))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".infer-")] == []


def result_of(keys, values, part):
    return next(v for k, v in zip(keys, values, strict=True) if part in k)


@pytest.mark.parametrize("case", ["R06", "R07"])
def test_r06_r07_a_fifo_or_dev_zero_is_not_a_regular_file(built, tmp_path, case):
    path = tmp_path / ("f.npy" if case == "R06" else "z.npy")
    if case == "R06":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    r = run_py(built.bundle.directory, "infer", str(path))
    kind = "a FIFO" if case == "R06" else "a character device, through a link"
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        f"error: {path}: not a regular file ({kind}); pass an image, .npy or .npz file")


# --- serve ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case, option, message", [
    ("S84", ["--port", "99999"], "--port must be from 0 to 65535"),
    ("S85", ["--port", "-1"], "--port must be from 0 to 65535"),
    ("S93", ["--max-megapixels", "inf"], "--max-megapixels must be a number from 0 to 10000"),
    ("S93-nan", ["--max-megapixels", "nan"], "--max-megapixels must be a number from 0 to"),
    ("S93-timeout", ["--timeout", "inf"], "--timeout must be > 0 and at most 3600 seconds"),
    ("top", ["--top", "-1"], "--top must be from 1 to 100000"),
])
def test_s84_s85_s93_serve_options_out_of_range_exit_2(built, case, option, message):
    r = run_py(built.bundle.directory, "serve", *option)
    assert r.returncode == 2 and message in r.stderr.splitlines()[-1]
    assert "Traceback" not in r.stderr and "bug" not in r.stderr


def post(body: bytes, *headers: str) -> bytes:
    head = ["POST /infer HTTP/1.1", "Host: device", *headers]
    if not any(h.lower().startswith("content-length:") for h in headers):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def png(width: int, height: int, depth: int = 8, kind: int = 2, level: int = 1) -> bytes:
    """A real PNG of black pixels (kind 2 RGB, 6 RGBA; depth 8 or 16)."""
    import struct
    import zlib

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    per_pixel = {2: 3, 6: 4}[kind] * depth // 8
    z = zlib.compressobj(level)
    row = b"\x00" * (1 + per_pixel * width)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth,
                                                               kind, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def answer(url, body, *headers, timeout=60.0):
    status, head, data = raw_http(url, post(body, *headers), timeout=timeout)
    return status, head, (json.loads(data) if data.startswith(b"{") else data)


def legit(url, source="127.0.0.1"):
    """A real image request from *source*: (status, seconds it took)."""
    import cv2

    image = cv2.imencode(".png", np.full((40, 50, 3), 200, np.uint8))[1].tobytes()
    host, port = url.rsplit("/", 1)[-1].split(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=20,
                                  source_address=(source, 0)) as sock:
        sock.sendall(post(image, "Content-Type: image/png", "Connection: close"))
        data = read_to_end(sock)
    return int(data.split()[1]) if data.startswith(b"HTTP/") else None, time.monotonic() - start


def peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


@pytest.fixture(scope="module")
def guarded(built, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "guarded.log"
    proc, url = start_server(built.bundle.directory, log, "--quiet", "--timeout", "3",
                             "--max-concurrent", "4", "--max-per-client", "8",
                             "--max-connections", "12")
    yield url, proc
    proc.terminate()
    proc.wait(timeout=30)
    assert "Traceback" not in log.read_text()


def connect(url, source="127.0.0.1"):
    host, port = url.rsplit("/", 1)[-1].split(":")
    return socket.create_connection((host, int(port)), timeout=20, source_address=(source, 0))


def test_s24_slow_bodies_hold_no_slot_and_run_out_of_time(guarded):
    url, _ = guarded
    drippers = [connect(url) for _ in range(5)]   # more than --max-concurrent 4
    for s in drippers:
        s.sendall(post(b"\x93", "Content-Length: 1000000"))
    start = time.monotonic()
    for _ in range(3):
        time.sleep(0.5)
        for s in drippers:
            s.sendall(b"\x00")
        status, took = legit(url)
        assert status == 200 and took < 5
    # the whole request's deadline: --timeout 3 s plus 1 s a MB, however steadily they drip
    for s in drippers:
        s.settimeout(10)
        data = b""
        try:
            while True:
                s.sendall(b"\x00")
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
                time.sleep(0.3)
        except OSError:   # the server closed it while it was dripping
            pass
        assert data.startswith(b"HTTP/1.0 408") or data.startswith(b"HTTP/1.1 408") or not data
        s.close()
    assert time.monotonic() - start < 3 + 1 + 5


def test_s23_drip_fed_headers_are_capped_per_client_and_closed_at_the_deadline(guarded):
    url, _ = guarded
    start = time.monotonic()
    idle = connect(url, "127.0.0.5")   # sends nothing at all
    drippers = [connect(url, "127.0.0.2") for _ in range(8)]   # --max-per-client 8
    for s in drippers:
        s.sendall(b"POST /infer HTTP/1.1\r\nX-")
    time.sleep(0.3)
    # a ninth from that address gets a 503 at once; another client is served meanwhile
    extra = connect(url, "127.0.0.2")
    extra.sendall(b"GET /health HTTP/1.1\r\n\r\n")
    data = extra.recv(1 << 16)
    assert data.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in data
    assert b"8 connections from 127.0.0.2 are open (--max-per-client)" in data
    extra.close()
    assert legit(url)[0] == 200
    # in all, --max-connections 12: 4 more from a third address fill it
    others = [connect(url, "127.0.0.3") for _ in range(4)]
    for s in others:
        s.sendall(b"GET /hea")
    time.sleep(0.3)
    # a fourth address waits up to 2 s for a place (a burst, not one client holding many),
    # then is answered: served once a place frees, or a 503 (never a reset or a hang)
    status, took = legit(url, "127.0.0.4")
    assert status in (200, 503) and took < 2 + 3 + 2
    # one byte of header every 0.5 s: a per-read timeout would wait forever, the deadline
    # for the whole request closes them all by --timeout 3 s
    for s in drippers + others:
        s.settimeout(10)
    closed = 0
    while time.monotonic() - start < 8 and closed < len(drippers):
        closed = 0
        for s in drippers:
            try:
                s.sendall(b"a")
                s.setblocking(False)
                try:
                    if s.recv(1 << 16) == b"":
                        closed += 1
                except BlockingIOError:
                    pass
                finally:
                    s.setblocking(True)
            except OSError:
                closed += 1
        time.sleep(0.5)
    assert closed == len(drippers), "drip-fed connections still open after the deadline"
    idle.settimeout(5)
    assert idle.recv(1 << 16) == b""   # an idle connection is closed by the deadline too
    idle.close()
    for s in drippers + others:
        s.close()
    time.sleep(0.5)
    assert legit(url, "127.0.0.4")[0] == 200   # their places are free again


def test_s47_s48_s49_json_bodies_are_bounded_by_the_model_inputs(guarded):
    url, proc = guarded
    before = peak_rss_kb(proc.pid)
    # the declared length alone refuses it: the body is never read
    status, _, body = answer(url, b"", "Content-Type: application/json",
                             "Content-Length: 60000000")
    assert status == 413 and "the JSON body is 60000000 bytes, over the" in body["error"]
    zeros = b"[" + b"0," * 4_000_000 + b"0]"   # 8 MB sniffed as JSON: refused before parsing
    status, _, body = answer(url, zeros, "Content-Type: application/octet-stream")
    assert status == 413 and "this model's inputs can take" in body["error"]
    assert peak_rss_kb(proc.pid) - before < 60_000   # a parse would take hundreds of MB
    keys = json.dumps({f"k{i}": 0 for i in range(5000)}).encode()
    status, _, raw = raw_http(url, post(keys, "Content-Type: application/json"))
    assert status == 400 and len(raw) < 1000, len(raw)
    assert "and 4990 more" in json.loads(raw)["error"]


def test_s72_an_npz_of_many_members_is_refused_unread(guarded, tmp_path):
    import io
    import zipfile

    tiny = io.BytesIO()
    np.save(tiny, np.zeros(1, np.float32))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for i in range(20000):
            z.writestr(f"a{i}.npy", tiny.getvalue())
    start = time.monotonic()
    status, _, body = answer(guarded[0], buf.getvalue(), "Content-Type: application/octet-stream")
    assert status == 413 and body["error"] == (
        "request body: the .npz holds 20000 arrays, over the 256 limit; send the model's "
        "inputs only")
    assert time.monotonic() - start < 5


def test_s70_s71_decoded_bytes_are_bounded_before_decoding(guarded):
    url, proc = guarded
    big = png(4500, 4500, depth=16, kind=6)   # 20 MP, under 50 MP, but 162 MB decoded
    assert len(big) < 2_000_000
    before = peak_rss_kb(proc.pid)
    status, _, body = answer(url, big, "Content-Type: image/png")
    assert status == 413 and body["error"] == (
        "request body: the image is 4500x4500 with 4 channel(s) of 16 bit(s), 162 MB once "
        "decoded, over the 150 MB that --max-megapixels 50 allows (3 bytes a pixel); resize it "
        "or save it with 8 bits a channel")
    assert peak_rss_kb(proc.pid) - before < 30_000   # never decoded
    # 8-bit RGBA: its alpha is dropped by the decoder, and it answers as its RGB twin
    import cv2

    rgb = np.full((40, 50, 3), 200, np.uint8)
    rgba = np.concatenate([rgb, np.full((40, 50, 1), 7, np.uint8)], axis=2)
    answers = [answer(url, cv2.imencode(".png", img)[1].tobytes(), "Content-Type: image/png")
               for img in (rgb, rgba)]
    assert [a[0] for a in answers] == [200, 200]
    assert answers[0][2]["outputs"] == answers[1][2]["outputs"]


@pytest.mark.parametrize("case, sig", [("S26", signal.SIGTERM), ("S27", signal.SIGHUP)])
def test_s26_s27_sigterm_and_sighup_stop_gracefully(built, tmp_path, case, sig):
    import cv2

    proc, url = start_server(built.bundle.directory, tmp_path / "log", "--timeout", "10")
    image = cv2.imencode(".png", np.full((40, 50, 3), 200, np.uint8))[1].tobytes()
    in_flight = connect(url)
    in_flight.sendall(post(image[:10], "Content-Type: image/png",
                           f"Content-Length: {len(image)}"))   # headers in, body half-way
    time.sleep(0.3)
    proc.send_signal(sig)
    time.sleep(0.5)
    host, port = url.rsplit("/", 1)[-1].split(":")
    with pytest.raises(ConnectionRefusedError):   # no longer accepting
        socket.create_connection((host, int(port)), timeout=5)
    in_flight.sendall(image[10:])   # the request in flight is still answered
    data = read_to_end(in_flight)
    in_flight.close()
    assert data.startswith(b"HTTP/1.0 200") or data.startswith(b"HTTP/1.1 200"), data[:200]
    assert b"Connection: close" in data
    assert proc.wait(timeout=30) == 0
    name = "SIGTERM" if sig == signal.SIGTERM else "SIGHUP"
    log = (tmp_path / "log").read_text()
    assert log.rstrip().splitlines()[-1] == (
        f"edgepack: {name}: stopped serving {built.bundle.directory.name}; every request in "
        "flight was answered")
    assert "Traceback" not in log


def test_s24_s49_bodies_read_before_a_slot_still_have_a_memory_bound(built, tmp_path):
    """Bodies are read before a slot is taken (S24); the bytes held at once keep the bound that
    taking the slot first gave: --max-concurrent x 64 MB, then 503 (S49)."""
    proc, url = start_server(built.bundle.directory, tmp_path / "log", "--quiet", "--timeout",
                             "5", "--max-concurrent", "1")
    holder = connect(url)
    holder.sendall(post(bytes(40 << 20), f"Content-Length: {50 << 20}"))   # 40 of 50 MB
    time.sleep(0.5)
    status, headers, body = answer(url, bytes(30 << 20), "Content-Type: application/octet-stream")
    assert status == 503 and headers["Retry-After"] == "1"
    assert body["error"] == "busy: 64 MB of request bodies are being read; retry shortly"
    holder.close()   # its 40 MB are let go: the next body is read and answered
    time.sleep(0.5)
    status, _, body = answer(url, bytes(30 << 20), "Content-Type: application/octet-stream")
    assert status == 400 and "unsupported body" in body["error"]
    proc.terminate()
    proc.wait(timeout=30)


def test_s31_s32_a_burst_over_the_connection_caps_is_served_not_reset(built, tmp_path):
    """600 clients at once from one address, each holding its connection until the server
    closes it, against the default caps (256 connections, 64 per client): keep-alive ends
    while the server is crowded, a burst waits for a place, the listen queue holds the rest.
    Every client gets an answer, a 200 or (over --max-per-client) a 503 with Retry-After, and
    none is reset (before, about half were)."""
    import asyncio

    proc, url = start_server(built.bundle.directory, tmp_path / "log", "--quiet")
    host, port = url.rsplit("/", 1)[-1].split(":")
    golden = np.load(built.bundle.directory / "golden" / "model.inputs.npz")
    buffer = io.BytesIO()
    np.savez(buffer, **{name: golden[name][0] for name in golden.files})   # one sample
    request = post(buffer.getvalue())

    async def one():
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(request)
            await writer.drain()
            data = await reader.read()
            writer.close()
            return data.split(b" ")[1].decode() if data else "empty"
        except OSError as exc:
            return type(exc).__name__

    async def burst(n):
        return await asyncio.wait_for(asyncio.gather(*[one() for _ in range(n)]), 120)

    try:
        answers = Counter(asyncio.run(burst(600)))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert set(answers) <= {"200", "503"}, answers
    assert answers["200"] >= 64, answers


def _part_preprocess(change):
    return lambda m: change(m["parts"][0]["preprocess"])


@pytest.mark.parametrize("case, edit, said", [
    ("N-MAN-04", _part_preprocess(lambda p: p.update(size=[100000, 100000])),
     "parts[0].preprocess.size = [100000, 100000] is not [width, height] from 1 to 16384"),
    ("N-MAN-05", _part_preprocess(lambda p: p.update(size=[-64, 64])), "parts[0].preprocess.size"),
    ("N-MAN-06", _part_preprocess(lambda p: p.update(std=[0, 0, 0])),
     "parts[0].preprocess.std = [0, 0, 0] holds 0"),
    ("N-MAN-07", _part_preprocess(lambda p: p.update(mean="abc")),
     "parts[0].preprocess.mean = 'abc' is not 3 finite numbers"),
    ("N-MAN-26", _part_preprocess(lambda p: p.update(color="cmyk")),
     "parts[0].preprocess.color = 'cmyk' is not one of rgb, bgr, gray"),
    ("N-MAN-18", lambda m: m["budget"].update(min_cosine="high"),
     "budget.min_cosine is not a number (got 'high')"),
    ("N-OV-10", lambda m: m["providers"][0].update(when="sometimes"),
     "providers[0].when is not one of always, faster (got 'sometimes')"),
])
def test_run_py_checks_a_manifest_as_verify_does(built, image_dir, tmp_path, case, edit, said):
    """One manifest schema (runner/manifest.py check_manifest), read by run.py and verify:
    each edited field is exit 2 naming it, from check, infer and verify alike."""
    bundle = copy_bundle(built, tmp_path / "b")
    edit_manifest(bundle, edit)
    photo = sorted(p for p in Path(image_dir).rglob("*") if p.is_file())[0]
    for args in (["check"], ["infer", str(photo)]):
        r = run_py(bundle, *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        assert said in r.stderr.splitlines()[-1], (args, r.stderr)
    r = subprocess.run([EDGEPACK, "verify", str(bundle)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and said in r.stderr, r.stderr


@pytest.mark.parametrize("case", ["N-MAN-23", "N-MAN-30"])
def test_a_manifest_nested_too_deep_or_too_large_is_exit_2(built, tmp_path, case):
    bundle = copy_bundle(built, tmp_path / "b")
    path = bundle / "manifest.json"
    if case == "N-MAN-23":
        path.write_text("[" * 100000 + "]" * 100000)
    else:   # a valid manifest padded to 17 MiB
        manifest = json.loads(path.read_text())
        manifest["padding"] = "x" * (17 << 20)
        path.write_text(json.dumps(manifest))
    r = run_py(bundle, "check")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert ("more than a manifest holds (16 MiB)" if case == "N-MAN-30" else
            "cannot read the manifest") in r.stderr.splitlines()[-1], r.stderr


@pytest.mark.parametrize("case", ["B29-fifo", "B30-dev-zero"])
def test_b29_b30_a_special_file_as_the_model_fails_integrity_as_the_docs_say(built, tmp_path,
                                                                             case):
    """A FIFO or a link to /dev/zero as model.onnx: never opened; verify and check exit 1 (an
    integrity failure, as docs/guarantees.md says), infer refuses with exit 2."""
    bundle = copy_bundle(built, tmp_path / "b")
    model = bundle / json.loads((bundle / "manifest.json").read_text())["parts"][0]["model"]["file"]
    model.unlink()
    if case == "B29-fifo":
        os.mkfifo(model)
    else:
        model.symlink_to("/dev/zero")
    start = time.monotonic()
    r = subprocess.run([EDGEPACK, "verify", str(bundle)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "not a regular file" in r.stdout + r.stderr, r.stdout + r.stderr
    r = run_py(bundle, "check")
    assert r.returncode == 1 and "not a regular file" in r.stdout + r.stderr
    r = run_py(bundle, "infer", str(bundle / "golden" / "model.inputs.npz"))
    assert r.returncode == 2 and "not a regular file" in r.stderr.splitlines()[-1]
    assert time.monotonic() - start < 60


def test_n_stray_11_a_numpy_py_on_pythonpath_is_named_not_blamed_on_onnxruntime(built,
                                                                               tmp_path):
    bundle = copy_bundle(built, tmp_path / "b")
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "numpy.py").write_text("X = 1\n")
    r = subprocess.run([sys.executable, "run.py", "check"], cwd=bundle, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(stray)})
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "reinstall" not in last, r.stderr
    assert f"the numpy imported here is {stray / 'numpy.py'}, outside this Python's packages " \
        f"(PYTHONPATH={stray})" in last, last
