"""Accuracy-aware quantization: meet an accuracy budget by keeping the most sensitive nodes FP32.

An AccuracyBudget says what quantization may cost; search.py finds the INT8 variants that keep
it, and decision.py decides between them and FP32.
"""

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._runtimes.runner.task_spec import task_kind
from ..errors import PackagerError
from ..graph.execute import Sample, compare_outputs, run_model, scaled_cosine

Metric = Callable[[dict[str, np.ndarray], Sequence[Any] | None], float]
PROBE_SAMPLES = 4       # samples whose intermediate tensors are compared per round
SMALL_CALIBRATION = 32


EMBEDDING_COSINE = 0.995   # default budget for L2-normalised embeddings (see embedding_outputs)


def embedding_outputs(reference: dict[str, np.ndarray]) -> list[str]:
    """Outputs that are L2-normalised embeddings: float vectors of 16 or more values whose norm
    is 1 on every sample. What users do with them is compare them with each other, and there a
    cosine of 0.98 to FP32 is not enough: all-MiniLM-L6-v2 at cosine 0.985 changed the nearest
    sentence of 12 % of sentences."""
    found = []
    for name, arr in reference.items():
        if arr.dtype.kind != "f" or len(arr) == 0 or arr[0].size < 16:
            continue
        norms = np.linalg.norm(arr.reshape(len(arr), -1).astype(np.float64), axis=1)
        if np.all(np.abs(norms - 1.0) < 1e-3):
            found.append(name)
    return found


