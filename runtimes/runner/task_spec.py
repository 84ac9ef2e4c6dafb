"""A part's task: its kinds, parameters and defaults, and the check of a task object against the
model's outputs (names, and shapes where known), naming the key that is wrong."""

from .contents import task_kind  # noqa: F401 (this module's API too)

KINDS = ("raw", "classify", "detect", "embed", "ctc", "segment", "vad", "multilabel", "tts")
DECODERS = ("yolov8", "yolov5", "centernet", "db")
POOLINGS = ("none", "mean", "cls")
# Each kind's parameters and their defaults ("labels" of classify: the part's own labels).
PARAMETERS = {
    "raw": {},
    "classify": {"output": 0, "labels": None, "top": 5, "softmax": "auto"},
    "detect": {"decoder": "yolov8", "output": 0, "outputs": None, "score": 0.25, "iou": 0.45,
               "labels": None, "max_boxes": 300, "stride": 4, "agnostic": False,
               # decoder db (a DB text map): a pixel is text above threshold; each blob's box
               # grows by unclip (distance = area x unclip / perimeter); short sides under
               # min_size go; dilate grows the mask by 2x2 first (PaddleOCR's defaults)
               "threshold": 0.3, "unclip": 1.5, "min_size": 3, "dilate": False},
    "embed": {"output": 0, "pooling": "none", "mask": "attention_mask", "normalize": True},
    "ctc": {"output": 0, "alphabet": None, "blank": 0, "softmax": "auto"},
    "segment": {"output": 0, "threshold": 0.5},
    "vad": {"output": 0, "threshold": 0.5},
    # output None: every output; output and threshold may be lists (one threshold per output)
    "multilabel": {"output": None, "threshold": 0.5, "labels": None, "sigmoid": "auto"},
    # a waveform: its sample rate, and what counts as the same length, and close (task_tts.py)
    # (the spreads: the original's own, between thread counts, which the build measures)
    # pad: the token id a shorter sentence is padded with (the build measures what it changes)
    "tts": {"output": 0, "rate": 24000, "length_tolerance": 0.02, "mel_db": 2.0, "snr_db": 10.0,
            "mel_spread_db": None, "snr_spread_db": None, "pad": 0},
}
# Each kind's figures (runner/task_figures.py): what `keep` (and --keep) may name for it.
FIGURES = {
    "raw": (),
    "classify": ("expected_drop", "top1"),
    "detect": ("recall", "precision"),
    "embed": ("recall5", "rank", "retrieval1", "cosine_min"),
    "ctc": ("exact", "cer"),
    "segment": ("iou", "pixels"),
    "vad": ("frame_drop", "frames"),
    "multilabel": ("f1",),
    "tts": ("length", "mel", "snr"),
}


# a DB text map's box score line and box count where the task does not name them
# (PaddleOCR's det_db_box_thresh and max_candidates)
DB_DEFAULTS = {"score": 0.6, "max_boxes": 1000}


def settings(task):
    """The task's parameters with their defaults filled in."""
    kind = task_kind(task)
    out = dict(PARAMETERS.get(kind, {}))
    if kind == "detect" and (task or {}).get("decoder") == "db":
        out.update(DB_DEFAULTS)
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


def multilabel_problem(key, value, output_names):
    """What is wrong with a multilabel task's output (None, one, or a list) or threshold (one, or
    a list), or ''."""
    if isinstance(value, list) and not value:
        return "must not be an empty list"
    if key == "output":
        if value is None:
            return ""
        for ref in (value if isinstance(value, list) else [value]):
            problem = output_problem(ref, output_names)
            if problem:
                return problem
        if isinstance(value, list) and len(set(map(repr, value))) != len(value):
            return "names an output twice"
        return ""
    for number in (value if isinstance(value, list) else [value]):
        if not is_number(number) or not 0.0 < number <= 1.0:
            return "must be a number in (0, 1] or a list of them, got %r" % (str(number)[:40],)
    return ""


