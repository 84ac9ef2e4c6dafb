"""The classify head: the top classes of one output, and top-1 agreement between two models.
"""

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .task_figures import flip_words, share
from .tasks import as_probabilities, label_of, pick


def read(conf, outputs, feed=None, part_labels=None):
    row = pick(outputs, conf["output"]).reshape(-1)
    probs = as_probabilities(row, conf["softmax"])
    labels = conf["labels"] or part_labels
    order = np.argsort(-probs, kind="stable")[:conf["top"]]
    return {"top": [{"class": int(i), "label": label_of(labels, int(i)),
                     "score": float(probs[i])} for i in order]}


def figures(conf, reference, candidate, feeds=None):
    """top1: the share of samples whose top class is the reference's; expected_drop: the
    accuracy the candidate is expected to lose under the reference's own probabilities (per
    sample, the probability of the reference's answer minus that of the candidate's, averaged):
    a flip on a near-tie costs what the reference was unsure of, a confident flip a whole
    sample. Each flip is listed with the reference's margin (what it cost)."""
    same, cost, flips = 0, 0.0, []
    for i, (r, g) in enumerate(zip(reference, candidate)):
        probs = as_probabilities(pick(r, conf["output"]).reshape(-1), conf["softmax"])
        mine, theirs = int(np.argmax(probs)), int(np.argmax(pick(g, conf["output"])))
        if mine == theirs:
            same += 1
            continue
        margin = float(probs[mine] - probs[theirs])
        cost += margin
        flips.append({"sample": i, "fp32": mine, "candidate": theirs, "margin": margin})
    n = len(reference)
    return {"top1": share(same, n),
            "expected_drop": {"value": cost / n if n else None, "n": n, "matched": same,
                              "flips": flips, "detail": flip_words(flips)}}


def summary(result):
    if not result.get("top"):
        return ""
    best = result["top"][0]
    return "%s %.4g" % (best["label"] or "class %d" % best["class"], best["score"])
