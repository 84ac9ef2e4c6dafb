"""Where an INT8 graph loses its time: onnxruntime's own per-op profile of FP32 and INT8.

Both graphs run under onnxruntime's profiler with the target's threads, as the session the
device opens would (all graph optimisations, so the kernels profiled are the fused ones that
run). Node times are summed per op type and per *family* (QLinearConv, ConvInteger, FusedConv
and NCHWc Conv are all "Conv"), so the FP32 and INT8 columns line up; Q/DQ nodes and NCHWc
layout reorders are families of their own. A *float island* is a run of float nodes between a
DequantizeLinear and a QuantizeLinear: each costs a DQ and a Q besides its own float kernels.
"""

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import QuantizationError
from ..graph.execute import Sample

QDQ = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
LAYOUT = ("ReorderInput", "ReorderOutput", "Transpose")
INTEGER_PREFIXES = ("QLinear", "QGemm", "ConvInteger", "MatMulInteger", "DynamicQuantize",
                    "MatMulIntegerToFloat", "QAttention", "QEmbed")
# onnxruntime's fused or integer kernels, named by the float op they compute
FAMILY = {"FusedConv": "Conv", "NhwcFusedConv": "Conv", "ConvInteger": "Conv", "QGemm": "Gemm",
          "FusedGemm": "Gemm", "MatMulInteger": "MatMul", "MatMulIntegerToFloat": "MatMul",
          "DynamicQuantizeMatMul": "MatMul", "FusedMatMul": "MatMul", "NhwcConv": "Conv",
          "QLinearGlobalAveragePool": "GlobalAveragePool",
          # x * sigmoid(x) (SiLU) fused by onnxruntime in FP32; INT8 runs it as QLinearSigmoid
          # and QLinearMul, so it lines up with the Sigmoid row (the Mul row shows the rest)
          "QuickGelu": "Sigmoid",
          "ReorderInput": "layout", "ReorderOutput": "layout", "Transpose": "layout",
          "QuantizeLinear": "Q/DQ", "DequantizeLinear": "Q/DQ", "DynamicQuantizeLinear": "Q/DQ"}


def family(op: str) -> str:
    """The float op a kernel computes: QLinearConv -> Conv, ReorderInput -> layout."""
    if op in FAMILY:
        return FAMILY[op]
    return op[len("QLinear"):] if op.startswith("QLinear") else op


def is_integer(op: str) -> bool:
    return op.startswith(INTEGER_PREFIXES)


@dataclass
class OpProfile:
    """Per-run kernel time of one graph, in ms (mean over the profiled runs)."""

    path: str
    p50_ms: float                       # wall time per call, outside the profiler
    kernel_ms: float                    # the sum of every node's kernel time
    by_op: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    nodes: list[tuple[str, str, float]] = field(default_factory=list)   # name, op, ms; slowest
    islands: int = 0                    # float runs between DQ and Q
    island_ms: float = 0.0              # their float kernels' time
    runs: int = 0                       # the timed calls behind p50_ms

    def by_family(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for op, ms in self.by_op.items():
            out[family(op)] = out.get(family(op), 0.0) + ms
        return out

    @property
    def qdq_ms(self) -> float:
        return sum(ms for op, ms in self.by_op.items() if op in QDQ)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "p50_ms": round(self.p50_ms, 4),
                "kernel_ms": round(self.kernel_ms, 4),
                "by_op": {k: round(v, 4) for k, v in self.by_op.items()},
                "counts": dict(self.counts), "qdq_ms": round(self.qdq_ms, 4),
                "float_islands": self.islands, "island_ms": round(self.island_ms, 4),
                "runs": self.runs, "top_nodes": [{"node": n, "op": o, "ms": round(ms, 4)}
                              for n, o, ms in self.nodes]}


