"""The INT8 search: quantize one FP32 model several ways and keep the variants within budget.

Each stage runs only when the ones before found nothing within the accuracy budget:

1. structure: the preset over every op it can quantize; where it misses with U8 activations and
   S8 weights, 7-bit weights (onnxruntime's reduce_range: x86 CPUs without VNNI multiply 8-bit
   ones with an int16 sum that overflows); only the heavy ops (Conv, MatMul, Gemm: activations
   and elementwise ops such as HardSwish, Sigmoid, Add, Resize stay float, so there are fewer
   Q/DQ pairs); the first heavy layer and the last before each output in FP32.
2. calibration: MinMax / Entropy / Percentile ranges, per-channel / per-tensor weights, on the
   most accurate structure so far.
3. ranked sensitivity: rank nodes by the error each adds (sensitivity.layer_errors) once, then
   bisect over how many of the worst stay FP32: log2(n) quantizations instead of one per node.

Calibration runs once per method (onnxruntime's range cache), so a variant costs one quantizer
pass and one held-out evaluation. A quantizer failure or an invalid quantized graph is retried
with the node it names (or its op type) kept in float.

Static variants are quantized from the FP32 graph with its HardSwish decompositions written as
single ops (graph/hard_activations.py, exact): one activation per block instead of four, so the
INT8 graph has fewer Q/DQ pairs and float islands (PP-OCRv4's detector: 1.14x FP32 against
1.03x, the same accuracy). Accuracy is always measured against the FP32 graph as given. When
INT8 cannot pay, the log says where the fastest variant loses its time (profile.py).
"""

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx

from ..errors import QuantizationError
from ..graph.execute import Sample, run_model
from ..progress import OFF, Log, Progress
from ..targets import CALIBRATION_METHODS as METHODS
from .budget import PROBE_SAMPLES, AccuracyBudget, worst_samples
from .calibration import spread
from .graph_facts import (  # noqa: F401
    HEAVY_OPS,
    INTEGER_OPS,
    boundary_floor,
    count_ops,
    dynamic_ops,
    entropy_differs,
    heavy_nodes,
    last_layers,
    macs,
    post_processing,
    quantize_nodes,
    saturates,
)
from .quantize import OverTime, QuantConfig, quantize_file
from .sensitivity import layer_errors, quantized_nodes

RETRIES = 4          # quantizer failures worked around per variant
# No new stage starts after SEARCH_SECONDS (--search-seconds), and the bisection starts no probe
# after BISECT_SHARE times that: zoo builds took up to 264 s (CenterFace), mostly in searches
# that found no INT8 variant within budget, and users wait on every build. At 40 s, three zoo
# builds still took 67-79 s; at 18 s (and the rest of this change) the four slowest take 22-57 s, and every
# zoo model ships what it did at 40 s.
SEARCH_SECONDS = 18.0
BISECT_SHARE = 1.25
# The bisection starts only with time left for its ranking and one probe: about this many times
# the first variant's quantize-and-measure (CenterFace: ranking 1.9-3.6x, a probe 1-1.5x)
BISECT_COST = 4.0
# Entropy and percentile ranges come from histograms of every tensor, which onnxruntime builds
# over all samples at once: 30 s for CenterFace's 19 samples (MinMax: 2.5 s). Their tails
# settle on fewer samples: the histogram methods calibrate on this many, evenly spread.
HISTOGRAM_SAMPLES = 8
MIN_GAIN = 1.05   # INT8 must beat FP32 by 5% (more than run-to-run noise here) to be shipped
# A bisection probe that misses the budget is timed (to stop when keeping more nodes FP32 cannot
# pay) unless the last timed one predicts it pays by this much more than MIN_GAIN: its speed-up
# scaled by the multiply-adds left in INT8 (MiniLM: 3 probes timed, 2-3 s each, all paying)
PREDICT_MARGIN = 1.1
# A variant with under 4% of the multiply-adds in INT8 is not built: even infinitely fast INT8
# kernels would leave 96% of the work, short of decision.MIN_GAIN (ocr-det's bisection built
# variants with 1-5 of 113 ops in INT8, 4 of its 14 candidates)
MIN_INT8_SHARE = 0.04


