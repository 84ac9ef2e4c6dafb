"""Evidence by rotation: every sample both calibrates and judges (k-fold cross-checking).

A build given 12 calibration images holds 2 out: too few to tell a good INT8 variant from a bad
one, so it shipped FP32 without trying. A detector's 6 held-out images held 6 boxes, too few to
show 95 % box recall, and its INT8 shipped on "pass, not shown" though it missed 2 of 17 boxes
elsewhere. Here a candidate's configuration is quantized k times, each time calibrated on all
samples but one fold and judged on that fold; the folds' outputs together are judged as one
held-out set as large as all the samples. What ships is still calibrated on the usual split:
k-fold measures the procedure (this configuration, calibrated on this many samples), which is
what decides whether INT8 keeps the budget.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..graph.execute import Sample, run_model
from ..progress import Log
from .budget import AccuracyBudget
from .calibration import spread
from .quantize import QuantConfig, quantize_file

FOLDS = 5          # each fold a fifth: the default --holdout 0.2, turned round
MIN_POOL = 4       # fewer samples than this cannot judge anything, rotated or not
TRIES = 2          # candidates of one generator the rotation judges before it gives up on it


@dataclass(frozen=True)
class Evidence:
    """How a candidate's accuracy was measured: on the held-out split, or by rotation."""

    method: str        # "held-out" or "k-fold"
    samples: int       # samples judged
    folds: int = 0

    def to_record(self) -> dict[str, Any]:
        return {"method": self.method, "samples": self.samples, "folds": self.folds}

    def words(self) -> str:
        if self.method != "k-fold":
            return f"{self.samples} held-out samples"
        return (f"all {self.samples} samples, each judged by a model calibrated without it "
                f"({self.folds}-fold rotation)")


def shown(accuracy: dict[str, Any]) -> bool:
    """Whether the candidate's figures counted enough units to show their keep (True when
    only a cosine judges it: a cosine is shown by every sample)."""
    return not unshown_figures(accuracy)


def unshown_figures(accuracy: dict[str, Any]) -> list[dict[str, Any]]:
    """The gated figures (the task's, a class output's expected drop) whose count cannot show
    their keep, the one needing most units first."""
    task = accuracy.get("task") or {}
    found = [{"name": name, **f} for name, f in task.get("figures", {}).items()]
    found += [{"name": "expected_drop", **f} for f in accuracy.get("expected_drop", {}).values()]
    if accuracy.get("labelled"):   # (the labels gate: the agreement figures are reported)
        found = [{"name": "labelled_drop", **accuracy["labelled"]}]
    return sorted((f for f in found if not f.get("shown", True)),
                  key=lambda f: -f.get("needed", 0))


def verdict(accuracy: dict[str, Any], evidence: "Evidence") -> str:
    """How strong the evidence for *accuracy* is: 'shown' where the count could show every
    gated figure's budget (one confident miss would break it), else 'not proven: 19 samples
    judged, 100 would show a 1-point drop'."""
    missing = unshown_figures(accuracy)
    if not missing:
        return "shown"
    from .._runtimes.runner.task_figures import WORDS, percent

    worst = missing[0]
    unit = worst.get("unit") or WORDS.get(worst["name"], ("", "samples"))[1]
    judged = evidence.samples if unit == "samples" else worst.get("n", 0)
    if worst["name"] in ("expected_drop", "labelled_drop"):
        what = f"a {100 * worst['keep']:g}-point {worst.get('verb', 'drop')}"
    else:
        what = f"{WORDS[worst['name']][0]} {percent(worst['keep'])}".replace(" on ", " ")
    return f"not proven: {judged} {unit} judged, {worst['needed']} would show {what}"


def wanted(held: int, pool: int, passing: Sequence[Any], min_held: int,
           budget: AccuracyBudget, labels: Any) -> bool:
    """Whether the held-out split is too thin to decide and rotation would judge more."""
    if not passing or pool <= held or pool < MIN_POOL:
        return False
    if budget.metric is not None and labels is not None:
        return False   # the user's labels exist for the held-out split only
    return held < min_held or not all(shown(c.accuracy) for c in passing)


def folds_of(count: int, folds: int = FOLDS) -> list[list[int]]:
    """Index folds spread over the set (sample i in fold i mod k), none empty."""
    k = max(2, min(folds, count))
    return [list(range(j, count, k)) for j in range(k)]


