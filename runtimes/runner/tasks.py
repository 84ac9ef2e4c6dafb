"""Task heads: a part's outputs read in its task's terms (labels, boxes, vectors, text, speech).

A part's task is the manifest's `parts[i].task`, a JSON object; absent or {"kind": "raw"} means
tensors. The host's decision and the device's `infer`/`serve` call the same functions:

    task_problem(task, outputs)                 '' or one line naming the key that is wrong
                                                (outputs: names, or {"name", "shape"} objects)
    apply(task, outputs, feed=None, labels=None)  one sample's result as JSON-able data
    part_result(part, names, outputs, feed)     a manifest part's result, with its "kind"
    add_image_boxes(result, preprocess, size)   a detector's boxes in the photo's own pixels

*outputs* is one sample's session outputs (batch 1): a dict {output name: array} in the
session's order, or a list of arrays in that order (then a task can name outputs by index
only). *feed* is the sample's inputs (embed's mean pooling reads its mask there). Keys of a
result starting with '_' hold arrays (a segmentation map) that `public` leaves out of JSON.
"""

import collections

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import BundleError, one_line
from .task_spec import (  # noqa: F401  (task_problem, KINDS...: this module's API too)
    DECODERS,
    KINDS,
    PARAMETERS,
    POOLINGS,
    is_count,
    multilabel_refs,
    settings,
    task_kind,
    task_problem,
)

MAX_CANDIDATES = 30000   # boxes over the score line that NMS looks at (the highest first)


# ---------------------------------------------------------------------------------------------
# Helpers


def named(outputs):
    """(names or None, arrays) of one sample's outputs (a dict or a list)."""
    if isinstance(outputs, dict):
        return list(outputs), [np.asarray(v) for v in outputs.values()]
    return None, [np.asarray(v) for v in outputs]


def pick(outputs, ref):
    """The output *ref* (an index or a name) of one sample's outputs."""
    names, arrays = named(outputs)
    if is_count(ref):
        return arrays[ref]
    if names is None or ref not in names:
        raise ValueError("output %r is not among the outputs given" % (ref,))
    return arrays[names.index(ref)]


def softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def is_distribution(x, axis=-1):
    """Whether every row along *axis* is already probabilities summing to 1."""
    x = np.asarray(x, np.float64)
    return bool(x.size and x.min() >= 0.0 and x.max() <= 1.0 and
                np.allclose(x.sum(axis=axis), 1.0, atol=1e-3))


def as_probabilities(x, mode, axis=-1):
    if mode is True or (mode == "auto" and not is_distribution(x, axis)):
        return softmax(x, axis)
    return np.asarray(x, np.float64)


def label_of(labels, index):
    return labels[index] if labels and 0 <= index < len(labels) else None


def public(result):
    """*result* without the keys that hold arrays (those starting with '_'), for JSON."""
    return dict((k, v) for k, v in result.items() if not str(k).startswith("_"))


# ---------------------------------------------------------------------------------------------
# Heads


def classify(conf, outputs, part_labels=None):
    row = pick(outputs, conf["output"]).reshape(-1)
    probs = as_probabilities(row, conf["softmax"])
    labels = conf["labels"] or part_labels
    order = np.argsort(-probs, kind="stable")[:conf["top"]]
    return {"top": [{"class": int(i), "label": label_of(labels, int(i)),
                     "score": float(probs[i])} for i in order]}


def iou_matrix(a, b):
    """IoU of boxes *a* (N, 4) against *b* (M, 4), x1 y1 x2 y2."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-12)


def matched_pairs(want, got, threshold=0.5, classes=None):
    """[(i, j)]: each box of *want* with the box of *got* it overlaps most at IoU >= *threshold*,
    each of *got* matched once, the best-overlapping boxes of *want* first; with *classes*
    ((want's, got's) class ids) only boxes of the same class match."""
    if not len(want) or not len(got):
        return []
    iou = iou_matrix(want, got)
    if classes is not None:
        iou = iou * (np.asarray(classes[0])[:, None] == np.asarray(classes[1])[None, :])
    used, pairs = set(), []
    for i in np.argsort(-iou.max(axis=1), kind="stable"):
        for j in np.argsort(-iou[i], kind="stable"):
            if iou[i, j] < threshold:
                break
            if int(j) not in used:
                used.add(int(j))
                pairs.append((int(i), int(j)))
                break
    return pairs


def nms(boxes, scores, threshold, classes=None, limit=None):
    """Indices kept by greedy non-maximum suppression, best first (at most *limit*); with
    *classes*, a box only suppresses boxes of its own class."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    keep = []
    while order.size and (limit is None or len(keep) < limit):
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        overlap = iou_matrix(boxes[i:i + 1], boxes[rest])[0]
        drop = overlap >= threshold
        if classes is not None:
            drop &= classes[rest] == classes[i]
        order = rest[~drop]
    return keep