def hard_fused(fp32: Path, folder: Path, log: Log = lambda _: None) -> Path:
    """*fp32* with its HardSwish/HardSigmoid chains as single ops, when it has any: what static
    INT8 is quantized from (the same function, fewer Q/DQ pairs; compare's rows too)."""
    from ..graph.hard_activations import rewrite
    from ..graph.modelio import is_large, load_model, save_model

    proto = load_model(fp32)
    if is_large(proto):   # (a copy of a >2 GiB graph is not worth a few Q/DQ pairs)
        return fp32
    made = rewrite(proto)
    if not any(made.values()):
        return fp32
    path = folder / "fp32.fused.onnx"
    save_model(proto, path)
    log("search: INT8 variants start from the FP32 graph with "
        + ", ".join(f"{n} {op} chains" for op, n in made.items() if n)
        + " written as single ops (the same function, fewer Q/DQ pairs)")
    return path


def as_preset(graph: onnx.GraphProto, config: QuantConfig) -> tuple[QuantConfig, list[str]]:
    """*config* as the search's "INT8 preset" quantizes *graph*: min-max ranges where the
    preset says auto, and (static) the post-processing after the last heavy op kept FP32;
    with those nodes. compare's INT8 rows take it too, so both give one figure per graph."""
    if config.calibration_method == "auto":
        config = replace(config, calibration_method="minmax")
    tail = post_processing(graph) if config.mode == "static" else []
    if tail:
        config = replace(config, exclude=tuple(dict.fromkeys(config.exclude + tuple(tail))))
    return config, tail


@dataclass
class Candidate:
    """One way to ship the model, with its accuracy (and latency once timed)."""

    label: str
    config: QuantConfig
    path: Path
    accuracy: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    notes: list[str] = field(default_factory=list)
    int8_nodes: int = 0      # heavy ops computed in INT8
    boundaries: int = 0      # float -> int8 edges left once onnxruntime fused the graph
    quantize_nodes: int = 0  # QuantizeLinear / DynamicQuantizeLinear nodes in the file
    p50_ms: float | None = None
    p90_ms: float | None = None
    folds: tuple[Path, ...] = ()   # judged by rotation: its graph per fold (kfold.confirm)

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.accuracy.get("budget", {}).get("passed"))

    def summary(self) -> dict[str, Any]:
        acc = self.accuracy
        return {"label": self.label, "precision": self.config.describe(),
                "exclude": list(self.config.exclude), "op_types": list(self.config.op_types),
                "cosine_min": acc.get("cosine_min"), "drop": acc.get("drop"),
                "meets_budget": self.passed, "int8_nodes": self.int8_nodes,
                "qdq_boundaries": self.boundaries, "p50_ms": self.p50_ms, "p90_ms": self.p90_ms,
                "bytes": self.path.stat().st_size if self.path.is_file() else None,
                "error": self.error or None, "notes": self.notes,
                **({"task": {k: v["value"] for k, v in acc["task"]["figures"].items()}}
                   if acc.get("task") else {}),
                **({{"box mAP@0.5": "labelled_map50", "CER": "labelled_cer"}.get(
                    acc["labelled"].get("metric", ""), "labelled_top1"):
                    {k: acc["labelled"][k] for k in ("fp32", "candidate", "n")}}
                   if acc.get("labelled") else {}),
                **({"expected_drop": {k: v["value"] for k, v in acc["expected_drop"].items()}}
                   if acc.get("expected_drop") else {})}

    def line(self) -> str:
        if self.error:
            return f"{self.label}: {self.error}"
        failures = self.accuracy["budget"]["failures"]
        return (f"{self.label}: cosine min {self.accuracy['cosine_min']:.4f}, "
                f"{self.int8_nodes} INT8 ops, {self.boundaries} Q/DQ boundaries"
                + (f" - misses ({'; '.join(failures)})" if failures else " - within budget"))


