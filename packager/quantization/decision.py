"""The precision decision: ship the fastest candidate that keeps the accuracy budget.

Candidates: FP32 (onnxruntime optimises it at load, as it will on the device), the INT8
variants of the search (search.py), dynamic INT8, and FP16 on GPU targets. Each is measured on
held-out samples; those within budget are timed with the target's threads, here or on the device
(`--time-on`). INT8 ships only when it is within budget and measurably faster than FP32, so a
model onnxruntime runs always gets a bundle, never slower or less accurate than it says.
"""

import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from .._runtimes.runner.load import noise
from .._runtimes.runner.sessions import GPU_PROVIDERS
from ..errors import BudgetMissed, SpecError
from ..graph.execute import Sample, run_model
from ..graph.quantized import quantized_ops, quantized_summary
from ..progress import OFF, Log, Progress
from ..targets import Target
from ..timing import SETTLE, calls_per_block, machine, session, time_blocks
from . import kfold
from .advice import NOT_CROSS_CHECKED, what_to_try
from .budget import AccuracyBudget
from .kfold import Evidence
from .quantize import QuantConfig, quantize_file
from .request import QuantRequest
from .search import MIN_GAIN, Candidate, Search, dynamic_ops

SAME_SPEED = 1.03  # candidates this close in p50 count as equally fast: fewer Q/DQ boundaries win
# On a busy machine (runner/load.py: others use a quarter of the cores, or p90 > 1.5x p10) INT8
# must be this much faster to ship: a speech-quality model shipped INT8 in one busy build and
# FP32 in the next, its gain inside the noise
NOISY_GAIN = 1.2
MIN_HELD = 4      # fewer held-out samples cannot tell a good INT8 variant from a bad one
FEW_HELD = 16     # below this the accuracy figure is rough, and the build says so
MAX_TIMED = 6     # INT8 variants timed against FP32 (the most quantized first)


@dataclass(frozen=True)
class Decision:
    candidate: Candidate
    record: dict[str, Any]
    candidates: tuple[Candidate, ...] = ()   # all that were built (provider graphs reuse FP16)
    # the k-fold rotation that judged them, where the held-out split was thin: another provider
    # judges its graphs on the same folds (build/provider_choice.py)
    rotation: kfold.Rotation | None = None

    @property
    def config(self) -> QuantConfig:
        return self.candidate.config


def _runner(sess: Any, feed: Sample) -> Callable[[], Any]:
    return lambda: sess.run(None, feed)


# Times models: (paths, feed, threads, rounds, block) -> ({path: {"p50", "p90"}}, device info)
Timer = Callable[[Sequence[Path], Sample, int, int, int], tuple[dict[str, dict], dict[str, Any]]]


def local_timer(paths: Sequence[Path], feed: Sample, threads: int, rounds: int,
                block: int, *, labels: Sequence[str] = (), steps: Progress | None = None
                ) -> tuple[dict[str, dict], dict[str, Any]]:
    """*labels* name the models on the *steps* line (paths when they are not unique)."""
    keys = list(labels) if len(set(labels)) == len(paths) else [str(p) for p in paths]
    runs = {k: _runner(session(p, threads), feed) for k, p in zip(keys, paths, strict=True)}
    times = time_blocks(runs, rounds=rounds, block=block, steps=steps, settle=SETTLE)
    return {str(p): times[k] for k, p in zip(keys, paths, strict=True)}, machine()


def timing_place(target: Target, timer: Any) -> str:
    """Why latency can (or cannot) be measured for this target: '' when it can."""
    if timer is not None:
        return ""
    if any(p.name in GPU_PROVIDERS for p in target.providers):
        return (f"{target.name} runs on a GPU and this host's CPU timings say nothing about it; "
                "pass --time-on HOST to time the candidates on the device")
    if target.arch != platform.machine():
        return (f"{target.name} is {target.arch} and this host {platform.machine()}; pass "
                "--time-on HOST to time the candidates on the device")
    return ""


