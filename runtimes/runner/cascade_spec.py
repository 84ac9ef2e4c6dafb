"""A bundle's pipeline: its parts run as one cascade. The manifest's `pipeline` section, its
defaults, and its check against the parts (one line naming the key that is wrong).

Three kinds: "ocr" (below), "face", an MTCNN cascade (runner/cascade_face.py), and "tts",
token ids to speech through an encoder, length regulation and a vocoder (cascade_tts.py):

    {"kind": "face",
     "stages": [{"part": "pnet", "step": "propose", "min_face": 20, "factor": 0.709, ...},
                {"part": "rnet", "step": "refine", "threshold": 0.7, "nms": 0.7},
                {"part": "onet", "step": "output", "threshold": 0.7, "nms": 0.7}]}

    {"kind": "ocr",
     "stages": [{"part": "det", "step": "detect", "threshold": 0.3, ...},
                {"part": "cls", "step": "direction", "threshold": 0.9, ...},   (optional)
                {"part": "rec", "step": "recognize", "min_confidence": 0.5}]}

An OCR cascade: the text detector's probability map (a DB head, (1, 1, H, W)) gives text
boxes; each box is cropped from the photo, turned upright by the direction classifier (classes
0 and 180 degrees) and read by the recogniser (a ctc task with its alphabet). Every stage's part
has a preprocess object: the detector's resizes the photo; a crop's size, colour order and
normalisation come from it too, its resize is always "keep the height's ratio, pad the width".
"""

PIPELINE_KINDS = ("ocr", "face", "tts")
# The steps of each kind in the order they run; the optional ones may be left out.
STEPS = {"ocr": ("detect", "direction", "recognize"), "face": ("propose", "refine", "output"),
         "tts": ("encode", "vocode")}
OPTIONAL_STEPS = {"ocr": ("direction",), "face": (), "tts": ()}
# Each step's parameters and defaults (rapidocr's for PP-OCR: config.yaml of rapidocr 1.4).
STEP_PARAMETERS = {
    # threshold: a map pixel is text above it; box_threshold: a box's mean probability;
    # unclip: DB's box growth (distance = area x unclip / perimeter); min_size: a box's short
    # side in map pixels; dilate: grow the text mask by a 2x2 kernel first
    "detect": {"threshold": 0.3, "box_threshold": 0.5, "unclip": 1.6, "min_size": 3,
               "max_boxes": 1000, "dilate": True},
    # a crop is turned 180 degrees when the classifier says class `rotated` above `threshold`
    "direction": {"threshold": 0.9, "rotated": 1},
    # lines read with a lower mean character confidence are left out; split: a line longer
    # than the input holds at its height is read in pieces cut at pale columns (else squeezed)
    "recognize": {"min_confidence": 0.5, "split": True},
    # MTCNN, facenet-pytorch's detect_face: P-Net's pyramid starts at 12 / min_face and shrinks
    # by factor; a cell proposes a face at threshold; NMS at nms within a level, nms_all
    # across levels
    "propose": {"min_face": 20, "factor": 0.709, "threshold": 0.6, "nms": 0.5, "nms_all": 0.7},
    # R-Net keeps a 24x24 crop over threshold, then NMS (IoU) at nms
    "refine": {"threshold": 0.7, "nms": 0.7},
    # O-Net keeps a 48x48 crop over threshold, then NMS at nms over the smaller box ("Min")
    "output": {"threshold": 0.7, "nms": 0.7},
    # durations: the encoder's output of frames per token (default: its 2-dimensional one);
    # max_repeat: a token's frames at most (0: no cap); pad: the id a short sentence is padded
    # with to the encoder's static length
    "encode": {"durations": "", "max_repeat": 0, "pad": 0},
    # context: frames of overlap either side of each chunk the vocoder runs (a convolutional
    # vocoder's receptive field); rate: samples a second; a sentence sounds alike when its
    # length is within length_tolerance and its log-mel distance within mel_db (task_tts)
    "vocode": {"context": 0, "rate": 24000, "length_tolerance": 0.02, "mel_db": 2.0},
}
MAX_BOXES = 100000


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def is_count(value):
    return isinstance(value, int) and not isinstance(value, bool)


def stage_settings(stage):
    """A stage's parameters with their defaults filled in (its part and step included)."""
    out = dict(STEP_PARAMETERS.get(stage.get("step"), {}))
    out.update(stage)
    return out


