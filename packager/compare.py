"""compare(): what actually runs fastest on this machine, and at what accuracy.

PyTorch eager and torch.compile (for PyTorch sources), ONNX Runtime FP32 as exported and after
offline optimisation, INT8 static (QDQ U8S8, QDQ S8S8, QOperator), INT8 dynamic and FP16, at
batch 1 and a larger batch; for models with attention, also the transformer-fused FP32 graph and
its dynamic INT8 (what `build` ships for them). Warm latency is timed in one process, interleaved
in blocks (timing.py), together with the roofline graphs a bundle ships (bundle/roofline.py:
MatMuls of several shapes, QLinearMatMul, Conv and QLinearConv of the model's heaviest convs):
the best rate of each kind is the ceiling each row's GOP/s is a share of. Where a Python with
onnxruntime-openvino exists (ort_builds.py), the ORT FP32 graph and the INT8 QDQ U8S8 graph also
run under its OpenVINO execution provider (compare_openvino.py), timed in blocks with that
Python's own CPU provider. Cold start (import + load + first call) is measured apart, in fresh
processes.
"""

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .bundle.roofline import MATMUL_SHAPES
from .compare_batch import COMPILED, DYNAMIC_FUSED, EAGER, FUSED, VARIANTS, compare_batch
from .compare_bundle import refuse_as_model, shipped_graph
from .compare_openvino import OPENVINO_ROWS, OV_CPU
from .compare_speech import compare_speech, is_speech, speech_markdown
from .errors import PackagerError, ShapeError
from .graph.inspection import graph_inputs, io_specs
from .graph.modelio import load_model
from .progress import OFF, Log, Progress
from .quantization.calibration import HOLDOUT, load_samples, split_holdout
from .source.export import make_inputs
from .source.specs import TensorSpec
from .source.torchload import is_torch_source, load_source
from .targets import Target, load_target
from .timing import COLD_ORT, machine

EVAL_SAMPLES = 16   # random inputs drawn when no calibration data is given

COLD_TORCH = """import json, sys, time
t0 = time.perf_counter()
import numpy as np, torch
t1 = time.perf_counter()
from packager.source.torchload import load_source
args = json.loads(sys.argv[3])
m = load_source(sys.argv[1], factory_args=args["factory_args"], weights=args["weights"],
                submodule=args["submodule"]).module
torch.set_num_threads(max(1, int(args["threads"])) if int(args["threads"]) else torch.get_num_threads())
t2 = time.perf_counter()
with np.load(sys.argv[2]) as f:
    feed = [torch.from_numpy(f[n]) for n in args["names"]]
t3 = time.perf_counter()
with torch.inference_mode():
    m(*feed)
t4 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "load_ms": (t2 - t1) * 1e3,
                  "first_call_ms": (t4 - t3) * 1e3, "total_ms": (t2 - t0 + t4 - t3) * 1e3}))
"""


