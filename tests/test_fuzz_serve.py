"""run.py serve under random and mutated HTTP requests (a fixed seed): never a 5xx, a hang, a
dead server or a traceback. EDGEPACK_FUZZ_CASES sets how many (`make fuzz` runs 5000)."""

import io
import json
import os
import random
import struct
import time
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest

from conftest import raw_http, start_server

pytestmark = pytest.mark.fuzz

CASES = int(os.environ.get("EDGEPACK_FUZZ_CASES", "300"))
SEED = 20240611
SERVER_TIMEOUT = 1.0   # --timeout: a stalled case costs this long
CLIENT_TIMEOUT = 15.0  # no answer (or hang-up) by then: the server hangs


def seeds() -> dict[str, bytes]:
    """Valid bodies to mutate, and a few hostile ones."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    npy, npz = io.BytesIO(), io.BytesIO()
    np.save(npy, x)
    np.savez_compressed(npz, image=x)
    bomb = io.BytesIO()   # 300 MB of zeros, a few hundred KB zipped
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z, z.open("image.npy", "w") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                 "shape": (75 << 20,)})
        for _ in range(300):
            f.write(bytes(1 << 20))
    huge_npy = io.BytesIO()
    np.lib.format.write_array_header_1_0(huge_npy, {"descr": "<f8", "fortran_order": False,
                                                    "shape": (1 << 40, 1 << 20)})
    png = cv2.imencode(".png", image)[1].tobytes()
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
    giant = png[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]   # header says 3.6 GP
    return {
        "png": png, "jpg": cv2.imencode(".jpg", image)[1].tobytes(),
        "bmp": cv2.imencode(".bmp", image)[1].tobytes(),
        "webp": cv2.imencode(".webp", image)[1].tobytes(),
        "giant.png": giant, "npy": npy.getvalue(), "npz": npz.getvalue(),
        "bomb.npz": bomb.getvalue(), "huge.npy": huge_npy.getvalue() + b"\x00" * 64,
        "json": json.dumps({"inputs": {"image": x.tolist()}}).encode(),
        "deep.json": b"[" * 100_000 + b"]" * 100_000,
        "wide.json": b'{"inputs": {"image": [' + b"[]," * 50_000 + b"[]]}}",
        "odd.json": json.dumps({"inputs": {"image": [["a", None], [True, 1e400]]}}).encode(),
    }


def mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["flip", "cut", "insert", "splice", "zero"])
        if not data:
            break
        at = rng.randrange(len(data))
        if kind == "flip":
            for _ in range(rng.randint(1, 16)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == "cut":
            del data[at:at + rng.randint(1, max(1, len(data) // 2))]
        elif kind == "insert":
            data[at:at] = rng.randbytes(rng.randint(1, 64))
        elif kind == "splice":
            data[at:] = data[rng.randrange(len(data)):]
        else:
            data[at:at + 32] = bytes(len(data[at:at + 32]))
    return bytes(data)


METHODS = ["POST"] * 6 + ["GET"] * 2 + ["PUT", "HEAD", "DELETE", "OPTIONS", "PATCH", "BREW", "",
                                        "P\x00ST", "G" * 300]
PATHS = ["/infer"] * 6 + ["/infer/model", "/infer/nope", "/infer?part=model", "/infer?part=x",
                          "/health", "/metadata", "/", "//[x/infer", "/infer/%00%ff", "*",
                          "http://device/infer", "/" + "a" * 70_000, "/infer#frag", "/infer?" + "&" * 500]
VERSIONS = ["HTTP/1.1"] * 6 + ["HTTP/1.0"] * 2 + ["HTTP/0.9", "HTTP/x.y", "HTTP/1.1.1", "FOO", "",
                                                  "HTTP/2.0"]
TYPES = ["image/png", "image/jpeg", "application/json", "application/octet-stream", "text/plain",
         "image/", "", "application/json; charset=utf-8"]


def make_case(rng: random.Random, bodies: dict[str, bytes]) -> dict:
    name = rng.choice(list(bodies) + ["random", "empty"])
    if name == "random":
        body = rng.randbytes(rng.randint(1, 4096))
    elif name == "empty":
        body = b""
    else:
        body = bodies[name] if rng.random() < 0.3 else mutate(rng, bodies[name])
    if rng.random() < 0.75:   # most cases reach the body's decoding
        method, version = "POST", rng.choice(["HTTP/1.1", "HTTP/1.0"])
        path = rng.choice(["/infer", "/infer", "/infer/model", "/infer?part=model"])
    else:
        method, path, version = rng.choice(METHODS), rng.choice(PATHS), rng.choice(VERSIONS)
    headers = ["Host: device"]
    if rng.random() < 0.8:
        headers.append("Content-Type: " + rng.choice(TYPES))
    length = rng.choice(["true"] * 6 + ["less", "more", "huge", "abc", "-1", "twice", "none",
                                        "chunked", "spaces", "64MB+1", "digits"])
    stall = False
    if length == "true":
        headers.append(f"Content-Length: {len(body)}")
    elif length == "less":
        headers.append(f"Content-Length: {rng.randint(0, max(0, len(body) - 1))}")
    elif length == "more":
        headers.append(f"Content-Length: {len(body) + rng.randint(1, 1 << 20)}")
        stall = rng.random() < 0.1   # most hang up after the short body; a few wait for 408
    elif length == "huge":
        headers.append(f"Content-Length: {rng.randint(1 << 26, 1 << 62)}")
    elif length == "twice":
        headers += [f"Content-Length: {len(body)}", f"Content-Length: {len(body) + 1}"]
    elif length == "chunked":
        headers.append("Transfer-Encoding: chunked")
    elif length == "spaces":
        headers.append(f"Content-Length:    {len(body)}   ")
    elif length == "64MB+1":
        headers.append(f"Content-Length: {(64 << 20) + 1}")
    elif length == "digits":
        headers.append("Content-Length: " + "9" * rng.choice([19, 5000, 60000]))
    elif length != "none":
        headers.append(f"Content-Length: {length}")
    if rng.random() < 0.1:
        headers.append("Expect: 100-continue")
    if rng.random() < 0.05:
        headers += [f"X-Junk-{i}: {i}" for i in range(rng.choice([10, 150]))]
    if rng.random() < 0.05:
        headers.append("X-Long: " + "x" * rng.choice([1000, 70_000]))
    if rng.random() < 0.05:
        headers.append(rng.randbytes(40).decode("latin-1").replace("\r", "").replace("\n", ""))
    line = " ".join(p for p in (method, path, version) if p)
    if rng.random() < 0.03:   # the request cut off inside its headers, then silence
        head = (line + "\r\n" + "\r\n".join(headers))[:rng.randint(1, 60)]
        return {"data": head.encode("latin-1"), "stall": True, "version": version, "what": "cut head"}
    head = (line + "\r\n" + "\r\n".join(headers) + "\r\n\r\n").encode("latin-1")
    return {"data": head + body, "stall": stall, "version": version,
            "what": f"{method[:10]} {path[:30]} {version} body={name} length={length}"}


def run_case(url: str, case: dict) -> str | None:
    """None when the server answered as it should, else what went wrong."""
    start = time.monotonic()
    try:
        status, headers, body = raw_http(url, case["data"], half_close=not case["stall"],
                                         timeout=CLIENT_TIMEOUT)
    except TimeoutError:
        return f"no answer in {time.monotonic() - start:.0f} s (a hang)"
    except ConnectionRefusedError:
        return "connection refused (the server is down)"
    if status is None or status < 500:
        return None
    if status == 503 and headers.get("Retry-After"):
        return None   # over --max-concurrent: the designed answer
    if status == 505 and case["version"] == "HTTP/2.0":
        return None   # http.server's answer to a major version it does not speak
    return f"{status}: {body[:300]!r}"


def test_serve_survives_random_requests(built, tmp_path):
    rng = random.Random(SEED)
    bodies = seeds()
    cases = [make_case(rng, bodies) for _ in range(CASES)]
    log = tmp_path / "serve.log"
    proc, url = start_server(built.bundle.directory, log, "--timeout", str(SERVER_TIMEOUT),
                             "--max-concurrent", "4")
    try:
        start = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(lambda c: run_case(url, c), cases))
        seconds = time.monotonic() - start
        failures = [f"{case['what']} -> {outcome}"
                    for case, outcome in zip(cases, outcomes, strict=True) if outcome]
        assert proc.poll() is None, "the server died: " + log.read_text()[-2000:]
        png = bodies["png"]
        status, _, body = raw_http(url, b"POST /infer HTTP/1.1\r\nContent-Type: image/png\r\n"
                                        b"Content-Length: %d\r\n\r\n" % len(png) + png)
        assert status == 200, body   # and it still serves
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n" + "\n".join(failures[:20])
    assert "Traceback" not in text and "a request from" not in text, text[-3000:]
    print(f"fuzz: {CASES} cases in {seconds:.1f} s, seed {SEED}")
