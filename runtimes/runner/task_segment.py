"""The segment head: a class map per sample, and the IoU of the segmented pixels between two
models.
"""

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .task_figures import share
from .tasks import pick


def segment_map(conf, outputs):
    """(H, W) class map of one sample: argmax over axis 1, or one channel over threshold."""
    x = np.asarray(pick(outputs, conf["output"]), np.float64)
    if x.ndim == 4:
        x = x[0]
    if x.ndim == 3 and x.shape[0] > 1:
        return x.argmax(axis=0)
    x = x.reshape(x.shape[-2:]) if x.ndim >= 2 else x.reshape(1, -1)
    if x.size and (x.min() < 0.0 or x.max() > 1.0):   # logits: the threshold is a probability
        x = 1.0 / (1.0 + np.exp(-x))
    return (x >= conf["threshold"]).astype(np.int64)


def read(conf, outputs, feed=None, part_labels=None):
    classes = segment_map(conf, outputs)
    ids, counts = np.unique(classes, return_counts=True)
    return {"classes": dict((str(int(i)), float(c) / classes.size) for i, c in zip(ids, counts)),
            "shape": list(classes.shape), "_map": classes.astype(np.int32)}


def figures(conf, reference, candidate, feeds=None):
    """IoU and pixel agreement of the maps. The share of pixels that agree says little where
    one class is most of the image: on a text detector's map (3 % text) 99.9 % of pixels agreed
    while the text regions moved enough to lose 11 % of the boxes. So the figure judged is the
    IoU of the segmented pixels, pooled over the samples: for a one-channel map over its
    threshold, of the pixels over it; for a class map, the mean over the classes either model
    paints of each class's IoU. Its unit is the sample (the pixels of one image move
    together)."""
    matched = n = 0
    inter, union = {}, {}
    for r, g in zip(reference, candidate):
        a, b = segment_map(conf, r), segment_map(conf, g)
        if a.shape != b.shape:
            b = np.full(a.shape, -1)
        matched += int(np.sum(a == b))
        n += a.size
        classes = (1,) if _one_channel(conf, r) else sorted(set(np.unique(a)) | set(np.unique(b)) - {-1})
        for c in classes:
            inter[c] = inter.get(c, 0) + int(np.sum((a == c) & (b == c)))
            union[c] = union.get(c, 0) + int(np.sum((a == c) | (b == c)))
    painted = [c for c in union if union[c]]
    iou = (float(np.mean([inter[c] / float(union[c]) for c in painted])) if painted else None)
    return {"iou": {"value": iou, "n": len(reference), "classes": len(painted),
                    "samples": len(reference)},
            "pixels": share(matched, n, samples=len(reference))}


def _one_channel(conf, outputs):
    """Whether segment_map thresholds one channel (else it takes the argmax over classes)."""
    x = np.asarray(pick(outputs, conf["output"]))
    x = x[0] if x.ndim == 4 else x
    return not (x.ndim == 3 and x.shape[0] > 1)


def summary(result):
    shares = sorted(result["classes"].items(), key=lambda kv: -kv[1])[:5]
    return "classes " + ", ".join("%s %.1f%%" % (k, 100 * v) for k, v in shares)