@dataclass(frozen=True)
class AccuracyBudget:
    """min_cosine: every held-out sample's output cosine to FP32; max_drop: the fall in accuracy
    (top-1 agreement with FP32 for class scores, else mean cosine; or the user's metric)."""

    min_cosine: float | None = None
    max_drop: float | None = None
    metric: Metric | None = None
    metric_name: str = ""
    task: dict[str, Any] | None = None    # the part's declared task (runner/task_spec.py)
    keep: dict[str, float] | None = None  # --keep over the task's defaults
    # outputs known to be class scores (a Softmax feeds them, or --labels count them): judged
    # by top-1 agreement, not by SMALL_OUTPUT's absolute error (a 4-class head's logits moved
    # by 1.4 % of their largest magnitude in INT8, every top-1 the same)
    class_outputs: frozenset[str] = frozenset()
    # the part's outputs feed another part (a pipeline's earlier stage): what the next part
    # reads is every value, so the cosine keeps gating the outputs its task's head reads too
    feeds_part: bool = False
    # labels of the samples ({fingerprint(sample): class number}, from class folders) and the
    # class-score output they judge: then the budget is the labelled top-1's drop against FP32;
    # or, for a detect task, each sample's labelled boxes ((k, 5) class x1 y1 x2 y2 in input
    # pixels, build/box_labels.py): then it is the box mAP@0.5's drop; for a ctc task, the text
    # each sample reads (build/text_labels.py): then it is the character error rate's rise
    truth: Mapping[str, Any] | None = None
    truth_output: str | None = None
    # the task the build suggests for a part that declares none: (--task text, the task)
    suggested: tuple[str, dict[str, Any]] | None = None
    # (input, output) pairs of a recurrent state fed back by the caller (streamed.state_pairs):
    # with a task judged, each model streams the held-out samples and the task judges the
    # frames; the state outputs' cosine is reported
    states: tuple[tuple[str, str], ...] = ()

    @property
    def active(self) -> bool:
        return self.min_cosine is not None or self.max_drop is not None or self.judged

    @property
    def judged(self) -> bool:
        """Whether the candidates are also judged in their task's terms."""
        return task_kind(self.task) != "raw"

    def describe(self) -> str:
        parts = []
        if self.min_cosine is not None:
            parts.append(f"cosine >= {self.min_cosine}" + (
                " (on outputs the task does not read)" if self.judged and not self.feeds_part
                else ""))
        if self.truth:
            what = "box mAP@0.5 drop" if self.boxes else "CER rise" if self.texts else \
                "top-1 drop"
            parts.append(f"labelled {what} <= {100 * self.drop_limit:g} point"
                         f"{'s' * (self.drop_limit != 0.01)}")
        elif self.max_drop is not None:
            parts.append(f"{self.metric_name or 'accuracy'} drop <= {100 * self.max_drop:g}%")
        elif self.class_outputs and not self.judged:
            parts.append(f"expected top-1 drop <= {100 * EXPECTED_DROP:g}%")
        if self.judged and not self.truth:   # (with labels, agreement is reported)
            from .._runtimes.runner.task_figures import AT_MOST, keep_for

            parts += [f"{name} {'<=' if name in AT_MOST else '>='} {100 * value:g}%"
                      if name != "cosine_min" else f"{self.task['kind']} cosine >= {value:g}"
                      for name, value in keep_for(self.task, self.keep).items()]
        return " and ".join(parts) or "none"

    @property
    def streams(self) -> bool:
        """Whether the candidates are judged streamed (a recurrent state, a task's frames)."""
        return bool(self.states) and self.judged and not self.feeds_part

    def evaluate(self, candidate: Path, fp32: Path, held: Sequence[Sample],
                 labels: Sequence[Any] | None = None,
                 reference: dict[str, np.ndarray] | None = None,
                 outputs: dict[str, np.ndarray] | None = None,
                 streamed: bool = False) -> dict[str, Any]:
        """measure_accuracy plus the drop and whether the budget holds (*reference*: FP32's
        outputs on *held*, when already computed; *outputs*: the candidate's, when it ran
        elsewhere, e.g. under another execution provider; *streamed*: both were run as
        streams, each its own state fed back). Where the budget streams and the candidate
        runs here, both stream; outputs given sample by sample keep the state's cosine gate."""
        if self.streams and outputs is None and not streamed:
            from .streamed import run_streamed

            reference = run_streamed(fp32, held, self.states)
            outputs = run_streamed(candidate, held, self.states)
            streamed = True
        reference = run_model(fp32, held) if reference is None else reference
        outputs = run_model(candidate, held) if outputs is None else outputs
        reference_outputs, candidate_outputs = reference, outputs
        acc = measure_accuracy(candidate, fp32, held, reference, outputs)
        if self.judged:
            acc["task"] = self.judge_task(reference_outputs, candidate_outputs, held)
        expected = self.expected_drops(reference_outputs, candidate_outputs)
        if expected:
            acc["expected_drop"] = expected
        labelled = self.labelled_drop(held, reference_outputs, candidate_outputs)
        if labelled:   # the anchors' budget: what the labels say was lost
            acc["labelled"] = labelled
        # what a head's figure or the labels judge: their cosine is said, not gated
        read = self.read_by_head(list(reference_outputs)) | (
            {self.truth_output} if labelled else set())
        if streamed and self.streams:   # a state reaches the frames: they judge it
            read |= {o for _, o in self.states if o in reference_outputs}
            acc["streamed"] = {"states": [list(p) for p in self.states], "samples": len(held)}
        gated = [n for n in acc["outputs"] if n not in read]
        if read:
            acc["cosine_reported"] = sorted(n for n in acc["outputs"] if n in read)
        if self.metric is not None:
            reference = self.score(reference, labels, "the FP32 model's")
            score = self.score(outputs, labels, "the quantized model's")
            acc.update({"metric": self.metric_name, "metric_fp32": reference,
                        "metric_quantized": score})
            drop = reference - score
        elif labelled:
            drop = labelled["value"]
        else:
            drop = expected_drop_of(acc)
            if drop is None:
                drop = 1.0 - acc["cosine_mean"]
        acc["drop"] = drop
        failures = []
        broken = [k for k in ("cosine_min", "cosine_mean", "drop")
                  if not np.isfinite(acc.get(k, 0.0))]
        if broken:   # NaN compares False with every bound: it would pass them all
            failures.append(f"{broken[0].replace('_', ' ')} is {acc[broken[0]]} (the outputs hold "
                            "NaN or infinity where FP32's do not)")
        cosines = {n: acc["outputs"][n]["cosine_min"] for n in gated}
        if self.min_cosine is not None and cosines and min(cosines.values()) < self.min_cosine:
            worst = min(cosines, key=cosines.get)
            where = f" on output '{worst}'" if len(acc["outputs"]) > 1 else ""
            failures.append(f"cosine {cosines[worst]:.4f} < {self.min_cosine}{where}")
        if labelled:
            failures += [] if labelled["passed"] else [labelled["text"]]
        elif self.max_drop is not None and drop > self.max_drop:
            failures.append(f"drop {100 * drop:.2f}% > {100 * self.max_drop:g}%")
        if not self.judged:   # (a declared task's figure judges its outputs)
            failures += small_output_failures(
                reference_outputs, acc.get("outputs", {}),
                self.class_outputs | ({self.truth_output} if labelled else set()))
            if self.max_drop is None and not labelled:   # (else the drop above is this figure)
                failures += [f"output '{name}' (class scores): {e['text']}" for name, e in
                             expected.items() if not e["passed"]]
        if self.judged and not labelled:   # (with labels, agreement with FP32 is reported)
            failures += [f["text"] for f in acc["task"]["figures"].values() if not f["passed"]]
        acc["budget"] = {"spec": self.describe(), "passed": not failures, "failures": failures}
        return acc

    @property
    def boxes(self) -> bool:
        """Whether the labels are boxes (a detect task's), not classes."""
        return bool(self.truth) and task_kind(self.task) == "detect"

    @property
    def texts(self) -> bool:
        """Whether the labels are the texts a ctc task reads."""
        return bool(self.truth) and task_kind(self.task) == "ctc"

    @property
    def drop_limit(self) -> float:
        """The largest accuracy drop allowed (--max-accuracy-drop, 1 point by default)."""
        return EXPECTED_DROP if self.max_drop is None else self.max_drop

    def labelled_drop(self, held: Sequence[Sample], reference: dict[str, np.ndarray],
                      outputs: dict[str, np.ndarray]) -> dict[str, Any] | None:
        """FP32's and the candidate's top-1 against the labels of the *held* samples that have
        one, the drop between them, and whether its count can show the budget (a 1-point drop
        needs 100 samples: one sample more wrong is then 1 point); None without labels."""
        if self.boxes or self.texts:
            from .labelled import labelled_boxes, labelled_texts

            judge = labelled_boxes if self.boxes else labelled_texts
            return judge([self.truth.get(fingerprint(s)) for s in held], self.task,
                         self.drop_limit, reference, outputs)
        if not self.truth or self.truth_output not in reference or not len(held):
            return None
        keys = [self.truth.get(fingerprint(s)) for s in held]
        rows = [i for i, k in enumerate(keys) if k is not None]
        if not rows:
            return None
        truth = np.array([keys[i] for i in rows])
        fp32, cand = (float(np.mean(a.reshape(len(held), -1)[rows].argmax(axis=1) == truth))
                      for a in (reference[self.truth_output], outputs[self.truth_output]))
        from .._runtimes.runner.task_figures import needed

        limit, n = self.drop_limit, len(rows)
        need = needed("expected_drop", limit)   # (an at-most share: one sample is 1/n of it)
        value = fp32 - cand
        passed, shown = value <= limit + 1e-12, n >= need
        text = (f"labelled top-1 {100 * cand:.1f}% against FP32's {100 * fp32:.1f}% on {n} "
                f"labelled samples: a drop of {100 * value:.1f} points (needs at most "
                f"{100 * limit:g}" + ("" if shown else f"; {n} samples cannot show "
                                      f"{100 * limit:g}: {need} needed") + ")")
        return {"value": value, "fp32": fp32, "candidate": cand, "n": n, "keep": limit,
                "needed": need, "shown": shown, "passed": passed, "text": text,
                "output": self.truth_output}

    def read_by_head(self, names: Sequence[str]) -> set[str]:
        """The outputs the declared task's head reads (none for raw, or where the part feeds
        another part)."""
        if not self.judged or self.feeds_part:
            return set()
        return head_outputs(self.task, names)

    def expected_drops(self, reference: dict[str, np.ndarray],
                       outputs: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
        """Per class-score output (no task declared): the expected top-1 drop under FP32's own
        probabilities, its flips with FP32's margins, and whether the samples show the budget."""
        if self.judged:
            return {}
        from .._runtimes.runner.task_figures import judge_one

        found = {}
        limit = self.drop_limit
        for name in sorted(set(self.class_outputs) | set(position_outputs(reference))):
            if name not in reference or reference[name].dtype.kind != "f" or \
                    reference[name].dtype == object:
                continue
            figure = scores_expected_drop(reference[name], outputs[name])
            found[name] = {**judge_one("expected_drop", figure, limit),
                           "flips": figure["flips"], "positions": figure["positions"]}
        return found

    def judge_task(self, reference: dict[str, np.ndarray], outputs: dict[str, np.ndarray],
                   held: Sequence[Sample]) -> dict[str, Any]:
        """The task's figures for *outputs* against FP32's *reference* on *held* (each stacked
        over the samples) and runner/task_figures.judge's verdict on them."""
        from .._runtimes.runner.task_figures import figures, judge, split_samples

        names = list(reference)
        found = figures(self.task, split_samples(reference, names),
                        split_samples(outputs, names), feeds=list(held))
        verdict = judge(self.task, found, self.keep)
        return {"kind": task_kind(self.task), **verdict}

    def score(self, outputs: dict[str, np.ndarray], labels: Sequence[Any] | None,
              whose: str) -> float:
        """The user's metric on *outputs*, as a finite float, or a PackagerError naming it."""
        name = self.metric_name or getattr(self.metric, "__name__", "metric")
        try:
            value = self.metric(outputs, labels)
        except Exception as exc:  # the user's code: whatever it raises is theirs to fix
            raise PackagerError(f"--metric {name} raised {type(exc).__name__} on {whose} "
                                f"outputs: {str(exc).strip()[:200]}",
                                "fix the function; it takes (outputs: dict of name -> array, "
                                "labels or None) and returns a float") from None
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating) or \
                not np.isfinite(value):
            raise PackagerError(f"--metric {name} returned {value!r:.80} "
                                f"({type(value).__name__}) on {whose} outputs, not a number",
                                "return a finite float, higher is better")
        return float(value)


