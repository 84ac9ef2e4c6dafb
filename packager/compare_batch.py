"""compare's rows for one batch size: the graphs each variant runs (exported, simplified,
optimised, fused, quantized; the bundle's own), their outputs against the reference, all timed
interleaved with the roofline graphs and the OpenVINO rows, and one row per variant."""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ._runtimes.runner.roofline import ceiling_share
from .bundle.roofline import write_roofline
from .compare_openvino import OPENVINO_ROWS, OV_CPU, OV_INT8, openvino_rows
from .compare_samples import agreement, batched
from .errors import PackagerError, ShapeError
from .graph.inspection import estimate_flops, model_family
from .graph.modelio import load_model, save_model
from .graph.shapes import dynamic_tensors, fix_shapes_proto, shapes_from_run
from .graph.simplify import simplify_proto
from .ort_builds import CPU, OPENVINO
from .progress import Log, Progress
from .quantization.calibration import HOLDOUT
from .quantization.quantize import QuantConfig, quantize_file
from .quantization.search import as_preset, hard_fused
from .source.export import export_loaded
from .source.specs import TensorSpec
from .source.torchload import LoadedModel
from .targets import Target
from .timing import session, time_blocks

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


@dataclass
class BatchGraphs:
    """What one batch's rows run: the graph files, the feeds, what each variant took to make
    and why one could not be made."""

    raw: Path                       # the export (or the .onnx at this batch)
    simple: Path                    # simplified: what the ORT rows start from
    flops: int | None               # the FP32 graph's work per call
    roof: Path                      # the folder of the roofline graphs
    roofline: dict[str, Any]        # their spec (bundle/roofline.py)
    feeds: list[dict[str, Any]]
    wanted: list[str]               # the rows asked for that can be made
    fusion: dict[str, Any] | None = None
    paths: dict[str, Path] = field(default_factory=dict)      # each row's graph
    prepare: dict[str, float] = field(default_factory=dict)   # seconds to make it
    errors: dict[str, str] = field(default_factory=dict)      # why a row could not run