def profile_model(path: Path, feed: Sample, *, threads: int = 0, runs: int = 20,
                  warmup: int = 3, top: int = 10, seconds: float | None = None) -> OpProfile:
    """Run *path* *runs* times under onnxruntime's profiler; per-op-type kernel time per run.
    *seconds*: no run starts after it (one at least), and the warm-up stops after
    WARMUP_SECONDS (one call at least): a model that takes a second a call (Kokoro-82M's 13
    profiled calls took 50 s of its build)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="edgepack-prof-") as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        optimized = os.path.join(tmp, "optimized.onnx")
        so.optimized_model_filepath = optimized   # the graph that runs: for its float islands
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "profile")
        try:
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise QuantizationError(f"{path}: onnxruntime cannot load it ({_first(exc)})",
                                    "profile a model that `edgepack inspect` reads") from None
        from ..timing import warm_up

        warm = warm_up(lambda: sess.run(None, feed), warmup)[0] if warmup else 0
        walls: list[float] = []
        began = time.perf_counter()
        while len(walls) < runs and not (walls and seconds is not None and
                                         time.perf_counter() - began > seconds):
            start = time.perf_counter()
            sess.run(None, feed)
            walls.append(time.perf_counter() - start)
        events = json.loads(Path(sess.end_profiling()).read_text())
        islands = float_islands(optimized) if os.path.isfile(optimized) else []
    found = _summarise(str(path), events, len(walls) + warm,
                       sorted(walls)[len(walls) // 2] * 1e3, islands, top)
    found.runs = len(walls)
    return found


def _summarise(path: str, events: list[dict], calls: int, p50_ms: float,
               islands: list[set[str]], top: int) -> OpProfile:
    by_op: dict[str, float] = {}
    counts: dict[str, int] = {}
    per_node: dict[str, tuple[str, float]] = {}
    for ev in events:
        if ev.get("cat") != "Node" or not ev.get("name", "").endswith("_kernel_time"):
            continue
        op = ev.get("args", {}).get("op_name", "?")
        name = ev["name"][:-len("_kernel_time")]
        ms = ev.get("dur", 0) / 1e3 / calls
        by_op[op] = by_op.get(op, 0.0) + ms
        counts[op] = counts.get(op, 0) + 1
        per_node[name] = (op, per_node.get(name, (op, 0.0))[1] + ms)
    counts = {op: max(1, n // calls) for op, n in counts.items()}
    nodes = sorted(((n, op, ms) for n, (op, ms) in per_node.items()), key=lambda r: -r[2])
    island_nodes = set().union(*islands) if islands else set()
    return OpProfile(path, p50_ms, sum(by_op.values()),
                     dict(sorted(by_op.items(), key=lambda kv: -kv[1])), counts, nodes[:top],
                     len(islands), sum(per_node.get(n, ("", 0.0))[1] for n in island_nodes))


def float_islands(path: str | Path) -> list[set[str]]:
    """Runs of float nodes (names) fed by a DequantizeLinear and feeding a QuantizeLinear."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    producer = {o: n for n in graph.node for o in n.output}
    users: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    floating = {n.name for n in graph.node if n.name and n.op_type not in QDQ
                and not is_integer(n.op_type)}
    seen: set[str] = set()
    found = []
    for node in graph.node:
        if node.name not in floating or node.name in seen:
            continue
        group, todo = set(), [node]
        while todo:   # the connected float region around node
            cur = todo.pop()
            if cur.name in group:
                continue
            group.add(cur.name)
            near = [producer[i] for i in cur.input if i in producer]
            near += [u for o in cur.output for u in users.get(o, [])]
            todo += [m for m in near if m.name in floating and m.name not in group]
        seen |= group
        members = [n for n in graph.node if n.name in group]
        fed = any(producer.get(i) is not None and producer[i].op_type == "DequantizeLinear"
                  for n in members for i in n.input)
        feeds = any(u.op_type == "QuantizeLinear" for n in members for o in n.output
                    for u in users.get(o, []))
        if fed and feeds:
            found.append(group)
    return found