def requested_precision(asked: str | None, preset: Any) -> str:
    """The precision a part asks for, decided once (the build's plan and decide() read it):
    int8, fp16 or fp32 when --precision forces one; else the target preset's own FP32 or FP16
    (TensorRT builds FP16 itself); else auto."""
    if asked in ("int8", "fp16", "fp32"):
        return asked
    return preset.precision if preset.precision in ("fp32", "fp16") else "auto"


def decide(fp32: Path, folder: Path, *, target: Target, family: str,
           request: QuantRequest | Mapping[str, Any], calib: Sequence[Sample],
           held: Sequence[Sample],
           budget: AccuracyBudget, labels: Sequence[Any] | None = None, timer: Any = None,
           log: Log = lambda _: None, progress=None,
           fp32_outputs: dict[str, Any] | None = None,
           steps: Progress | None = None,
           provider_pays: Callable[[list[Candidate]], str] | None = None,
           require_proof: bool = False, whole: Sequence[Sample] | None = None) -> Decision:
    """Build the candidates for *fp32*, measure them, and pick the one to ship. *request*: the
    user's quantization options (QuantRequest: its precision forces one, missing the budget is
    then an error; the others pin those fields of the search). *fp32_outputs*: FP32's on *held*, when
    known. *steps*: each candidate and timing block shown. *provider_pays*
    (build/provider_choice.py): whether INT8 pays under another provider (OpenVINO) where it
    does not on the CPU provider; then the search goes on for a variant within budget.
    *require_proof*: INT8 ships only where the samples could show its budget (else FP32, as a
    CI gate wants); by default the fastest within budget ships and its evidence is said.
    *whole*: the calibration set before it was thinned to fit memory (*calib*): see _pool."""
    steps = steps or OFF
    started = time.perf_counter()
    request = QuantRequest.of(request)
    preset = target.preset_for(family)
    requested = requested_precision(request.precision, preset)
    base = QuantConfig.from_preset(preset, **request.config_fields())
    forced = requested if requested != "auto" else None
    if fp32_outputs is None:
        fp32_outputs = run_model(fp32, held)
    given = quantized_ops(onnx.load(str(fp32), load_external_data=False).graph)
    if given:
        return _as_given(fp32, given, base, forced, budget, held, labels, fp32_outputs,
                         started, log)
    reference = Candidate("FP32", replace(base, precision="fp32"), fp32,
                          budget.evaluate(fp32, fp32, held, labels, fp32_outputs))
    candidates = [reference]
    if forced in ("fp32", "fp16"):
        chosen = reference if forced == "fp32" else _fp16(fp32, folder, base, held, budget,
                                                          labels, candidates, fp32_outputs)
        _check_forced(forced, [chosen] if chosen.passed else [], chosen.line(), budget)
        return _record(chosen, reference, candidates, f"{forced.upper()}: "
                       f"{request.why or 'asked for'}", forced, budget, held, started, {}, log)
    why_not = timing_place(target, timer)
    threads = int(target.session.get("intra_op_threads", 0))
    pays = Pays(forced, why_not, held, reference, fp32, threads, timer, steps, provider_pays, log)
    search = Search(fp32, folder, calib=calib, held=held, budget=budget, labels=labels, log=log,
                    progress=progress, reference=fp32_outputs, pays=pays, steps=steps,
                    seconds=request.search_seconds, whole=whole)
    pays.search = search
    base = _search_int8(search, base, request, forced, preset, target, family,
                        bool(calib), provider_pays, log)
    candidates += search.candidates
    if not forced and any(p.name in GPU_PROVIDERS for p in target.providers):
        search.show("FP16")
        _fp16(fp32, folder, base, held, budget, labels, candidates, fp32_outputs)
    steps.finish()
    passing = [c for c in candidates[1:] if c.passed]
    if forced == "int8":
        best = search.best()
        _check_forced(forced, passing, f"best of {len(search.candidates)} INT8 variants was "
                      f"{best.line() if best else 'none ran'}", budget)
    passing, evidence, unsure, rotation = _evidence(
        passing, _pool(calib, whole, held), held, bool(forced), fp32, folder, search, budget,
        labels, log, require_proof, keep=provider_pays is not None, cap=len(calib))

    def record(chosen: Candidate, reason: str, timing: dict[str, Any],
               asked: str = "auto") -> Decision:
        return replace(_record(chosen, reference, candidates, reason, asked, budget, held,
                               started, timing, log, evidence), rotation=rotation)

    if unsure:
        return record(reference, unsure, {})
    if not passing and search.futile:
        return record(reference, f"FP32: {search.futile}",
                      {"measured": True, "threads": threads, **pays.measured})
    if not passing:
        return record(reference, _none_kept(candidates, budget, fp32, held, fp32_outputs), {})
    ranked = _ranked(passing)
    if why_not:
        return record(*_untimed(ranked[0], target, why_not), forced or "auto")
    return record(*_timed(ranked, reference, fp32, held, threads, timer, steps, forced, log),
                  forced or "auto")


