"""run.py serve: a stdlib HTTP endpoint in the bundle; bad requests get a 4xx, never a crash."""

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import cv2
import numpy as np
import pytest

from conftest import PREP, raw_http, start_server


@pytest.fixture
def server(built):
    proc = subprocess.Popen([sys.executable, "-I", "run.py", "serve", "--port", "0", "--quiet"],
                            cwd=built.bundle.directory, stderr=subprocess.PIPE, text=True)
    url, log = None, []
    for _ in range(20):
        log.append(proc.stderr.readline())
        found = re.search(r"serving \S+ on (http://[\d.]+:\d+)", log[-1])
        if found:
            url = found.group(1)
            break
    assert url, "the server did not start"
    # the session ran before the server listened: the first request pays no warm-up
    assert any(re.match(r"edgepack: model warmed up \(\d+ ms for its first 2 runs\)", ln)
               for ln in log), log
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="session")
def built_fp32(tmp_path_factory, cnn_onnx, image_dir):
    """The tiny CNN as an FP32 bundle: a NaN input comes out as NaN scores (the INT8 bundle
    quantizes NaN to a number before its first layer)."""
    from packager.build.job import build

    out = tmp_path_factory.mktemp("bundles") / "cnn32"
    return build(cnn_onnx, out, target="x86_64-cpu", calib=image_dir, preprocess=PREP,
                 labels=[f"class{i}" for i in range(10)], quant={"precision": "fp32"})