EXPECTED_DROP = 0.01    # a classifier's expected top-1 drop under FP32's probabilities


def fingerprint(sample: Sample) -> str:
    """A sample's identity by content (its labels follow it into any split or rotation)."""
    import hashlib

    digest = hashlib.sha1(usedforsecurity=False)
    _update(digest, sample)
    return digest.hexdigest()


def _update(digest: Any, sample: Sample) -> None:
    """Feed *sample*'s input names and bytes, in name order, to *digest*."""
    for name in sorted(sample):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(sample[name]).tobytes())


def head_outputs(task: dict[str, Any] | None, names: Sequence[str]) -> set[str]:
    """The names of the outputs *task*'s head reads among the model's *names* (a CenterFace
    decoder reads its heatmap, scale, offset and landmarks; a multilabel head its list)."""
    from .._runtimes.runner.task_spec import multilabel_refs, settings

    conf = settings(task)
    kind = conf["kind"]
    if kind == "raw":
        return set()
    if kind == "multilabel":
        refs, _ = multilabel_refs(conf, len(names))
    elif kind == "detect" and conf["decoder"] == "centernet":
        refs = conf["outputs"] or list(range(min(4, len(names))))
    else:
        refs = [conf["output"]]
    return {names[r] if isinstance(r, int) else r for r in refs
            if not isinstance(r, int) or 0 <= r < len(names)}


