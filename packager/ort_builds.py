"""Other onnxruntime builds on this host: the OpenVINO execution provider.

`onnxruntime-openvino` (PyPI) is onnxruntime with Intel's OpenVINO inside, as the
OpenVINOExecutionProvider. It replaces the `onnxruntime` package (the same import name), so it
lives in a Python of its own: $EDGEPACK_OPENVINO_PYTHON, else `.venv-openvino` beside the
checkout's `.venv` (`make openvino`), else this Python when its onnxruntime has the provider.
An empty $EDGEPACK_OPENVINO_PYTHON turns it off.

Models run there through runtimes/time_models.py (the script `--time-on` sends to devices), in a
subprocess: timed side by side with the CPU provider in the same blocks, or run on samples for
their outputs. Nothing here is needed to build a bundle: without that Python the OpenVINO
candidates are not measured, and the build says so.
"""

import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import PackagerError

OPENVINO = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
OPENVINO_OPTIONS = {"device_type": "CPU"}   # FP32 inference on the CPU (no bf16/fp16 hint)
OPENVINO_PACKAGE = "onnxruntime-openvino"
OPENVINO_MIN = "1.20"
OPENVINO_INSTALL = ("python3 -m venv ~/ort && ~/ort/bin/pip install "
                    "'onnxruntime-openvino>=1.20' numpy  # in place of onnxruntime (the same "
                    "import name): not both in one venv")
ENV = "EDGEPACK_OPENVINO_PYTHON"
TIMEOUT_S = 600

# a plan row: (key, model path, [(provider, options), ...] tried in order)
Row = tuple[str, Path, Sequence[tuple[str, Mapping[str, Any]]]]


class OrtBuildError(PackagerError):
    """The other onnxruntime could not run the models (its Python failed or timed out)."""


def openvino_chain() -> list[tuple[str, dict[str, Any]]]:
    return [(OPENVINO, dict(OPENVINO_OPTIONS)), (CPU, {})]


def cpu_chain() -> list[tuple[str, dict[str, Any]]]:
    return [(CPU, {})]


def openvino_python() -> Path | None:
    """A Python whose onnxruntime has the OpenVINO provider, or None."""
    given = os.environ.get(ENV)
    if given is not None:
        return Path(given) if given and _has_openvino(given) else None
    local = Path(__file__).resolve().parent.parent / ".venv-openvino" / "bin" / "python"
    for python in (local, Path(sys.executable)):
        if python.is_file() and _has_openvino(str(python)):
            return python
    return None


def why_no_openvino() -> str:
    if os.environ.get(ENV) == "":
        return f"{ENV} is empty"
    if os.environ.get(ENV):
        return f"{ENV}={os.environ[ENV]} has no onnxruntime with the OpenVINO provider"
    return (f"no Python with {OPENVINO_PACKAGE} on this host (`make openvino`, or set {ENV} to "
            "one)")


@functools.cache
def _has_openvino(python: str) -> bool:
    try:
        proc = subprocess.run(
            [python, "-c", "import onnxruntime as o; print(o.get_available_providers())"],
            capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and OPENVINO in proc.stdout


def _script() -> str:
    from ._runtimes import time_models

    return time_models.__file__


def _call(python: Path, args: list[str], what: str, timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run([str(python), _script(), *args], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise OrtBuildError(f"{python}: {what} took over {timeout:.0f} s",
                          f"unset {ENV} to build without OpenVINO") from None
    except OSError as exc:
        raise OrtBuildError(f"{python}: {what} could not start ({exc.strerror})",
                          f"set {ENV} to a working Python") from None
    lines = proc.stdout.strip().splitlines()
    try:
        if proc.returncode != 0 or not lines:
            raise ValueError
        return json.loads(lines[-1])
    except ValueError:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise OrtBuildError(f"{python}: {what} failed ({last})",
                          f"check its onnxruntime, or unset {ENV}") from None


def _write_plan(folder: Path, rows: Sequence[Row],
                only: Mapping[str, Sequence[int]] | None = None) -> Path:
    """PLAN.json for runtimes/time_models.py (*only*: the sample numbers a row runs on)."""
    plan = folder / "plan.json"
    plan.write_text(json.dumps([[key, str(path), [[n, dict(o)] for n, o in chain]]
                                + ([[int(i) for i in only[key]]] if only and key in only else [])
                                for key, path, chain in rows]))
    return plan


def time_plan(python: Path, rows: Sequence[Row], feed: Mapping[str, np.ndarray], threads: int,
              rounds: int, block: int, timeout: float = TIMEOUT_S, every: bool = False
              ) -> tuple[dict[str, dict[str, float]], dict[str, str], dict[str, Any]]:
    """Time every row interleaved in blocks in *python*: ({key: {p50, p90}}, {key: provider
    that really ran}, the device). The rounds stop once the order is clear, unless *every*."""
    with tempfile.TemporaryDirectory(prefix="edgepack-ort-") as tmp:
        folder = Path(tmp)
        np.savez(folder / "feed.npz", **feed)
        plan = _write_plan(folder, rows)
        data = _call(python, [str(folder / "feed.npz"), str(threads), str(rounds), str(block),
                              *(["--all-rounds"] if every else []), "--plan", str(plan)],
                     "timing the candidates", timeout)
    return data["timings"], data["providers"], data["device"]


def outputs_plan(python: Path, rows: Sequence[Row], samples: Sequence[Mapping[str, Any]],
                 threads: int, timeout: float = TIMEOUT_S,
                 only: Mapping[str, Sequence[int]] | None = None
                 ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
    """Each row's outputs on *samples* (on the sample numbers *only* lists for its key, in
    that order), stacked per output name as graph.execute.run_model's (ragged where a length
    follows the input), and the provider that really ran each."""
    from ._runtimes.runner.metrics import stack_or_ragged

    with tempfile.TemporaryDirectory(prefix="edgepack-ort-") as tmp:
        folder = Path(tmp)
        np.savez(folder / "samples.npz", **{f"{i}/{k}": np.asarray(v)
                                            for i, s in enumerate(samples) for k, v in s.items()})
        plan = _write_plan(folder, rows, only)
        data = _call(python, ["--outputs", str(folder / "samples.npz"), str(folder / "out.npz"),
                              str(threads), "--plan", str(plan)], "running the samples", timeout)
        found: dict[str, dict[str, list]] = {}
        with np.load(folder / "out.npz") as out:
            for name in out.files:
                key, index, output = name.split("/", 2)
                found.setdefault(key, {}).setdefault(output, []).append((int(index), out[name]))
    rank = {key: {int(i): n for n, i in enumerate(only[key])} for key in (only or {})}
    stacked = {key: {o: stack_or_ragged([v for _, v in sorted(
        vals, key=lambda t: rank[key][t[0]] if key in rank else t[0])])
        for o, vals in outs.items()} for key, outs in found.items()}
    return stacked, data["providers"]