def _none_kept(candidates: list[Candidate], budget: AccuracyBudget, fp32: Path,
               held: Sequence[Sample], fp32_outputs: dict[str, Any]) -> str:
    """Why FP32 ships when no INT8 variant kept the budget, and what to try."""
    advice = what_to_try(candidates[1:], budget, fp32, held, fp32_outputs)
    tried = [c for c in candidates[1:] if c.accuracy]
    if not tried:   # each one's line says why it was not built
        return ("FP32: no INT8 variant could be built (" + "; ".join(
            c.line() for c in candidates[1:3]) + (" ..." if len(candidates) > 3 else "") + ")"
            + (f". To try: {advice}" if advice else ""))
    closest = max(tried, key=lambda c: _cosine(c))   # the search's lines above list them all
    return (f"FP32: none of {len(tried)} INT8 variant{'s' if len(tried) > 1 else ''} kept the "
            f"budget (the closest: {closest.line()})" + (f". To try: {advice}" if advice else ""))


def _cosine(cand: Candidate) -> float:
    value = cand.accuracy.get("cosine_min")
    return value if isinstance(value, float) and value == value else -2.0


def _check_forced(forced: str, passing: list[Candidate], best: str,
                  budget: AccuracyBudget) -> None:
    """BudgetMissed when --precision *forced* has nothing within budget (*best*: its figure)."""
    if passing:
        return
    if forced == "int8":
        raise BudgetMissed(
            f"--precision int8 misses the accuracy budget ({budget.describe()}): {best}",
            "drop --precision to ship the best precision within budget (FP32 if nothing "
            "else), or loosen --min-cosine")
    raise BudgetMissed(f"--precision {forced} misses the accuracy budget: {best}",
                       "drop --precision to let build decide")


class Pays:
    """The search's question once its variants with the most INT8 miss the budget: do they
    pay at all? '' unless they are still not MIN_GAIN faster than FP32 (then moving nodes back
    to float will not make them faster, and the reason says why INT8 stays out)."""

    def __init__(self, forced, why_not, held, reference, fp32, threads, timer, steps,
                 provider_pays, log):
        self.forced, self.why_not, self.held, self.reference = forced, why_not, held, reference
        self.fp32, self.threads, self.timer, self.steps = fp32, threads, timer, steps
        self.provider_pays, self.log = provider_pays, log
        self.search: Search | None = None   # set once the search exists (it asks this)
        self.measured: dict[str, Any] = {}

    def __call__(self, structural: list[Candidate]) -> str:
        reference = self.reference
        if self.forced or self.why_not or not structural or len(self.held) < MIN_HELD:
            return ""
        timed = frontier(structural)   # a variant another beats in ops and boundaries is slower
        self.measured["measured_on"], _ = _time([reference] + timed, self.fp32, self.held,
                                                self.threads, self.timer, self.steps)
        self.search.reference_ms = reference.p50_ms
        fastest = min(timed, key=lambda c: c.p50_ms)
        if reference.p50_ms / fastest.p50_ms >= MIN_GAIN:
            return ""
        elsewhere = self.provider_pays(structural) if self.provider_pays is not None else ""
        if elsewhere:
            self.log(f"search: INT8 does not pay on the CPU provider, but {elsewhere}: "
                     "searching on")
            return ""
        why = (f"INT8 cannot pay on this CPU: {fastest.label} ({fastest.int8_nodes} ops in "
               f"INT8) runs {fastest.p50_ms:.3f} ms p50 against FP32's "
               f"{reference.p50_ms:.3f} ms, short of {100 * (MIN_GAIN - 1):.0f}% faster")
        # a faster variant timed earlier (the preset) that paid but missed the budget is the
        # real story: the budget, not the CPU, keeps INT8 out
        paid = [c for c in self.search.candidates if c.p50_ms and not c.passed and not c.error
                and reference.p50_ms / c.p50_ms >= MIN_GAIN]
        if paid:
            best = min(paid, key=lambda c: c.p50_ms)
            failures = "; ".join(best.accuracy["budget"]["failures"])
            why = (f"the INT8 that pays misses the budget: {best.label} runs "
                   f"{reference.p50_ms / best.p50_ms:.2f}x FP32's speed ({best.p50_ms:.3f} vs "
                   f"{reference.p50_ms:.3f} ms p50) but {failures}; keeping nodes FP32 to "
                   f"meet it costs the gain: " + why.replace("INT8 cannot pay on this CPU: ", ""))
        return why