def parameter_problem(step, key, value):
    """What is wrong with one parameter of a *step* stage, or ''."""
    if key not in STEP_PARAMETERS[step]:
        return "is not a parameter of a %s stage (%s)" % (
            step, ", ".join(["part", "step"] + sorted(STEP_PARAMETERS[step])))
    if key in ("threshold", "box_threshold", "nms", "nms_all"):
        if not is_number(value) or not 0.0 <= value <= 1.0:
            return "must be a number from 0 to 1, got %r" % (str(value)[:40],)
    elif key == "min_confidence":
        if not is_number(value) or not 0.0 <= value <= 1.0:
            return "must be a number from 0 to 1, got %r" % (str(value)[:40],)
    elif key == "unclip":
        if not is_number(value) or not 0.0 <= value <= 10.0:
            return "must be a number from 0 to 10, got %r" % (str(value)[:40],)
    elif key in ("min_size", "rotated"):
        if not is_count(value) or not 0 <= value <= 100000:
            return "must be a whole number from 0 to 100000, got %r" % (str(value)[:40],)
    elif key == "max_boxes":
        if not is_count(value) or not 1 <= value <= MAX_BOXES:
            return "must be a whole number from 1 to %d, got %r" % (MAX_BOXES, str(value)[:40])
    elif key == "min_face":   # 12 / min_face scales the photo: a tiny one makes huge levels
        if not is_number(value) or not 6 <= value <= 100000:
            return "must be a number from 6 to 100000 (pixels), got %r" % (str(value)[:40],)
    elif key == "factor":     # each pyramid level's scale times factor: near 1, endless levels
        if not is_number(value) or not 0.1 <= value <= 0.95:
            return "must be a number from 0.1 to 0.95, got %r" % (str(value)[:40],)
    elif key in ("dilate", "split") and not isinstance(value, bool):
        return "must be true or false"
    return speech_parameter_problem(key, value)


def speech_parameter_problem(key, value):
    """What is wrong with one parameter of a tts stage, or ''."""
    if key == "durations" and not isinstance(value, str):
        return "must name one of the encoder's outputs (or be empty)"
    if key in ("max_repeat", "context") and (not is_count(value) or not 0 <= value <= 10000):
        return "must be a whole number from 0 to 10000, got %r" % (str(value)[:40],)
    if key == "pad" and (not is_count(value) or not 0 <= value < 1 << 31):
        return "must be a token id (a whole number from 0), got %r" % (str(value)[:40],)
    if key == "rate" and (not is_count(value) or not 1000 <= value <= 384000):
        return "must be samples a second from 1000 to 384000, got %r" % (str(value)[:40],)
    if key == "length_tolerance" and (not is_number(value) or not 0.0 <= value <= 1.0):
        return "must be a share from 0 to 1, got %r" % (str(value)[:40],)
    if key == "mel_db" and (not is_number(value) or not 0.0 < value <= 100.0):
        return "must be decibels above 0 (at most 100), got %r" % (str(value)[:40],)
    return ""


def speech_part_problem(step, part, conf):
    """What keeps *part* from running a tts *step* (its inputs and outputs), or ''."""
    inputs = part.get("inputs") if isinstance(part.get("inputs"), list) else []
    shape = inputs[0].get("shape") if len(inputs) == 1 and isinstance(inputs[0], dict) else None
    dims = 2 if step == "encode" else 3
    if not isinstance(shape, list) or len(shape) != dims or shape[0] != 1 or \
            not all(is_count(d) and d > 0 for d in shape):
        return "takes %s, not one static %s" % (
            "%d input(s)" % len(inputs) if shape is None else "an input of shape %s" % shape,
            "(1, T) of token ids" if step == "encode" else "(1, C, D) of frames")
    if step == "vocode" and shape[1] <= 2 * conf.get("context", 0):
        return "runs %d frames at a time: not more than twice the context (%d)" % (
            shape[1], conf.get("context", 0))
    outputs = [o for o in part.get("outputs") or () if isinstance(o, dict)]
    names = [o.get("name") for o in outputs]
    if step == "encode":
        wanted = conf.get("durations") or None
        ranks = dict((o.get("name"), len(o.get("shape") or ())) for o in outputs)
        if wanted is not None and wanted not in names:
            return "has no output %r (durations); its outputs: %s" % (
                str(wanted)[:40], ", ".join(str(n)[:40] for n in names[:10]))
        if not (wanted or 2 in ranks.values()) or 3 not in [
                r for n, r in ranks.items() if n != wanted]:
            return "has no (1, T, D) hidden states and (1, T) durations among its outputs"
    elif not outputs:
        return "has no output (the chunk's samples)"
    return ""


def image_input_problem(part):
    """What keeps *part* from taking an image crop (one 4-D input, a preprocess with a size),
    or ''."""
    inputs = part.get("inputs") if isinstance(part.get("inputs"), list) else []
    if len(inputs) != 1 or not isinstance(inputs[0], dict) or \
            not isinstance(inputs[0].get("shape"), list) or len(inputs[0]["shape"]) != 4:
        return "takes %d input(s), not one image tensor (1, C, H, W)" % len(inputs)
    spec = part.get("preprocess")
    if not isinstance(spec, dict) or not isinstance(spec.get("size"), list) or \
            len(spec["size"]) != 2 or not all(is_count(v) and v > 0 for v in spec["size"]):
        return "has no preprocess with a size (the crop's size and normalisation come from it)"
    if spec.get("layout", "nchw") not in ("nchw", "nhwc"):
        return "has preprocess.layout %r, not nchw or nhwc" % (str(spec.get("layout"))[:20],)
    if spec.get("dtype", "float32") not in ("float32", "float16", "uint8"):
        return "has preprocess.dtype %r, not float32, float16 or uint8" % (
            str(spec.get("dtype"))[:20],)
    for key in ("scale", "pad", "mean", "std"):
        value = spec.get(key)
        values = value if isinstance(value, list) and key in ("mean", "std") else [value]
        if value is not None and (not values or not all(is_number(v) and abs(v) <= 1e6
                                                        for v in values) or
                                  len(values) not in (1, 3) or
                                  key == "std" and 0 in values):
            return "has preprocess.%s %r, not a number up to 1e6%s" % (
                key, str(value)[:20], " (or 3), none of them 0" if key == "std" else
                " (or 3)" if key == "mean" else "")
    return ""


