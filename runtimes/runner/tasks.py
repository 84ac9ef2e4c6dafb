"""Task heads: a part's outputs read in its task's terms (labels, boxes, vectors, text, speech).

A part's task is the manifest's `parts[i].task`, a JSON object; absent or {"kind": "raw"} means
tensors. The host's decision and the device's `infer`/`serve` call the same functions:

    task_problem(task, output_names)  '' or one line naming the key that is wrong
    apply(task, outputs, feed=None)   one sample's result as JSON-able data

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

KINDS = ("raw", "classify", "detect", "embed", "ctc", "segment", "vad")
DECODERS = ("yolov8", "yolov5", "centernet")
POOLINGS = ("none", "mean", "cls")
# Each kind's parameters and their defaults ("labels" of classify: the part's own labels).
PARAMETERS = {
    "raw": {},
    "classify": {"output": 0, "labels": None, "top": 5, "softmax": "auto"},
    "detect": {"decoder": "yolov8", "output": 0, "outputs": None, "score": 0.25, "iou": 0.45,
               "labels": None, "max_boxes": 300, "stride": 4, "agnostic": False},
    "embed": {"output": 0, "pooling": "none", "mask": "attention_mask", "normalize": True},
    "ctc": {"output": 0, "alphabet": None, "blank": 0, "softmax": "auto"},
    "segment": {"output": 0, "threshold": 0.5},
    "vad": {"output": 0, "threshold": 0.5},
}
MAX_CANDIDATES = 30000   # boxes over the score line that NMS looks at (the highest first)


def task_kind(task):
    """The task's kind: 'raw' when there is none."""
    if not task:
        return "raw"
    return task.get("kind", "raw") if isinstance(task, dict) else "raw"


def settings(task):
    """The task's parameters with their defaults filled in."""
    kind = task_kind(task)
    out = dict(PARAMETERS.get(kind, {}))
    out.update((k, v) for k, v in (task or {}).items() if k != "kind")
    out["kind"] = kind
    return out


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def is_count(value):
    return isinstance(value, int) and not isinstance(value, bool)


def output_problem(ref, output_names):
    if is_count(ref):
        if not 0 <= ref < len(output_names):
            return "is output %d, the model has %d output(s)" % (ref, len(output_names))
        return ""
    if isinstance(ref, str) and ref:
        if ref not in output_names:
            return "names output %r, the model's are %s" % (
                ref[:60], ", ".join(str(n)[:40] for n in output_names[:10]))
        return ""
    return "must be an output's index or name, got %r" % (str(ref)[:40],)


def string_list_problem(value, what):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return "must be a list of %s" % what
    return ""


def value_problem(kind, key, value, output_names):
    """What is wrong with one parameter of a *kind* task, or ''."""
    if key == "output":
        return output_problem(value, output_names)
    if key == "outputs":
        if value is None:
            return ""
        if not isinstance(value, list) or not 3 <= len(value) <= 4:
            return "must list 3 or 4 outputs (heatmap, scale, offset[, landmarks])"
        for ref in value:
            problem = output_problem(ref, output_names)
            if problem:
                return problem
        return ""
    if key in ("labels", "alphabet"):
        if value is None:
            return ""
        problem = string_list_problem(value, "strings")
        return problem or ("must not be empty" if not value else "")
    if key in ("top", "max_boxes", "stride"):
        if not is_count(value) or not 1 <= value <= 100000:
            return "must be a whole number from 1 to 100000, got %r" % (str(value)[:40],)
        return ""
    if key == "softmax":
        return "" if value in ("auto", True, False) else \
            "must be \"auto\", true or false, got %r" % (str(value)[:40],)
    if key in ("score", "iou", "threshold"):
        if not is_number(value) or not 0.0 < value <= 1.0:
            return "must be a number in (0, 1], got %r" % (str(value)[:40],)
        return ""
    if key in ("normalize", "agnostic"):
        return "" if isinstance(value, bool) else "must be true or false"
    if key == "decoder":
        return "" if value in DECODERS else "must be one of %s, got %r" % (
            ", ".join(DECODERS), str(value)[:40])
    if key == "pooling":
        return "" if value in POOLINGS else "must be one of %s, got %r" % (
            ", ".join(POOLINGS), str(value)[:40])
    if key == "mask":
        return "" if isinstance(value, str) and value else "must be an input's name"
    if key == "blank":
        if not is_count(value) or value < 0:
            return "must be a class index (0 or more), got %r" % (str(value)[:40],)
        return ""
    return "is not a parameter of a %s task (%s)" % (
        kind, ", ".join(sorted(PARAMETERS[kind])) or "it takes none")


def task_problem(task, output_names):
    """'' when *task* (a part's task object, or None) fits a model with *output_names*; else
    one line naming the key ('task.score must be ...'), for a manifest or a profile to report."""
    if task is None:
        return ""
    if not isinstance(task, dict):
        return "task must be an object with a kind (%s)" % ", ".join(KINDS)
    kind = task.get("kind")
    if kind not in KINDS:
        return "task.kind must be one of %s, got %r" % (", ".join(KINDS), str(kind)[:40])
    output_names = [str(n) for n in output_names]
    for key in sorted(k for k in task if k != "kind"):
        problem = value_problem(kind, str(key), task[key], output_names)
        if problem:
            return "task.%s %s" % (str(key)[:40], problem)
    if kind == "detect" and task.get("decoder", "yolov8") == "centernet" and \
            task.get("outputs") is None and len(output_names) < 3:
        return "task.decoder centernet needs heatmap, scale and offset outputs; the model " \
               "has %d" % len(output_names)
    if kind == "ctc" and task.get("alphabet") is not None and \
            task.get("blank", 0) >= len(task["alphabet"]):
        return "task.blank %r is past the alphabet's %d entries" % (task.get("blank", 0),
                                                                   len(task["alphabet"]))
    return ""


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


def nms(boxes, scores, threshold, classes=None):
    """Indices kept by greedy non-maximum suppression, best first; with *classes*, a box only
    suppresses boxes of its own class."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    keep = []
    while order.size:
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
    keep = nms(boxes, scores, conf["iou"], None if conf["agnostic"] else classes)
    keep = keep[:conf["max_boxes"]]
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


def apply(task, outputs, feed=None, labels=None):
    """One sample's result in *task*'s terms (see the module's docstring for *outputs* and
    *feed*; *labels* are the part's own, used when the task names none):

    classify {"top": [{"class", "label", "score"}]}; detect {"boxes": [{"box": [x1, y1, x2,
    y2] in the model's input pixels, "score", "class", "label"[, "landmarks": [[x, y]]]}]};
    embed {"embedding", "norm"}; ctc {"text" (None without an alphabet, then "ids"),
    "confidence"}; segment {"classes": {id: pixel share}, "shape", "_map"}; vad {"speech",
    "probability"}; raw {}.
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
    return ""