def class_axis(arr: np.ndarray) -> int:
    """The class axis of scores stacked over samples: (S, 1, C) and (S, 1, T, C) the last, a
    segmentation's (S, 1, C, H, W) the channels."""
    return 2 if arr.ndim == 5 else arr.ndim - 1


def position_outputs(reference: dict[str, np.ndarray]) -> list[str]:
    """Outputs shaped like class scores per position, with no task declared: a CTC or frame
    classifier's (1, T, C) or a segmentation's (1, C, H, W) holding probabilities along the
    class axis on every sample (a captcha reader's strings changed on 21 % of captchas at a
    cosine within budget: its argmax per position is what it answers)."""
    from .._runtimes.runner.tasks import is_distribution

    found = []
    for name, arr in reference.items():
        if arr.dtype.kind != "f" or arr.ndim not in (4, 5) or arr.shape[1] != 1:
            continue
        axis = class_axis(arr)
        positions = arr[0].size // arr.shape[axis]
        if arr.shape[axis] >= 2 and positions >= 2 and is_distribution(arr, axis):
            found.append(name)
    return found


def scores_expected_drop(reference: np.ndarray, outputs: np.ndarray) -> dict[str, Any]:
    """The expected top-1 drop of class scores (S, 1, ..., C...) judged per position: per
    sample the mean over its positions of FP32's probability of its own answer minus FP32's
    probability of the candidate's (a softmax of the scores where they are logits), averaged
    over the samples; the samples with a flip, with the costliest flip's FP32 margin."""
    from .._runtimes.runner.task_figures import flip_words
    from .._runtimes.runner.tasks import as_probabilities

    axis, count = class_axis(reference), len(reference)
    ref = np.moveaxis(reference.astype(np.float64), axis, -1)
    got = np.moveaxis(outputs.astype(np.float64), axis, -1)
    ref = ref.reshape(count, -1, ref.shape[-1])
    got = got.reshape(count, -1, got.shape[-1])
    probs = as_probabilities(ref, "auto")
    mine, theirs = probs.argmax(-1), got.argmax(-1)
    cost = (np.take_along_axis(probs, mine[..., None], -1) -
            np.take_along_axis(probs, theirs[..., None], -1))[..., 0]
    flips = [{"sample": i, "positions": int((mine[i] != theirs[i]).sum()),
              "margin": float(cost[i].max())} for i in range(count)
             if (mine[i] != theirs[i]).any()]
    return {"value": float(cost.mean(axis=1).mean()) if count else None, "n": count,
            "matched": count - len(flips), "flips": flips, "positions": int(ref.shape[1]),
            "detail": flip_words(flips)}


