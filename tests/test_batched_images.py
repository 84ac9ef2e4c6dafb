"""A bundle built at a static batch of N > 1 takes images as a batch-1 bundle does: infer
stacks them N at a time (the last call padded), serve pads one image to N; each image's answer
is the one the batch-1 bundle gives it."""

import json
import urllib.request

import numpy as np
import pytest

from conftest import PREP, run_py, start_server, write_images
from packager.build.job import build
from packager.source.specs import TensorSpec

LABELS = [f"class{i}" for i in range(10)]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, cnn_onnx, image_dir):
    """The tiny CNN in FP32 at batch 4 and at batch 1 (FP32: the two compute the same numbers)."""
    out = tmp_path_factory.mktemp("batched")
    made = {}
    for batch in (4, 1):
        made[batch] = build(cnn_onnx, out / f"b{batch}", target="x86_64-cpu", calib=image_dir,
                            preprocess=PREP, labels=LABELS, quant={"precision": "fp32"},
                            inputs=[TensorSpec("image", (batch, 3, 32, 32))]).bundle.directory
    return made


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_images(tmp_path_factory.mktemp("photos") / "six", 6, seed=7)


def infer(bundle, *args):
    r = run_py(bundle, "infer", *args)
    assert r.returncode == 0, r.stderr
    return r


def test_infer_a_folder_on_batch_4_answers_each_image_as_batch_1(bundles, photos, tmp_path):
    manifest = json.loads((bundles[4] / "manifest.json").read_text())
    assert manifest["parts"][0]["inputs"][0]["shape"] == [4, 3, 32, 32]
    one = json.loads(infer(bundles[1], str(photos), "--json", "--raw", "--out",
                           str(tmp_path / "b1.npz")).stdout)
    four = json.loads(infer(bundles[4], str(photos), "--json", "--raw", "--out",
                            str(tmp_path / "b4.npz")).stdout)
    assert len(four["results"]) == 6
    assert [r["file"] for r in four["results"]] == [r["file"] for r in one["results"]] == \
        [str(p) for p in sorted(photos.iterdir())]
    assert four["batching"] == "batch 4: 6 images in 2 calls, the last padded"
    assert "batching" not in one
    for a, b in zip(four["results"], one["results"], strict=True):
        assert a.keys() == b.keys() and a["key"] == b["key"]
        assert a["outputs"]["scores"]["shape"] == b["outputs"]["scores"]["shape"] == [1, 10]
        assert [t["index"] for t in a["outputs"]["scores"]["top"]] == \
            [t["index"] for t in b["outputs"]["scores"]["top"]]
        np.testing.assert_allclose([t["score"] for t in a["outputs"]["scores"]["top"]],
                                   [t["score"] for t in b["outputs"]["scores"]["top"]], atol=1e-4)
    with np.load(tmp_path / "b1.npz") as f1, np.load(tmp_path / "b4.npz") as f4:
        assert sorted(f4.files) == sorted(f1.files) and len(f4.files) == 6
        for key in f1.files:
            assert f4[key].shape == f1[key].shape == (1, 10)
            np.testing.assert_allclose(f4[key], f1[key], atol=1e-4)
        # the images differ: a row mix-up (every image given the first's answer) would show
        assert len(set(round(float(f4[k][0, 0]), 6) for k in f4.files)) == 6


def test_human_output_one_line_per_image_and_the_note_once(bundles, photos):
    files = [str(p) for p in sorted(photos.iterdir())][:5]
    one = infer(bundles[1], *files).stdout.splitlines()
    four = infer(bundles[4], *files).stdout.splitlines()
    assert four[0] == "batch 4: 5 images in 2 calls, the last padded"
    assert sum("batch 4" in line for line in four) == 1
    assert [line.split(":")[0] for line in four[1:]] == files
    # "FILE: scores = class N 'classN' (score S)": the same class for each image as batch 1
    assert [line.split(" (score")[0] for line in four[1:]] == \
        [line.split(" (score")[0] for line in one]


def test_a_tensor_input_must_still_match_the_batch(bundles, tmp_path):
    np.save(tmp_path / "one.npy", np.zeros((1, 3, 32, 32), np.float32))
    r = run_py(bundles[4], "infer", str(tmp_path / "one.npy"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "has shape [1, 3, 32, 32], the model wants [4, 3, 32, 32]" in r.stderr
    np.save(tmp_path / "four.npy", np.zeros((4, 3, 32, 32), np.float32))
    answer = json.loads(infer(bundles[4], str(tmp_path / "four.npy"), "--json", "--raw").stdout)
    assert answer["results"][0]["outputs"]["scores"]["shape"] == [4, 10]
    assert "batching" not in answer


def test_serve_one_image_on_batch_4_answers_as_batch_1(bundles, photos, tmp_path):
    image = sorted(photos.iterdir())[3]
    expected = json.loads(infer(bundles[1], str(image), "--json").stdout)["results"][0]
    proc, url = start_server(bundles[4], tmp_path / "serve.log", "--quiet")
    try:
        req = urllib.request.Request(url + "/infer", data=image.read_bytes(), method="POST")
        req.add_header("Content-Type", "image/png" if image.suffix == ".png" else "image/jpeg")
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200
            got = json.loads(resp.read())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert got["part"] == "model" and got["latency_ms"] > 0
    assert got["stages_ms"]["model"] == got["latency_ms"]   # serve's own: where the time went
    assert set(got) - {"part", "latency_ms", "stages_ms"} == set(expected) - {"file", "key"}
    scores, want = got["outputs"]["scores"], expected["outputs"]["scores"]
    assert scores["shape"] == want["shape"] == [1, 10]
    assert [(t["index"], t["label"]) for t in scores["top"]] == \
        [(t["index"], t["label"]) for t in want["top"]]
    np.testing.assert_allclose([t["score"] for t in scores["top"]],
                               [t["score"] for t in want["top"]], atol=1e-4)