class Search:
    """Quantize *fp32* many ways into *folder*; every variant is measured on *held*."""

    def __init__(self, fp32: Path, folder: Path, *, calib: Sequence[Sample],
                 held: Sequence[Sample], budget: AccuracyBudget,
                 labels: Sequence[Any] | None = None, log: Log = lambda _: None,
                 progress=None, reference: dict[str, Any] | None = None,
                 pays: Callable[[list["Candidate"]], str] | None = None,
                 steps: Progress | None = None, seconds: float | None = None,
                 whole: Sequence[Sample] | None = None):
        """*reference*: FP32's outputs on *held* when already computed. *pays*, given variants
        that miss the budget, times them against FP32 and returns why INT8 cannot pay ('' when
        it can): variants with more nodes in float will not be faster, so the search stops.
        *steps* shows each variant as it is built and measured (how many is not known ahead).
        *seconds*: no stage starts after it, no bisection probe after BISECT_SHARE x it.
        *whole*: the calibration set before it was thinned to fit onnxruntime's calibrator in
        memory: a generator that streams its statistics (NNCF) calibrates on all of it."""
        self.fp32, self.folder, self.calib, self.held = fp32, folder, calib, held
        self.whole = list(whole) if whole is not None and len(whole) > len(calib) else None
        self.budget, self.labels, self.log, self.progress = budget, labels, log, progress
        self.pays, self.steps = pays, steps or OFF
        self.steps.start("search", None)
        self.steps_since = self.steps.started
        self.candidates: list[Candidate] = []
        # FP32's outputs, once for every variant
        self.reference = run_model(fp32, held) if reference is None else reference
        self.source = hard_fused(fp32, folder, log)   # what static variants are quantized from
        self.graph = onnx.load(str(self.source), load_external_data=False).graph
        self.started = time.perf_counter()
        self.futile = ""   # why INT8 cannot pay, when the search stopped for that
        self.threads = 0   # the target's intra-op threads, for the profile of a futile search
        self.limit = SEARCH_SECONDS if seconds is None else float(seconds)
        self.histogram_cap: int | None = HISTOGRAM_SAMPLES   # None: every sample
        self._said: set[str] = set()   # notes logged once
        self.first_cost = 0.0   # seconds the first variant took to build and measure
        self.reference_ms: float | None = None   # FP32's p50 when *pays* timed it

    # -- building blocks -------------------------------------------------------------------

    def _cache(self, config: QuantConfig) -> Path | None:
        if config.mode != "static" or config.op_types:
            return self._full_cache(config) if config.mode == "static" else None
        return self.folder / f"ranges.{config.calibration_method}.json"

    def _full_cache(self, config: QuantConfig) -> Path | None:
        """A restricted-op variant may reuse ranges computed over all ops, never make them."""
        path = self.folder / f"ranges.{config.calibration_method}.json"
        return path if path.is_file() else None

    def variant(self, label: str, config: QuantConfig, bounded: bool = False) -> Candidate:
        """Quantize and measure one variant; quantizer failures are retried around the node.
        *bounded*: its calibration stops when it would end past the bisection's limit."""
        began = time.perf_counter()
        path = self.folder / f"variant_{len(self.candidates):02d}.onnx"
        cand = Candidate(label, config, path)
        self.show(label)
        for _ in range(RETRIES + 1):
            try:
                source = self.source if cand.config.mode == "static" else self.fp32
                quantize_file(source, path, config=cand.config,
                              samples=self._samples(cand.config),
                              progress=self.progress, cache=self._cache(cand.config),
                              deadline=self.started + self.limit * BISECT_SHARE
                              if bounded else None)
                break
            except OverTime as exc:
                cand.error = exc.message
                break
            except QuantizationError as exc:
                avoid = self._culprits(exc.message, cand.config)
                if not avoid:
                    cand.error = exc.message
                    break
                why = _first_line(exc.message.replace(f"{self.source}: ", "")
                                  .replace(f"{self.fp32}: ", ""))
                cand.notes.append(f"kept {', '.join(avoid)} in float: the quantizer failed "
                                  f"there ({why})")
                self.log(f"search: {label}: {cand.notes[-1]}")
                cand.config = replace(cand.config, exclude=cand.config.exclude + tuple(avoid))
        else:
            cand.error = f"quantization kept failing after {RETRIES} retries"
        if not cand.error:
            cand.int8_nodes, cand.boundaries = count_ops(path)
            cand.quantize_nodes = quantize_nodes(path)
            if cand.int8_nodes == 0:
                cand.error = "no heavy op is left in INT8, so it cannot be faster than FP32"
            else:
                cand.accuracy = self.budget.evaluate(path, self.fp32, self.held, self.labels,
                                                     self.reference)
        if not self.candidates:
            self.first_cost = time.perf_counter() - began
        self.candidates.append(cand)
        self.log(f"search: {cand.line()}")
        return cand

    def _samples(self, config: QuantConfig) -> Sequence[Sample]:
        """The calibration samples for *config*: a spread subset for the histogram methods."""
        if config.streams and self.whole:
            if "streams" not in self._said:
                self._said.add("streams")
                self.log(f"search: NNCF calibrates on all {len(self.whole)} calibration samples "
                         f"(it reduces each sample's statistics as it goes; onnxruntime's "
                         f"calibrator holds every tensor of every sample, so it takes "
                         f"{len(self.calib)})")
            return self.whole
        cap = self.histogram_cap
        if config.mode != "static" or config.calibration_method == "minmax" or cap is None or \
                len(self.calib) <= cap:
            return self.calib
        if "histogram" not in self._said:
            self._said.add("histogram")
            self.log(f"search: {config.calibration_method} ranges come from {cap} of the "
                     f"{len(self.calib)} calibration samples, evenly spread (onnxruntime's "
                     "histograms of every tensor cost about 10x a MinMax pass)")
        return [self.calib[i] for i in spread(len(self.calib), cap)]

    def over(self, what: str, needs: float = 0.0, end: float | None = None,
             own: bool = False) -> bool:
        """Whether the search is past its limit, or *needs* seconds more would end past *end*
        (default: the bisection's limit); says so once per *what* (what is left out). *own*:
        a stage with a window of its own (NNCF's, after onnxruntime's search): only *end*
        bounds it."""
        end = self.limit * BISECT_SHARE if end is None else end
        if (own or self.elapsed < self.limit) and self.elapsed + needs <= end:
            return False
        if what not in self._said:
            self._said.add(what)
            self.log(f"search: {what} not tried: " + (
                f"the search is at its {self.limit:.0f} s limit ({self.elapsed:.0f} s"
                if self.elapsed >= self.limit and not own else
                f"it would take about {needs:.0f} s more, past the search's "
                f"{end:.0f} s ({self.elapsed:.0f} s so far")
                + "; --search-seconds sets another)")
        return True

    def show(self, label: str) -> None:
        """Put the candidate now built on the *steps* line (after timing drew its own there)."""
        self.steps.start("search", None, done=len(self.candidates), since=self.steps_since)
        self.steps.step(label)

    def _culprits(self, message: str, config: QuantConfig) -> list[str]:
        """Node names (else all nodes of the op type) that a quantizer error points at."""
        excluded = set(config.exclude)
        pointed = re.findall(r"at (?:.*, )?node '([^']+)'", message)
        tensors = re.findall(r"tensor '([^']+)'", message)
        named = [n.name for n in self.graph.node if n.name and n.name not in excluded and
                 (n.name in pointed or set(n.input) & set(tensors))]
        if named:
            return named[:1]
        named = [n.name for n in self.graph.node if n.name and n.name not in excluded
                 and re.search(r"(?<![\w/.-])" + re.escape(n.name) + r"(?![\w/.-])", message)]
        if named:
            return [max(named, key=len)]
        op = re.search(r"Op \((\w+)\)|op_type[=: ]+'?(\w+)", message)
        op_type = op and (op.group(1) or op.group(2))
        return [n.name for n in self.graph.node if n.op_type == op_type and n.name
                and n.name not in excluded] if op_type else []

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def best(self) -> Candidate | None:
        """The most accurate variant that ran (budget first, then cosine)."""
        ran = [c for c in self.candidates if not c.error]
        return max(ran, key=_accuracy_key, default=None)

    @staticmethod
    def more_accurate(first: Candidate, second: Candidate) -> Candidate:
        """The more accurate of two variants (as best() ranks them; *first* on a tie or error)."""
        if second.error or (not first.error and _accuracy_key(first) >= _accuracy_key(second)):
            return first
        return second

    def found(self) -> bool:
        return any(c.passed for c in self.candidates)

    # -- the stages ------------------------------------------------------------------------

    def run(self, base: QuantConfig, pinned: set[str]) -> list[Candidate]:
        """Every stage that is needed; returns all variants tried. With *pays*, the structural
        variants that miss the budget are timed first (the later stages only move nodes back
        to float), and so is each bisection probe that misses it."""
        if base.calibration_method == "auto":
            pinned = pinned - {"calibration_method"}
        present = sorted({n.op_type for n in self.graph.node} & set(HEAVY_OPS))
        fast = dynamic_ops(self.graph)
        if base.mode == "dynamic" and "op_types" not in pinned and "Conv" in present and fast:
            base = replace(base, op_types=fast)   # no ConvInteger
        base, tail = as_preset(self.graph, base)
        if tail:
            self.log(f"search: {len(tail)} post-processing node{'s' if len(tail) > 1 else ''} "
                     f"after the last heavy op stay FP32 ({', '.join(tail[:3])}"
                     f"{', ...' if len(tail) > 3 else ''})")
        preset = self.variant("INT8 preset", base)
        # dynamic: one cheap variant more, and a preset within budget may still be saturated
        # here while the device (ARM, or x86 with VNNI) is not: its outputs would not reproduce
        if saturates(base) and "reduce_range" not in pinned and (
                base.mode == "dynamic" or not self.found()):
            narrow = self.variant("INT8 7-bit weights", replace(base, reduce_range=True))
            if narrow.accuracy and (not preset.accuracy or narrow.accuracy["cosine_min"] >
                                    preset.accuracy["cosine_min"]):
                base = narrow.config   # the structures below start from the better kernel
        if "op_types" not in pinned and present and base.mode == "static":
            floor = boundary_floor(self.graph)
            if preset.passed and preset.quantize_nodes <= floor:   # it could only tie or lose
                self.log(f"search: INT8 heavy ops only not built: it quantizes at least {floor} "
                         f"tensors, the preset {preset.quantize_nodes}")
            else:
                self.variant("INT8 heavy ops only", replace(base, op_types=tuple(present)))
        if not self.found() and self.pays is not None and base.mode == "static":
            self.futile = self.pays([c for c in self.candidates if not c.error])
            if self.futile:
                self.log(f"search: stopped: {self.futile}")
                self.explain()
                return self.candidates
        if not self.found() and "exclude" not in pinned:
            self._edges(base)
        if "calibration_method" in pinned:
            self.histogram_cap = None   # the user's method, on all their samples
        if not self.found() and base.mode == "static" and \
                not self.over("other calibration methods"):
            self._calibration(pinned)
        if not self.found() and not self.over("the sensitivity bisection",
                                              BISECT_COST * self.first_cost):
            self.bisect()
        return self.candidates

    def explain(self) -> None:
        """Log where the fastest timed INT8 variant loses its time against FP32 (one line)."""
        from ..timing import machine
        from .profile import losses, profile_pair

        timed = [c for c in self.candidates if c.p50_ms and not c.error]
        if not timed or not self.held:
            return
        fastest = min(timed, key=lambda c: c.p50_ms)
        try:
            pair = profile_pair(self.fp32, fastest.path, self.held[0], threads=self.threads,
                                runs=10)
        except QuantizationError as exc:   # a graph the profiler cannot load: no profile
            self.log(f"search: no profile of {fastest.label}: {exc.message}")
            return
        here = machine()   # the host: with --time-on the device may differ, and says so
        self.log(f"search: {fastest.label}: {losses(*pair)} (profiled on {here['cpu']}, "
                 f"{' '.join(here['flags']) or 'no VNNI/AMX flags'})")

    def _edges(self, base: QuantConfig) -> None:
        heavy = [n.name for n in heavy_nodes(self.source) if n.name]
        edges = tuple(dict.fromkeys(heavy[:1] + last_layers(self.graph)))
        if edges and len(heavy) > len(edges):
            shape = self.best().config if self.best() else base
            self.variant("INT8, first and last layers FP32",
                         replace(shape, exclude=tuple(dict.fromkeys(shape.exclude + edges))))

    def _calibration(self, pinned: set[str]) -> None:
        shape = self.best()
        if shape is None:
            return
        if "calibration_method" not in pinned:
            for method in METHODS:
                if method == "entropy" and not entropy_differs():
                    continue
                if method != shape.config.calibration_method and not self.found():
                    self.variant(f"INT8 {method} calibration",
                                 replace(shape.config, calibration_method=method), bounded=True)
        if "per_channel" not in pinned and not self.found():
            shape = self.best()
            flip = not shape.config.per_channel
            self.variant(f"INT8 {'per-channel' if flip else 'per-tensor'} weights",
                         replace(shape.config, per_channel=flip))

    def _keep(self, start: Candidate, order: Sequence[str], k: int) -> Candidate:
        who = " NNCF" if start.config.generator == "nncf" else ""
        return self.variant(f"INT8{who}, {k} most sensitive node{'s' if k > 1 else ''} FP32",
                            replace(start.config, exclude=tuple(
                                dict.fromkeys(start.config.exclude + tuple(order[:k])))))

    def int8_share(self, start: Candidate, order: Sequence[str], k: int) -> float:
        """The share of the graph's heavy multiply-adds left in INT8 with *order*[:k] kept FP32
        too (1.0 where some heavy op's size is unknown: no bound then)."""
        cost = macs(self.graph)
        if not cost or any(c is None for c in cost.values()):
            return 1.0
        nodes = list(self.graph.node)
        excluded = set(start.config.exclude) | set(order[:k])
        kinds = set(start.config.op_types) if start.config.op_types else None
        total = sum(cost.values()) or 1
        left = sum(c for i, c in cost.items() if nodes[i].name not in excluded and
                   (kinds is None or nodes[i].op_type in kinds))
        return left / total

    def ranking(self, cand: Candidate) -> list[str]:
        """Quantized nodes of *cand*, the ones that add most error first."""
        probe = worst_samples(self.fp32, cand.path, self.held, PROBE_SAMPLES)
        rows = layer_errors(self.source, cand.path, probe)
        order: list[str] = []
        for row in rows:
            if row["damage"] <= 1e-4:
                break
            for name in [row.get("exclude")] + list(row.get("feeders", [])):
                if name and name not in order and name not in cand.config.exclude:
                    order.append(name)
        rest = [n for n in quantized_nodes(cand.path) if n not in order
                and n not in cand.config.exclude]
        return order + sorted(rest)

    def bisect(self, start: Candidate | None = None, timed: bool = True,
               until: float | None = None) -> Candidate | None:
        """Keep the k worst nodes of *start* (default: the most accurate variant) FP32; find
        the smallest k. *timed*: probes that miss are timed on the CPU provider to stop when
        more float cannot pay (not for a graph made for another provider). *until*: no probe
        starts after it (seconds into the search; default BISECT_SHARE x its limit)."""
        until = self.limit * BISECT_SHARE if until is None else until
        start = start or self.best()
        if start is None or start.error or not start.accuracy:
            return None
        order = self.ranking(start)
        if not order:
            return None
        self.log(f"search: bisecting over {len(order)} ranked nodes of '{start.label}' "
                 f"(worst: {', '.join(order[:3])})")
        lo, hi, found = 0, len(order), None   # k=lo misses the budget; k=hi is untested
        paid: tuple[float, float] | None = None   # (INT8 share, gain) of the last timed miss
        while lo + 1 < hi:
            if self.elapsed > until:
                self.log(f"search: bisection stopped after {self.elapsed:.0f} s with k between "
                         f"{lo} and {hi} of {len(order)} nodes (--search-seconds sets the "
                         "limit)")
                break
            k = (lo + hi) // 2
            share = self.int8_share(start, order, k)
            if share < MIN_INT8_SHARE:   # it cannot be 5% faster whatever its INT8 kernels do
                self.log(f"search: INT8, {k} most sensitive nodes FP32 not built: "
                         f"{100 * share:.1f}% of the multiply-adds left in INT8")
                hi = k
                continue
            cand = self._keep(start, order, k)
            if cand.passed:
                hi, found = k, cand
            elif cand.error:   # nothing left in INT8: fewer nodes, then
                hi = k
            else:
                lo = k
                # more nodes in float will not be faster than this one, which misses
                why = ""
                if self.pays is not None and timed and lo + 1 < hi:
                    guess = predicted_gain(paid, share)
                    if guess is not None and guess >= MIN_GAIN * PREDICT_MARGIN:
                        self.log(f"search: {cand.label} not timed: the last timed probe "
                                 f"predicts {guess:.2f}x FP32 with {100 * share:.0f}% of the "
                                 "multiply-adds in INT8")
                    else:
                        why = self.pays([cand])
                        if not why and cand.p50_ms and self.reference_ms:
                            paid = (share, self.reference_ms / cand.p50_ms)
                if why:
                    self.futile = (f"{why}; it misses the budget, and keeping more nodes FP32 "
                                   "will not make it faster")
                    self.log(f"search: stopped: {self.futile}")
                    self.explain()
                    break
        if found is None and hi == len(order) and not self.futile and \
                self.elapsed <= until and \
                self.int8_share(start, order, hi) >= MIN_INT8_SHARE:
            cand = self._keep(start, order, hi)
            found = cand if cand.passed else None
        return found