def expected_drop_of(acc: dict[str, Any]) -> float | None:
    """The largest expected top-1 drop the candidate's accuracy record holds (a classify task's
    figure, or a class-score output's), or None where nothing is judged that way."""
    task = (acc.get("task") or {}).get("figures", {})
    found = [task["expected_drop"]["value"]] if "expected_drop" in task else []
    found += [e["value"] for e in acc.get("expected_drop", {}).values()]
    found = [v for v in found if v is not None]
    return max(found) if found else None


SMALL_OUTPUT = 8        # values per sample: a score, a few regression numbers
SMALL_OUTPUT_ERROR = 0.01   # of the output's largest magnitude over the held-out samples


def small_output_failures(reference: dict[str, np.ndarray],
                          compared: dict[str, dict[str, Any]],
                          class_outputs: frozenset[str] = frozenset()) -> list[str]:
    """Outputs of a few values per sample (a [1, 1] score, a quality model's three MOS numbers)
    that moved more than 1% of their largest magnitude. A cosine cannot judge them: a [1, 1]
    output always has cosine 1, and a few positive numbers stay near it whatever their values
    (a speech-quality model at max abs 0.76 on scores of 1-5 kept cosine 0.999). Class scores
    (*class_outputs*) are judged by their expected top-1 drop instead."""
    found = []
    for name, ref in reference.items():
        if ref.dtype.kind != "f" or not len(ref) or ref[0].size > SMALL_OUTPUT or \
                name not in compared:
            continue
        if name in class_outputs:   # judged by their expected drop (expected_drops)
            continue
        scale = float(np.abs(ref).max())
        allowed = max(SMALL_OUTPUT_ERROR * scale, 1e-6)
        if compared[name]["max_abs"] > allowed:
            found.append(f"output '{name}' ({ref[0].size} value{'s' * (ref[0].size > 1)} a "
                         f"sample): max abs {compared[name]['max_abs']:.4g} > {allowed:.4g} "
                         f"({100 * SMALL_OUTPUT_ERROR:g}% of its largest magnitude, "
                         f"{scale:.4g}; a cosine cannot judge so few values)")
    return found


