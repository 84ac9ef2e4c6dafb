"""compare(): what actually runs fastest on this machine, and at what accuracy.

PyTorch eager and torch.compile (for PyTorch sources), ONNX Runtime FP32 as exported and after
offline optimisation, INT8 static (QDQ U8S8, QDQ S8S8, QOperator), INT8 dynamic and FP16, at
batch 1 and a larger batch; for models with attention, also the transformer-fused FP32 graph and
its dynamic INT8 (what `build` ships for them). Warm latency is timed in one process, interleaved
in blocks (timing.py), together with the roofline graphs a bundle ships (bundle/roofline.py:
MatMuls of several shapes, QLinearMatMul, Conv and QLinearConv of the model's heaviest convs):
the best rate of each kind is the ceiling each row's GOP/s is a share of. Where a Python with
onnxruntime-openvino exists (engines.py), the ORT FP32 graph and the INT8 QDQ U8S8 graph also
run under its OpenVINO execution provider (compare_engines.py), timed in blocks with that
Python's own CPU provider. Cold start (import + load + first call) is measured apart, in fresh
processes.
"""

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .bundle.roofline import MATMUL_SHAPES
from .compare_bundle import refuse_as_model, shipped_graph
from .compare_engines import OPENVINO_ROWS, OV_CPU, OV_INT8, openvino_rows
from .compare_samples import agreement, batched
from .errors import PackagerError
from .graph.inspection import estimate_flops, graph_inputs, io_specs, model_family
from .graph.modelio import load_model, save_model
from .graph.shapes import fix_shapes_proto
from .graph.simplify import simplify_proto
from .progress import OFF, Progress
from .quantization.calibration import load_samples, split_holdout
from .quantization.quantize import QuantConfig, quantize_file
from .source.export import export_loaded, make_inputs
from .source.specs import TensorSpec
from .source.torchload import LoadedModel, is_torch_source, load_source
from .targets import Target, load_target
from .timing import machine, session, time_blocks

Log = Callable[[str], None]
EAGER, COMPILED, ORT_FP32, ORT_OPT = ("PyTorch eager", "torch.compile", "ORT FP32",
                                      "ORT FP32 optimised")
QUANTIZED = {
    "INT8 QDQ U8S8": {"precision": "int8", "mode": "static", "format": "qdq",
                      "activation_type": "uint8", "weight_type": "int8"},
    "INT8 QDQ S8S8": {"precision": "int8", "mode": "static", "format": "qdq",
                      "activation_type": "int8", "weight_type": "int8"},
    "INT8 QOperator": {"precision": "int8", "mode": "static", "format": "qoperator",
                       "activation_type": "uint8", "weight_type": "int8"},
    "INT8 dynamic": {"precision": "int8", "mode": "dynamic"},
    "FP16": {"precision": "fp16"},
}
# the graph `build` ships for a model with attention: onnxruntime's transformer fusions
# (pipeline.fuse_model), as FP32 and quantized as "INT8 dynamic" is; only when something fused
ORT_FUSED, DYNAMIC_FUSED = "ORT FP32 fused", "INT8 dynamic fused"
FUSED = {ORT_FUSED: None, DYNAMIC_FUSED: "INT8 dynamic"}
VARIANTS = (EAGER, COMPILED, ORT_FP32, ORT_OPT, ORT_FUSED, "INT8 QDQ U8S8", "INT8 QDQ S8S8",
            "INT8 QOperator", "INT8 dynamic", DYNAMIC_FUSED, "FP16", *OPENVINO_ROWS)
# timing only: each runs every roofline graph of its kind once a call, timing each
ROOFLINE = {"fp32": "roofline FP32", "int8": "roofline integer"}
EVAL_SAMPLES = 16   # random inputs drawn when no calibration data is given