def profile_pair(fp32: Path, int8: Path, feed: Sample, *, threads: int = 0, runs: int = 20,
                 top: int = 10) -> tuple[OpProfile, OpProfile]:
    """Profile both graphs, interleaved in halves so that load on the machine hits both."""
    half = max(1, runs // 2)
    first = [profile_model(p, feed, threads=threads, runs=half, top=top) for p in (fp32, int8)]
    second = [profile_model(p, feed, threads=threads, runs=half, top=top)
              for p in (int8, fp32)][::-1]
    return _merge(first[0], second[0]), _merge(first[1], second[1])


def _merge(a: OpProfile, b: OpProfile) -> OpProfile:
    by_op = {k: (a.by_op.get(k, 0.0) + b.by_op.get(k, 0.0)) / 2
             for k in set(a.by_op) | set(b.by_op)}
    nodes: dict[str, tuple[str, float]] = {}
    for n, op, ms in a.nodes + b.nodes:
        nodes[n] = (op, nodes.get(n, (op, 0.0))[1] + ms / 2)
    return OpProfile(a.path, (a.p50_ms + b.p50_ms) / 2, (a.kernel_ms + b.kernel_ms) / 2,
                     dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
                     {**b.counts, **a.counts},
                     sorted(((n, op, ms) for n, (op, ms) in nodes.items()),
                            key=lambda r: -r[2])[:len(a.nodes)], a.islands,
                     (a.island_ms + b.island_ms) / 2)


def family_rows(fp32: OpProfile, int8: OpProfile) -> list[dict[str, Any]]:
    """Per family: FP32 ms, INT8 ms, INT8's extra, its kernels; the costliest extra first."""
    a, b = fp32.by_family(), int8.by_family()
    rows = []
    for fam in set(a) | set(b):
        kernels = sorted((op for op in int8.by_op if family(op) == fam),
                         key=lambda op: -int8.by_op[op])
        rows.append({"family": fam, "fp32_ms": a.get(fam, 0.0), "int8_ms": b.get(fam, 0.0),
                     "extra_ms": b.get(fam, 0.0) - a.get(fam, 0.0),
                     "int8_kernels": [f"{op} x{int8.counts.get(op, 1)}" for op in kernels]})
    return sorted(rows, key=lambda r: -r["extra_ms"])


def table(fp32: OpProfile, int8: OpProfile, top: int = 12) -> str:
    """Markdown: where the INT8 graph loses its time against FP32."""
    lines = [f"where the INT8 graph loses its time (onnxruntime profiler, ms per run): "
             f"FP32 {fp32.kernel_ms:.3f} ms in kernels ({fp32.p50_ms:.3f} ms p50), "
             f"INT8 {int8.kernel_ms:.3f} ms ({int8.p50_ms:.3f} ms p50)",
             "", "| op | FP32 ms | INT8 ms | INT8 extra | INT8 kernels |",
             "| --- | --- | --- | --- | --- |"]
    rows = sorted(family_rows(fp32, int8), key=lambda r: -abs(r["extra_ms"]))  # gains too
    for r in rows[:top]:
        lines.append(f"| {r['family']} | {r['fp32_ms']:.3f} | {r['int8_ms']:.3f} | "
                     f"{r['extra_ms']:+.3f} | {', '.join(r['int8_kernels'])} |")
    lines += ["", f"Q/DQ: {int8.qdq_ms:.3f} ms; float islands between integer ops: "
              f"{int8.islands} ({int8.island_ms:.3f} ms of float kernels)",
              "slowest INT8 nodes: " + "; ".join(f"{n} ({op}) {ms:.3f} ms"
                                                 for n, op, ms in int8.nodes[:5])]
    return "\n".join(lines)


def losses(fp32: OpProfile, int8: OpProfile, count: int = 3) -> str:
    """One line: the op families that cost INT8 most over FP32."""
    worst = [r for r in family_rows(fp32, int8) if r["extra_ms"] > 0][:count]
    if not worst:
        return (f"profile: INT8 {int8.kernel_ms:.3f} ms in kernels against FP32's "
                f"{fp32.kernel_ms:.3f} ms, no op family slower")
    return (f"profile: INT8 {int8.kernel_ms:.3f} ms in kernels against FP32's "
            f"{fp32.kernel_ms:.3f} ms; costliest over FP32: " + ", ".join(
                f"{r['family']} {r['extra_ms']:+.3f} ms ({r['fp32_ms']:.3f} -> "
                f"{r['int8_ms']:.3f})" for r in worst)
            + f"; Q/DQ {int8.qdq_ms:.3f} ms, {int8.islands} float islands")


def profile_rows(fp32: OpProfile, int8: OpProfile) -> dict[str, Any]:
    return {"fp32": fp32.as_dict(), "int8": int8.as_dict(), "families": family_rows(fp32, int8)}


def _first(exc: BaseException) -> str:
    return ((str(exc).strip().splitlines() or [type(exc).__name__])[0])[:200]


def feed_of(samples: Sequence[Sample]) -> Sample:
    if not samples:
        raise QuantizationError("profiling needs one sample", "pass --calib with a sample")
    return samples[0]
