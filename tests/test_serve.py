"""run.py serve: a stdlib HTTP endpoint in the bundle; bad requests get a 4xx, never a crash."""

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request

import cv2
import numpy as np
import pytest


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
