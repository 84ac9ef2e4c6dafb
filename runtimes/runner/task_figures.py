"""Task figures: how far two models agree in a task's terms on the same held-out samples (top-1,
box recall and precision, nearest neighbours, strings, pixels, speech frames), and the judgement
of those figures against what a user keeps.

    figures(task, reference, candidate, feeds=None)  {name: {"value", "n", ...}}
    split_samples({name: stacked array})             [{name: one sample's array}]
    parse_keep("top1=99%,recall=0.9")                {"top1": 0.99, "recall": 0.9}
    judge(task, figures, keep=None)                  {"passed", "shown", "text", "figures"}

What a task keeps: DEFAULT_KEEP for its kind, the task's own "keep" object over it (as the
manifest records it), and judge's *keep* (--keep) over both.

*reference* and *candidate* are lists of per-sample outputs (the same samples through two
models, e.g. FP32 and INT8), each as tasks.apply takes them: a dict {output name: array} or a
list of arrays in the session's order. *feeds*: the samples' inputs (embed's mean pooling reads
its mask there).
"""

import math

from .contents import optional_module
from .errors import BundleError
from .task_spec import FIGURES, settings, task_kind

# What a user would accept of each kind (shares at least, "cer" at most), on a held-out set
# large enough to show it.
DEFAULT_KEEP = {
    # (a classifier: the accuracy expected lost under FP32's own probabilities, 1 point as
    # NNCF's accuracy control; top-1 agreement is reported beside it, gated only when kept)
    "classify": {"expected_drop": 0.01},
    "detect": {"recall": 0.95, "precision": 0.95},
    # (what retrieval reads: each sample's 5 nearest others, and the order of all pairs)
    "embed": {"recall5": 0.99, "rank": 0.99},
    # (a sequence reader: the characters it gets wrong against FP32's, 1 point as the field
    # reads OCR by CER; strings equal is its agreement, reported, gated only when kept: one
    # near-tie character flips a whole string, as a near-tie flips a classifier's top-1)
    "ctc": {"cer": 0.01},
    "segment": {"iou": 0.98},
    # (a speech detector: the frames expected lost under FP32's own probability, as a
    # classifier's; a flip at p 0.52 costs 0.04 of a frame, a confident one a whole frame)
    "vad": {"frame_drop": 0.01},
    "multilabel": {"f1": 0.99},
    "tts": {"length": 1.0, "mel": 1.0},   # (snr: said, kept only when asked: --keep snr=...)
}
AT_MOST = ("cer", "expected_drop", "frame_drop")        # lower is better
# a figure a user's keep names in place of another: keeping top1 judges agreement, not the drop
INSTEAD = {"top1": ("expected_drop",), "frames": ("frame_drop",), "retrieval1": ("recall5", "rank"),
           "cosine_min": ("recall5", "rank"), "exact": ("cer",)}
POOLED = ("iou", "recall5", "rank")   # one figure over all the samples, not a share of them
NO_COUNT = ("cosine_min",)   # a floor on every sample: one sample shows it
ALIASES = {"cosine": "cosine_min", "top-1": "top1", "retrieval@1": "retrieval1", "miou": "iou",
           "recall@5": "recall5", "spearman": "rank"}
WORDS = {   # how each figure reads: "<words> <value> of <n> <unit>"
    "top1": ("top-1 agrees on", "samples"),
    "expected_drop": ("expected top-1 drop under FP32's probabilities", "samples"),
    "recall": ("box recall (IoU 0.5, same class)", "reference boxes"),
    "precision": ("box precision (IoU 0.5, same class)", "candidate boxes"),
    "retrieval1": ("nearest neighbour agrees on", "samples"),
    "recall5": ("the 5 nearest neighbours kept (recall@5)", "samples"),
    "rank": ("the pairs' similarities in the same order (rank correlation)", "samples"),
    "cosine_min": ("cosine min", "samples"),
    "exact": ("strings equal on", "samples"),
    "cer": ("character error rate", "characters"),
    "pixels": ("pixels agree on", "pixels"),
    "iou": ("segmented-pixel IoU", "samples"),
    "frames": ("speech frames agree on", "frames"),
    "frame_drop": ("expected frame drop under FP32's probabilities", "frames"),
    "f1": ("labels on agree (F1) on", "labels on in the reference"),
    "length": ("the same length (within the task's tolerance) on", "samples"),
    "mel": ("log-mel distance within the task's mel_db on", "samples"),
    "snr": ("waveform SNR at least the task's snr_db on", "samples"),
}


