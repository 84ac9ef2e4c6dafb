"""The FP32 graph the precision decision starts from, and the bundle's speed against the original.

Simplification does not always make a graph faster: onnxsim folds each Pad into an asymmetric
Conv pad that onnxruntime runs slower than Pad + Conv (graph/simplify.py). So the build keeps
the fastest of onnxsim's graph, onnxsim's without its Pad folds and the unsimplified static
graph (all computing the same outputs), timed interleaved with the user's original file, and
ends by timing the bundle's graph against that original in one run. The transformer-fused
graph (fuse_model) is chosen the same way: kept only when it is not slower.
"""

import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from .._runtimes.runner.load import noise
from ..graph.execute import Sample, compare_outputs, run_model
from ..graph.freeze import fold_constant_ifs
from ..graph.modelio import save_model
from ..graph.shapes import dynamic_tensors, fix_shapes_proto, shapes_from_run
from ..graph.simplify import (
    GraphChoice,
    GraphTimer,
    constants_to_initializers,
    fastest_graph,
    padded_ops,
    quiet_stderr,
    simplify_proto,
    upgrade_opset,
)
from ..progress import Log
from ..quantization.decision import local_timer, plan_timing, timing_place
from ..quantization.sensitivity import name_nodes
from ..targets import Target
from ..timing import SETTLE, machine, session, time_blocks

CONTROL_FLOW = ("If", "Loop", "Scan")
PADS_KEPT = "onnxsim, Pads kept"
UNSIMPLIFIED = "unsimplified"


def simplify_static(fixed: onnx.ModelProto, path: Path, *, batch: int, frozen: bool,
                    fold_pads: bool = True) -> tuple[onnx.ModelProto, str, str]:
    """onnxsim (or the fallback) on the static graph, Ifs decided by frozen inputs folded, and
    shape inference re-run: (model, simplifier, fallback reason)."""
    simplified, simplifier, reason = simplify_proto(fixed, path, fold_pads=fold_pads)
    if frozen and any(n.op_type == "If" for n in simplified.graph.node):
        # what the simplifier folded may decide more Ifs
        simplified = fold_constant_ifs(simplified)
        simplified, simplifier, reason = simplify_proto(simplified, path, fold_pads=fold_pads)
    # static inputs let the simplifier fold shape arithmetic
    return fix_shapes_proto(simplified, {}, batch=batch, strict=False), simplifier, reason


def graph_timer(target: Target, timer: Any, feed: Sample) -> tuple[GraphTimer | None, str]:
    """A function timing graphs interleaved with the target's threads (here, or with *timer*
    on the device), or (None, why latency cannot be measured for this target)."""
    why = timing_place(target, timer)
    if why:
        return None, why
    threads = int(target.session.get("intra_op_threads", 0))
    plans: list[tuple[int, int]] = []

    def time_graphs(paths: Sequence[Path]) -> tuple[dict[str, dict[str, float]], Any]:
        if not plans:   # the FP32 graph's time per call sizes every later run's blocks too
            plans.append(plan_timing(paths[0], feed, threads))
        rounds, block = plans[0]
        if timer is not None:
            return timer(list(paths), feed, threads, rounds, block)
        runs = {}
        for p in paths:
            with quiet_stderr():   # the original's load warnings (initializers listed as inputs)
                sess = session(p, threads)
            runs[str(p)] = lambda s=sess: s.run(None, feed)
        # stops after 3 of 5 rounds when the order is already clear
        return time_blocks(runs, rounds=rounds, block=block, settle=SETTLE), machine()

    return time_graphs, ""