COLD_ORT = """import json, sys, time
t0 = time.perf_counter()
import numpy as np, onnxruntime as ort
t1 = time.perf_counter()
so = ort.SessionOptions(); so.intra_op_num_threads = int(sys.argv[3])
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
feed = dict(np.load(sys.argv[2]))
t3 = time.perf_counter()
s.run(None, feed)
t4 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "load_ms": (t2 - t1) * 1e3,
                  "first_call_ms": (t4 - t3) * 1e3, "total_ms": (t2 - t0 + t4 - t3) * 1e3}))
"""
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
            log: Log = lambda _: None, steps: Progress | None = None) -> dict[str, Any]:
    """Benchmark every variant of *source* (PyTorch or .onnx) on this machine; see module doc.

    *steps* shows each variant built, each timing block and each cold start (on a terminal).
    *bundle*: its shipped graph is one more row, "shipped (NAME: precision)".
    """
    refuse_as_model(source)
    shipped = shipped_graph(bundle) if bundle is not None else None
    steps = steps or OFF
    target = load_target(target) if isinstance(target, str | Path) else target
    by_case = {v.lower(): v for v in VARIANTS}
    wanted = [by_case.get(v.lower(), v) for v in variants or VARIANTS]
    unknown = [v for v in wanted if v not in VARIANTS]
    for name, value in (("--batch", min(batches, default=1)), ("--rounds", rounds),
                        ("--block", block), ("--threads", 1 if threads is None else threads)):
        if value < 1:
            raise PackagerError(f"{name} {value}: must be 1 or more", f"pass {name} 1 or more")
    if unknown:
        raise PackagerError(f"unknown variant '{unknown[0]}'", f"variants: {', '.join(VARIANTS)}")
    if threads is None:
        threads = int(target.session.get("intra_op_threads", 0))
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
    one = [TensorSpec(s.name, (1, *s.shape[1:]), s.dtype) for s in specs]
    if calib is not None:
        samples = load_samples(calib, inputs=[{"name": s.name, "shape": list(s.shape),
                                               "dtype": s.dtype} for s in one],
                               preprocess=preprocess)
    else:
        samples = [dict(zip([s.name for s in one], make_inputs(one, loaded.module if loaded
                                                                 else _NoModule(), seed=i),
                            strict=True)) for i in range(EVAL_SAMPLES)]
    calib_set, held = split_holdout(samples, fraction=0.25)
    wanted += [shipped["label"]] if shipped else []
    rows: list[dict[str, Any]] = []
    ceilings: list[dict[str, Any]] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="edgepack-compare-") as tmp:
        for i, batch in enumerate(batches):
            log(f"compare: batch {batch}")
            batch_rows, ceiling = _compare_batch(
                Path(tmp), source, loaded, specs, batch, calib_set, held, target, threads,
                wanted, rounds, block, log, steps, f"batch {batch} ({i + 1}/{len(batches)})",
                notes, shipped)
            rows += batch_rows
            ceilings.append(ceiling)
        if cold:
            _cold_starts(Path(tmp), source, loaded, rows, threads, weights, factory_args,
                         submodule, log, steps)
    return {"source": str(source), "machine": machine(), "threads": threads,
            "reference": "PyTorch" if loaded is not None else "ORT FP32",
            "batches": list(batches), "rounds": rounds, "block": block,
            "samples": {"calibration": len(calib_set), "held_out": len(held),
                        "data": "calibration" if calib is not None else "random"},
            "roofline": ceilings, "rows": rows, "notes": list(dict.fromkeys(notes))}


class _NoModule:
    def modules(self):
        return []