def share(matched, n, **extra):
    entry = {"value": (float(matched) / n) if n else None, "n": int(n), "matched": int(matched)}
    entry.update(extra)
    return entry


def flip_words(flips, shown=5):
    """'2 flips, FP32's margins 0.008, 0.31' (the costliest first), or '' with none."""
    if not flips:
        return ""
    worst = sorted((f["margin"] for f in flips), reverse=True)
    return "%d flip%s, FP32's margin%s %s%s" % (
        len(flips), "s" * (len(flips) > 1), "s" * (len(flips) > 1),
        ", ".join("%.3g" % m for m in worst[:shown]), " ..." * (len(worst) > shown))


def split_samples(stacked, names=None):
    """Per-sample outputs (or feeds) from arrays stacked over samples, as golden .npz files
    and check hold them ({name: (samples, 1, ...)}): [{name: (1, ...)}], in *names*' order."""
    names = list(stacked) if names is None else list(names)
    count = min(len(stacked[n]) for n in names) if names else 0
    return [dict((n, stacked[n][i]) for n in names) for i in range(count)]


def figures(task, reference, candidate, feeds=None):
    """The figures of *task* ({name: {"value", "n", "matched"...}}) for *candidate* against
    *reference*; a value is None when the samples hold nothing to measure (no boxes). Each
    kind's are its head's (task_<kind>.py)."""
    if len(reference) != len(candidate):
        raise ValueError("%d reference samples, %d candidate samples: the same samples go "
                         "through both" % (len(reference), len(candidate)))
    conf = settings(task)
    if conf["kind"] == "raw":
        return {}
    head = optional_module("task_" + conf["kind"])
    return head.figures(conf, list(reference), list(candidate), feeds)


# ---------------------------------------------------------------------------------------------
# What a user keeps, and the judgement


def parse_keep(text):
    """{figure: threshold} from --keep text: 'top1=99%', 'recall=0.9,precision=90%', 'cer=1%'.
    Raises BundleError naming --keep on anything else."""
    keep = {}
    known = sorted(set(n for names in FIGURES.values() for n in names))
    for item in str(text).split(","):
        name, sep, value = item.strip().partition("=")
        name = ALIASES.get(name.strip().lower(), name.strip().lower())
        if not sep or not name or not value.strip():
            raise BundleError("--keep %r: write FIGURE=VALUE, e.g. top1=99%% or cer=1%%"
                              % str(text)[:80])
        if name not in known:
            raise BundleError("--keep %r: no figure %r; figures: %s"
                              % (str(text)[:80], name[:40], ", ".join(known)))
        value = value.strip()
        percent = value.endswith("%")
        try:
            number = float(value[:-1] if percent else value)
        except ValueError:
            number = float("nan")
        number = number / 100.0 if percent else number
        low = -1.0 if name == "cosine_min" else 0.0
        if not low <= number <= 1.0:   # nan fails too
            raise BundleError("--keep %r: %s=%s is not a share from 0 to 1 (write 99%% or 0.99)"
                              % (str(text)[:80], name, value[:40]))
        keep[name] = number
    return keep


def keep_for(task, keep=None):
    """What the task keeps: DEFAULT_KEEP, the task's own `keep` over it (the manifest's record),
    and *keep* (parse_keep's) over both; a figure the task does not have is refused, naming
    --keep."""
    kind = task_kind(task)
    merged = dict(DEFAULT_KEEP.get(kind, {}))
    own = dict((task or {}).get("keep") or {})
    for asked in (own, keep or {}):
        for name, others in INSTEAD.items():
            if name in asked and not any(o in asked or o in own for o in others):
                for other in others:
                    merged.pop(other, None)
    merged.update(own)
    for name, value in sorted((keep or {}).items()):
        if name not in FIGURES.get(kind, ()):
            raise BundleError("--keep %s: a %s task has no %s figure (it has: %s)" % (
                name, kind, name, ", ".join(FIGURES.get(kind, ())) or "none"))
        merged[name] = value
    return merged


