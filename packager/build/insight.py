"""What the bundle's page shows beyond the decision, measured once in the build: the shipped
graph's top-1 against the user's class folders beside FP32's (with confusion matrices), where
each graph spends its time (onnxruntime's profiler, per op type and per node), and which nodes
stayed float and why. All of it goes into the manifest's precision section, so the page only
reads what the bundle records."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from ..errors import QuantizationError
from ..quantization.graph_facts import HEAVY_OPS, post_processing
from ..quantization.profile import profile_model
from .label_check import labelled_top1
from .plan import PartRequest
from .records import BuildContext, PartData, Reference

PROFILE_RUNS = 10   # profiled calls per graph (after 3 warm-up calls)...
PROFILE_SECONDS = 5.0   # ...none started after this long (one at least): a 1.4 s TTS model
TOP_NODES = 10


def labelled_both(req: PartRequest, data: PartData, ref: Reference, shipped: Path,
                  fp32_shipped: bool) -> dict[str, Any] | None:
    """FP32's top-1 on the labelled images (the build's preprocessing check) with the shipped
    graph's beside it, under "shipped", on the same images: --eval's where given (images the
    build never calibrated on), else the calibration folders'."""
    if ref.evaluated:
        again = ref.evaluated if fp32_shipped else labelled_top1(
            shipped, ref.eval_samples or [], Path(ref.evaluated["folder"]), req.labels)
        return {**ref.evaluated, "shipped": again}
    if not ref.labelled or "skipped" in ref.labelled:
        return ref.labelled
    again = ref.labelled if fp32_shipped else labelled_top1(shipped, data.samples, req.calib,
                                                            req.labels)
    return {**ref.labelled, "shipped": again}


def profiles(fp32: Path | None, shipped: Path, feed: dict, threads: int,
             log) -> dict[str, Any]:
    """{"fp32": ..., "shipped": ...}: per op type and the slowest nodes, ms per call on this
    host's CPU provider (the shipped graph alone when it is FP32 or was given quantized)."""
    found: dict[str, Any] = {"measured_on": "the build host, CPU provider",
                             "runs": PROFILE_RUNS}
    graphs = {"shipped": shipped} if fp32 is None or fp32 == shipped else \
        {"fp32": fp32, "shipped": shipped}
    for key, path in graphs.items():
        try:
            found[key] = profile_model(path, feed, threads=threads, runs=PROFILE_RUNS,
                                       top=TOP_NODES, seconds=PROFILE_SECONDS).as_dict()
            found[key].pop("path", None)
        except QuantizationError as exc:
            log(f"profile: {key} graph not profiled: {exc.message}")
            found[key] = {"skipped": exc.message}
    ran = [found[k].get("runs") for k in graphs if isinstance(found.get(k), dict)
           and found[k].get("runs")]
    if ran:
        found["runs"] = min(ran)   # (fewer than PROFILE_RUNS where PROFILE_SECONDS ended them)
    if fp32 is not None and fp32 == shipped:
        found["fp32"] = "shipped"
    return found


def float_nodes(shipped: Path, graph: onnx.GraphProto, exclude: Sequence[str],
                asked: Sequence[str], notes: Sequence[str], label: str,
                mode: str) -> list[dict[str, str]]:
    """The shipped INT8 graph's nodes that run in float, each with why: those the quantizer
    was told to leave (--exclude, the post-processing tail, a retry's notes, the candidate's
    own choice) and heavy ops it did not quantize."""
    tail = set(post_processing(graph))
    ops = {n.name: n.op_type for n in graph.node if n.name}
    out = []
    for name in exclude:
        note = next((n for n in notes if name in n), "")
        why = ("you asked (--exclude)" if name in asked else
               "post-processing after the last heavy op: INT8 saves nothing there and one "
               "range over tensors of different scales erases the small ones" if name in tail
               else note or f"left float by the candidate that shipped ({label})")
        out.append({"node": name, "op": ops.get(name, "?"), "why": why})
    model = onnx.load(str(shipped), load_external_data=False)
    made = {o: n.op_type for n in model.graph.node for o in n.output}
    named = {row["node"] for row in out}
    for node in model.graph.node:
        if node.op_type in HEAVY_OPS and node.name not in named and \
                not any(made.get(i) == "DequantizeLinear" for i in node.input[1:2]):
            why = ("dynamic INT8 quantizes MatMul and Gemm weights only" if mode == "dynamic"
                   else "the quantizer left it float (no INT8 kernel for its inputs)")
            out.append({"node": node.name or "(unnamed)", "op": node.op_type, "why": why})
    return out


def insight(req: PartRequest, data: PartData, ref: Reference, decision: Any, graph: onnx.GraphProto,
            threads: int, ctx: BuildContext) -> dict[str, Any]:
    """The page's build-time figures for one part (manifest keys labelled_top1, profile and
    float_nodes)."""
    config, candidate = decision.config, decision.candidate
    given = config.mode == "given"
    fp32_shipped = config.precision == "fp32"
    found: dict[str, Any] = {"labelled_top1": labelled_both(req, data, ref, candidate.path,
                                                            fp32_shipped)}
    feed = data.feed
    found["profile"] = profiles(None if given else (candidate.path if fp32_shipped
                                                    else ref.path),
                                candidate.path, feed, threads, ctx.log)
    found["float_nodes"] = None if fp32_shipped or given else float_nodes(
        candidate.path, graph, config.exclude, req.quant.exclude or (), candidate.notes,
        candidate.label, config.mode)
    return found