def choose_fp32(fixed: onnx.ModelProto, simplified: onnx.ModelProto, simplifier: str,
                model_path: Path, original: Path | None, *, target: Target, frozen: bool,
                samples: Sequence[Sample], time_graphs: GraphTimer | None, why_not: str,
                folder: Path, name: str, log: Log) -> GraphChoice:
    """Save the simplified graph and the variants worth timing against it; keep the fastest
    (GraphChoice.path, named nodes) that computes the same outputs."""
    graphs = {simplifier: save_model(name_nodes(simplified), folder / f"{name}.fp32.onnx")}
    nodes = {simplifier: len(simplified.graph.node)}
    notes = {}
    if simplifier == "onnxsim" and padded_ops(fixed) > padded_ops(simplified):
        kept, _, _ = simplify_static(fixed, model_path, batch=target.batch, frozen=frozen,
                                     fold_pads=False)
        graphs[PADS_KEPT] = _save(kept, samples, folder / f"{name}.fp32-pads.onnx")
        nodes[PADS_KEPT] = len(kept.graph.node)
    plain = upgrade_opset(fixed, model_path)
    constants_to_initializers(plain)
    if any(n.op_type in CONTROL_FLOW for n in plain.graph.node):
        notes[UNSIMPLIFIED] = "not tried: it holds control flow (If/Loop/Scan) the quantizer " \
                              "cannot see through"
    elif len(plain.graph.node) != len(simplified.graph.node):
        plain = fix_shapes_proto(plain, {}, batch=target.batch, strict=False)
        graphs[UNSIMPLIFIED] = _save(plain, samples, folder / f"{name}.fp32-plain.onnx")
        nodes[UNSIMPLIFIED] = len(plain.graph.node)
    same = False   # the unsimplified candidate is the original: timed once, for both
    if original is None and model_path.suffix == ".onnx":
        # a file exported at other input shapes (or with fixed dims) runs at the build's only
        # once they are set: that copy, nothing else changed, stands for the original
        original = folder / f"{name}.original-static.onnx"
        if UNSIMPLIFIED in graphs:
            shutil.copyfile(graphs[UNSIMPLIFIED], original)
            same = True
        else:
            _save(plain, samples, original)
        notes["original"] = "timed at the build's input shapes (it does not take them as it is)"
    elif original is not None and UNSIMPLIFIED in graphs:
        same = op_counts(plain.graph) == op_counts(onnx.load(str(original),
                                                              load_external_data=False).graph)
    choice = fastest_graph(graphs, samples=samples[:4], time_graphs=time_graphs,
                           why_not=why_not, original=None if same else original, log=log)
    if same and choice.record.get("measured") and UNSIMPLIFIED in choice.record["candidates"]:
        choice.record["original_p50_ms"] = choice.record["candidates"][UNSIMPLIFIED].get("p50_ms")
        choice.record["original_is"] = UNSIMPLIFIED
    record = {**choice.record, "nodes": nodes}
    if "original" in notes:
        record["original"] = notes.pop("original")
    for label, note in notes.items():
        record["candidates"][label] = {"dropped": note}
    return GraphChoice(choice.label, choice.path, record, original)


def op_counts(graph: onnx.GraphProto) -> dict[str, int]:
    """{op type: count} but Constants (an initializer in one graph, a node in the other)."""
    counts: dict[str, int] = {}
    for node in graph.node:
        if node.op_type != "Constant":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _save(model: onnx.ModelProto, samples: Sequence[Sample], path: Path) -> Path:
    if dynamic_tensors(model):
        model, _ = shapes_from_run(model, samples[:2])
    return save_model(name_nodes(model), path)


def original_graph(path: Path, feed: Sample) -> tuple[Path | None, str]:
    """The user's original graph (their .onnx, or the plain export) when it runs on the
    bundle's inputs, else (None, why not)."""
    try:
        with quiet_stderr():
            session(path, 1).run(None, dict(feed))
    except Exception as exc:   # frozen inputs, an opset this onnxruntime lacks: no comparison
        return None, f"the original does not run on the bundle's inputs ({type(exc).__name__}: " \
                     f"{' '.join(str(exc).split())[:120]})"
    return path, ""


def vs_original(mine: float, spread: tuple, theirs: float, where: Any, load: Any
                ) -> dict[str, Any]:
    """against_original's record: the bundle's p50 (*mine*, its p10-p90 *spread*) against the
    original's (*theirs*), timed in one run *where*, under *load*."""
    return {"measured": True, "bundle_p50_ms": round(mine, 4), "original_p50_ms": round(theirs, 4),
            "speedup": round(theirs / mine, 3), "measured_on": where,
            "bundle_p10_p90_ms": [round(v, 4) for v in spread] if None not in spread else None,
            "load": load}


