"""A faster execution provider as a candidate: OpenVINO on x86.

A target lists such a provider with `when = "faster"` (targets/x86_64-cpu.toml). After the
precision decision has picked the CPU provider's graph, the graphs it measured within budget
(FP32 and INT8) run once more under that provider, in a Python whose onnxruntime has it
(packager/ort_builds.py): their accuracy on the samples that judged the decision (the held-out
split; where that was too thin, every sample, each calibrated graph as the k-fold rotation made
it for the fold it never saw), then their latency, interleaved in the same blocks as the CPU
provider's choice. The provider is shipped, first in the bundle's list,
only when its fastest graph within budget is MIN_GAIN faster than the CPU provider's choice in
that same run; the CPU provider keeps its own graph as the fallback, so a device without the
provider runs exactly what it would have run without it.
"""

import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import ort_builds
from .._runtimes.runner.load import load_facts, noise, snapshot
from ..errors import SpecError
from ..graph.execute import Sample
from ..progress import OFF, Log, Progress
from ..quantization.budget import AccuracyBudget
from ..quantization.decision import MIN_GAIN, NOISY_GAIN, SAME_SPEED, Decision, plan_timing
from ..quantization.kfold import Evidence, Rotation, verdict
from ..quantization.search import Candidate, best_of_each_generator
from ..targets import Provider, Target
from ..timing import machine
from .fp32_graph import vs_original
from .provider_graphs import ProviderGraph

WANTED = ("auto", "yes", "no")


@dataclass(frozen=True)
class Judging:
    """What the provider's graphs are judged on: the samples (in the order their outputs
    stack), their labels, FP32's outputs on them under the CPU provider, what they amount to,
    and the rotation whose fold graphs run where the decision was judged by rotation."""

    samples: Sequence[Sample]
    labels: Sequence[Any] | None
    reference: dict[str, Any]
    evidence: Evidence
    rotation: Rotation | None = None

    @classmethod
    def of(cls, decision: Decision, graphs: Sequence[Candidate], held: Sequence[Sample],
           labels: Sequence[Any] | None, fp32_outputs: dict[str, Any]) -> "Judging":
        """The rotation's samples where the decision was judged by rotation and every
        calibrated graph kept its fold graphs; else the held-out split."""
        rotation = decision.rotation
        if rotation is None or any(_calibrated(c) and not c.folds for c in graphs):
            return cls(held, labels, fp32_outputs, Evidence("held-out", len(held)))
        return cls(rotation.order, None, rotation.sampled, rotation.evidence, rotation)

    def rows(self, keys: dict[str, Candidate], chain: list
             ) -> tuple[list[ort_builds.Row], dict[str, list[int]], list[Sample]]:
        """(plan rows, the sample numbers each runs on, the samples sent): a calibrated graph
        runs once per fold, its fold's graph on the fold; the others on every sample."""
        if self.rotation is None:
            return [(k, c.path, chain) for k, c in keys.items()], {}, list(self.samples)
        rows, only = [], {}
        for key, cand in keys.items():
            if not _calibrated(cand):
                rows.append((key, cand.path, chain))
                only[key] = [i for fold in self.rotation.folds for i in fold]
                continue
            for j, (graph, fold) in enumerate(zip(cand.folds, self.rotation.folds, strict=True)):
                rows.append((f"{key}@{j}", graph, chain))
                only[f"{key}@{j}"] = list(fold)
        return rows, only, self.rotation.pool

    def gather(self, keys: dict[str, Candidate], outputs: dict[str, Any], ran: dict[str, str]
               ) -> tuple[dict[str, Any], dict[str, str]]:
        """Each graph's outputs in the samples' order and the provider that ran it (the
        fold graphs': the provider that ran them all, '' where they differ)."""
        if self.rotation is None:
            return outputs, ran
        joined, which = {}, {}
        for key, cand in keys.items():
            parts = [key] if not _calibrated(cand) else [
                f"{key}@{j}" for j in range(len(self.rotation.folds))]
            seen = {ran.get(p, "") for p in parts}
            which[key] = seen.pop() if len(seen) == 1 else ""
            if all(p in outputs for p in parts):
                joined[key] = {name: np.concatenate([outputs[p][name] for p in parts])
                               for name in outputs[parts[0]]}
        return joined, which


