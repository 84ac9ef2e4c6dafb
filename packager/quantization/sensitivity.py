"""Where quantization hurts: compare every intermediate tensor of the FP32 and quantized graphs.

For each node of the FP32 graph, the quantized graph's value of the same tensor is compared with
the FP32 one over the same inputs (cosine and SQNR). A node's *damage* is how much agreement it
loses between its inputs and its output: the node where a large error first appears, which is
the one to keep in FP32.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..graph.execute import Sample, scaled_cosine

SKIP_OPS = {"QuantizeLinear", "DequantizeLinear", "Constant", "Shape", "Identity"}


def intermediate_outputs(model: Path, samples: Sequence[Sample]) -> dict[str, list[np.ndarray]]:
    """Every node output of *model* (float tensors only) for each sample."""
    import onnxruntime as ort

    proto = onnx.load(str(model))
    known = {o.name for o in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in known:
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
                known.add(name)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    collected: dict[str, list[np.ndarray]] = {n: [] for n in names}
    sequences = set()   # a sequence-typed output (SplitToSequence's) comes back as a list
    for sample in samples:
        for name, value in zip(names, session.run(names, sample), strict=True):
            if isinstance(value, list):
                sequences.add(name)
            else:
                collected[name].append(np.asarray(value))
    return {k: v for k, v in collected.items()
            if v and k not in sequences and v[0].dtype.kind == "f"}


def _agreement(ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, float]:
    """(cosine, SQNR dB) of *got* against *ref*, over all samples."""
    a = np.concatenate([r.astype(np.float64).ravel() for r in ref])
    b = np.concatenate([g.astype(np.float64).ravel() for g in got])
    if a.shape != b.shape:
        return 0.0, -np.inf
    finite = np.isfinite(a)
    if not np.array_equal(finite, np.isfinite(b)):
        return 0.0, -np.inf   # inf/nan where the other graph has numbers (or vice versa)
    a, b = a[finite], b[finite]   # e.g. -inf attention masks, identical in both
    scale = float(np.abs(a).max()) if a.size else 0.0
    scale = scale or 1.0   # SQNR in the reference's units scaled to 1: no overflow near 1e154
    noise = float(np.sum(((a - b) / scale) ** 2))
    signal = float(np.sum((a / scale) ** 2))
    sqnr = 10 * np.log10(signal / noise) if noise > 0 else np.inf
    return scaled_cosine(a, b), float(sqnr)


def check_pair(fp32: Path, quantized: Path, *, same_graph: bool = True,
               needs_quantized: bool = True) -> None:
    """Refuse two models that are not an FP32 model and a quantized copy of it: different
    inputs, (*needs_quantized*) the second without a quantized op or the two swapped, or
    (*same_graph*) no tensor name in common, so nothing to compare layer by layer."""
    from ..errors import ModelError
    from ..graph.inspection import graph_inputs, io_specs
    from ..graph.modelio import load_model
    from ..graph.quantized import quantized_ops, quantized_summary

    a, b = (load_model(p, check=False, external_data=False) for p in (fp32, quantized))
    ins = [{i["name"]: (i["shape"], i["dtype"]) for i in io_specs(graph_inputs(m))} for m in (a, b)]
    if ins[0] != ins[1]:
        def describe(found: dict) -> str:
            return ", ".join(f"{k} {'x'.join(map(str, s))} {t}" for k, (s, t) in found.items())

        raise ModelError(f"{quantized} takes {describe(ins[1])} but {fp32} takes "
                         f"{describe(ins[0])}: not a quantized copy of it",
                         "pass the FP32 model and the model quantized from it")
    names = [{o for n in m.graph.node for o in n.output} for m in (a, b)]
    if same_graph and not names[0] & names[1]:
        raise ModelError(f"{quantized} and {fp32} share no tensor names: not a quantized copy "
                         "of it", "pass the FP32 model and the model quantized from it")
    if not needs_quantized:
        return
    found = [quantized_ops(m.graph) for m in (a, b)]
    if found[0] and not found[1]:
        raise ModelError(f"{fp32} is the quantized one ({quantized_summary(found[0])}) and "
                         f"{quantized} has no quantized op", "pass the FP32 model first: "
                         f"debug-quant {quantized} {fp32}")
    if not found[1]:
        raise ModelError(f"{quantized} has no quantized op: nothing to compare with {fp32}",
                         "pass a model quantized from it second (edgepack quantize writes one)")


def layer_errors(fp32: Path, quantized: Path, samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """Per FP32 node: agreement of its output in the quantized graph, and the damage it adds.

    Sorted worst first (largest damage, then lowest cosine).
    """
    ref = intermediate_outputs(fp32, samples)
    got = intermediate_outputs(quantized, samples)
    # where the quantized graph quantizes a tensor, what the next node reads is its
    # dequantized copy: compare that (a fused ReLU, for one, only shows there)
    copies = dequantized_copies(quantized)
    seen = {t: copies.get(t) for t in ref}
    fidelity = {name: _agreement(ref[name], got[seen[name] or name]) for name in ref
                if (seen[name] or name) in got}
    graph = onnx.load(str(fp32), load_external_data=False).graph
    producer = {o: n for n in graph.node for o in n.output}
    in_int8 = quantized_nodes(quantized)
    rows = []
    for node in graph.node:
        if node.op_type in SKIP_OPS or not node.output or node.output[0] not in fidelity:
            continue
        cosine, sqnr = fidelity[node.output[0]]
        reads = node_inputs(node, producer)
        upstream = [fidelity[i][0] for i in reads if i in fidelity]
        before = min(upstream) if upstream else 1.0
        feeders = [producer[i].name for i in reads
                   if i in producer and producer[i].name in in_int8]
        culprit = node.name if node.name in in_int8 else None
        if culprit is None and feeders:   # e.g. a ReLU fused into the convolution before it
            culprit = feeders[0]
        rows.append({"node": node.name, "op": node.op_type, "output": node.output[0],
                     "cosine": cosine, "sqnr_db": sqnr, "input_cosine": before,
                     "damage": max(0.0, before - cosine), "quantized": culprit is not None,
                     "exclude": culprit, "feeders": feeders})
    rows.sort(key=lambda r: (-r["damage"], r["cosine"]))
    return rows


def dequantized_copies(quantized: Path) -> dict[str, str]:
    """tensor -> the DequantizeLinear output that carries it in the quantized graph."""
    graph = onnx.load(str(quantized), load_external_data=False).graph
    after_q = {n.input[0]: n.output[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    dq = {n.input[0]: n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    return {t: dq[q] for t, q in after_q.items() if q in dq}


def node_inputs(node: onnx.NodeProto, outer: dict[str, Any]) -> list[str]:
    """A node's inputs, plus the outer tensors its If/Loop/Scan bodies read."""
    names = list(node.input)
    for attr in node.attribute:
        for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            inner = {o for n in body.node for o in n.output}
            names += [i for n in body.node for i in node_inputs(n, outer)
                      if i in outer and i not in inner]
    return list(dict.fromkeys(names))