CLASS_HEADS = ("Softmax", "LogSoftmax")
PASS_THROUGH = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def class_outputs(graph: Any, labels: Sequence[str] | None) -> frozenset[str]:
    """Outputs that hold class scores: a Softmax feeds them (through reshapes), or their last
    axis counts the --labels."""
    producer = {o: n for n in graph.node for o in n.output}
    found = set()
    for out in graph.output:
        node = producer.get(out.name)
        while node is not None and node.op_type in PASS_THROUGH:
            node = producer.get(node.input[0])
        dims = [d.dim_value for d in out.type.tensor_type.shape.dim]
        if (node is not None and node.op_type in CLASS_HEADS) or \
                (labels and dims and dims[-1] == len(labels) and len(labels) > 1):
            found.add(out.name)
    return frozenset(found)


def check_min_cosine(value: float) -> float:
    """--min-cosine: a cosine in [0, 1] (1: identical outputs), else PackagerError."""
    if not 0 <= value <= 1:   # NaN fails this too
        raise PackagerError(f"--min-cosine {value:g} is not a cosine in [0, 1]",
                            "for example --min-cosine 0.99 (every held-out output's cosine to "
                            "FP32)")
    return value


def parse_drop(text: str) -> float:
    """'1%' or '0.01' -> 0.01."""
    value = text.strip()
    try:
        number = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise PackagerError(f"--max-accuracy-drop {text!r} is not a number or percentage",
                            "for example --max-accuracy-drop 1%") from None
    if not 0 <= number < 1:
        raise PackagerError(f"--max-accuracy-drop {text}: must be between 0% and 100%",
                            "for example 1%")
    return number