def compare(source: str | Path, *, inputs: Sequence[TensorSpec] = (), calib: Path | None = None,
            preprocess: dict[str, Any] | None = None, target: Target | str = "x86_64-cpu",
            batches: Sequence[int] = (1, 8), rounds: int = 5, block: int = 20,
            threads: int | None = None, variants: Sequence[str] | None = None,
            weights: Path | None = None, factory_args: dict[str, Any] | None = None,
            submodule: str | None = None, cold: bool = True, bundle: Path | None = None,
            audio_rate: int | None = None, log: Log = lambda _: None,
            steps: Progress | None = None) -> dict[str, Any]:
    """Benchmark every variant of *source* (PyTorch or .onnx) on this machine; see module doc.

    *steps* shows each variant built, each timing block and each cold start (on a terminal).
    *bundle*: its shipped graph is one more row, "shipped (NAME: precision)". *audio_rate*:
    the first output is a waveform at that many Hz (speech): each row's real-time factor.
    """
    target = load_target(target) if isinstance(target, str | Path) else target
    if threads is None:
        threads = int(target.session.get("intra_op_threads", 0))
    if speech := is_speech(source):   # whole sentences, real-time factors, log-mel distance
        return compare_speech(source, speech, calib=calib, bundle=bundle, rounds=rounds,
                              threads=threads, cold=cold, log=log)
    refuse_as_model(source)
    shipped = shipped_graph(bundle) if bundle is not None else None
    audio_rate = audio_rate or (shipped or {}).get("audio_rate")
    steps = steps or OFF
    by_case = {v.lower(): v for v in VARIANTS}
    wanted = [by_case.get(v.lower(), v) for v in variants or VARIANTS]
    unknown = [v for v in wanted if v not in VARIANTS]
    for name, value in (("--batch", min(batches, default=1)), ("--rounds", rounds),
                        ("--block", block), ("--threads", threads or 1)):
        if value < 1:
            raise PackagerError(f"{name} {value}: must be 1 or more", f"pass {name} 1 or more")
    if unknown:
        raise PackagerError(f"unknown variant '{unknown[0]}'", f"variants: {', '.join(VARIANTS)}")
    loaded = None
    if is_torch_source(source):
        loaded = load_source(str(source), factory_args=factory_args, weights=weights,
                             submodule=submodule)
        specs = list(inputs) or loaded.example_inputs
        if not specs:
            raise PackagerError("no --input given for a PyTorch model",
                                "give one per forward() argument: --input NAME:1x3x224x224")
    else:
        wanted = [v for v in wanted if v not in (EAGER, COMPILED)]
        model = load_model(Path(source))
        refuse_as_model(source, model)
        given = {s.name: s for s in inputs}
        specs = [given.get(i["name"]) or TensorSpec(
            i["name"], tuple(d if isinstance(d, int) and d > 0 else 1 for d in i["shape"]),
            i["dtype"]) for i in io_specs(graph_inputs(model))]
    # (build's split: its held-out samples judge both)
    calib_set, held = split_holdout(_samples(specs, calib, preprocess, loaded), fraction=HOLDOUT)
    wanted += [shipped["label"]] if shipped else []
    rows: list[dict[str, Any]] = []
    ceilings: list[dict[str, Any]] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="edgepack-compare-") as tmp:
        for i, batch in enumerate(batches):
            log(f"compare: batch {batch}")
            try:
                batch_rows, ceiling = compare_batch(
                    Path(tmp), source, loaded, specs, batch, calib_set, held, target, threads,
                    wanted, rounds, block, log, steps, f"batch {batch} ({i + 1}/{len(batches)})",
                    notes, shipped)
            except ShapeError as exc:   # a model fixed at batch 1: the other batches say so
                if i == 0:
                    raise
                batch_rows, ceiling = _no_batch(batch, wanted, exc, notes, steps), None
            rows += batch_rows
            ceilings += [ceiling] if ceiling else []
        if cold:
            _cold_starts(Path(tmp), source, loaded, rows, threads, weights, factory_args,
                         submodule, log, steps)
    _finish_rows(rows, audio_rate)
    return {"source": str(source), "machine": machine(), "threads": threads,
            "audio_rate": audio_rate,
            "reference": "PyTorch" if loaded is not None else "ORT FP32",
            "batches": list(batches), "rounds": rounds, "block": block,
            "samples": {"calibration": len(calib_set), "held_out": len(held),
                        "data": "calibration" if calib is not None else "random"},
            "roofline": ceilings, "rows": rows, "notes": list(dict.fromkeys(notes))}


def _samples(specs: Sequence[TensorSpec], calib: Path | None,
             preprocess: dict[str, Any] | None, loaded) -> list[dict[str, Any]]:
    """Batch-1 samples: the calibration data's, else random inputs of the specs."""
    one = [TensorSpec(s.name, (1, *s.shape[1:]), s.dtype) for s in specs]
    if calib is not None:
        return load_samples(calib, inputs=[{"name": s.name, "shape": list(s.shape),
                                            "dtype": s.dtype} for s in one],
                            preprocess=preprocess)
    return [dict(zip([s.name for s in one], make_inputs(one, loaded.module if loaded
                                                        else _NoModule(), seed=i),
                     strict=True)) for i in range(EVAL_SAMPLES)]


def _finish_rows(rows: list[dict[str, Any]], audio_rate: int | None) -> None:
    """Each row's real-time factor for speech, and no private keys left."""
    for r in rows:
        if audio_rate and "error" not in r and r.get("_out0_elements"):
            # seconds of speech per second of compute, warm (the cold start is its own column);
            # the real-time factor is its inverse, compute over audio, as Piper and ESPnet say
            r["x_real_time"] = r["_out0_elements"] / audio_rate / (r["p50_ms"] / 1000.0)
            r["rtf"] = 1.0 / r["x_real_time"] if r["x_real_time"] else None
            r.pop("top1", None)   # a waveform's samples are no class scores
        r.pop("_path", None)
        r.pop("_out0_elements", None)


