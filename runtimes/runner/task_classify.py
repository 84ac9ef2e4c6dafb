"""The classify head: the top classes of one output, and top-1 agreement between two models.
"""

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .task_figures import share
from .tasks import as_probabilities, label_of, pick


def read(conf, outputs, feed=None, part_labels=None):
    row = pick(outputs, conf["output"]).reshape(-1)
    probs = as_probabilities(row, conf["softmax"])
    labels = conf["labels"] or part_labels
    order = np.argsort(-probs, kind="stable")[:conf["top"]]
    return {"top": [{"class": int(i), "label": label_of(labels, int(i)),
                     "score": float(probs[i])} for i in order]}


def figures(conf, reference, candidate, feeds=None):
    same = sum(int(np.argmax(pick(r, conf["output"]))) ==
               int(np.argmax(pick(g, conf["output"]))) for r, g in zip(reference, candidate))
    return {"top1": share(same, len(reference))}


def summary(result):
    if not result.get("top"):
        return ""
    best = result["top"][0]
    return "%s %.4g" % (best["label"] or "class %d" % best["class"], best["score"])