def strict_json(text):
    """json.loads as JavaScript's JSON.parse reads: NaN, Infinity and -Infinity are refused."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def npy(array: np.ndarray) -> bytes:
    buf = __import__("io").BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def request(url, body=None, content_type=None):
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    if content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_health_metadata_and_inference(server):
    status, health = request(server + "/health")
    assert status == 200 and health["status"] == "ok"
    assert health["providers"]["model"] == ["CPUExecutionProvider"]
    status, meta = request(server + "/metadata")
    assert meta["parts"][0]["inputs"] == [{"name": "image", "shape": [1, 3, 32, 32],
                                           "dtype": "float32"}]
    png = cv2.imencode(".png", np.full((40, 50, 3), 200, np.uint8))[1].tobytes()
    status, out = request(server + "/infer", png, "image/png")
    assert status == 200, out
    top = out["outputs"]["scores"]["top"]
    assert len(top) == 5 and top[0]["label"].startswith("class") and out["latency_ms"] > 0
    # photo to answer by stage, as bench FILE... reports them
    stages = out["stages_ms"]
    assert set(stages) == {"decode", "preprocess", "model", "post"}
    assert all(v >= 0 for v in stages.values()) and stages["model"] == out["latency_ms"]

    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    buf = __import__("io").BytesIO()
    np.save(buf, x)
    status, by_npy = request(server + "/infer", buf.getvalue(), "application/octet-stream")
    status2, by_json = request(server + "/infer", json.dumps({"inputs": {"image": x.tolist()}})
                               .encode(), "application/json")
    assert status == status2 == 200
    assert by_npy["outputs"]["scores"]["top"][0] == by_json["outputs"]["scores"]["top"][0]


@pytest.mark.parametrize("path, body, ctype, code, message", [
    ("/infer", b"", None, 400, "empty request body"),
    ("/infer", b"\x00\x01garbage", "application/octet-stream", 400, "unsupported body"),
    ("/infer", b"\x89PNG broken", "image/png", 400, "not a readable image"),
    ("/infer", b'{"inputs": {"image": [1, 2, 3]}}', "application/json", 400,
     "image has shape [3], the model wants [1, 3, 32, 32]"),
    ("/infer", b'{"inputs": {"img": []}}', "application/json", 400, "no input named image"),
    ("/infer", b"{not json", "application/json", 400, "cannot decode the request body"),
    ("/infer/vocoder", b"{}", "application/json", 404, "no part named vocoder"),
    ("/predict", b"{}", "application/json", 404, "no such path /predict"),
])
def test_bad_requests_get_4xx_and_the_server_lives(server, path, body, ctype, code, message):
    status, out = request(server + path, body, ctype)
    assert status == code and message in out["error"]
    assert request(server + "/health")[0] == 200


# ----------------------------------------------------------------------------- bounds
# A server that gives a silent client 1 s and runs one request at a time, shared by the tests
# below (each leaves it serving; each checks that it still does).


@pytest.fixture(scope="module")
def strict(built, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "strict.log"
    proc, url = start_server(built.bundle.directory, log, "--timeout", "1",
                             "--max-concurrent", "1")
    yield url, log, proc
    proc.terminate()
    proc.wait(timeout=30)
    assert "Traceback" not in log.read_text()


PNG = cv2.imencode(".png", np.full((40, 50, 3), 200, np.uint8))[1].tobytes()


def post(body: bytes, *headers: str) -> bytes:
    head = ["POST /infer HTTP/1.1", "Host: device", *headers]
    if not any(h.lower().startswith("content-length:") for h in headers):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def still_serves(url: str) -> None:
    status, _, body = raw_http(url, post(PNG, "Content-Type: image/png"))
    assert status == 200, body
    assert json.loads(body)["outputs"]["scores"]["top"][0]["label"].startswith("class")


@pytest.mark.parametrize("lengths, code, message", [
    (["abc"], 400, "Content-Length 'abc' is not one byte count"),
    (["-5"], 400, "Content-Length '-5' is not one byte count"),
    (["4", "5"], 400, "Content-Length '4, 5' is not one byte count"),
    (["99999999999999999999999"], 413, "is over the 64 MB limit"),
    (["67108865"], 413, "body of 67108865 bytes is over the 64 MB limit"),
])
def test_content_length_lies_get_4xx(strict, lengths, code, message):
    url = strict[0]
    status, _, body = raw_http(url, post(b"abcd", *(f"Content-Length: {n}" for n in lengths)))
    assert status == code and message in json.loads(body)["error"]
    still_serves(url)


def test_chunked_body_without_length_gets_411(strict):
    status, _, body = raw_http(strict[0], b"POST /infer HTTP/1.1\r\nTransfer-Encoding: chunked"
                                          b"\r\n\r\n4\r\nabcd\r\n0\r\n\r\n")
    assert status == 411 and "send a Content-Length" in json.loads(body)["error"]
    still_serves(strict[0])


def test_deep_json_gets_400_without_recursion(strict):
    deep = b"[" * 100_000 + b"]" * 100_000
    status, _, body = raw_http(strict[0], post(deep, "Content-Type: application/json"))
    assert status == 400
    assert json.loads(body)["error"] == ('the JSON body nests deeper than 64 levels; send '
                                         '{"inputs": {name: nested list}}')
    # brackets inside strings are not nesting; a real tensor 4 levels deep passes the bound
    x = np.zeros((1, 3, 32, 32), np.float32).tolist()
    status, _, body = raw_http(strict[0], post(json.dumps({"inputs": {"image": x}, "note": "[[[" * 40})
                                               .encode(), "Content-Type: application/json"))
    assert status == 200, body
    still_serves(strict[0])


def test_a_silent_client_gets_408_and_lets_go(strict):
    url, log, _ = strict
    start = time.monotonic()
    # half a body, then silence: 408 after --timeout (1 s), and the slot is free again
    status, _, body = raw_http(url, post(b"x" * 10, "Content-Length: 1000"))
    assert status == 408 and "the body did not arrive in time (--timeout 1 s for the request" in \
        json.loads(body)["error"]
    # half the headers, then silence
    status, _, body = raw_http(url, b"POST /infer HTTP/1.1\r\nHost: device\r\nContent-")
    assert status == 408 and "the headers did not arrive in time" in json.loads(body)["error"]
    assert time.monotonic() - start < 8
    # a body cut short by a client that hangs up: 400 at once
    status, _, body = raw_http(url, post(b"x" * 10, "Content-Length: 1000"), half_close=True)
    assert status == 400 and "the body ended after 10 of the 1000 bytes" in json.loads(body)["error"]
    still_serves(url)


def test_over_max_concurrent_gets_503_with_retry_after(built, tmp_path):
    """S24: a slot is taken once the body is in: a client still sending its body holds none,
    and only requests that really run fill --max-concurrent (then 503 with Retry-After)."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    proc, url = start_server(built.bundle.directory, tmp_path / "log", "--timeout", "4",
                             "--max-concurrent", "1")
    host, port = url.rsplit("/", 1)[-1].split(":")
    holder = socket.create_connection((host, int(port)), timeout=10)
    holder.sendall(post(b"x", "Content-Length: 100"))   # its body never comes: no slot held
    time.sleep(0.2)
    still_serves(url)
    assert request(url + "/health")[0] == 200   # GETs need no slot
    # 49 MP images take a while to decode in the one slot: those queued over 2 s get a 503
    slow = post(big_png(7000, 7000), "Content-Type: image/png")
    with ThreadPoolExecutor(16) as pool:   # 16 x ~0.3 s of decoding: well over the 2 s wait
        answers = list(pool.map(lambda _: raw_http(url, slow, timeout=120), range(16)))
    codes = [status for status, _, _ in answers]
    assert set(codes) == {200, 503}, codes
    for status, headers, body in answers:
        if status == 503:
            assert headers["Retry-After"] == "1"
            assert "busy: 1 requests are running (--max-concurrent); retry shortly" in \
                json.loads(body)["error"]
    holder.close()   # its body ends short: 400
    still_serves(url)
    proc.terminate()
    proc.wait(timeout=30)