def _no_batch(batch: int, wanted: Sequence[str], exc: ShapeError, notes: list[str],
              steps: Progress) -> list[dict[str, Any]]:
    steps.finish()
    notes.append(f"batch {batch}: {exc.message}")
    return [{"variant": v, "batch": batch,
             "error": f"the model does not run at batch {batch} (see the notes)"} for v in wanted]


class _NoModule:
    def modules(self):
        return []


def _cold_starts(tmp: Path, source, loaded, rows, threads, weights, factory_args, submodule,
                 log: Log, steps: Progress) -> None:
    """Import + load + first call in a fresh process, batch 1 only."""
    first = min((r["batch"] for r in rows), default=1)
    feed = tmp / f"feed_b{first}.npz"
    todo = [r for r in rows if r["batch"] == first and "error" not in r and
            (r["variant"] == EAGER or r.get("_path"))]
    steps.start("cold start", len(todo))
    for row in todo:
        steps.step(row["variant"])
        if row["variant"] == EAGER:
            with np.load(feed) as f:
                names = list(f.files)
            args = json.dumps({"factory_args": factory_args or {}, "weights":
                               str(weights) if weights else None, "submodule": submodule,
                               "threads": threads, "names": names})
            cmd = [sys.executable, "-c", COLD_TORCH, str(source), str(feed), args]
        else:
            cmd = [sys.executable, "-c", COLD_ORT, row["_path"], str(feed), str(threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode == 0 and proc.stdout.strip():
            row["cold_start"] = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            row["cold_start_error"] = (proc.stderr.strip().splitlines() or ["failed"])[-1][:160]
    steps.finish()


def markdown(result: dict[str, Any]) -> str:
    """The comparison as a Markdown table (one row per variant and batch)."""
    if result.get("kind") == "speech":
        return speech_markdown(result)
    from ._runtimes.runner.load import BUSY
    from .timing import machine_line

    shares = {r["batch"]: r["load"]["other_share"] for r in result["rows"]
              if (r.get("load") or {}).get("other_share") is not None}
    audio = 1 if result.get("audio_rate") else 0
    busy = "; ".join(f"batch {b}: other processes used {100 * v:.0f}% of the cores"
                     + (" (NOISY)" if v > BUSY else "") for b, v in shares.items())
    lines = [f"Machine: {machine_line(result['machine'])}; {result['threads'] or 'default'} "
             f"intra-op threads (ORT spinning off); {result['rounds']} rounds, interleaved in "
             "blocks" + (f"; {busy}" if busy else "") + ".", "",
             "| variant | batch | p50 ms | p90 ms | per sample ms | vs eager | vs ORT FP32 | "
             "GOP/s | % of ceiling | size MB | cosine min | top-1 | cold start ms | prepare s |"
             + (" x real time |" if audio else ""), "|" + " --- |" * (14 + audio)]

    def num(value, fmt):
        return format(value, fmt) if isinstance(value, int | float) else "-"

    def ratio(value):
        return "-" if not value else f"{value:.2f}x" if value >= 0.1 else f"{value:.3f}x"

    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['batch']} | failed: {r['error']} |" +
                         " |" * (11 + audio))
            continue
        cold = r.get("cold_start", {}).get("total_ms")
        share = r.get("ceiling_share")
        lines.append(
            f"| {r['variant']} | {r['batch']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | "
            f"{r['per_sample_ms']:.2f} | {ratio(r['vs_eager'])} | {ratio(r['vs_ort_fp32'])} | "
            f"{_figure(r.get('gops'))} | {num(share and 100 * share, '.0f')} | "
            f"{r['size_mb']:.2f} | {r['cosine_min']:.4f} | "
            f"{num(100 * r['top1'], '.1f') + '%' if 'top1' in r else '-'} | "
            f"{num(cold, '.0f')} | {num(r.get('prepare_s'), '.1f')} |"
            + (f" {num(r.get('x_real_time'), '.1f')} |" if audio else ""))
    lines += ["", f"cosine / top-1: against {result['reference']} on "
        f"{result['samples']['held_out']} held-out {result['samples']['data']} samples. Cold "
        "start: import + load + first call in a fresh process (batch "
        f"{min(result['batches'])}). prepare: quantization, offline optimisation, fusion or "
        "compile time."]
    lines += _ceiling_lines(result) + _openvino_lines(result)
    lines += [f"\n{note}" for note in result.get("notes", ())]
    lines += _fused_lines(result)
    return "\n".join(lines) + "\n"