def xywh_to_xyxy(xywh):
    return np.concatenate([xywh[:, :2] - xywh[:, 2:4] / 2, xywh[:, :2] + xywh[:, 2:4] / 2], axis=1)


def yolo_candidates(conf, outputs):
    """(boxes xyxy, scores, classes) of every anchor of a YOLOv8 or YOLOv5 head."""
    pred = np.asarray(pick(outputs, conf["output"]), np.float64)
    pred = pred.reshape(pred.shape[-2:]) if pred.ndim >= 2 else pred.reshape(1, -1)
    if conf["decoder"] == "yolov8":
        # (4 + C, N) as exported; a (N, 4 + C) export (anchors first) is read the same way
        if pred.shape[0] > pred.shape[1]:
            pred = pred.T
        pred = pred.T
        cls = pred[:, 4:] if pred.shape[1] > 4 else np.ones((len(pred), 1))
    else:
        cls = pred[:, 4:5] * pred[:, 5:] if pred.shape[1] > 5 else pred[:, 4:5]
    return xywh_to_xyxy(pred[:, :4]), cls.max(axis=1), cls.argmax(axis=1)


def centernet_candidates(conf, outputs):
    """(boxes, scores, classes, landmarks or None) of a CenterFace-style head: heatmap peaks,
    box size exp(scale) * stride, centre offset, landmarks relative to the box."""
    names, arrays = named(outputs)
    refs = conf["outputs"] or list(range(min(4, len(arrays))))
    heat = np.asarray(pick(outputs, refs[0]), np.float64)
    heat = heat.reshape(heat.shape[-2:])
    scale = np.asarray(pick(outputs, refs[1]), np.float64)[0]
    offset = np.asarray(pick(outputs, refs[2]), np.float64)[0]
    marks = np.asarray(pick(outputs, refs[3]), np.float64)[0] if len(refs) > 3 else None
    stride = conf["stride"]
    ys, xs = np.nonzero(heat >= conf["floor"])
    h = np.exp(scale[0, ys, xs]) * stride
    w = np.exp(scale[1, ys, xs]) * stride
    x1 = np.maximum(0.0, (xs + offset[1, ys, xs] + 0.5) * stride - w / 2)
    y1 = np.maximum(0.0, (ys + offset[0, ys, xs] + 0.5) * stride - h / 2)
    boxes = np.stack([x1, y1, x1 + w, y1 + h], axis=1)
    points = None
    if marks is not None and marks.shape[0] >= 2:
        count = marks.shape[0] // 2
        lm = marks[:, ys, xs]   # (2 * count, K): y then x of each point, as box fractions
        points = np.stack([lm[1::2][:count].T * w[:, None] + x1[:, None],
                           lm[0::2][:count].T * h[:, None] + y1[:, None]], axis=2)
    return boxes, heat[ys, xs], np.zeros(len(ys), np.int64), points


def decode_boxes(conf, outputs, score=None):
    """(boxes, scores, classes, landmarks or None) after the score line and NMS, best first."""
    floor = conf["score"] if score is None else score
    conf = dict(conf, floor=floor)
    points = None
    if conf["decoder"] == "centernet":
        boxes, scores, classes, points = centernet_candidates(conf, outputs)
    else:
        boxes, scores, classes = yolo_candidates(conf, outputs)
    pick_ = np.nonzero(scores >= floor)[0]
    if pick_.size > MAX_CANDIDATES:
        pick_ = pick_[np.argsort(-scores[pick_], kind="stable")[:MAX_CANDIDATES]]
    boxes, scores, classes = boxes[pick_], scores[pick_], classes[pick_]
    points = points[pick_] if points is not None else None
    keep = nms(boxes, scores, conf["iou"], None if conf["agnostic"] else classes,
               conf["max_boxes"])
    return (boxes[keep], scores[keep], classes[keep],
            points[keep] if points is not None else None)