def _search_int8(search: Search, base: QuantConfig, request: QuantRequest, forced: str | None,
                 preset: Any, target: Target, family: str, static_ok: bool, provider_pays: Any,
                 log: Log) -> QuantConfig:
    """The INT8 variants: onnxruntime's search from the preset, dynamic INT8 where static
    found nothing, the target's static preset beside a family's dynamic one, and NNCF's.
    Returns the base config they started from (dynamic where there is no calibration data)."""
    if base.mode == "static" and not static_ok:
        base = replace(base, mode="dynamic")   # no calibration data: dynamic ranges only
        log("search: no calibration data, so INT8 candidates are dynamic")
    pinned = request.pinned()
    search.run(replace(base, precision="int8"), pinned)
    fast = dynamic_ops(search.graph)   # dynamic INT8 of a Conv is slower than float
    if not forced and base.mode == "static" and "mode" not in pinned and not search.found() \
            and not search.futile and fast:   # (and dynamic is slower than static anyway)
        search.variant("INT8 dynamic", replace(
            base, precision="int8", mode="dynamic",
            op_types=base.op_types if "op_types" in pinned else fast))
    if (forced != "int8" and base.mode == "dynamic" and static_ok and "mode" not in pinned
            and preset is not target.quantization and target.quantization.mode == "static"
            and not search.over("INT8 static (the target's default preset)",
                                2 * search.first_cost, search.limit)):   # (~2 variants)
        # a family preset chose dynamic (transformers): the target's static preset is still
        # measured, since which wins depends on the model and the onnxruntime version
        search.variant("INT8 static (target's default preset)", QuantConfig.from_preset(
            target.quantization, **request.config_fields(), precision="int8"))
    # NNCF's graphs are made for OpenVINO: tried where the target lists it (not where a GPU
    # preset asks for TensorRT's symmetric S8 and float biases), and where INT8 may pay
    if target.faster and not any(p.name in GPU_PROVIDERS for p in target.providers) and \
            not (search.futile and provider_pays is None) and \
            not ("mode" in pinned and base.mode != "static"):   # (--mode dynamic: none)
        nncf_variant(search, base, family, log)
    return base


def _ranked(passing: list[Candidate]) -> list[Candidate]:
    """The variants within budget worth timing, the most INT8 first: one with no more ops in
    INT8 and no fewer Q/DQ boundaries than another is not timed; of equal structure, the more
    accurate first (untimed, it is the one shipped)."""
    useful = [c for c in passing if not any(
        d is not c and d.int8_nodes >= c.int8_nodes and d.boundaries <= c.boundaries and
        (d.int8_nodes, -d.boundaries) != (c.int8_nodes, -c.boundaries) for d in passing)]
    return sorted(useful, key=lambda c: (-c.int8_nodes, c.boundaries,
                                         -c.accuracy.get("cosine_min", 0.0)))[:MAX_TIMED]