def _calibrated(cand: Candidate) -> bool:
    return cand.config.precision == "int8" and cand.config.mode == "static"


@dataclass(frozen=True)
class ProviderChoice:
    """The provider to list first, and the graph it runs (the decision's own graph, or another
    candidate: then shipped beside it as that provider's graph)."""

    provider: Provider
    candidate: Candidate
    accuracy: dict[str, Any]
    package: str
    install: str


def _label(provider: Provider) -> str:
    return provider.name.replace("ExecutionProvider", "")


def check_wanted(target: Target, wanted: str, timer: Any = None) -> None:
    """SpecError unless --openvino *wanted* can be done for *target* on this host: called by
    build before anything slow runs, and again where the provider is chosen."""
    if wanted not in WANTED:
        raise SpecError(f"--openvino {wanted}: not one of {', '.join(WANTED)}",
                        "use auto (measure), yes or no")
    if wanted != "yes":
        return
    if not target.faster:
        raise SpecError(f"--openvino yes: {target.name} lists no provider the build can "
                        "choose for speed", "use it with x86_64-cpu, or drop it")
    if timer is not None or target.arch != platform.machine() or ort_builds.openvino_python() is None:
        raise SpecError(f"--openvino yes: cannot run {_label(target.faster[0])} here to measure "
                        "its accuracy (" + ("timed on the device" if timer is not None else
                                            f"{target.name} is {target.arch}, this host "
                                            f"{platform.machine()}"
                                            if target.arch != platform.machine() else
                                            ort_builds.why_no_openvino()) + ")",
                        "drop --openvino yes, or run `make openvino` (or set "
                        "EDGEPACK_OPENVINO_PYTHON)")


def choose_provider(decision: Decision, target: Target, fp32: Path, held: Sequence[Sample],
                  budget: AccuracyBudget, labels: Sequence[Any] | None,
                  fp32_outputs: dict[str, Any], *, timer: Any = None,
                  log: Log = lambda _: None, wanted: str = "auto",
                  original: Path | None = None, steps: Progress = OFF) -> ProviderChoice | None:
    """The faster provider and its graph, or None; the decision's record gets a "provider_choice"
    entry either way (what was tried, the figures, why). *wanted*: auto (measure), yes (list
    it when a graph keeps the budget under it), no. *original*: the user's graph, timed on
    the CPU provider in the same run."""
    check_wanted(target, wanted, timer)
    if not target.faster:
        return None
    if wanted == "no":
        decision.record["provider_choice"] = {"provider": target.faster[0].name, "chosen": False,
                                     "reason": "--openvino no"}
        return None
    provider = target.faster[0]
    name = _label(provider)
    record: dict[str, Any] = {"provider": provider.name, "chosen": False}
    decision.record["provider_choice"] = record

    def skip(why: str) -> None:
        record["reason"] = why
        log(f"provider: {name} not measured: {why}")

    python, why = _where(target, timer, held, name)
    if why:
        return skip(why)
    chosen = decision.candidate
    graphs = _tried_graphs(decision, original)
    threads = int(target.session.get("intra_op_threads", 0))
    chain = [(provider.name, dict(provider.options)), (ort_builds.CPU, {})]
    keys = {f"g{i}": c for i, c in enumerate(graphs)}
    judging = Judging.of(decision, graphs, held, labels, fp32_outputs)
    steps.start(f"{name} (another Python)", [1.0, 2.0])   # outputs, then the timing
    steps.step(f"outputs of {len(keys)} graph{'s' if len(keys) > 1 else ''} on "
               f"{judging.evidence.words()}")
    rows, only, sent = judging.rows(keys, chain)
    try:
        outputs, ran = ort_builds.outputs_plan(python, rows, sent, threads, only=only)
    except ort_builds.OrtBuildError as exc:
        steps.finish()
        return skip(exc.message)
    outputs, ran = judging.gather(keys, outputs, ran)
    within, tried = _judged(keys, outputs, ran, provider, budget, fp32, judging)
    record["tried"] = list(tried.values())
    record["judged_on"] = judging.evidence.to_record()
    if not within:
        steps.finish()
        return skip(f"no graph kept the budget under {name}")
    rounds, block = plan_timing(fp32, held[0], threads)
    steps.step(f"timing {len(within)} graph{'s' if len(within) > 1 else ''} against the CPU "
               "provider's")
    rows = [("cpu", chosen.path, ort_builds.cpu_chain())] + [
        (k, within[k][0].path, chain) for k in within]
    if original is not None:
        rows.append(("original", original, ort_builds.cpu_chain()))
    before = snapshot()   # (the timing subprocess's CPU counts as this build's own)
    try:
        times, ran, device = ort_builds.time_plan(python, rows, held[0], threads, rounds, block)
    except ort_builds.OrtBuildError as exc:
        return skip(exc.message)
    finally:
        steps.finish()
    load = load_facts(before, wait=False)
    for key in within:
        tried[key]["p50_ms"] = round(times[key]["p50"], 4)
    cand, acc = within[_fastest(within, times)]
    best_ms, cpu_ms = times[_fastest(within, times)]["p50"], times["cpu"]["p50"]
    _record_times(record, times, best_ms, cand.label, chosen.label, device, load)
    return _verdict(record, provider, cand, acc, cpu_ms / best_ms, noise(load, times["cpu"]),
                    wanted, chosen, best_ms, cpu_ms, device, times, log, judging.evidence)