def needed(name, threshold):
    """Units (samples, boxes, frames, characters) needed before one miss could break
    *threshold*: 100 for 99 %; 0 for a floor every sample shows."""
    if name in NO_COUNT:
        return 1
    gap = threshold if name in AT_MOST else 1.0 - threshold
    if gap <= 0:
        return 1
    return int(math.ceil(round(1.0 / gap, 6)))


def percent(value, at_most=False):
    """A share as text, rounded the cautious way (99.96 % of an at-least figure reads 99.9 %)."""
    p = 100.0 * value
    p = math.ceil(p * 10 - 1e-9) / 10 if at_most else math.floor(p * 10 + 1e-9) / 10
    return ("%.1f" % p).rstrip("0").rstrip(".") + "%"


def judge_one(name, entry, threshold):
    at_most = name in AT_MOST
    words, unit = WORDS[name]
    value, n = entry.get("value"), entry.get("n", 0)
    need = needed(name, threshold)
    if name in NO_COUNT:
        shown = n >= 1
        ok = value is not None and value >= threshold
        text = "%s %.5f over %d %s (needs %.4f)" % (words, value if value is not None else
                                                   float("nan"), n, unit, threshold)
        return {"value": value, "keep": threshold, "passed": ok, "shown": shown, "needed": need,
                "n": n, "text": text}
    if value is None:
        return {"value": None, "keep": threshold, "passed": True, "shown": False, "needed": need,
                "n": 0, "text": "%s: no %s among %d samples to judge it (needs %s; %d needed)" % (
                    words, unit, entry.get("samples", 0), percent(threshold, at_most), need)}
    ok = value <= threshold + 1e-12 if at_most else value >= threshold - 1e-12
    shown = n >= need
    if at_most or name in POOLED:
        head = "%s %s over %d %s" % (words, percent(value, at_most), n, unit)
    else:
        head = "%s %s of %d %s" % (words, percent(value), n, unit)
    text = "%s (needs %s%s%s)%s" % (
        head, "at most " if at_most else "", percent(threshold, at_most),
        "" if shown else "; %d %s cannot show %s: %d needed" % (
            n, unit, percent(threshold, at_most), need),
        " [%s]" % entry["detail"] if entry.get("detail") else "")
    return {"value": value, "keep": threshold, "passed": ok, "shown": shown, "needed": need,
            "n": n, "text": text}


def judge(task, figures, keep=None):
    """*figures* (figures()) against the task's keep (DEFAULT_KEEP, *keep* over it):
    {"passed": no figure breaks its keep, "shown": every figure counted enough units to show
    its keep (a set too small passes nothing: a caller reports it, and a disagreement still
    fails), "text": one line, "figures": {name: {value, keep, passed, shown, needed, text}},
    "reported": {name: text} of the figures measured and not kept (said, never gated)}."""
    kept = keep_for(task, keep)
    judged, reported = {}, {}
    for name in FIGURES.get(task_kind(task), ()):
        if name in kept and name in figures:
            judged[name] = judge_one(name, figures[name], kept[name])
        elif name in figures and figures[name].get("value") is not None and name in WORDS:
            reported[name] = reported_text(name, figures[name])
    passed = all(j["passed"] for j in judged.values())
    shown = all(j["shown"] for j in judged.values())
    text = "; ".join([j["text"] + ("" if j["passed"] else ": FAILED") for j in judged.values()]
                     + [t + " (reported)" for t in reported.values()])
    return {"passed": passed, "shown": shown, "text": text, "figures": judged,
            "reported": reported}


def reported_text(name, entry):
    words, unit = WORDS[name]
    at_most = name in AT_MOST
    return "%s %s %s %d %s" % (words, percent(entry["value"], at_most),
                               "over" if at_most or name in POOLED else "of", entry["n"], unit)