def _untimed(chosen: Candidate, target: Target, why_not: str
             ) -> tuple[Candidate, str, dict[str, Any]]:
    """Where latency cannot be measured: the variant with the most INT8 within budget, and
    the reason (what is known of a GPU target's providers decides)."""
    gpu = any(p.name in GPU_PROVIDERS for p in target.providers)
    if gpu:
        floats = sorted({p.instead_of_int8.upper() for p in target.providers
                         if p.instead_of_int8})
        reason = (f"{chosen.label}: within budget with the most ops in INT8, from what is "
                  "known of the target's providers (TensorRT runs a QDQ graph in INT8"
                  + (f"; {', '.join(floats)} graphs serve the providers that do not"
                     if floats else "") + f"); not timed on the target: {why_not}")
    else:
        reason = (f"{chosen.label}: within budget with the most ops in INT8; latency not "
                  f"measured ({why_not})")
    return chosen, reason, {"measured": False, "why": why_not,
                            "basis": "providers" if gpu else "ops"}


def _timed(ranked: list[Candidate], reference: Candidate, fp32: Path, held: Sequence[Sample],
           threads: int, timer: Any, steps: Progress, forced: str | None, log: Log
           ) -> tuple[Candidate, str, dict[str, Any]]:
    """FP32 and the ranked variants timed interleaved: the fastest (fewest boundaries among
    equally fast) ships when it is MIN_GAIN faster than FP32 beyond the machine's noise."""
    log(f"search: timing FP32 and {len(ranked)} INT8 candidates within budget, interleaved")
    where, noisy = _time([reference] + ranked, fp32, held, threads, timer, steps)
    timing = {"measured": True, "threads": threads, "measured_on": where, "noisy": noisy}
    fastest = min(c.p50_ms for c in ranked)
    chosen = min((c for c in ranked if c.p50_ms <= fastest * SAME_SPEED),
                 key=lambda c: (c.boundaries, c.p50_ms))
    gain = reference.p50_ms / chosen.p50_ms
    if noisy:
        log(f"warning: the candidates were timed on a busy machine ({noisy}): INT8 ships only "
            f"{NOISY_GAIN:.2f}x faster than FP32 or more; build on a quiet machine for the "
            "closer calls")
    if gain < MIN_GAIN and not forced:
        reason = (f"FP32: the fastest INT8 within budget ({chosen.label}, {chosen.p50_ms:.3f} ms "
                  f"p50) is not {100 * (MIN_GAIN - 1):.0f}% faster than FP32 "
                  f"({reference.p50_ms:.3f} ms)")
        chosen = reference
    elif within_noise(gain, noisy) and not forced:   # the safer one
        reason = (f"FP32: {chosen.label} timed {gain:.2f}x FP32's speed ({chosen.p50_ms:.3f} vs "
                  f"{reference.p50_ms:.3f} ms p50), within a busy machine's noise ({noisy}); "
                  "the exact FP32 ships")
        chosen = reference
    else:
        reason = (f"{chosen.label}: {gain:.2f}x FP32's speed ({chosen.p50_ms:.3f} vs "
                  f"{reference.p50_ms:.3f} ms p50) at cosine {chosen.accuracy['cosine_min']:.4f}"
                  + (f", {chosen.accuracy['labelled']['text']}" if chosen.accuracy.get("labelled")
                     else f", {chosen.accuracy['task']['text']}" if chosen.accuracy.get("task")
                     else ""))
        if gain < 1.0:
            log(f"warning: --precision int8 is slower than FP32 here ({chosen.p50_ms:.3f} vs "
                f"{reference.p50_ms:.3f} ms p50); without --precision, build ships FP32")
    if isinstance(where, dict) and where.get("host"):
        reason += (f"; timed on {where['host']}"
                   + (f" under {', '.join(where['providers'])}" if where.get("providers") else ""))
    return chosen, reason, timing