def _fastest(within: dict[str, Any], times: dict[str, dict]) -> str:
    """The graph timed fastest; of those within SAME_SPEED, the one with fewer Q/DQ boundaries."""
    fastest = min(times[k]["p50"] for k in within)
    return min((k for k in within if times[k]["p50"] <= fastest * SAME_SPEED),
               key=lambda k: (within[k][0].boundaries, times[k]["p50"]))


def _record_times(record: dict[str, Any], times: dict[str, dict], best_ms: float, graph: str,
                  cpu_graph: str, device: dict[str, Any], load: dict[str, Any]) -> None:
    cpu_ms = times["cpu"]["p50"]
    record.update({"cpu_p50_ms": round(cpu_ms, 4), "p50_ms": round(best_ms, 4),
                   "graph": graph, "measured_on": device, "cpu_graph": cpu_graph})
    if "original" in times:
        record["original_p50_ms"] = round(times["original"]["p50"], 4)
        # the CPU provider's graph against the original in one run: the build's speed line
        # takes these figures instead of timing the two again (fp32_graph.against_original)
        record["vs_original"] = vs_original(
            cpu_ms, (times["cpu"].get("p10"), times["cpu"].get("p90")),
            times["original"]["p50"], {**machine(), "onnxruntime": device.get("onnxruntime")},
            load)


def _where(target: Target, timer: Any, held: Sequence[Sample], name: str
           ) -> tuple[str | None, str]:
    """(the Python that runs the provider, '') or (None, why it cannot be measured here)."""
    if timer is not None:
        return None, ("the candidates were timed on the device (--time-on); the build "
                      f"measures {name} on this host only")
    if target.arch != platform.machine():
        return None, f"{target.name} is {target.arch} and this host {platform.machine()}"
    if len(held) < 2:
        return None, "too few held-out samples to measure its accuracy"
    python = ort_builds.openvino_python()
    return (python, "") if python is not None else (None, ort_builds.why_no_openvino())


def _tried_graphs(decision: Decision, original: Path | None) -> list[Candidate]:
    """The graphs tried under the provider: the shipped one when --precision forced it, else
    the best of each generator and the user's original graph (OpenVINO builds its own graph:
    the unsimplified file may suit it better)."""
    if decision.record.get("mode") not in (None, "auto"):
        return [decision.candidate]
    graphs = _graphs(decision)
    if original is not None and original not in {c.path for c in graphs}:
        graphs.append(Candidate(f"{decision.candidates[0].label}, the original graph",
                                decision.candidates[0].config, original))
    return graphs


