"""Factory fixtures: small real models (PyTorch export and onnx.helper) and real image files."""

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from packager.build.job import build

# Builds in the tests do not measure the OpenVINO provider, whether or not this machine has a
# Python with it (the bundles the suite checks must not depend on that); tests/test_openvino.py
# turns it on where it asks for it.
OPENVINO_PYTHON = os.environ.get("EDGEPACK_OPENVINO_PYTHON")
os.environ["EDGEPACK_OPENVINO_PYTHON"] = ""

PREP = {"size": [32, 32], "resize": "letterbox", "color": "rgb", "layout": "nchw",
        "scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25],
        "dtype": "float32", "pad": 114}
PREP_TEXT = "size=32x32,resize=letterbox,color=rgb,layout=nchw,scale=1/255,mean=0.5,std=0.25"


def tiny_cnn():
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Identity(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()


@pytest.fixture(scope="session")
def cnn_onnx(tmp_path_factory) -> Path:
    """A tiny CNN exported by PyTorch with a dynamic batch axis (input 'image' Nx3x32x32)."""
    import torch

    path = tmp_path_factory.mktemp("models") / "cnn.onnx"
    torch.onnx.export(tiny_cnn(), (torch.zeros(1, 3, 32, 32),), str(path), input_names=["image"],
                      output_names=["scores"], opset_version=17,
                      dynamic_axes={"image": {0: "batch"}}, dynamo=False)
    return path


def write_images(folder: Path, count: int, *, seed: int = 0, size=(48, 40)) -> Path:
    """Real PNG and JPEG files with shapes on noise, of varying sizes."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        w, h = size[0] + (i % 3) * 8, size[1] + (i % 2) * 6
        img = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        cv2.circle(img, (w // 2, h // 2), min(w, h) // 3, tuple(int(c) for c in rng.integers(0, 255, 3)), -1)
        cv2.imwrite(str(folder / f"img_{i:03d}{'.jpg' if i % 2 else '.png'}"), img)
    return folder


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    return write_images(tmp_path_factory.mktemp("calib") / "images", 20)


def save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def embed_model(path: Path) -> Path:
    """Two inputs, one int64 (token ids) and one float mask: Gather -> MatMul -> mean."""
    rng = np.random.default_rng(0)
    emb = numpy_helper.from_array(rng.normal(size=(50, 16)).astype(np.float32), "emb")
    w = numpy_helper.from_array(rng.normal(size=(16, 8)).astype(np.float32), "w")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]),
             helper.make_node("Unsqueeze", ["mask", "axes2"], ["m"]),
             helper.make_node("Mul", ["e", "m"], ["em"]),
             helper.make_node("MatMul", ["em", "w"], ["h"]),
             helper.make_node("ReduceMean", ["h", "axes"], ["y"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 12]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [emb, w, axes, numpy_helper.from_array(np.array([2], dtype=np.int64), "axes2")])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


@pytest.fixture(scope="session")
def embed_onnx(tmp_path_factory) -> Path:
    return embed_model(tmp_path_factory.mktemp("models") / "embed.onnx")


@pytest.fixture(scope="session")
def embed_npz(tmp_path_factory) -> Path:
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("calib") / "tokens.npz"
    np.savez(path, ids=rng.integers(0, 50, (24, 12)).astype(np.int64),
             mask=(rng.random((24, 12)) > 0.2).astype(np.float32))
    return path


@pytest.fixture(scope="session")
def built(tmp_path_factory, cnn_onnx, image_dir):
    """One INT8 bundle of the tiny CNN for x86_64-cpu, built once per session."""
    out = tmp_path_factory.mktemp("bundles") / "cnn"
    return build(cnn_onnx, out, target="x86_64-cpu", calib=image_dir, preprocess=PREP,
                 labels=[f"class{i}" for i in range(10)], quant={"precision": "int8"})


def run_py(bundle: Path, *args: str) -> subprocess.CompletedProcess:
    """Run a bundle's run.py as the device would: its own folder, a fresh process."""
    return subprocess.run([sys.executable, "-I", "run.py", *args], cwd=bundle,
                          capture_output=True, text=True, timeout=300)


def spoken(bundle: Path, tokens: np.ndarray, folder: Path, name: str, output: str) -> np.ndarray:
    """The waveform *bundle*'s `run.py infer` speaks for *tokens* (saved as folder/NAME.npy),
    read from its --out under the key NAME.npy/OUTPUT."""
    np.save(folder / f"{name}.npy", tokens)
    r = subprocess.run([sys.executable, str(bundle / "run.py"), "infer",
                        str(folder / f"{name}.npy"), "--out", str(folder / f"o{name}")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return np.load(folder / f"o{name}.npz")[f"{name}.npy/{output}"].reshape(-1)


@pytest.fixture(scope="session")
def encoder_files(tmp_path_factory):
    """Trained encoder weights (.safetensors) and a tokenised calibration set (.npz)."""
    import torch
    import torch_models
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("encoder")
    save_file(torch_models.train_encoder().state_dict(), str(folder / "enc.safetensors"))
    ids, mask, _ = torch_models.topic_batch(torch.Generator().manual_seed(1), n=40)
    np.savez(folder / "tokens.npz", input_ids=ids.numpy(), attention_mask=mask.numpy())
    return folder / "enc.safetensors", folder / "tokens.npz"


def start_server(bundle: Path, log: Path, *options: str, code: str | None = None
                 ) -> tuple[subprocess.Popen, str]:
    """`run.py serve --port 0 OPTIONS` in *bundle*, its stderr in *log*: (process, base URL).
    *code*: a Python program to run instead (`python -I -c CODE`), which starts the server."""
    import re
    import time

    argv = ["-c", code] if code else ["run.py", "serve", "--port", "0", *options]
    with open(log, "w") as err:   # a file, not a pipe: a server that logs never blocks on it
        proc = subprocess.Popen([sys.executable, "-I", *argv], cwd=bundle, stderr=err, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"serving \S+ on (http://[\d.]+:\d+)", log.read_text())
        if found:
            return proc, found.group(1)
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the server did not start: " + log.read_text())


def read_to_end(sock) -> bytes:
    """Everything the server sends on *sock* until it closes (a reset ends it too)."""
    answer = b""
    try:
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def raw_http(url: str, data: bytes, *, half_close: bool = False, timeout: float = 10.0,
             pause: float = 0.0, rest: bytes = b"") -> tuple[int | None, dict, bytes]:
    """Send *data* (then, after *pause* s, *rest*) to the server at *url* over a plain socket;
    read the answer to the end: (status or None when it hung up without one, headers, body).
    A client timeout raises socket.timeout: the server hung."""
    import socket
    import time

    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            if pause:
                time.sleep(pause)
            if rest:
                sock.sendall(rest)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError as exc:   # it answered early and closed (EPIPE, ECONNRESET, ENOTCONN)
            if isinstance(exc, TimeoutError):
                raise
        answer = read_to_end(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/"):
        return None, {}, answer
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers, body


def ship_heads(bundle: Path, manifest: dict) -> dict:
    """*manifest* (a dict, written by the caller) with its parts' tasks and heads copied into
    *bundle*'s runner/ and listed in its file table, as a build that declared those tasks ships
    them (a test that edits a part's task in a built bundle)."""
    import hashlib
    import shutil

    from packager._runtimes.runner.contents import RUNNER_HEADS, RUNNER_TASKS, has_tasks, part_kinds

    here = Path(__file__).parent.parent / "runtimes"
    wanted = [RUNNER_HEADS[kind] for kind in part_kinds(manifest)]
    for rel in wanted + (list(RUNNER_TASKS) if has_tasks(manifest) else []):
        shutil.copyfile(here / rel, bundle / rel)
        manifest["files"][rel] = hashlib.sha256((bundle / rel).read_bytes()).hexdigest()
    return manifest


# ---------------------------------------------------------------------------------------------
# Two tiers: `make test` (everything but the tests tests/full_only.txt lists: a few minutes) and
# `make test-all` (all of it; CI runs it).
FULL_ONLY = Path(__file__).with_name("full_only.txt")


def pytest_collection_modifyitems(config, items):
    """Mark `full` the tests full_only.txt lists (by file and function, every parameter)."""
    listed = {line.split()[0] for line in FULL_ONLY.read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if name in listed:
            item.add_marker(pytest.mark.full)


def pytest_sessionstart(session):
    """A suite started in the background of a non-interactive shell (`make test &`) inherits
    SIGINT ignored, and so would every process a test starts: the Ctrl-C tests' servers and
    builds would never stop (they timed out, and an import check saw SIG_IGN). Restore it."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