def against_original(graph: Path, original: Path | None, time_graphs: GraphTimer | None,
                     why_not: str, choice: GraphChoice | None = None,
                     same_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The bundle's graph against the original, timed in the same blocks (the build's last
    line, speed_line). When the bundle ships *choice*'s FP32 graph, the blocks that chose it
    timed the original too: those figures are reused; so are *same_run*'s (the provider choice
    timed this graph and the original on the CPU provider in one run: provider_choice)."""
    if original is None or time_graphs is None:
        return {"measured": False, "why": why_not or "no original graph to time"}
    if same_run:
        return same_run
    if _same_file(graph, original):   # a graph is not timed against itself
        return {"measured": False, "why": "the bundle ships the original file unchanged"}
    known = choice.record if choice is not None and choice.path == graph else {}
    if known.get("measured") and "original_p50_ms" in known:
        stats = known["candidates"][choice.label]
        mine, spread = stats["p50_ms"], (stats.get("p10"), stats.get("p90"))
        theirs, where, load = known["original_p50_ms"], known.get("measured_on"), known.get("load")
    else:
        times, where = time_graphs([graph, original])
        stats = times[str(graph)]
        mine, theirs = stats["p50"], times[str(original)]["p50"]
        spread, load = (stats.get("p10"), stats.get("p90")), stats.get("load")
    return vs_original(mine, spread, theirs, where, load)


def _same_file(a: Path, b: Path) -> bool:
    """Whether *a* and *b* hold the same bytes."""
    import filecmp

    try:
        return a.stat().st_size == b.stat().st_size and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


FUSION_SLACK = 1.03   # the fused graph may not be slower than the unfused beyond noise
FUSION_COSINE = 0.99999   # fused ops reorder float sums; anything further off is not the model


def fuse_model(fixed: Any, model_path: Path, target: Target, held: Sequence[Sample],
               reference: Mapping[str, Any], path: Path, log: Log, *,
               unfused: Path | None = None, timer: Any = None
               ) -> tuple[Path | None, dict | None]:
    """The transformer-fused FP32 graph (fused before simplification, where attention still
    matches, and again after it), kept only when it computes what the unfused graph does and,
    where the target can be timed (here or with *timer*), runs no slower than *unfused*."""
    from ..graph.fusion import fuse_transformer

    first = fuse_transformer(fixed, target.min_onnxruntime)
    if first is None:
        log("fusion: onnxruntime's transformer optimizer found nothing to fuse")
        return None, None
    try:
        simplified, _, _ = simplify_proto(first.model, model_path)
        simplified = fix_shapes_proto(simplified, {}, batch=target.batch, strict=False)
        second = fuse_transformer(simplified, target.min_onnxruntime)
        final = second.model if second else simplified
        if dynamic_tensors(final):
            final, _ = shapes_from_run(final, held[:2])
        save_model(name_nodes(final), path)
        agreement = min(o["cosine_min"] for o in
                        compare_outputs(run_model(path, held), dict(reference)).values())
    except Exception as exc:   # an optional rewrite that fails costs its speed, not the build
        log(f"fusion: dropped, the fused graph does not run here ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:160]})")
        return None, None
    counts = Counter(first.fused) + Counter(second.fused if second else {})
    text = ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))
    if agreement < FUSION_COSINE:
        log(f"fusion: dropped, the fused graph ({text}) differs from the unfused one "
            f"(cosine {agreement:.6f} < {FUSION_COSINE})")
        return None, None
    log(f"fusion: {text} ({first.heads or '?'} heads, hidden {first.hidden or '?'}); outputs "
        f"match the unfused graph (cosine {agreement:.6f})")
    timing = _time_fusion(path, unfused, held, target, timer) if unfused else {}
    if timing.get("measured"):
        line = (f"fused FP32 p50 {timing['fused_p50_ms']:.3f} ms, unfused "
                f"{timing['unfused_p50_ms']:.3f} ms")
        if timing["fused_p50_ms"] > timing["unfused_p50_ms"] * FUSION_SLACK:
            log(f"fusion: dropped, it runs slower ({line})")
            return None, None
        log(f"fusion: kept, {line}")
    return path, {**first.record(), "fused": dict(counts), "cosine_to_unfused": agreement,
                  "min_onnxruntime": target.min_onnxruntime, "timing": timing}


def _time_fusion(fused: Path, unfused: Path, held: Sequence[Sample], target: Target,
                 timer: Any) -> dict[str, Any]:
    """Fused against unfused FP32, interleaved, where the decision could time candidates."""
    why = timing_place(target, timer)
    if why:
        return {"measured": False, "why": why}
    threads = int(target.session.get("intra_op_threads", 0))
    rounds, block = plan_timing(unfused, held[0], threads)
    times, where = (timer or local_timer)([fused, unfused], held[0], threads, rounds, block)
    return {"measured": True, "fused_p50_ms": times[str(fused)]["p50"],
            "unfused_p50_ms": times[str(unfused)]["p50"], "threads": threads,
            "measured_on": where}


def speed_line(record: dict[str, Any]) -> str:
    """The build's last word on speed, from against_original's record."""
    if not record.get("measured"):
        return f"not compared with the original ({record.get('why', '?')})"
    where = record.get("measured_on")
    info = where if isinstance(where, dict) else {}
    cpu = info.get("host") or info.get("cpu") or "this host"
    spread = record.get("bundle_p10_p90_ms")
    load = record.get("load") or {}
    share = load.get("other_share")
    runtime = f", onnxruntime {info['onnxruntime']}" if info.get("onnxruntime") else ""
    return (f"bundle {record['bundle_p50_ms']:.3f} ms p50"
            + (f" (p10-p90 {spread[0]:.3f}-{spread[1]:.3f})" if spread else "")
            + f" against the original's {record['original_p50_ms']:.3f} ms: "
            f"{record['speedup']:.2f}x its speed (timed in one run on {cpu}, "
            f"{info.get('cores', '?')} cores{runtime}"
            + (f"; other processes used {100 * share:.0f}% of them" if share is not None else "")
            + ")" + ("; the same speed within timing noise (the original's p50 lies inside "
                     "the bundle's p10-p90)" if spread and record["speedup"] < 1
                     and spread[0] <= record["original_p50_ms"] <= spread[1] else "")
            + (f"; NOISY ({why}): build again on a quiet machine for a steady figure"
                     if (why := noise(load, {"p10": spread[0], "p90": spread[1]}
                                      if spread else {})) else ""))