def quantizable_ops() -> set[str]:
    """Op types onnxruntime's quantizer can quantize: only these are worth excluding."""
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry

    return set(QDQRegistry) | set(QLinearOpsRegistry) | set(IntegerOpsRegistry)


def quantized_nodes(quantized: Path) -> set[str]:
    """Quantizable nodes that read a dequantized tensor (QDQ), or integer ops (QOperator)."""
    graph = onnx.load(str(quantized), load_external_data=False).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    ops = quantizable_ops()
    names = set()
    for node in graph.node:
        if node.op_type.startswith("QLinear") or node.op_type in ("MatMulInteger",
                                                                   "ConvInteger"):
            names.add(node.name.removesuffix("_quant"))
        elif node.op_type in ops and any(i in dequantized for i in node.input):
            names.add(node.name)
    return names


def suggest(rows: Sequence[dict[str, Any]], excluded: Sequence[str],
            count: int = 1) -> list[tuple[str, str]]:
    """The *count* nodes to keep in FP32 next, each with the reason: (node, why)."""
    picks: list[tuple[str, str]] = []
    for row in rows:
        if row["damage"] <= 1e-4:
            break
        why = f"{row['node']} loses cosine {row['damage']:.4f} (output {row['cosine']:.4f})"
        # a node already in FP32 still reads its inputs' quantized copies: their producers next
        for name in [row.get("exclude")] + list(row.get("feeders", [])):
            if name and name not in excluded and name not in [p for p, _ in picks]:
                picks.append((name, why if name == row.get("exclude") else
                              f"its quantized output feeds {row['node']}, which "
                              f"loses cosine {row['damage']:.4f}"))
                break
        if len(picks) == count:
            break
    return picks


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give unnamed nodes stable names: the quantizer excludes nodes by name."""
    used = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in used:
                name += "_"
            node.name = name
            used.add(name)
    return model