class Rotation:
    """The pool of samples in fold order and FP32's outputs on it, computed once."""

    def __init__(self, fp32: Path, pool: Sequence[Sample], folds: int = FOLDS,
                 cap: int | None = None, states: Sequence[tuple[str, str]] = ()):
        """*cap*: the most samples one calibration may hold (what memory fits: the pool may
        be the whole set where the build's own calibration was thinned to fit). *states*: a
        recurrent state's (input, output) pairs: each fold is run as one stream (in order,
        each model's own state fed back; streamed.py)."""
        self.fp32, self.pool, self.cap, self.states = fp32, list(pool), cap, tuple(states)
        self.folds = folds_of(len(self.pool), folds)
        self.order = [self.pool[i] for fold in self.folds for i in fold]
        self.reference = self._over_folds(fp32)
        # FP32 sample by sample, as another provider's outputs are gathered (not streamed)
        self.sampled = run_model(fp32, self.order) if self.states else self.reference
        self.evidence = Evidence("k-fold", len(self.order), len(self.folds))

    def _run(self, model: Path, samples: Sequence[Sample]) -> dict[str, np.ndarray]:
        if self.states:
            from .streamed import run_streamed

            return run_streamed(model, samples, self.states)
        return run_model(model, samples)

    def _over_folds(self, model: Path) -> dict[str, np.ndarray]:
        """*model* on every sample in fold order: one run, or a stream per fold (states)."""
        if not self.states:
            return run_model(model, self.order)
        return self._joined([self._run(model, [self.pool[i] for i in fold])
                             for fold in self.folds])

    @staticmethod
    def _joined(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def accuracy(self, source: Path, config: QuantConfig, folder: Path,
                 budget: AccuracyBudget, histogram_cap: int | None,
                 keep: Path | None = None) -> dict[str, Any]:
        """*config* quantized from *source* once per fold, each judged on its own fold (the
        fold graphs kept in *keep*, as fold_graphs names them: another provider judges them
        there too)."""
        if config.mode != "static":   # no calibration: every sample is unseen already
            path = folder / "kfold_all.onnx"
            quantize_file(source, path, config=config)
            return self._judge(path, budget, self._over_folds(path))
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            folder = keep
        parts: list[dict[str, np.ndarray]] = []
        path = folder / "kfold_0.onnx"
        for j, fold in enumerate(self.folds):
            out = set(fold)
            calib = [s for i, s in enumerate(self.pool) if i not in out]
            if self.cap and len(calib) > self.cap and not config.streams:
                calib = [calib[i] for i in spread(len(calib), self.cap)]
            if histogram_cap and config.calibration_method != "minmax" and \
                    len(calib) > histogram_cap:
                calib = [calib[i] for i in spread(len(calib), histogram_cap)]
            path = folder / f"kfold_{j}.onnx"
            quantize_file(source, path, config=config, samples=calib)
            parts.append(self._run(path, [self.pool[i] for i in fold]))
            if j and keep is None:
                (folder / f"kfold_{j - 1}.onnx").unlink(missing_ok=True)
        return self._judge(path, budget, self._joined(parts))

    def fold_graphs(self, keep: Path) -> list[Path]:
        """The graphs accuracy(..., keep=*keep*) left, fold by fold."""
        return [keep / f"kfold_{j}.onnx" for j in range(len(self.folds))]

    def _judge(self, path: Path, budget: AccuracyBudget,
               outputs: dict[str, np.ndarray]) -> dict[str, Any]:
        acc = budget.evaluate(path, self.fp32, self.order, None, self.reference, outputs,
                              streamed=bool(self.states))
        acc["evidence"] = self.evidence.to_record()
        return acc


def confirm(passing: Sequence[Any], rotation: Rotation, *, source: Callable[[Any], Path],
            folder: Path, budget: AccuracyBudget, histogram_cap: int | None,
            log: Log, keep: bool = False) -> list[Any]:
    """Cross-check the candidates within budget on the held-out split, each generator's in
    turn (most INT8 first; each costs FOLDS quantizations; FP16 and dynamic INT8 are groups of
    their own) until one of it keeps the budget on the rotation or TRIES of it have missed
    there: their accuracy becomes the rotation's;
    returns those still within budget. (Only the first of each was tried before, and
    nudenet's onnxruntime INT8 with 51 Q/DQ boundaries, within budget on every held-out
    photo, went untried behind the preset the rotation refused.) *keep*: each calibrated
    candidate keeps its fold graphs (Candidate.folds) for another provider to be judged the
    same way."""
    ranked = sorted(passing, key=lambda c: (-c.int8_nodes, c.boundaries,
                                            -c.accuracy.get("cosine_min", 0.0)))
    tried: dict[str, int] = {}
    settled: set[str] = set()
    for cand in ranked:
        # each generator's static INT8 a group; FP16 and dynamic INT8 (no calibration) their own
        generator = cand.config.generator if cand.config.mode == "static" and \
            cand.config.precision == "int8" else f"{cand.config.precision} {cand.config.mode}"
        if generator in settled or tried.get(generator, 0) >= TRIES:
            continue
        n = sum(tried.values())
        tried[generator] = tried.get(generator, 0) + 1
        before = cand.accuracy
        kept = folder / f"folds-{n}" if keep and cand.config.mode == "static" else None
        cand.accuracy = {**rotation.accuracy(source(cand), cand.config, folder, budget,
                                             histogram_cap, keep=kept), "held_out_only": {
            "cosine_min": before.get("cosine_min"), "samples": before.get("samples")}}
        cand.notes.append("judged by rotation: " + rotation.evidence.words())
        if kept is not None:
            cand.folds = tuple(rotation.fold_graphs(kept))
        log(f"search: {cand.line()} (cross-checked on {len(rotation.order)} samples, "
            f"{len(rotation.folds)}-fold)")
        if cand.passed:
            settled.add(generator)
    return [c for c in passing if c.accuracy.get("evidence") and c.passed]