def compare_batch(tmp: Path, source, loaded: LoadedModel | None, specs, batch: int,
                  calib_set, held, target: Target, threads: int, wanted, rounds: int,
                  block: int, log: Log, steps: Progress, phase: str, notes: list[str],
                  shipped: dict[str, Any] | None = None
                  ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of one batch size, and the ceiling timed with them."""
    g = _batch_graphs(tmp, source, loaded, specs, batch, calib_set, held, target, wanted, log,
                      steps, phase, shipped, notes)
    rows, outputs, reference = _timed_rows(g, loaded, threads, steps)
    steps.finish()
    scale = max(1, batch)
    # the ceiling first in every round, timed in the same blocks and threads as the variants
    # (its convs at this batch, so it grows with the batch as the rows do)
    graph_times: dict[str, list[float]] = {}
    rows = {**_roofline_rows(g.roof, g.roofline, threads, graph_times), **rows}
    log(f"compare: timing {len(rows) - len(ROOFLINE)} rows and the MatMul ceiling, "
        f"batch {batch}")
    medians = time_blocks(rows, rounds=rounds, block=max(3, block // scale), steps=steps,
                          phase=f"{phase} timing")
    openvino = openvino_rows(g.wanted, g.raw, g.paths.get("INT8 QDQ U8S8"), g.roof, g.roofline,
                             g.feeds, [o.name for o in session(g.raw, threads).get_outputs()],
                             threads, rounds, max(3, block // scale))
    wanted = g.wanted
    if openvino["note"]:   # no OpenVINO Python (or it failed): a note, no rows
        notes.append(openvino["note"])
        wanted = [v for v in wanted if v not in OPENVINO_ROWS or v in openvino["errors"]]
    medians.update(openvino["medians"])
    outputs.update(openvino["outputs"])
    g.errors.update(openvino["errors"])
    ceiling = _ceiling(g.roofline, graph_times, openvino["rates"])
    ceiling.update(batch=batch, ops_per_call=g.flops)
    rows = [_row(name, batch, g, medians, outputs, reference, openvino, ceiling, loaded)
            for name in wanted]
    np.savez(tmp / f"feed_b{batch}.npz", **g.feeds[0])
    return rows, ceiling


def _batch_graphs(tmp: Path, source, loaded: LoadedModel | None, specs, batch: int,
                  calib_set, held, target: Target, wanted, log: Log, steps: Progress,
                  phase: str, shipped: dict[str, Any] | None,
                  notes: list[str] | None = None) -> BatchGraphs:
    """Export (or fix the shapes of) the model at *batch*, simplify it, and make every graph
    the wanted rows run (optimised, fused, quantized), timing what each took."""
    built = [v for v in wanted if v in (ORT_OPT, COMPILED, *QUANTIZED, DYNAMIC_FUSED)]
    steps.start(f"{phase} build", 3 + any(v in FUSED for v in wanted) + len(built))
    steps.step("export" if loaded is not None else "fix shapes")
    shaped = [TensorSpec(s.name, (batch, *s.shape[1:]), s.dtype) for s in specs]
    held_b = batched(held, batch, count=max(2, len(held) // batch))
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
    simplified = static_or_data_dependent(simplified, batch, feeds,
                                          notes if notes is not None else [])
    simple = save_model(simplified, tmp / f"sim_b{batch}.onnx")
    # the graphs a bundle of this model at this batch ships for `run.py bench --roofline`
    roof = tmp / f"roofline_b{batch}"
    roof.mkdir()
    g = BatchGraphs(raw, simple, estimate_flops(simplified), roof,
                    write_roofline(roof, [], target, model=simplified), feeds, list(wanted))
    if any(v in FUSED for v in wanted):
        transformer = model_family(simplified) == "transformer"
        if transformer:
            steps.step("fusion")
            start = time.perf_counter()
            g.fusion = _fuse_graph(fixed, simple, raw, target, batch, feeds,
                                   tmp / f"fused_b{batch}.onnx", log)
            g.prepare[ORT_FUSED] = time.perf_counter() - start
        if g.fusion is None:   # no attention, or nothing fused: no fused rows
            g.wanted = [v for v in g.wanted if v not in FUSED]
            built = [v for v in built if v not in FUSED]
            steps.start(f"{phase} build", 3 + transformer + len(built), done=steps.index,
                        since=steps.started)
    _float_graphs(g, tmp, batch, steps)
    _quantized_graphs(g, tmp, batch, batched(calib_set, batch), target, steps,
                      notes if notes is not None else [])
    if shipped is not None:   # the bundle's own graph, at the batch it was built for
        if batch == shipped["batch"]:
            g.paths[shipped["label"]] = shipped["path"]
        else:
            g.errors[shipped["label"]] = f"the bundle's graph takes batch {shipped['batch']}"
    return g


def static_or_data_dependent(simplified, batch: int, feeds, notes: list[str]):
    """Every shape static, or where runs show a tensor's shape follows the input's values (a
    waveform that follows the text), those left dynamic, and a note saying so."""
    try:
        return fix_shapes_proto(simplified, {}, batch=batch)
    except ShapeError:
        loose = fix_shapes_proto(simplified, {}, batch=batch, strict=False)
        loose, varying = shapes_from_run(loose, feeds[:2])
        left = [n for n, _, _ in dynamic_tensors(loose) if n not in varying]
        if left:   # not the data's doing: the error it was
            return fix_shapes_proto(simplified, {}, batch=batch)
        notes.append(f"{len(varying)} tensor(s) have shapes that follow the input's values "
                     f"and stay dynamic ({', '.join(varying[:3])}{', ...' if len(varying) > 3 else ''}"
                     "): outputs of different lengths compare zero-padded to the longer")
        return loose


def _float_graphs(g: BatchGraphs, tmp: Path, batch: int, steps: Progress) -> None:
    """The FP32 rows' graphs: as exported, optimised offline by onnxruntime, fused."""
    import onnxruntime as ort

    if ORT_FP32 in g.wanted:
        g.paths[ORT_FP32] = g.raw
    if ORT_OPT in g.wanted:
        steps.step(ORT_OPT)
        start = time.perf_counter()
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(tmp / f"opt_b{batch}.onnx")
        ort.InferenceSession(str(g.simple), so, providers=["CPUExecutionProvider"])
        g.paths[ORT_OPT] = tmp / f"opt_b{batch}.onnx"
        g.prepare[ORT_OPT] = time.perf_counter() - start
    if g.fusion is not None and ORT_FUSED in g.wanted:
        g.paths[ORT_FUSED] = g.fusion["path"]


def _quantized_graphs(g: BatchGraphs, tmp: Path, batch: int, calib_b, target: Target,
                      steps: Progress, notes: list[str]) -> None:
    """The INT8 and FP16 rows' graphs, each quantized as its QUANTIZED entry says (a fused
    variant exactly as its unfused counterpart); the OpenVINO INT8 row runs the QDQ U8S8 graph,
    built even when its own row is not wanted. Static INT8 is prepared as build's "INT8 preset"
    is (search.hard_fused, search.as_preset): one graph, one figure in both."""
    static: dict[Path, tuple[Path, onnx.GraphProto]] = {}
    for name in dict.fromkeys([*g.wanted, *(["INT8 QDQ U8S8"] if OV_INT8 in g.wanted else [])]):
        if name not in QUANTIZED and name != DYNAMIC_FUSED:
            continue
        graph, overrides = ((g.fusion["path"], QUANTIZED[FUSED[name]]) if name in FUSED else
                            (g.simple, QUANTIZED[name]))
        config = QuantConfig.from_preset(target.quantization, **overrides)
        if config.precision == "int8" and config.mode == "static":
            if graph not in static:
                folder = tmp / f"static_b{batch}_{len(static)}"
                folder.mkdir()
                source = hard_fused(graph, folder)
                static[graph] = (source, onnx.load(str(source), load_external_data=False).graph)
            graph, proto = static[graph]
            config, tail = as_preset(proto, config)
            notes.append("INT8 static rows are quantized as build's \"INT8 preset\" is ("
                         + ("HardSwish/HardSigmoid chains as single ops, "
                            if graph.name == "fp32.fused.onnx" else "")
                         + f"{config.calibration_method} ranges"
                         + (f", {len(tail)} post-processing nodes FP32" if tail else "")
                         + f"), judged on build's held-out split (--holdout {HOLDOUT:g}) "
                         "by build's cosine: one graph, one figure")
        out = tmp / f"{name.replace(' ', '_')}_b{batch}.onnx"
        steps.step(name)
        start = time.perf_counter()
        try:
            quantize_file(graph, out, config=config, samples=calib_b)
            g.paths[name] = out
            g.prepare[name] = time.perf_counter() - start
        except PackagerError as exc:
            g.errors[name] = exc.message


def _timed_rows(g: BatchGraphs, loaded: LoadedModel | None, threads: int, steps: Progress
             ) -> tuple[dict[str, Callable[[], Any]], dict[str, list], list]:
    """(a call per row to time, each row's outputs on the feeds, the reference outputs: eager
    PyTorch's for a PyTorch source, else ORT FP32's)."""
    rows: dict[str, Callable[[], Any]] = {}
    outputs: dict[str, list[list[np.ndarray]]] = {}
    if loaded is not None:
        reference = _torch_rows(g, loaded, threads, steps, rows, outputs)
    else:
        steps.step("reference outputs")
    for name, path in g.paths.items():
        if name not in g.wanted:
            continue
        try:
            sess = session(path, threads)
            own = [{k: v for k, v in f.items() if k in {i.name for i in sess.get_inputs()}}
                   for f in g.feeds]   # (a bundle's graph may hold an input frozen)
            outputs[name] = [sess.run(None, f) for f in own]
            rows[name] = (lambda s=sess, f=own[0]: s.run(None, f))
        except Exception as exc:
            g.errors[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
    if loaded is None:
        reference = outputs.get(ORT_FP32) or [session(g.raw, threads).run(None, f)
                                              for f in g.feeds]
    return rows, outputs, reference


def _torch_rows(g: BatchGraphs, loaded: LoadedModel, threads: int, steps: Progress,
                   rows: dict[str, Callable[[], Any]], outputs: dict[str, list]) -> list:
    """Eager PyTorch and torch.compile as rows (into *rows*, *outputs*); eager's outputs,
    the reference every row is judged against."""
    import torch

    torch.set_num_threads(threads or torch.get_num_threads())
    module = loaded.module
    names = list(g.feeds[0])
    tensors = [[torch.from_numpy(f[n]) for n in names] for f in g.feeds]

    def torch_out(fn):
        with torch.inference_mode():
            return [[t.numpy() for t in _flat(fn(*ts))] for ts in tensors]

    steps.step("reference outputs")
    reference = torch_out(module)
    if EAGER in g.wanted:
        outputs[EAGER] = reference
        rows[EAGER] = lambda: _no_grad(module, tensors[0])
    if COMPILED in g.wanted:
        try:
            # Inductor's pool of compile workers otherwise keeps the CPU busy in the
            # background while the other rows are timed (22 ms instead of 0.2 ms for
            # eager on a 2-core machine).
            import torch._inductor.config as inductor

            inductor.compile_threads = 1
            steps.step(COMPILED)
            start = time.perf_counter()
            compiled = torch.compile(module)
            outputs[COMPILED] = torch_out(compiled)
            g.prepare[COMPILED] = time.perf_counter() - start
            rows[COMPILED] = lambda: _no_grad(compiled, tensors[0])
        except Exception as exc:   # no C++ compiler, unsupported op, ...
            g.errors[COMPILED] = (f"{type(exc).__name__}: "
                                  f"{str(exc).strip().splitlines()[0][:160]}")
    return reference


def _row(name: str, batch: int, g: BatchGraphs, medians: dict[str, Any],
         outputs: dict[str, list], reference: list, openvino: dict[str, Any],
         ceiling: dict[str, Any], loaded: LoadedModel | None) -> dict[str, Any]:
    """One variant's row: its speed (against eager and ORT FP32), size, agreement with the
    reference and share of the ceiling; or why it did not run."""
    row: dict[str, Any] = {"variant": name, "batch": batch}
    if name in g.errors or name not in medians:
        row["error"] = g.errors.get(name, "not run")
        return row
    eager = medians.get(EAGER, {}).get("p50")
    p50 = medians[name]["p50"]
    other = name in OPENVINO_ROWS   # timed in another process: against its own ORT FP32
    own_base = medians.get(OV_CPU if other else ORT_FP32, {}).get("p50")
    graph = (g.paths.get("INT8 QDQ U8S8") if name == OV_INT8 else g.raw) if other else \
        g.paths.get(name)
    row.update({"p50_ms": p50, "p90_ms": medians[name]["p90"],
                "p10_ms": medians[name].get("p10"), "load": medians[name].get("load"),
                "per_sample_ms": p50 / batch,
                "vs_eager": None if other else eager / p50 if eager else None,
                "vs_ort_fp32": own_base / p50 if own_base else None,
                "size_mb": (graph.stat().st_size / 1e6 if graph is not None else
                            sum(p.numel() * p.element_size()
                                for p in loaded.module.parameters()) / 1e6),
                **agreement(outputs[name], reference)})
    first = (outputs.get(name) or [[None]])[0][0]   # the first output of the timed feed
    row["_out0_elements"] = int(np.asarray(first).size) if first is not None else None
    if other:
        device = openvino["device"] or {}
        row.update(provider=openvino["providers"].get(name),
                   runtime=f"onnxruntime {device.get('onnxruntime', '?')}")
    row.update(_roofline_share(name, g.flops, p50, ceiling))
    if name in FUSED:
        row["fusion"] = {k: v for k, v in g.fusion.items() if k not in ("path", "timing")}
    if name in g.prepare:
        row["prepare_s"] = g.prepare[name]
    row["_path"] = str(g.paths.get(name, ""))
    return row


def _fuse_graph(fixed, simple: Path, raw: Path, target: Target, batch: int, held,
                path: Path, log: Log) -> dict[str, Any] | None:
    """The transformer-fused FP32 graph exactly as `build` makes it (pipeline.fuse_model: fused
    before and after simplification, kept only when its outputs match *simple*'s), with what
    fused; None when nothing did."""
    from .build.fp32_graph import fuse_model
    from .graph.execute import run_model

    fused, record = fuse_model(fixed, raw, replace(target, batch=batch), held,
                          run_model(simple, held), path, log)
    return None if fused is None else {**record, "path": fused}


def _roofline_rows(tmp: Path, spec: dict[str, Any], threads: int,
                      record: dict[str, list[float]]) -> dict[str, Callable]:
    """The bundle's roofline graphs fed as `run.py bench --roofline` feeds them: one row a
    kind, each call running every graph of that kind twice and recording the second (warm) run's
    ms in *record* by graph file."""
    from ._runtimes.runner.roofline import roofline_feed, roofline_graphs

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
    from ._runtimes.runner.roofline import roofline_graphs

    rates = [(dict(g, runtime="ORT CPU", provider=CPU),
              g["ops"] / (float(np.median(times[g["file"]])) * 1e6))
             for g in roofline_graphs(spec) if times.get(g["file"])]
    rates += [(dict(g, runtime="OpenVINO", provider=OPENVINO), gops) for g, gops in openvino]
    found: dict[str, Any] = {"int8_kind": spec["int8_kind"], "graphs": [
        {"kind": g["kind"], "op": g["op"], "shape": g["shape"], "runtime": g["runtime"],
         "provider": g["provider"], "gops": gops} for g, gops in rates]}
    for kind in ROOFLINE:
        best = max(((gops, g) for g, gops in rates if g["kind"] == kind), key=lambda t: t[0],
                   default=None)
        if best is not None:
            found[f"{kind}_gops"] = best[0]
            found[f"{kind}_best"] = (f"{best[1]['op']} {'x'.join(map(str, best[1]['shape']))}"
                                     f" ({best[1]['runtime']})")
    return found


def _roofline_share(name: str, flops: int | None, p50_ms: float,
                    ceiling: dict[str, Any]) -> dict[str, Any]:
    """GOP/s at p50 and, for ONNX Runtime rows, its share of the ceiling of its kind as
    `run.py bench` has it (bench.ceiling_share: one definition): the CPU provider's best, and
    OpenVINO's too for a row that runs under OpenVINO."""
    gops = flops / (p50_ms * 1e6) if flops else None
    kind = None if name in (EAGER, COMPILED) else "int8" if "INT8" in name else "fp32"
    provider = OPENVINO if name in OPENVINO_ROWS and name != OV_CPU else CPU
    return {"ops_per_call": flops, "gops": gops, "ceiling": kind,
            "ceiling_share": ceiling_share(gops, kind, ceiling.get("graphs", ()), provider)
            if gops and kind else None}


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