def _compare_batch(tmp: Path, source, loaded: LoadedModel | None, specs, batch: int,
                   calib_set, held, target: Target, threads: int, wanted, rounds: int,
                   block: int, log: Log, steps: Progress, phase: str, notes: list[str],
                   shipped: dict[str, Any] | None = None
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of one batch size, and the ceiling timed with them."""
    import onnxruntime as ort

    built = [v for v in wanted if v in (ORT_OPT, COMPILED, *QUANTIZED, DYNAMIC_FUSED)]
    steps.start(f"{phase} build", 3 + any(v in FUSED for v in wanted) + len(built))
    steps.step("export" if loaded is not None else "fix shapes")
    shaped = [TensorSpec(s.name, (batch, *s.shape[1:]), s.dtype) for s in specs]
    calib_b, held_b = batched(calib_set, batch), batched(held, batch, count=max(2, len(held) //
                                                                             batch))
    feeds = [{s.name: h[s.name].astype(s.dtype) for s in shaped} for h in held_b]
    raw = tmp / f"raw_b{batch}.onnx"
    if loaded is not None:
        export_loaded(loaded, raw, inputs=shaped, target=target, force=True)
    else:
        proto = fix_shapes_proto(load_model(Path(source)), {s.name: list(s.shape)
                                                            for s in shaped}, strict=False)
        save_model(proto, raw)
    steps.step("simplify")
    fixed = fix_shapes_proto(load_model(raw), {}, batch=batch, strict=False)
    simplified, _, _ = simplify_proto(fixed, raw)
    simplified = fix_shapes_proto(simplified, {}, batch=batch)
    simple = save_model(simplified, tmp / f"sim_b{batch}.onnx")
    flops = estimate_flops(simplified)   # every row's work per call: the FP32 graph's
    from .bundle.assemble import write_roofline

    # the graphs a bundle of this model at this batch ships for `run.py bench --roofline`
    roof = tmp / f"roofline_b{batch}"
    roof.mkdir()
    roofline = write_roofline(roof, [], target, model=simplified)
    paths: dict[str, Path] = {}
    prepare: dict[str, float] = {}
    errors: dict[str, str] = {}
    fusion = None
    if any(v in FUSED for v in wanted):
        transformer = model_family(simplified) == "transformer"
        if transformer:
            steps.step("fusion")
            start = time.perf_counter()
            fusion = _fuse_graph(fixed, simple, raw, target, batch, feeds,
                                 tmp / f"fused_b{batch}.onnx", log)
            prepare[ORT_FUSED] = time.perf_counter() - start
        if fusion is None:   # no attention, or nothing fused: no fused rows
            wanted = [v for v in wanted if v not in FUSED]
            built = [v for v in built if v not in FUSED]
            steps.start(f"{phase} build", 3 + transformer + len(built), done=steps.index,
                        since=steps.started)
    if ORT_FP32 in wanted:
        paths[ORT_FP32] = raw
    if ORT_OPT in wanted:
        steps.step(ORT_OPT)
        start = time.perf_counter()
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(tmp / f"opt_b{batch}.onnx")
        ort.InferenceSession(str(simple), so, providers=["CPUExecutionProvider"])
        paths[ORT_OPT] = tmp / f"opt_b{batch}.onnx"
        prepare[ORT_OPT] = time.perf_counter() - start
    if fusion is not None and ORT_FUSED in wanted:
        paths[ORT_FUSED] = fusion["path"]
    # the OpenVINO INT8 row runs the QDQ U8S8 graph: built even when its own row is not wanted
    for name in dict.fromkeys([*wanted, *(["INT8 QDQ U8S8"] if OV_INT8 in wanted else [])]):
        if name not in QUANTIZED and name != DYNAMIC_FUSED:
            continue
        # a fused variant is quantized exactly as its unfused counterpart
        graph, overrides = ((fusion["path"], QUANTIZED[FUSED[name]]) if name in FUSED else
                            (simple, QUANTIZED[name]))
        out = tmp / f"{name.replace(' ', '_')}_b{batch}.onnx"
        steps.step(name)
        start = time.perf_counter()
        try:
            quantize_file(graph, out, config=QuantConfig.from_preset(target.quantization,
                                                                     **overrides),
                          samples=calib_b)
            paths[name] = out
            prepare[name] = time.perf_counter() - start
        except PackagerError as exc:
            errors[name] = exc.message
    if shipped is not None:   # the bundle's own graph, at the batch it was built for
        if batch == shipped["batch"]:
            paths[shipped["label"]] = shipped["path"]
        else:
            errors[shipped["label"]] = f"the bundle's graph takes batch {shipped['batch']}"
    names = [s.name for s in shaped]
    engines: dict[str, Callable[[], Any]] = {}
    outputs: dict[str, list[list[np.ndarray]]] = {}
    if loaded is not None:
        import torch

        torch.set_num_threads(threads or torch.get_num_threads())
        module = loaded.module
        tensors = [[torch.from_numpy(f[n]) for n in names] for f in feeds]

        def torch_out(fn):
            with torch.inference_mode():
                return [[t.numpy() for t in _flat(fn(*ts))] for ts in tensors]

        steps.step("reference outputs")
        reference = torch_out(module)
        if EAGER in wanted:
            outputs[EAGER] = reference
            engines[EAGER] = lambda: _no_grad(module, tensors[0])
        if COMPILED in wanted:
            try:
                # Inductor's pool of compile workers otherwise keeps the CPU busy in the
                # background while the other engines are timed (22 ms instead of 0.2 ms for
                # eager on a 2-core machine).
                import torch._inductor.config as inductor

                inductor.compile_threads = 1
                steps.step(COMPILED)
                start = time.perf_counter()
                compiled = torch.compile(module)
                outputs[COMPILED] = torch_out(compiled)
                prepare[COMPILED] = time.perf_counter() - start
                engines[COMPILED] = lambda: _no_grad(compiled, tensors[0])
            except Exception as exc:   # no C++ compiler, unsupported op, ...
                errors[COMPILED] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
    if loaded is None:
        steps.step("reference outputs")
    for name, path in paths.items():
        if name not in wanted:
            continue
        try:
            sess = session(path, threads)
            own = [{k: v for k, v in f.items() if k in {i.name for i in sess.get_inputs()}}
                   for f in feeds]   # (a bundle's graph may hold an input frozen)
            outputs[name] = [sess.run(None, f) for f in own]
            engines[name] = (lambda s=sess, f=own[0]: s.run(None, f))
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
    if loaded is None:
        reference = outputs.get(ORT_FP32) or [session(raw, threads).run(None, f) for f in feeds]
    scale = max(1, batch)
    steps.finish()
    # the ceiling first in every round, timed in the same blocks and threads as the variants
    # (its convs at this batch, so it grows with the batch as the rows do)
    graph_times: dict[str, list[float]] = {}
    engines = {**_roofline_engines(roof, roofline, threads, graph_times), **engines}
    log(f"compare: timing {len(engines) - len(ROOFLINE)} engines and the MatMul ceiling, "
        f"batch {batch}")
    medians = time_blocks(engines, rounds=rounds, block=max(3, block // scale), steps=steps,
                          phase=f"{phase} timing")
    openvino = openvino_rows(wanted, raw, paths.get("INT8 QDQ U8S8"), roof, roofline, feeds,
                             [o.name for o in session(raw, threads).get_outputs()], threads,
                             rounds, max(3, block // scale))
    if openvino["note"]:   # no OpenVINO Python (or it failed): a note, no rows
        notes.append(openvino["note"])
        wanted = [v for v in wanted if v not in OPENVINO_ROWS or v in openvino["errors"]]
    medians.update(openvino["medians"])
    outputs.update(openvino["outputs"])
    errors.update(openvino["errors"])
    ceiling = _ceiling(roofline, graph_times, openvino["rates"])
    ceiling.update(batch=batch, ops_per_call=flops)
    eager = medians.get(EAGER, {}).get("p50")
    base = medians.get(ORT_FP32, {}).get("p50")
    rows = []
    for name in wanted:
        row: dict[str, Any] = {"variant": name, "batch": batch}
        if name in errors or name not in medians:
            row["error"] = errors.get(name, "not run")
            rows.append(row)
            continue
        p50 = medians[name]["p50"]
        other = name in OPENVINO_ROWS   # timed in another process: against its own ORT FP32
        own_base = medians.get(OV_CPU, {}).get("p50") if other else base
        graph = (paths.get("INT8 QDQ U8S8") if name == OV_INT8 else raw) if other else \
            paths.get(name)
        row.update({"p50_ms": p50, "p90_ms": medians[name]["p90"],
                    "p10_ms": medians[name].get("p10"), "load": medians[name].get("load"),
                    "per_sample_ms": p50 / batch,
                    "vs_eager": None if other else eager / p50 if eager else None,
                    "vs_ort_fp32": own_base / p50 if own_base else None,
                    "size_mb": (graph.stat().st_size / 1e6 if graph is not None else
                                sum(p.numel() * p.element_size()
                                    for p in loaded.module.parameters()) / 1e6),
                    **agreement(outputs[name], reference)})
        if other:
            device = openvino["device"] or {}
            row.update(provider=openvino["providers"].get(name),
                       runtime=f"onnxruntime {device.get('onnxruntime', '?')}")
        row.update(_roofline_share(name, flops, p50, ceiling))
        if name in FUSED:
            row["fusion"] = {k: v for k, v in fusion.items() if k not in ("path", "timing")}
        if name in prepare:
            row["prepare_s"] = prepare[name]
        row["_path"] = str(paths.get(name, ""))
        rows.append(row)
    np.savez(tmp / f"feed_b{batch}.npz", **feeds[0])
    return rows, ceiling


def _fuse_graph(fixed, simple: Path, raw: Path, target: Target, batch: int, held,
                path: Path, log: Log) -> dict[str, Any] | None:
    """The transformer-fused FP32 graph exactly as `build` makes it (pipeline.fuse_model: fused
    before and after simplification, kept only when its outputs match *simple*'s), with what
    fused; None when nothing did."""
    from .graph.execute import run_model
    from .pipeline import fuse_model

    fused, record = fuse_model(fixed, raw, replace(target, batch=batch), held,
                          run_model(simple, held), path, log)
    return None if fused is None else {**record, "path": fused}


def _roofline_engines(tmp: Path, spec: dict[str, Any], threads: int,
                      record: dict[str, list[float]]) -> dict[str, Callable]:
    """The bundle's roofline graphs fed as `run.py bench --roofline` feeds them: one engine a
    kind, each call running every graph of that kind twice and recording the second (warm) run's
    ms in *record* by graph file."""
    from ._runtimes.runner.bench import roofline_feed, roofline_graphs

    runs = {kind: [(g["file"], session(tmp / g["file"], threads), roofline_feed(g))
                   for g in roofline_graphs(spec) if g["kind"] == kind] for kind in ROOFLINE}

    def call(kind: str) -> None:
        for file, sess, feed in runs[kind]:
            sess.run(None, feed)   # untimed: the graph before it has evicted its caches
            start = time.perf_counter()
            sess.run(None, feed)
            record.setdefault(file, []).append((time.perf_counter() - start) * 1e3)

    return {name: (lambda k=kind: call(k)) for kind, name in ROOFLINE.items()}


def _ceiling(spec: dict[str, Any], times: dict[str, list[float]],
             openvino: Sequence[tuple[dict[str, Any], float]]) -> dict[str, Any]:
    """The best rate of each kind over every roofline graph, under onnxruntime's CPU provider
    here (*times*, ms per run) and under the OpenVINO provider (*openvino*: GOP/s)."""
    from ._runtimes.runner.bench import roofline_graphs

    rates = [(dict(g, engine="ORT CPU"), g["ops"] / (float(np.median(times[g["file"]])) * 1e6))
             for g in roofline_graphs(spec) if times.get(g["file"])]
    rates += [(dict(g, engine="OpenVINO"), gops) for g, gops in openvino]
    found: dict[str, Any] = {"int8_kind": spec["int8_kind"], "graphs": [
        {"kind": g["kind"], "op": g["op"], "shape": g["shape"], "engine": g["engine"],
         "gops": gops} for g, gops in rates]}
    for kind in ROOFLINE:
        best = max(((gops, g) for g, gops in rates if g["kind"] == kind), key=lambda t: t[0],
                   default=None)
        if best is not None:
            found[f"{kind}_gops"] = best[0]
            found[f"{kind}_best"] = (f"{best[1]['op']} {'x'.join(map(str, best[1]['shape']))}"
                                     f" ({best[1]['engine']})")
    return found


def _roofline_share(name: str, flops: int | None, p50_ms: float,
                    ceiling: dict[str, Any]) -> dict[str, Any]:
    """GOP/s at p50 and, for ONNX Runtime rows, its share of the MatMul rate of its kind: INT8
    rows against MatMulInteger, FP32 and FP16 (which the CPU runs in FP32) against MatMul."""
    gops = flops / (p50_ms * 1e6) if flops else None
    kind = None if name in (EAGER, COMPILED) else "int8" if "INT8" in name else "fp32"
    return {"ops_per_call": flops, "gops": gops, "ceiling": kind,
            "ceiling_share": gops / ceiling[f"{kind}_gops"] if gops and kind else None}


def _no_grad(fn, tensors):
    import torch

    with torch.inference_mode():
        return fn(*tensors)


def _flat(value):
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for v in value for t in _flat(v)]


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
    for row in rows:
        row.pop("_path", None)


def markdown(result: dict[str, Any]) -> str:
    """The comparison as a Markdown table (one row per variant and batch)."""
    from ._runtimes.runner.load import BUSY
    from .timing import machine_line

    shares = {r["batch"]: r["load"]["other_share"] for r in result["rows"]
              if (r.get("load") or {}).get("other_share") is not None}
    busy = "; ".join(f"batch {b}: other processes used {100 * v:.0f}% of the cores"
                     + (" (NOISY)" if v > BUSY else "") for b, v in shares.items())
    lines = [f"Machine: {machine_line(result['machine'])}; {result['threads'] or 'default'} "
             f"intra-op threads (ORT spinning off); {result['rounds']} rounds, interleaved in "
             "blocks" + (f"; {busy}" if busy else "") + ".", "",
             "| variant | batch | p50 ms | p90 ms | per sample ms | vs eager | vs ORT FP32 | "
             "GOP/s | % of ceiling | size MB | cosine min | top-1 | cold start ms | prepare s |",
             "|" + " --- |" * 14]

    def num(value, fmt):
        return format(value, fmt) if isinstance(value, int | float) else "-"

    def ratio(value):
        return "-" if not value else f"{value:.2f}x" if value >= 0.1 else f"{value:.3f}x"

    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['batch']} | failed: {r['error']} |" +
                         " |" * 11)
            continue
        cold = r.get("cold_start", {}).get("total_ms")
        share = r.get("ceiling_share")
        lines.append(
            f"| {r['variant']} | {r['batch']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | "
            f"{r['per_sample_ms']:.2f} | {ratio(r['vs_eager'])} | {ratio(r['vs_ort_fp32'])} | "
            f"{_figure(r.get('gops'))} | {num(share and 100 * share, '.0f')} | "
            f"{r['size_mb']:.2f} | {r['cosine_min']:.4f} | "
            f"{num(100 * r['top1'], '.1f') + '%' if 'top1' in r else '-'} | "
            f"{num(cold, '.0f')} | {num(r.get('prepare_s'), '.1f')} |")
    lines += ["", f"cosine / top-1: against {result['reference']} on "
        f"{result['samples']['held_out']} held-out {result['samples']['data']} samples. Cold "
        "start: import + load + first call in a fresh process (batch "
        f"{min(result['batches'])}). prepare: quantization, offline optimisation, fusion or "
        "compile time."]
    ceilings = [c for c in result.get("roofline", ()) if c.get("ops_per_call")]
    if ceilings:
        kind = ceilings[0]["int8_kind"]
        engines = sorted({g["engine"] for c in ceilings for g in c.get("graphs", ())})
        lines += ["", "GOP/s: operations per call (2 x the multiply-adds of Conv, Gemm, MatMul, "
                  "counted on the FP32 graph: " + ", ".join(
                      f"{_figure(c['ops_per_call'] / 1e9)} GOP at batch {c['batch']}"
                      for c in ceilings) + ") over p50. % of ceiling: that rate against this "
                  "machine's best, with the same threads: the fastest of the roofline graphs "
                  f"(MatMuls of {len(MATMUL_SHAPES)} shapes, square and im2col-like, as FP32 MatMul, "
                  f"{kind} MatMulInteger, QLinearMatMul and QDQ MatMul; two 3x3 convs and the "
                  "model's three heaviest at its batch, as FP32 Conv, QLinearConv and QDQ Conv), "
                  "timed under "
                  f"{' and '.join(engines)} beside the rows (INT8 rows against the best integer "
                  "graph, FP32 and FP16 against the best FP32 one): " + "; ".join(
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
    lines += [f"\n{note}" for note in result.get("notes", ())]
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
    return "\n".join(lines) + "\n"


def _figure(value: float | None) -> str:
    """A rate or count with three significant digits at most, and no exponent."""
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.3g}"