def detect(conf, outputs, part_labels=None):
    boxes, scores, classes, points = decode_boxes(conf, outputs)
    labels = conf["labels"] or part_labels
    found = []
    for k in range(len(boxes)):
        item = {"box": [round(float(v), 2) for v in boxes[k]], "score": float(scores[k]),
                "class": int(classes[k]), "label": label_of(labels, int(classes[k]))}
        if points is not None:
            item["landmarks"] = [[round(float(x), 2), round(float(y), 2)] for x, y in points[k]]
        found.append(item)
    return {"boxes": found}


def embedding(conf, outputs, feed=None):
    """(vector, norm before normalising) of one sample."""
    x = np.asarray(pick(outputs, conf["output"]), np.float64)
    pooling = conf["pooling"]
    if pooling != "none" and x.ndim >= 2:
        tokens = x.reshape((-1,) + x.shape[-2:])[0]   # (T, D) of the batch's one sample
        if pooling == "cls":
            x = tokens[0]
        else:
            mask = (feed or {}).get(conf["mask"])
            weight = np.ones(len(tokens)) if mask is None else \
                np.asarray(mask, np.float64).reshape(-1)[:len(tokens)]
            if weight.size != len(tokens):
                weight = np.ones(len(tokens))
            x = (tokens * weight[:, None]).sum(axis=0) / max(float(weight.sum()), 1e-9)
    x = x.reshape(-1)
    norm = float(np.linalg.norm(x))
    if conf["normalize"]:
        x = x / max(norm, 1e-12)
    return x, norm


def embed(conf, outputs, feed=None):
    x, norm = embedding(conf, outputs, feed)
    return {"embedding": [float(v) for v in x], "norm": norm}


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


def ctc(conf, outputs):
    ids, confidence = ctc_decode(conf, outputs)
    result = {"text": ctc_text(conf, ids), "confidence": confidence}
    if not conf["alphabet"]:
        result["ids"] = ids
    return result


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


def segment(conf, outputs):
    classes = segment_map(conf, outputs)
    ids, counts = np.unique(classes, return_counts=True)
    return {"classes": dict((str(int(i)), float(c) / classes.size) for i, c in zip(ids, counts)),
            "shape": list(classes.shape), "_map": classes.astype(np.int32)}


def vad_probabilities(conf, outputs):
    return np.asarray(pick(outputs, conf["output"]), np.float64).reshape(-1)


def vad(conf, outputs):
    probs = vad_probabilities(conf, outputs)
    return {"speech": [bool(p >= conf["threshold"]) for p in probs],
            "probability": [float(p) for p in probs]}


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


def multilabel(conf, outputs, part_labels=None):
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


def apply(task, outputs, feed=None, labels=None):
    """One sample's result in *task*'s terms (see the module's docstring for *outputs* and
    *feed*; *labels* are the part's own, used when the task names none):

    classify {"top": [{"class", "label", "score"}]}; detect {"boxes": [{"box": [x1, y1, x2,
    y2] in the model's input pixels, "score", "class", "label"[, "landmarks": [[x, y]]]}]};
    embed {"embedding", "norm"}; ctc {"text" (None without an alphabet, then "ids"),
    "confidence"}; segment {"classes": {id: pixel share}, "shape", "_map"}; vad {"speech",
    "probability"}; multilabel {"outputs": [{"output", "threshold", "frames", "classes",
    "on": [{"frame", "on": [label or index]}] (frames with a label on only)}]}; raw {}.
    """
    conf = settings(task)
    kind = conf["kind"]
    if kind == "classify":
        return classify(conf, outputs, labels)
    if kind == "detect":
        return detect(conf, outputs, labels)
    if kind == "embed":
        return embed(conf, outputs, feed)
    if kind == "ctc":
        return ctc(conf, outputs)
    if kind == "segment":
        return segment(conf, outputs)
    if kind == "vad":
        return vad(conf, outputs)
    if kind == "multilabel":
        return multilabel(conf, outputs, labels)
    return {}


def wants_task(part, raw=False):
    """Whether `infer`/`serve` answer *part* in its task's terms (it has one, --raw not given)."""
    return not raw and task_kind(part.get("task")) != "raw"