def _ceiling_lines(result: dict[str, Any]) -> list[str]:
    """What GOP/s and % of ceiling mean, with this machine's ceilings."""
    lines: list[str] = []
    ceilings = [c for c in result.get("roofline", ()) if c.get("ops_per_call")]
    if ceilings:
        kind = ceilings[0]["int8_kind"]
        runtimes = sorted({g["runtime"] for c in ceilings for g in c.get("graphs", ())})
        lines += ["", "GOP/s: operations per call (2 x the multiply-adds of Conv, Gemm, MatMul, "
                  "counted on the FP32 graph: " + ", ".join(
                      f"{_figure(c['ops_per_call'] / 1e9)} GOP at batch {c['batch']}"
                      for c in ceilings) + ") over p50. % of ceiling: that rate against this "
                  "machine's best, with the same threads: the fastest of the roofline graphs "
                  f"(MatMuls of {len(MATMUL_SHAPES)} shapes, square and im2col-like, as FP32 MatMul, "
                  f"{kind} MatMulInteger, QLinearMatMul and QDQ MatMul; two 3x3 convs and the "
                  "model's three heaviest at its batch, as FP32 Conv, QLinearConv and QDQ Conv), "
                  "timed under "
                  f"{' and '.join(runtimes)} beside the rows (INT8 rows against the best integer "
                  "graph, FP32 and FP16 against the best FP32 one; a row under the CPU "
                  "provider against the CPU provider's graphs, one under OpenVINO against both, "
                  "as `run.py bench --roofline` and verify count it): " + "; ".join(
                      f"batch {c['batch']}: FP32 {c['fp32_gops']:.0f} GOP/s ({c['fp32_best']}), "
                      f"integer {c['int8_gops']:.0f} GOP/s ({c['int8_best']})"
                      for c in ceilings if "fp32_gops" in c and "int8_gops" in c) + "."]
        over = sorted({r["variant"] for r in result["rows"]
                       if (r.get("ceiling_share") or 0) > 1})
        if over:
            lines += ["", "Above 100 %: " + ", ".join(over) + " ran faster than every roofline "
                      "graph of its kind (a kernel doing fewer multiplies than 2 x the "
                      "multiply-adds counted, e.g. a Winograd convolution, or one the roofline "
                      "set lacks); the share is shown as measured, not capped."]
    return lines


def _openvino_lines(result: dict[str, Any]) -> list[str]:
    """How the OpenVINO rows were run, and which providers ran them."""
    lines: list[str] = []
    other = [r for r in result["rows"] if r["variant"] in OPENVINO_ROWS and "runtime" in r]
    if other:
        first = other[0]
        lines += ["", f"OpenVINO rows: {first['runtime']} (onnxruntime-openvino) in its own "
                  "Python, the ORT FP32 graph and the INT8 QDQ U8S8 graph under its OpenVINO "
                  f"execution provider (FP32 inference, device CPU); their vs ORT FP32 is against "
                  f"\"{OV_CPU}\", the same graph under that onnxruntime's CPU provider timed in "
                  "the same blocks; vs eager and cold start are not measured there. Providers that "
                  "ran: " + ", ".join(f"{r['variant']} b{r['batch']}: {r.get('provider')}"
                                      for r in other if r["batch"] == first["batch"]) + "."]
    return lines


def _fused_lines(result: dict[str, Any]) -> list[str]:
    """What fused in the transformer-fused rows, per group of batches that fused alike."""
    lines: list[str] = []
    groups: dict[str, list] = {}   # batches whose graphs fused alike
    for r in result["rows"]:
        if r["variant"] in FUSED and "fusion" in r:
            f = r["fusion"]
            what = ", ".join(f"{op} {n}" for op, n in sorted(f["fused"].items()))
            groups.setdefault(f"{what}, by {f['by']}", []).append(
                (r["batch"], f["cosine_to_unfused"]))
    if groups:
        lines += ["", "fused: " + "; ".join(
            "batch " + ", ".join(str(b) for b in dict.fromkeys(b for b, _ in seen)) +
            f": {what} (outputs: cosine {min(c for _, c in seen):.6f} to unfused)"
            for what, seen in groups.items()) +
            f". {DYNAMIC_FUSED}: that graph quantized as INT8 dynamic is."]
    return lines


def _figure(value: float | None) -> str:
    """A rate or count with three significant digits at most, and no exponent."""
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.3g}"
