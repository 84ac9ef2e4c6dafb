"""compare's rows for the runtime users would pick instead on x86: OpenVINO, through
onnxruntime-openvino's execution provider in a Python of its own (ort_builds.py).

The ORT FP32 graph runs there under the OpenVINO provider ("OpenVINO FP32") and under that
onnxruntime's own CPU provider (the row the OpenVINO rows' "vs ORT FP32" is taken against, timed
in the same blocks of the same process), and the INT8 QDQ U8S8 graph compare builds runs under
the OpenVINO provider ("OpenVINO INT8 (QDQ)"). Accuracy comes from each row's outputs on the
held-out samples. The roofline graphs are timed there too, under the OpenVINO provider: its own
kernels (oneDNN) may beat onnxruntime's, and the ceiling is the best either reaches.
"""

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import ort_builds

OV_CPU, OV_FP32, OV_INT8 = ("ORT FP32 (OpenVINO's onnxruntime)", "OpenVINO FP32",
                            "OpenVINO INT8 (QDQ)")
OPENVINO_ROWS = (OV_CPU, OV_FP32, OV_INT8)

ROOFLINE_SCRIPT = """import json, sys
sys.path.insert(0, sys.argv[1])
from runner.roofline import time_roofline
graphs = json.loads(sys.argv[3])
rates = time_roofline(sys.argv[2], graphs, int(sys.argv[4]), json.loads(sys.argv[5]))
print(json.dumps([[g["file"], gops, provider] for g, gops, provider in rates]))
"""


def openvino_rows(wanted: Sequence[str], raw: Path, qdq: Path | None, tmp: Path,
                  roofline: Mapping[str, Any], feeds: Sequence[Mapping[str, np.ndarray]],
                  output_names: Sequence[str], threads: int, rounds: int,
                  block: int) -> dict[str, Any]:
    """Time and run the wanted OpenVINO rows in the OpenVINO Python: {"medians", "outputs"
    (per feed, per output, as compare's), "providers", "device", "rates" ([(graph, GOP/s)]
    under the OpenVINO provider), "errors", "note" (why none ran, or None)}."""
    found: dict[str, Any] = {"medians": {}, "outputs": {}, "providers": {}, "device": None,
                             "rates": [], "errors": {}, "note": None}
    todo = [name for name in OPENVINO_ROWS if name in wanted]
    if not todo:
        return found
    python = ort_builds.openvino_python()
    if python is None:
        found["note"] = f"OpenVINO rows skipped: {ort_builds.why_no_openvino()}."
        return found
    graphs = {OV_CPU: (raw, ort_builds.cpu_chain()), OV_FP32: (raw, ort_builds.openvino_chain()),
              OV_INT8: (qdq, ort_builds.openvino_chain())}
    if qdq is None and OV_INT8 in todo:
        found["errors"][OV_INT8] = "the INT8 QDQ U8S8 graph could not be built"
        todo.remove(OV_INT8)
    # the CPU row first: the OpenVINO rows' ratio is taken against it, in the same blocks
    rows = [(name, *graphs[name]) for name in (OV_CPU, *todo) if name in graphs]
    rows = list(dict((r[0], r) for r in rows).values())
    try:
        medians, providers, device = ort_builds.time_plan(python, rows, feeds[0], threads, rounds,
                                                       block, every=True)
        outputs, _ = ort_builds.outputs_plan(python, rows, feeds, threads)
    except ort_builds.OrtBuildError as exc:
        found["note"] = f"OpenVINO rows failed: {exc.message}."
        return found
    for name, _, _ in rows:
        if name not in todo and name != OV_CPU:
            continue
        found["medians"][name] = medians[name]
        found["outputs"][name] = [[outputs[name][o][i] for o in output_names]
                                  for i in range(len(feeds))]
    found.update(providers=providers, device=device,
                 rates=_openvino_roofline(python, tmp, roofline, threads))
    return found


def _openvino_roofline(python: Path, tmp: Path, spec: Mapping[str, Any],
                       threads: int) -> list[tuple[dict[str, Any], float]]:
    """The roofline graphs' GOP/s under the OpenVINO provider (those it really ran)."""
    from ._runtimes import runner
    from ._runtimes.runner.roofline import roofline_graphs

    graphs = roofline_graphs(spec)
    cmd = [str(python), "-c", ROOFLINE_SCRIPT, str(Path(runner.__file__).parent.parent),
           str(tmp), json.dumps(graphs), str(threads), json.dumps(ort_builds.openvino_chain())]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=ort_builds.TIMEOUT_S)
        rates = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return []   # no OpenVINO ceiling: the CPU provider's stands, and the note says so
    by_file = {g["file"]: g for g in graphs}
    return [(by_file[f], gops) for f, gops, provider in rates
            if provider == ort_builds.OPENVINO and f in by_file]