NNCF_SHARE = 1.5   # NNCF's window after onnxruntime's search, in units of the search's limit


def nncf_variant(search: Search, base: QuantConfig, family: str, log: Log) -> Candidate | None:
    """NNCF's INT8 of the same graph, beside onnxruntime's variants (nncf_generator.py): its
    own Q/DQ placement, ranges and bias correction; the head's post-processing stays float as
    in the preset. Built after the search, whatever it found: on the CPU provider it is often
    slower than onnxruntime's INT8, under OpenVINO often the fastest graph within budget, and
    the provider choice times it there."""
    from .graph_facts import post_processing
    from .nncf_generator import unavailable

    if not search.calib:
        return None
    why = unavailable()
    if why:
        log(f"search: NNCF's INT8 not tried: {why}")
        return None
    # a window of its own, NNCF_SHARE x onnxruntime's limit: however long that search ran (a
    # bisection over 111 nodes of the OCR detector took all of 60 s), the generator whose
    # graphs OpenVINO fuses still gets its turn, bisection included (4-6 probes)
    started = search.elapsed
    window = started + NNCF_SHARE * search.limit
    tail = tuple(post_processing(search.graph))
    # static whatever the family's preset chose (a transformer's is dynamic INT8): NNCF's
    # graphs are static QDQ, SmoothQuant for transformers (PP-OCRv4 rec, an SVTR: none was
    # made, and OpenVINO ran its FP32)
    config = replace(base, mode="static", generator="nncf", transformer=family == "transformer",
                     exclude=tuple(dict.fromkeys(base.exclude + tail)))
    made = search.variant("INT8 NNCF", config)
    cost = search.elapsed - started   # one NNCF graph, built and judged
    if not made.passed and not search.over("NNCF's min-max ranges", cost, window, own=True):
        # which range estimator keeps a model is the model's: measured, never assumed
        # (min-max: orientation 0.93 -> 0.96, ocr-cls 0.65 -> 0.86; magika 0.86 -> 0.09 mean)
        other = search.variant("INT8 NNCF, min-max ranges", replace(config, nncf_ranges="minmax"))
        made = search.more_accurate(made, other)
    # (room for two probes at least: a bisection cut short still keeps what it found)
    if made.passed or made.error or search.over("NNCF's sensitivity bisection",
                                                2 * cost, window, own=True):
        return made
    # its most damaging quantizers back to float, as the search does for onnxruntime's
    return search.bisect(made, timed=False, until=window) or made


def _pool(calib: Sequence[Sample], whole: Sequence[Sample] | None, held: Sequence[Sample]
          ) -> list[Sample]:
    """Every sample a rotation may judge on: the calibration set before it was thinned to fit
    memory (*whole*) where there was one, and the held-out split; none without calibration."""
    if not calib:
        return []
    return [*(whole if whole is not None and len(whole) > len(calib) else calib), *held]