def _accuracy_key(cand: Candidate) -> tuple[bool, float, float]:
    """Budget first, then the smaller drop, then the higher cosine (a NaN ranks last)."""
    drop, cosine = cand.accuracy.get("drop", 0.0), cand.accuracy["cosine_min"]
    return (cand.passed, -drop if math.isfinite(drop) else -math.inf,
            cosine if math.isfinite(cosine) else -math.inf)


def best_of_each_generator(ranked: Sequence[Candidate]) -> list[Candidate]:
    """The first of *ranked* from each generator (onnxruntime's, NNCF's), in *ranked*'s order:
    the providers differ on which generator's graph is best."""
    firsts: dict[str, Candidate] = {}
    for cand in ranked:
        firsts.setdefault(cand.config.generator, cand)
    return list(firsts.values())


def predicted_gain(paid: tuple[float, float] | None, share: float) -> float | None:
    """FP32's time over a variant's with *share* of the multiply-adds in INT8, from a timed one
    (*paid*: its share and gain), the INT8 part's saving taken as proportional to its
    multiply-adds; None without a timed one or when shares are unknown (1.0)."""
    if paid is None or paid[0] <= 0 or paid[0] >= 1.0 or share >= 1.0 or paid[1] <= 1.0:
        return None
    saving = (1.0 - 1.0 / paid[1]) / paid[0]   # of FP32's time, per unit of INT8 share
    left = 1.0 - saving * share
    return 1.0 / left if left > 0 else None


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:160]
