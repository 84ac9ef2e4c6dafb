"""The ctc head: text read greedily from a CTC output, and strings and characters that agree
between two models.
"""

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .task_figures import share
from .tasks import as_probabilities, pick


def ctc_steps(conf, outputs):
    """(T, C) class probabilities of one sample's CTC output ((1, T, C) or (T, 1, C))."""
    x = np.asarray(pick(outputs, conf["output"]), np.float64)
    if x.ndim == 3 and x.shape[0] != 1 and x.shape[1] == 1:
        x = x[:, 0, :]
    x = x.reshape((-1, x.shape[-1]))
    return as_probabilities(x, conf["softmax"])


def ctc_decode(conf, outputs):
    """(kept class ids, confidence): greedy decode, repeats collapsed, blanks dropped."""
    probs = ctc_steps(conf, outputs)
    best = probs.argmax(axis=1)
    kept = [k for k in range(len(best))
            if best[k] != conf["blank"] and (k == 0 or best[k] != best[k - 1])]
    confidence = float(np.mean(probs[kept, best[kept]])) if kept else 0.0
    return [int(best[k]) for k in kept], confidence


def ctc_text(conf, ids):
    alphabet = conf["alphabet"]
    if not alphabet:
        return None
    return "".join(alphabet[i] if i < len(alphabet) else "?" for i in ids)


def read(conf, outputs, feed=None, part_labels=None):
    ids, confidence = ctc_decode(conf, outputs)
    result = {"text": ctc_text(conf, ids), "confidence": confidence}
    if not conf["alphabet"]:
        result["ids"] = ids
    return result


def edit_distance(a, b):
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def figures(conf, reference, candidate, feeds=None):
    ref = [ctc_decode(conf, o)[0] for o in reference]
    got = [ctc_decode(conf, o)[0] for o in candidate]
    equal = sum(r == g for r, g in zip(ref, got))
    chars = sum(len(r) for r in ref)
    errors = sum(edit_distance(r, g) for r, g in zip(ref, got))
    return {"exact": share(equal, len(ref)),
            "cer": {"value": (float(errors) / chars) if chars else (0.0 if not errors else None),
                    "n": chars, "errors": errors, "samples": len(ref)}}


def summary(result):
    text = result["text"] if result["text"] is not None else " ".join(
        str(i) for i in result.get("ids", []))
    return "%r (confidence %.3f)" % (text, result["confidence"])