def _judged(keys: dict[str, Candidate], outputs: dict[str, Any], ran: dict[str, str],
            provider: Provider, budget: AccuracyBudget, fp32: Path, judging: Judging
            ) -> tuple[dict[str, tuple[Candidate, dict[str, Any]]], dict[str, dict[str, Any]]]:
    """Each graph's accuracy under *provider* (its outputs from the other Python) on
    *judging*'s samples: (those within budget with their figures, what each tried graph
    gave)."""
    within: dict[str, tuple[Candidate, dict[str, Any]]] = {}
    tried: dict[str, dict[str, Any]] = {}
    for key, cand in keys.items():
        if ran.get(key) != provider.name:
            tried[key] = {"label": cand.label, "error": f"{_label(provider)} did not start for it"}
            continue
        acc = budget.evaluate(cand.path, fp32, judging.samples, judging.labels,
                              judging.reference, outputs[key])
        tried[key] = {"label": cand.label, "precision": cand.config.describe(),
                      "cosine_min": acc["cosine_min"], "meets_budget": acc["budget"]["passed"],
                      **({"missed": acc["budget"]["failures"][:3]}
                         if acc["budget"]["failures"] else {})}
        if acc["budget"]["passed"]:
            within[key] = (cand, acc)
    return within, tried


def _verdict(record: dict[str, Any], provider: Provider, cand: Candidate, acc: dict[str, Any],
             gain: float, noisy: str, wanted: str, chosen: Candidate, best_ms: float,
             cpu_ms: float, device: dict[str, Any], times: dict[str, Any], log: Log,
             evidence: Evidence) -> ProviderChoice | None:
    """The provider listed first when its fastest graph within budget is MIN_GAIN faster than
    the CPU provider's (NOISY_GAIN on a busy machine; always with --openvino yes)."""
    name = _label(provider)
    if noisy and gain < NOISY_GAIN and gain >= MIN_GAIN and wanted != "yes":
        record["reason"] = (f"{name} ran {cand.label} at {gain:.2f}x the CPU provider's "
                            f"{chosen.label} on a busy machine ({noisy}): within its noise "
                            f"(needs {NOISY_GAIN:.2f}x there), so the CPU provider ships")
        log(f"provider: {record['reason']}")
        return None
    if gain < MIN_GAIN and wanted != "yes":
        record["reason"] = (f"{name}'s fastest graph within budget ({cand.label}, {best_ms:.3f} "
                            f"ms p50) is not {100 * (MIN_GAIN - 1):.0f}% faster than the CPU "
                            f"provider's {chosen.label} ({cpu_ms:.3f} ms) in the same run")
        log(f"provider: {record['reason']}")
        return None
    # judged under the provider on the decision's own samples: its own evidence, said
    proof = None if cand.config.precision == "fp32" else verdict(acc, evidence)
    record.update(chosen=True, gain=round(gain, 3), evidence=proof, reason=(
        ("--openvino yes: " if wanted == "yes" else "")
        + f"{name} runs {cand.label} at {gain:.2f}x the CPU provider's {chosen.label} "
        f"({best_ms:.3f} vs {cpu_ms:.3f} ms p50, one run, onnxruntime "
        f"{device.get('onnxruntime', '?')}"
        + (f"; the original on the CPU provider {times['original']['p50']:.3f} ms, "
           f"{times['original']['p50'] / best_ms:.2f}x" if "original" in times else "")
        + f") at cosine {acc['cosine_min']:.4f}"
        + (f", {acc['labelled']['text']}" if acc.get("labelled") else
           f", {acc['task']['text']}" if acc.get("task") else "")
        + (f", evidence {proof}" if proof else "")
        + f"; devices without {ort_builds.OPENVINO_PACKAGE} run the CPU provider"))
    log(f"provider: {record['reason']}")
    return ProviderChoice(provider, cand, acc, ort_builds.OPENVINO_PACKAGE, ort_builds.OPENVINO_INSTALL)