def _evidence(passing: list[Candidate], pool: list[Sample], held: Sequence[Sample],
              forced: bool, fp32: Path, folder: Path, search: Search, budget: AccuracyBudget,
              labels: Any, log: Log, require_proof: bool = False, keep: bool = False,
              cap: int | None = None
              ) -> tuple[list[Candidate], Evidence, str, kfold.Rotation | None]:
    """The candidates within budget on every sample there is (rotated over *pool* when the
    held-out split is too thin), what judged them, why FP32 ships ('' when INT8 may: a
    forced precision is never stopped here) and the rotation (None where the held-out split
    judged). Thin evidence is said, not turned into FP32, unless *require_proof* (then only
    the candidates the count could show ship). *keep*: the fold graphs are kept for another
    provider; *cap*: the most samples one fold's calibration holds (the build's calibration
    set, where the pool is larger than it and the held-out split)."""
    evidence, rotation = Evidence("held-out", len(held)), None
    # under FEW_HELD held-out samples the rotation judges, however many boxes or characters
    # they hold: a text detector's 10 held-out images held 69 boxes, 95.6 % kept (enough
    # boxes to show 95 %), and on 13 unseen images the same graph kept 88 % (boxes of one
    # image move together: the image is the unit that varies)
    if kfold.wanted(len(held), len(pool), passing, FEW_HELD, budget, labels):
        judged = list(passing)
        passing, rotation = _cross_check(passing, pool, fp32, folder, search, budget, log, keep,
                                         cap if cap and len(pool) > cap + len(held) else None)
        evidence = rotation.evidence
        if forced:   # --precision int8 is judged as the default build judges it
            _check_forced("int8", passing, f"on {evidence.words()}, {judged[0].line()}", budget)
    if forced:   # a forced precision ships with its evidence said, never turned into FP32
        return passing, evidence, "", rotation
    if evidence.samples < MIN_HELD:
        return passing, evidence, (
            f"FP32: {evidence.samples} samples are too few to decide whether INT8 keeps the "
            f"budget (need {MIN_HELD}); give more --calib samples"), rotation
    if not require_proof:
        return passing, evidence, "", rotation
    proven = [c for c in passing if kfold.shown(c.accuracy)]
    if passing and not proven:
        return passing, evidence, (
            f"FP32: INT8 not proven (--require-proof): {passing[0].label} misses nothing on "
            f"{evidence.words()}, but {_unshown(passing[0])}; give more --calib samples to "
            "prove it, or drop --require-proof to ship it with its evidence said"), rotation
    return proven, evidence, "", rotation


def _cross_check(passing: list[Candidate], pool: list[Sample], fp32: Path, folder: Path,
                 search: Search, budget: AccuracyBudget, log: Log, keep: bool,
                 cap: int | None) -> tuple[list[Candidate], kfold.Rotation]:
    """The candidates within budget judged again by k-fold rotation over every sample."""
    rotation = kfold.Rotation(fp32, pool, cap=cap,
                              states=budget.states if budget.streams else ())
    log(f"search: the held-out split is too thin to decide; judging on "
        f"{rotation.evidence.words()}")
    kept = kfold.confirm(passing, rotation, folder=folder, budget=budget, log=log,
                         source=lambda c: search.source if c.config.mode == "static" else fp32,
                         histogram_cap=search.histogram_cap, keep=keep)
    for cand in passing:   # not cross-checked: the thin split alone proves nothing
        if cand.accuracy.get("evidence") is None:
            budget_record = cand.accuracy["budget"]
            cand.accuracy["budget"] = {**budget_record, "passed": False, "failures": [
                f"{NOT_CROSS_CHECKED} (the held-out split alone is too thin to prove it)"]}
    return kept, rotation


def _unshown(cand: Candidate) -> str:
    """What the candidate's figures could not show, in the figures' own words."""
    return "; ".join(f["text"] for f in kfold.unshown_figures(cand.accuracy))


def frontier(cands: Sequence[Candidate]) -> list[Candidate]:
    """The variants no other beats in structure (as many INT8 ops or more, as few Q/DQ
    boundaries or fewer), one of each structure (7-bit weights run the same kernels): the only
    ones that can be the fastest (MiniLM's three structural misses timed as one)."""
    seen: set[tuple[int, int]] = set()
    kept = []
    for c in cands:
        shape = (c.int8_nodes, c.boundaries)
        if shape in seen or any(d.int8_nodes >= c.int8_nodes and d.boundaries <= c.boundaries
                                and (d.int8_nodes, d.boundaries) != shape for d in cands):
            continue
        seen.add(shape)
        kept.append(c)
    return kept


def within_noise(gain: float, noisy: str) -> bool:
    """Whether a gain timed on a busy machine (*noisy*: why) is too small to trust."""
    return bool(noisy) and gain < NOISY_GAIN


def _time(timed: Sequence[Candidate], fp32: Path, held: Sequence[Sample], threads: int,
          timer: Any, steps: Progress) -> tuple[Any, str]:
    """Time *timed* interleaved (here or with *timer*); sets their p50/p90, returns where and
    why the figures are noisy ('' when they are not: runner/load.py's measure)."""
    rounds, block = plan_timing(fp32, held[0], threads)
    paths = [c.path for c in timed]
    times, where = (timer(paths, held[0], threads, rounds, block) if timer else
                    local_timer(paths, held[0], threads, rounds, block,
                                labels=[c.label for c in timed], steps=steps))
    for c in timed:
        c.p50_ms, c.p90_ms = times[str(c.path)]["p50"], times[str(c.path)]["p90"]
    first = times[str(timed[0].path)]
    return where, noise(first.get("load"), first)