class TaskMisfit(BundleError):
    """The bundle's task cannot read its model's outputs (exit 2; in `serve`, 500: the
    bundle's fault, not the request's)."""

    status = 500


def part_result(part, names, outputs, feed=None):
    """*part*'s task result for one sample: {"kind", ...apply's keys}. A head that cannot read
    the outputs (a task that does not fit the model) is a BundleError, not a crash."""
    task = part.get("task")
    try:
        result = apply(task, collections.OrderedDict(zip(names, outputs)), feed,
                       part.get("labels"))
    except Exception as exc:
        raise TaskMisfit("the %s task of %s cannot read the model's outputs (%s); pass --raw "
                          "for the tensors, or rebuild the bundle with a task that fits"
                          % (task_kind(task), part.get("name"), one_line(exc))) from None
    result["kind"] = task_kind(task)
    return result


def input_to_image(spec, size):
    """A function taking (x, y) arrays in the model's input pixels to the original image's, by
    undoing *spec*'s resize (stretch, letterbox, center-crop) of an image of *size* (w, h)."""
    width, height = spec["size"]
    w, h = size
    mode = spec.get("resize", "stretch")
    if mode == "letterbox":
        r = min(float(width) / w, float(height) / h)
        nw, nh = max(1, int(round(w * r))), max(1, int(round(h * r)))
        left, top = (width - nw) // 2, (height - nh) // 2
    elif mode == "center-crop":
        r = max(float(width) / w, float(height) / h)
        nw, nh = max(width, int(round(w * r))), max(height, int(round(h * r)))
        left, top = -((nw - width) // 2), -((nh - height) // 2)
    else:
        nw, nh, left, top = width, height, 0, 0

    def convert(x, y):
        return (np.clip((np.asarray(x, np.float64) - left) * w / nw, 0, w),
                np.clip((np.asarray(y, np.float64) - top) * h / nh, 0, h))
    return convert


def add_image_boxes(result, spec, size):
    """Each box of a detect *result* also in the original image's pixels ("image_box",
    "image_landmarks"), for an image of *size* (width, height) preprocessed by *spec*."""
    convert = input_to_image(spec, size)
    for item in result.get("boxes", ()):
        xs, ys = convert([item["box"][0], item["box"][2]], [item["box"][1], item["box"][3]])
        item["image_box"] = [round(float(v), 2) for v in (xs[0], ys[0], xs[1], ys[1])]
        if "landmarks" in item:
            xs, ys = convert([p[0] for p in item["landmarks"]], [p[1] for p in item["landmarks"]])
            item["image_landmarks"] = [[round(float(x), 2), round(float(y), 2)]
                                       for x, y in zip(xs, ys)]
    result["image_size"] = [int(size[0]), int(size[1])]
    return result


def summary(task, result):
    """The result in a few words for a person: 'cat 0.93', '3 boxes: face 0.91, ...'."""
    kind = task_kind(task)
    if kind == "classify" and result.get("top"):
        best = result["top"][0]
        return "%s %.4g" % (best["label"] or "class %d" % best["class"], best["score"])
    if kind == "detect":
        shown = ["%s %.2f" % (b["label"] or "class %d" % b["class"], b["score"])
                 for b in result["boxes"][:5]]
        return "%d box(es)%s%s" % (len(result["boxes"]), ": " if shown else "",
                                   ", ".join(shown) + (", ..." if len(result["boxes"]) > 5 else ""))
    if kind == "embed":
        return "embedding of %d (norm %.4g)" % (len(result["embedding"]), result["norm"])
    if kind == "ctc":
        text = result["text"] if result["text"] is not None else " ".join(
            str(i) for i in result.get("ids", []))
        return "%r (confidence %.3f)" % (text, result["confidence"])
    if kind == "segment":
        shares = sorted(result["classes"].items(), key=lambda kv: -kv[1])[:5]
        return "classes " + ", ".join("%s %.1f%%" % (k, 100 * v) for k, v in shares)
    if kind == "vad":
        flags = result["speech"]
        return "speech in %d of %d frame(s)" % (sum(flags), len(flags))
    if kind == "multilabel":
        return "; ".join("%s: %d label(s) on in %d of %d frame(s)" % (
            o["output"], sum(len(f["on"]) for f in o["on"]), len(o["on"]), o["frames"])
            for o in result["outputs"])
    return ""