def _graphs(decision: Decision) -> list[Candidate]:
    """The decision's choice, FP32, and the most quantized INT8 graph within budget on the CPU
    provider from each generator (onnxruntime's, NNCF's; at most 4: every graph is evaluated
    and timed in the provider's run, and the next most quantized ones are near copies: MiniLM's
    13 and 14 nodes FP32). The budget is measured again under the other provider."""
    cands = list(decision.candidates)
    reference = cands[0]
    passing = sorted((c for c in cands[1:] if c.passed and c.config.precision == "int8"),
                     key=lambda c: (-c.int8_nodes, c.boundaries))
    # NNCF places Q/DQ where OpenVINO fuses them, so its graph may run fastest there while
    # onnxruntime's has more INT8 ops
    found: list[Candidate] = []
    for c in [decision.candidate, reference] + best_of_each_generator(passing):
        if c.path not in {f.path for f in found}:
            found.append(c)
    return found


def provider_graph(choice: ProviderChoice | None, decision: Decision) -> tuple[ProviderGraph, ...]:
    """The chosen provider's own graph, when it is not the one the CPU provider runs."""
    if choice is None or choice.candidate.path == decision.candidate.path:
        return ()
    precision = choice.candidate.config.precision
    return (ProviderGraph(precision, choice.candidate.path, (choice.provider.name,),
                          choice.accuracy, why=f"{_label(choice.provider)} runs it faster than "
                          f"the {decision.candidate.label} graph the CPU provider runs"),)


def with_provider(target: Target, results: Sequence[Any], payloads: Sequence[Any],
                log: Log) -> tuple[Target, list[Any]]:
    """The target the bundle is written for: the faster provider first when every part chose
    it; else without it, and no part ships a graph for it (*results*: PartResult, *payloads*:
    PartPayload, one per part)."""
    chosen = [r.provider_choice for r in results]
    if chosen and all(chosen):
        first = chosen[0]
        return target.with_provider(first.provider, first.package, first.install), \
            list(payloads)
    names = {e.provider.name for e in chosen if e is not None}
    if names:
        log(f"provider: {', '.join(sorted(names))} not listed: only some parts run faster under "
            "it")
    return target, [replace(p, graphs=tuple(g for g in p.graphs
                                            if not set(g.providers) & names)) for p in payloads]


def provider_pays(target: Target, fp32: Path, held: Sequence[Sample], *, timer: Any = None,
                wanted: str = "auto", log: Log = lambda _: None
                ) -> Callable[[list[Candidate]], str] | None:
    """For the INT8 search, where INT8 does not pay on the CPU provider: a function of the
    variants that returns how much faster the fastest of them runs under the faster provider
    than FP32 does under either provider ('' unless MIN_GAIN), timed in one run. None where the
    provider cannot be measured here (choose_provider says why)."""
    if (not target.faster or wanted == "no" or timer is not None
            or target.arch != platform.machine() or len(held) < 2):
        return None
    python = ort_builds.openvino_python()
    if python is None:
        return None
    provider = target.faster[0]
    name = _label(provider)
    chain = [(provider.name, dict(provider.options)), (ort_builds.CPU, {})]
    threads = int(target.session.get("intra_op_threads", 0))

    def pays(variants: list[Candidate]) -> str:
        rounds, block = plan_timing(fp32, held[0], threads)
        rows = [("cpu", fp32, ort_builds.cpu_chain()), ("fp32", fp32, chain)] + [
            (f"v{i}", c.path, chain) for i, c in enumerate(variants)]
        try:
            times, ran, _ = ort_builds.time_plan(python, rows, held[0], threads, rounds, block)
        except ort_builds.OrtBuildError as exc:
            log(f"provider: {name} not measured: {exc.message}")
            return ""
        if ran.get("fp32") != provider.name:
            return ""
        floor = min(times["cpu"]["p50"], times["fp32"]["p50"])
        timed = [(times[f"v{i}"]["p50"], c) for i, c in enumerate(variants)
                 if ran.get(f"v{i}") == provider.name]
        if not timed:
            return ""
        best_ms, best = min(timed, key=lambda t: t[0])
        if floor / best_ms < MIN_GAIN:
            return ""
        return (f"{best.label} runs at {floor / best_ms:.2f}x FP32's best under {name} "
                f"({best_ms:.3f} vs {floor:.3f} ms p50)")
    return pays