MAX_FACE_SIDE = 4096   # a face stage's input side (P-Net's holds pyramid blocks; crops are small)
MAX_FACE_BATCH = 1024


def face_part_problem(step, part):
    """What keeps *part* from running a face (MTCNN) *step*, or '': its input's sides (P-Net's
    12 or more) and batch (R-Net's and O-Net's crops a run)."""
    if step not in STEPS["face"]:
        return ""
    size = part["preprocess"]["size"]
    if min(size) < 12 or max(size) > MAX_FACE_SIDE:   # cascade_face.integral wants 12 or more
        return "takes %s pixels; a %s stage's input needs 12 to %d a side" % (
            "x".join(str(v) for v in size), step, MAX_FACE_SIDE)
    batch = part["inputs"][0]["shape"][0]
    if step != "propose" and (not is_count(batch) or not 1 <= batch <= MAX_FACE_BATCH):
        return "has a batch of %r; a %s stage runs 1 to %d crops at a time" % (
            str(batch)[:20], step, MAX_FACE_BATCH)
    return ""


def stage_problem(kind, i, stage, parts):
    """What is wrong with stage *i*, or '' (the message starts with the key: 'stages[1].x ...')."""
    where = "stages[%d]" % i
    if not isinstance(stage, dict):
        return "%s must be an object {part, step, ...}" % where
    step = stage.get("step")
    if step not in STEPS[kind]:
        return "%s.step must be one of %s, got %r" % (where, ", ".join(STEPS[kind]),
                                                      str(step)[:40])
    name = stage.get("part")
    if not isinstance(name, str) or name not in parts:
        return "%s.part must name one of the bundle's parts (%s), got %r" % (
            where, ", ".join(sorted(str(p)[:40] for p in parts)[:10]), str(name)[:40])
    for key in sorted(str(k) for k in stage if k not in ("part", "step")):
        problem = parameter_problem(step, key, stage[key])
        if problem:
            return "%s.%s %s" % (where, key[:40], problem)
    part = parts[name]
    if kind == "tts":
        problem = speech_part_problem(step, part, stage_settings(stage))
        return "%s.part %s %s" % (where, name[:40], problem) if problem else ""
    problem = image_input_problem(part)
    if problem:
        return "%s.part %s %s" % (where, name[:40], problem)
    problem = face_part_problem(step, part)
    if problem:
        return "%s.part %s %s" % (where, name[:40], problem)
    task = part.get("task") if isinstance(part.get("task"), dict) else {}
    if step == "recognize" and (task.get("kind") != "ctc" or not task.get("alphabet")):
        return "%s.part %s has no ctc task with an alphabet: the recogniser's text comes " \
               "from it" % (where, name[:40])
    return ""


def pipeline_problem(pipeline, parts):
    """'' when *pipeline* (the manifest's section) fits the bundle's *parts* (the manifest's
    list); else one line naming the key ('pipeline.stages[0].threshold must be ...')."""
    if not isinstance(pipeline, dict):
        return "pipeline must be an object {kind, stages}"
    kind = pipeline.get("kind")
    if kind not in PIPELINE_KINDS:
        return "pipeline.kind must be one of %s, got %r" % (", ".join(PIPELINE_KINDS),
                                                            str(kind)[:40])
    for key in pipeline:
        if key not in ("kind", "stages", "accuracy"):
            return "pipeline.%s is not a key of a pipeline (kind, stages, accuracy)" % \
                str(key)[:40]
    if not isinstance(pipeline.get("accuracy", {}), dict):
        return "pipeline.accuracy must be an object (the build's end-to-end figure)"
    stages = pipeline.get("stages")
    if not isinstance(stages, list) or not stages:
        return "pipeline.stages must be a non-empty list of stages"
    by_name = dict((p.get("name"), p) for p in parts if isinstance(p, dict))
    for i, stage in enumerate(stages):
        problem = stage_problem(kind, i, stage, by_name)
        if problem:
            return "pipeline." + problem
    steps = [s["step"] for s in stages]
    wanted = [s for s in STEPS[kind] if s in steps or s not in OPTIONAL_STEPS[kind]]
    if steps != wanted:
        return "pipeline.stages has steps %s; a %s pipeline runs %s in this order%s" % (
            ", ".join(steps), kind, ", ".join(STEPS[kind]),
            " (%s optional)" % ", ".join(OPTIONAL_STEPS[kind]) if OPTIONAL_STEPS[kind] else "")
    names = [s["part"] for s in stages]
    if len(set(names)) != len(names):
        return "pipeline.stages name a part twice; each stage runs its own part"
    return ""