def plan_timing(fp32: Path, feed: Sample, threads: int) -> tuple[int, int]:
    """Rounds and calls per block: about 0.3 s per candidate and round, 3 to 20 calls."""
    sess = session(fp32, threads)
    sess.run(None, feed)
    return 5, calls_per_block(lambda: sess.run(None, feed))


def _as_given(model: Path, given: dict[str, int], base: QuantConfig, forced: str | None,
              budget: AccuracyBudget, held: Sequence[Sample], labels: Sequence[Any] | None,
              outputs: dict[str, Any], started: float, log: Log) -> Decision:
    """A model that is quantized already ships as it is: quantizing its INT8 again would add
    error and no speed, and it has no float weights to go back to."""
    found = quantized_summary(given)
    if forced in ("fp32", "fp16"):
        raise SpecError(f"--precision {forced}: the model is quantized already ({found}) and "
                           "has no float weights to ship", "drop --precision: its INT8 ships as "
                           "given, or build from the float model")
    shipped = Candidate("INT8 (as given)", replace(base, precision="int8", mode="given",
                                                   exclude=()), model,
                        budget.evaluate(model, model, held, labels, outputs))
    log(f"search: the model is quantized already ({found}): its INT8 ships as given, "
        "not quantized again")
    return _record(shipped, shipped, [shipped], f"INT8 (as given): the model holds {found}; "
                   "it is not quantized again", forced or "auto", budget, held, started, {},
                   log)


def _fp16(fp32: Path, folder: Path, base: QuantConfig, held, budget, labels,
          candidates: list[Candidate], fp32_outputs: dict[str, Any]) -> Candidate:
    from ..errors import QuantizationError
    from .search import count_ops

    config = replace(base, precision="fp16")
    cand = Candidate("FP16", config, folder / "fp16.onnx")
    try:
        quantize_file(fp32, cand.path, config=config)
        cand.accuracy = budget.evaluate(cand.path, fp32, held, labels, fp32_outputs)
        cand.boundaries = count_ops(cand.path)[1]
    except QuantizationError as exc:
        cand.error = exc.message
    candidates.append(cand)
    return cand


def _record(chosen: Candidate, reference: Candidate, candidates: Sequence[Candidate],
            reason: str, mode: str, budget: AccuracyBudget, held: Sequence[Sample],
            started: float, timing: dict[str, Any], log: Log,
            evidence: Evidence | None = None) -> Decision:
    seconds = time.perf_counter() - started
    evidence = evidence or Evidence("held-out", len(held))
    notes = []
    if evidence.samples < FEW_HELD:
        notes.append(f"only {evidence.samples} samples judged: the accuracy figures are rough; "
                     f"{FEW_HELD} or more give a steadier decision")
    for note in notes:
        log(f"warning: {note}")
    proof = None if chosen is reference else kfold.verdict(chosen.accuracy, evidence)
    log(f"decision: {chosen.config.describe()} - {reason} ({len(candidates)} candidates, "
        f"{evidence.words()}{', evidence ' + proof if proof else ''}, {seconds:.1f} s)")
    record = {"mode": mode, "chosen": chosen.config.describe(), "label": chosen.label,
              "reason": reason, "budget": budget.describe(),
              "budget_min_cosine": budget.min_cosine, "held_out": len(held),
              "evidence": {**evidence.to_record(), "verdict": proof},
              "notes": notes, "search_seconds": round(seconds, 2),
              "fp32_p50_ms": reference.p50_ms, "min_gain_over_fp32": MIN_GAIN,
              "timing": timing, "candidates": [c.summary() for c in candidates]}
    return Decision(chosen, record, tuple(candidates))
