"""The multilabel head: labels on per frame of one or more outputs, and their F1 between two
models.
"""

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .task_spec import is_count, multilabel_refs
from .tasks import named, pick


def multilabel_reads(conf, outputs):
    """[(output name, threshold, (frames, labels) probabilities)] of the outputs a multilabel
    task reads: labels on the last axis, every axis before it frames (a (1, C) output is one
    frame); logits (values outside [0, 1]) go through a sigmoid, as the threshold is a
    probability."""
    names, arrays = named(outputs)
    refs, thresholds = multilabel_refs(conf, len(arrays))
    if len(thresholds) != len(refs):
        raise ValueError("%d thresholds for %d outputs" % (len(thresholds), len(refs)))
    reads = []
    for ref, threshold in zip(refs, thresholds):
        x = np.asarray(pick(outputs, ref), np.float64)
        x = x.reshape((-1, x.shape[-1])) if x.ndim else x.reshape(1, 1)
        if conf["sigmoid"] is True or (conf["sigmoid"] == "auto" and x.size and
                                       (x.min() < 0.0 or x.max() > 1.0)):
            x = 1.0 / (1.0 + np.exp(-np.clip(x, -60.0, 60.0)))
        name = ref if not is_count(ref) else names[ref] if names else "output %d" % ref
        reads.append((str(name), float(threshold), x))
    return reads


def read(conf, outputs, feed=None, part_labels=None):
    found = []
    for name, threshold, x in multilabel_reads(conf, outputs):
        labels = conf["labels"] or part_labels
        labels = labels if labels and len(labels) == x.shape[1] else None
        on = x >= threshold
        frames = [{"frame": int(t), "on": [labels[c] if labels else int(c)
                                           for c in np.nonzero(on[t])[0]]}
                  for t in np.nonzero(on.any(axis=1))[0]]
        found.append({"output": name, "threshold": threshold, "frames": int(x.shape[0]),
                      "classes": int(x.shape[1]), "on": frames})
    return {"outputs": found}


def figures(conf, reference, candidate, feeds=None):
    """F1 of the candidate's labels on against the reference's, over every frame, label and
    output read. Not the share of frames (or cells) that agree: most frames of a sparse
    posteriorgram are silent, so a model that turns every label off would score high on that;
    F1 counts only labels on, so all-off against a reference with labels on scores 0."""
    hits = on_ref = on_got = 0
    per = {}
    for r, g in zip(reference, candidate):
        for (name, threshold, a), (_, _, b) in zip(multilabel_reads(conf, r),
                                                   multilabel_reads(conf, g)):
            a, b = a >= threshold, b >= threshold
            hit = int(np.sum(a & b)) if a.shape == b.shape else 0
            counts = per.setdefault(name, [0, 0, 0])
            for k, v in enumerate((hit, int(a.sum()), int(b.sum()))):
                counts[k] += v
            hits, on_ref, on_got = hits + hit, on_ref + int(a.sum()), on_got + int(b.sum())

    def f1(hit, ref, got):
        return 2.0 * hit / (ref + got) if ref + got else None
    return {"f1": {"value": f1(hits, on_ref, on_got), "n": on_ref, "matched": hits,
                   "candidate": on_got, "samples": len(reference),
                   "outputs": dict((k, f1(*v)) for k, v in per.items())}}


def summary(result):
    return "; ".join("%s: %d label(s) on in %d of %d frame(s)" % (
        o["output"], sum(len(f["on"]) for f in o["on"]), len(o["on"]), o["frames"])
        for o in result["outputs"])
