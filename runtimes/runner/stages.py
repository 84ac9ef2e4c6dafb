"""`run.py bench FILE...`: latency from photo to answer, by stage, on this device: decode (an
image's bytes to pixels, or an .npy/.npz read), preprocess (resize, colour, normalise), model
(the session's run) and post-processing (the task's head: NMS, CTC decoding...), each timed
on every call, the file's bytes already in memory."""

import io
import os
import time

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .contents import optional_module, task_kind
from .errors import IMAGE_SUFFIXES, BundleError
from .inputs import check_feed, read_npz_input, single_input
from .metrics import latency_stats

STAGES = ("decode", "preprocess", "model", "post")


def _clock(record, stage, call, *args):
    start = time.perf_counter()
    value = call(*args)
    record[stage].append((time.perf_counter() - start) * 1000.0)
    return value


def _feed(record, part, path, data, max_pixels):
    """One file's feed for *part*, its decode and preprocess timed into *record*."""
    if path.lower().endswith(IMAGE_SUFFIXES):
        spec = part.get("preprocess")
        if not spec:
            raise BundleError("%s: %s takes no images; pass .npy or .npz files"
                              % (path, part["name"]))
        images = optional_module("images")
        image = _clock(record, "decode", images.decode_image,
                       np.frombuffer(data, dtype=np.uint8), spec, path, max_pixels)
        tensor = _clock(record, "preprocess", images.preprocess, image, spec)
        return check_feed({part["inputs"][0]["name"]: tensor}, part, path, 1)
    if path.lower().endswith(".npy"):
        arr = _clock(record, "decode", np.load, io.BytesIO(data), False)
        feed = single_input(arr, part, path)
    elif path.lower().endswith(".npz"):
        feed = _clock(record, "decode", read_npz_input, io.BytesIO(data), path)
    else:
        raise BundleError("%s: bench times images, .npy and .npz files" % path)
    record["preprocess"].append(0.0)
    return check_feed(feed, part, path)


def stage_times(session, part, paths, args):
    """{stage: latency stats (ms)} over --runs calls cycling through *paths* (after --warmup
    untimed ones), with "total" (photo to answer) and "files"."""
    datas = []
    for path in paths:
        if not os.path.isfile(path):
            raise BundleError("%s: not a file; pass images, .npy or .npz files" % path)
        with open(path, "rb") as f:
            datas.append((path, f.read()))
    names = [o.name for o in session.get_outputs()]
    tasks = optional_module("tasks") if task_kind(part.get("task")) != "raw" else None
    max_pixels = args.max_megapixels * 1e6
    record = dict((stage, []) for stage in STAGES)
    for i in range(args.warmup + args.runs):
        path, data = datas[i % len(datas)]
        if i == args.warmup:   # the warm-up calls are not kept
            record = dict((stage, []) for stage in STAGES)
        feed = _feed(record, part, path, data, max_pixels)
        outputs = _clock(record, "model", session.run, names, feed)
        if tasks is not None:
            _clock(record, "post", tasks.part_result, part, names, outputs, feed)
        else:
            record["post"].append(0.0)
    result = dict((stage, latency_stats(times)) for stage, times in record.items())
    result["total"] = latency_stats(np.sum([record[s] for s in STAGES], axis=0))
    result["files"] = len(paths)
    result["post_task"] = task_kind(part.get("task"))
    return result


def stages_line(part, stages):
    """'model: photo to answer p50 9.1 ms (p10-p90 ...) = decode 1.2 + preprocess 0.8 + model
    6.5 + post-processing (classify) 0.1 ms, over 3 file(s)': each stage's own p50."""
    total = stages["total"]
    return "%s: photo to answer p50 %.3f ms (p10-p90 %.3f-%.3f) = decode %.3f + preprocess " \
        "%.3f + model %.3f + post-processing%s %.3f ms (each stage's p50), over %d file(s)" % (
            part, total["p50"], total["p10"], total["p90"], stages["decode"]["p50"],
            stages["preprocess"]["p50"], stages["model"]["p50"],
            " (%s)" % stages["post_task"] if stages["post_task"] != "raw" else "",
            stages["post"]["p50"], stages["files"])