def big_png(width: int, height: int) -> bytes:
    """A real RGB PNG of *width* x *height* black pixels: under a MB, 3 bytes a pixel decoded."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    z = zlib.compressobj(1)
    row = b"\x00" * (1 + 3 * width)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_image_over_the_pixel_limit_gets_413_before_decoding(strict):
    url, _, proc = strict
    png = big_png(8000, 8000)   # 64 MP: 192 MB once decoded
    assert len(png) < 1_000_000
    before = peak_rss_kb(proc.pid)
    status, _, body = raw_http(url, post(png, "Content-Type: image/png"))
    assert status == 413
    assert json.loads(body)["error"] == ("request body: the image is 8000x8000 (64 MP), over the "
                                         "50 MP limit; resize it, or raise --max-megapixels")
    assert peak_rss_kb(proc.pid) - before < 50_000   # never decoded
    still_serves(url)


@pytest.mark.parametrize("data, code, message", [
    (b"PUT /infer HTTP/1.1\r\n\r\n", 405, "method PUT not allowed"),
    (b"BREW /infer HTTP/1.1\r\n\r\n", 405, "method BREW not allowed"),
    (b"POST //[x/infer HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 404, "no such path"),
    (b"GET /health?x=%zz HTTP/1.1\r\n\r\n", 200, None),
])
def test_odd_requests_get_4xx(strict, data, code, message):
    status, headers, body = raw_http(strict[0], data)
    assert status == code
    if message:
        assert message in json.loads(body)["error"]
    if code == 405:
        assert headers["Allow"] == "POST"
    still_serves(strict[0])


@pytest.mark.parametrize("method, path, body, code, allow", [
    ("GET", "/infer", b"", 405, "POST"),
    ("GET", "/infer/model", b"", 405, "POST"),
    ("DELETE", "/infer?part=model", b"", 405, "POST"),
    ("POST", "/health", b'{"inputs": {}}', 405, "GET"),
    ("PUT", "/metadata", b"x" * 5000, 405, "GET"),
    ("HEAD", "/health", b"", 405, "GET"),
    ("GET", "/predict", b"", 404, None),
    ("POST", "/", b"{}", 404, None),
    ("PATCH", "/nope", b"", 404, None),
])
def test_a_known_path_asked_with_another_method_gets_405_and_allow(strict, method, path, body,
                                                                      code, allow):
    """405 names the method the path takes (Allow, and the error); an unknown path is 404
    whatever the method. A body sent along is not read: that connection closes after it."""
    url = strict[0]
    head = f"{method} {path} HTTP/1.1\r\nHost: device\r\nContent-Length: {len(body)}\r\n\r\n"
    status, headers, answer = raw_http(url, head.encode() + body)
    assert status == code and headers.get("Allow") == allow, (status, headers, answer)
    if method == "HEAD":
        assert answer == b""
    else:
        error = json.loads(answer)["error"]
        bare = path.split("?")[0]
        assert error == (f"method {method} not allowed on {bare}: use {allow} {bare}" if allow
                         else f"no such path {bare}: use POST /infer, GET /health, GET /metadata")
    if body:
        assert headers.get("Connection") == "close"
    still_serves(url)



def test_bad_bodies_get_4xx(strict):
    x = np.zeros((1, 3, 32, 32), np.float32)
    buf = __import__("io").BytesIO()
    np.save(buf, x)
    npy = buf.getvalue()
    buf = __import__("io").BytesIO()
    np.save(buf, x.astype(np.complex64))
    for body, code, message in [
        (npy[:len(npy) // 2], 400, "the .npy header says shape [1, 3, 32, 32] float32 (12288 bytes)"),
        (buf.getvalue(), 400, "input image is complex64, the model wants float32; pass real values"),
        (b'{"inputs": {"image": "abc"}}', 400, "input image holds <U3, not numbers"),
        (b'{"inputs": {"image": [[1], [2, 3]]}}', 400, "cannot decode the request body"),
        (b"PK\x03\x04broken zip", 400, "cannot decode the request body"),
    ]:
        status, _, answer = raw_http(strict[0], post(body, "Content-Type: application/octet-stream"))
        assert status == code and message in json.loads(answer)["error"], answer
    still_serves(strict[0])


def test_a_burst_of_200_clients_is_answered_not_reset(server):
    from concurrent.futures import ThreadPoolExecutor

    def one(_):
        return raw_http(server, post(PNG, "Content-Type: image/png"), timeout=60)

    with ThreadPoolExecutor(200) as pool:
        answers = list(pool.map(one, range(200)))   # a reset raises here
    codes = [status for status, _, _ in answers]
    assert set(codes) <= {200, 503}, codes
    assert all(h["Retry-After"] == "1" for status, h, _ in answers if status == 503)
    assert codes.count(200) >= 100, codes


def test_ctrl_c_closes_the_server_and_exits_130(built, tmp_path):
    import signal
    import socket

    proc, url = start_server(built.bundle.directory, tmp_path / "log")
    assert request(url + "/health")[0] == 200
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    log = (tmp_path / "log").read_text()
    assert log.rstrip().endswith("interrupted: the server is closed") and "Traceback" not in log
    host, port = url.rsplit("/", 1)[-1].split(":")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5)


def test_busy_port_is_named(built):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-I", "run.py", "serve", "--port", str(port)],
                           cwd=built.bundle.directory, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"error: 127.0.0.1:{port} is in use (Address already in use); pass another --port, "
        "or --port 0 for a free one")


def test_non_finite_outputs_are_answered_as_null(built_fp32, tmp_path):
    """A model output of NaN or infinity: the answer is JSON every parser reads, with null in
    their place, and it says so."""
    proc, url = start_server(built_fp32.bundle.directory, tmp_path / "log", "--quiet")
    try:
        for value in (np.nan, np.inf):
            status, _, body = raw_http(url, post(npy(np.full((1, 3, 32, 32), value, np.float32)),
                                                 "Content-Type: application/octet-stream"))
            assert status == 200, body
            with pytest.raises(ValueError, match="is not JSON"):   # what Python's json writes
                strict_json(json.dumps({"score": value}))
            out = strict_json(body)
            assert [t["score"] for t in out["outputs"]["scores"]["top"]] == [None] * 5
            assert out["non_finite"]["count"] == 5
            assert out["non_finite"]["paths"][0] == "/outputs/scores/top/0/score"
            assert out["notes"] == ["output 'scores' holds 10 non-finite value(s) (NaN or "
                                    "infinity) of 10: the model computed them from this input"]
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        status, _, body = raw_http(url, post(npy(x), "Content-Type: application/octet-stream"))
        out = strict_json(body)   # a finite answer carries neither field
        assert status == 200 and "non_finite" not in out and "notes" not in out
        assert all(isinstance(t["score"], float) for t in out["outputs"]["scores"]["top"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Traceback" not in (tmp_path / "log").read_text()