def multilabel_refs(conf, count):
    """The outputs a multilabel task reads (indices or names) and each one's threshold, for a
    model of *count* outputs; (refs, thresholds) of different lengths when the task lists a
    threshold count that does not match."""
    refs = conf["output"]
    refs = list(range(count)) if refs is None else refs if isinstance(refs, list) else [refs]
    thresholds = conf["threshold"]
    thresholds = thresholds if isinstance(thresholds, list) else [thresholds] * len(refs)
    return refs, thresholds


def value_problem(kind, key, value, output_names):
    """What is wrong with one parameter of a *kind* task, or ''."""
    if kind == "multilabel" and key in ("output", "threshold"):
        return multilabel_problem(key, value, output_names)
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
    if key in ("softmax", "sigmoid"):
        return "" if value in ("auto", True, False) else \
            "must be \"auto\", true or false, got %r" % (str(value)[:40],)
    if key in ("score", "iou", "threshold"):
        if not is_number(value) or not 0.0 < value <= 1.0:
            return "must be a number in (0, 1], got %r" % (str(value)[:40],)
        return ""
    if key == "unclip":
        if not is_number(value) or not 0.0 <= value <= 10.0:
            return "must be a number from 0 to 10, got %r" % (str(value)[:40],)
        return ""
    if key == "min_size":
        if not is_count(value) or not 0 <= value <= 100000:
            return "must be a whole number from 0 to 100000, got %r" % (str(value)[:40],)
        return ""
    if key in ("normalize", "agnostic", "dilate"):
        return "" if isinstance(value, bool) else "must be true or false"
    if key == "decoder":
        return "" if value in DECODERS else "must be one of %s, got %r" % (
            ", ".join(DECODERS), str(value)[:40])
    if key == "pooling":
        return "" if value in POOLINGS else "must be one of %s, got %r" % (
            ", ".join(POOLINGS), str(value)[:40])
    if key == "keep":
        return keep_problem(kind, value)
    if key == "mask":
        return "" if isinstance(value, str) and value else "must be an input's name"
    if key == "rate":
        if not is_count(value) or not 1000 <= value <= 384000:
            return "must be a sample rate in Hz from 1000 to 384000, got %r" % (str(value)[:40],)
        return ""
    if key in ("length_tolerance", "mel_db", "snr_db", "mel_spread_db", "snr_spread_db"):
        top = 1.0 if key == "length_tolerance" else 200.0
        if key.endswith("spread_db") and value is None:
            return ""
        if not is_number(value) or not 0.0 <= value <= top:
            return "must be a number from 0 to %g, got %r" % (top, str(value)[:40])
        return ""
    if key in ("blank", "pad"):
        if not is_count(value) or value < 0:
            return "must be a class index (0 or more), got %r" % (str(value)[:40],)
        return ""
    return "is not a parameter of a %s task (%s)" % (
        kind, ", ".join(sorted(list(PARAMETERS[kind]) + ["keep"])))


def keep_problem(kind, keep):
    """What is wrong with a task's `keep` ({figure: threshold}), or ''."""
    if not isinstance(keep, dict):
        return "must be an object {figure: share}, e.g. {\"top1\": 0.99}"
    for name, value in sorted(keep.items()):
        if name not in FIGURES[kind]:
            return "names %r, not a figure of a %s task (%s)" % (
                str(name)[:40], kind, ", ".join(FIGURES[kind]) or "it has none")
        low = -1.0 if name == "cosine_min" else 0.0
        if not is_number(value) or not low <= value <= 1.0:
            return "%s must be a share from %g to 1, got %r" % (name, low, str(value)[:40])
    return ""


def output_shapes(outputs):
    """(names, shapes) of a model's outputs given as names or as {"name", "shape"} objects (a
    shape that is not a list of sizes is None: nothing is checked against it)."""
    names, shapes = [], []
    for out in outputs:
        if isinstance(out, dict):
            shape = out.get("shape")
            names.append(str(out.get("name")))
            shapes.append(list(shape) if isinstance(shape, list) and all(
                is_count(d) and d >= 0 for d in shape) else None)
        else:
            names.append(str(out))
            shapes.append(None)
    return names, shapes


def shape_of(ref, names, shapes):
    return shapes[ref] if is_count(ref) else shapes[names.index(ref)]