def load_metric(spec: str) -> tuple[Metric, str]:
    """`path/to/file.py:function`: function(outputs, labels) -> float, higher is better."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not Path(path).is_file():
        raise PackagerError(f"--metric {spec}: expected path/to/file.py:function",
                            "the function takes (outputs, labels) and returns a float, "
                            "higher is better")
    module_spec = importlib.util.spec_from_file_location("_edgepack_metric", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise PackagerError(f"--metric {spec}: importing {path} failed ({exc})",
                            "fix the file") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise PackagerError(f"--metric {spec}: {path} has no function {name}", "fix the name")
    return fn, name


def hygiene(calib: Sequence[Sample], held: Sequence[Sample]) -> list[str]:
    """Warnings about the calibration set: too small, or unlike the held-out samples."""
    notes = []
    if len(calib) < SMALL_CALIBRATION:
        notes.append(f"only {len(calib)} calibration samples; {SMALL_CALIBRATION} or more give "
                     "steadier activation ranges")
    if calib and held:
        for name in calib[0]:
            if calib[0][name].dtype.kind != "f":
                continue
            # float64 sums without a float64 copy of the set (53 photos at 640x480: 2.5 s)
            (mean_a, std_a), (mean_b, std_b) = (_moments([s[name] for s in group])
                                                for group in (calib, held))
            if std_a == 0:
                continue
            shift = abs(mean_a - mean_b) / std_a
            ratio = std_b / std_a
            if shift > 0.5 or not 0.5 <= ratio <= 2.0:
                notes.append(f"input {name}: held-out samples differ from the calibration set "
                             f"(mean {mean_b:.3g} vs {mean_a:.3g}, std {std_b:.3g} vs "
                             f"{std_a:.3g}); calibrate on data like what the device will see")
    return notes


def _moments(arrays: Sequence[np.ndarray]) -> tuple[float, float]:
    """Mean and standard deviation over all elements of *arrays*, summed in float64, scaled
    by the largest finite magnitude first (inputs near 1e154 overflowed the squares)."""
    count = sum(a.size for a in arrays)
    scale = max((float(np.abs(a[np.isfinite(a)]).max(initial=0.0)) for a in arrays
                 if a.size), default=0.0) or 1.0
    mean = sum(float(np.sum(a / scale, dtype=np.float64)) for a in arrays) / count
    var = sum(float(np.sum(np.square(a / scale - mean, dtype=np.float64)))
              for a in arrays) / count
    return mean * scale, var ** 0.5 * scale


def calibration_record(calib: Sequence[Sample], method: str) -> dict[str, Any]:
    """Hash, sample count and method of the calibration set, for the manifest."""
    import hashlib

    digest = hashlib.sha256()
    for sample in calib:
        _update(digest, sample)
    return {"sha256": digest.hexdigest(), "samples": len(calib), "method": method}


def worst_samples(fp32: Path, candidate: Path, held: Sequence[Sample], count: int) -> list[Sample]:
    """The held-out samples on which *candidate* agrees least with FP32: where to look."""
    ref, got = run_model(fp32, held), run_model(candidate, held)
    score = np.ones(len(held))
    for name, r in ref.items():
        for i, (a, b) in enumerate(zip(_rows(got[name], len(held)), _rows(r, len(held)),
                                       strict=True)):
            if len(a) != len(b):   # a length that follows the input (speech): zero-padded
                a, b = (np.pad(x, (0, max(len(a), len(b)) - len(x))) for x in (a, b))
            score[i] = min(score[i], scaled_cosine(a, b))
    return [held[i] for i in np.argsort(score)[:count]]


def _rows(outputs: np.ndarray, count: int) -> list[np.ndarray]:
    """Each sample's output flattened, float64: a stacked array's rows, or a ragged one's."""
    if outputs.dtype == object:
        return [np.asarray(x, np.float64).ravel() for x in outputs]
    return list(np.asarray(outputs, np.float64).reshape(count, -1))


def measure_accuracy(candidate: Path, reference: Path, samples: Sequence[Sample],
                     reference_outputs: dict[str, np.ndarray] | None = None,
                     candidate_outputs: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Accuracy of *candidate* against *reference* on held-out *samples* (the reference's
    outputs may be given, computed once for many candidates; the candidate's too)."""
    if reference_outputs is None:
        reference_outputs = run_model(reference, samples)
    if candidate_outputs is None:
        candidate_outputs = run_model(candidate, samples)
    outputs = compare_outputs(candidate_outputs, reference_outputs)
    summary = {"samples": len(samples), "outputs": outputs,
               "cosine_min": min(o["cosine_min"] for o in outputs.values()),
               "cosine_mean": float(np.mean([o["cosine_mean"] for o in outputs.values()])),
               "max_abs": max(o["max_abs"] for o in outputs.values())}
    top1 = [o["top1_agreement"] for o in outputs.values() if "top1_agreement" in o]
    if top1:
        summary["top1_agreement"] = min(top1)
    return summary


def accuracy_line(acc: dict[str, Any]) -> str:
    text = f"cosine min {acc['cosine_min']:.4f} mean {acc['cosine_mean']:.4f}, " \
           f"max abs {acc['max_abs']:.4g}"
    if "top1_agreement" in acc:
        text += f", top-1 agreement {100 * acc['top1_agreement']:.1f}%"
    if acc.get("metric") is not None:
        text += (f", {acc['metric'] or 'metric'} {acc['metric_quantized']:.4g} against FP32's "
                 f"{acc['metric_fp32']:.4g}")
    if acc.get("task"):
        text += f"; {acc['task']['kind']}: {acc['task']['text']}"
    if acc.get("labelled"):
        text += f"; {acc['labelled']['text']}"
    for name, drop in acc.get("expected_drop", {}).items():
        text += f"; output '{name}': {drop['text']}"
    return text + f" ({acc['samples']} samples{', random inputs' if acc.get('data') == 'random' else ''})"