def size(shape):
    total = 1
    for dim in shape:
        total *= dim
    return total


def multilabel_shape_problem(conf, names, shapes):
    refs, thresholds = multilabel_refs(conf, len(names))
    if len(thresholds) != len(refs):
        return "task.threshold lists %d values for %d output(s) read: give one per output" % (
            len(thresholds), len(refs))
    labels = conf["labels"]
    for ref in refs:
        shape = shape_of(ref, names, shapes)
        if shape is None:
            continue
        if not shape or size(shape) < 1:
            return "task.output: output %s has shape %s, no labels on its last axis" % (
                ref, shape)
        if labels and len(labels) != shape[-1]:
            return "task.labels has %d entries, output %s has %d labels (its last axis)" % (
                len(labels), ref, shape[-1])
    return ""


def shape_problem(conf, names, shapes):
    """What makes the output the task reads the wrong shape for it, or ''."""
    kind = conf["kind"]
    if kind == "multilabel":
        return multilabel_shape_problem(conf, names, shapes)
    if kind == "detect" and conf["decoder"] == "centernet":
        refs = conf["outputs"] or list(range(min(4, len(names))))
        wanted = ((1, "heatmap"), (2, "scale"), (2, "offset"), (None, "landmarks"))
        for ref, (channels, what) in zip(refs, wanted):
            shape = shape_of(ref, names, shapes)
            if shape is not None and (len(shape) != 4 or shape[1] != (channels or shape[1])
                                      or shape[1] % 2 and not channels):
                return "task.outputs: %s output %s has shape %s, not (1, %s, H, W)" % (
                    what, ref, shape, channels or "2 x points")
        return ""
    shape = shape_of(conf["output"], names, shapes)
    if shape is None:
        return ""
    where = "task.output: output %s has shape %s" % (conf["output"], shape)
    if kind == "classify" and size(shape) < 2:
        return where + ", one value: nothing to rank"
    if kind == "detect" and conf["decoder"] == "db":
        if len(shape) != 4 or size(shape[:2]) != 1:
            return where + ", not a DB text map (1, 1, H, W)"
        return ""
    if kind == "detect":
        low = 5 if conf["decoder"] == "yolov5" else 4
        if len(shape) not in (2, 3) or min(shape[-2:]) < low:
            return where + ", not a %s head (1, %s)" % (
                conf["decoder"], "N, 5 + classes" if low == 5 else "4 + classes, N")
    if kind == "embed" and conf["pooling"] != "none" and len(shape) < 3:
        return where + ", no token axis to pool (pooling %s needs (1, tokens, dim))" \
            % conf["pooling"]
    if kind == "ctc":
        if len(shape) not in (2, 3):
            return where + ", not (1, steps, classes)"
        if 0 not in shape and (size(shape[:-1]) < 2 or shape[-1] < 2):   # (0: not known yet)
            return where + ", not (1, steps, classes): a CTC head scores a sequence of " \
                "steps, each over a blank and at least one character"
        alphabet = conf["alphabet"]
        if alphabet and len(alphabet) != shape[-1]:
            return "task.alphabet has %d entries, output %s has %d classes (the blank " \
                   "included)" % (len(alphabet), conf["output"], shape[-1])
    if kind == "segment" and len(shape) not in (3, 4):
        return where + ", not (1, classes, H, W)"
    return ""


def task_problem(task, outputs):
    """'' when *task* (a part's task object, or None) fits a model with *outputs* (its output
    names in session order, or the manifest's {"name", "shape"} objects: then the shapes are
    checked too); else one line naming the key ('task.score must be ...')."""
    if task is None:
        return ""
    if not isinstance(task, dict):
        return "task must be an object with a kind (%s)" % ", ".join(KINDS)
    kind = task.get("kind")
    if kind not in KINDS:
        return "task.kind must be one of %s, got %r" % (", ".join(KINDS), str(kind)[:40])
    output_names, shapes = output_shapes(outputs)
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
    if kind == "raw" or not output_names:
        return ""
    return shape_problem(settings(task), output_names, shapes)
