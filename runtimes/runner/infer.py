"""`run.py infer`: the model run on image, .npy and .npz files."""

import collections
import os

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .contents import optional_module, task_kind, wants_pipeline
from .errors import IMAGE_SUFFIXES, BundleError, one_line
from .inputs import (
    describe_outputs,
    image_batch,
    image_row,
    input_files,
    load_input_file,
    stack_images,
)
from .manifest import one_part, require_intact
from .sessions import open_session


def printable(path):
    """*path* as text that encodes (a non-UTF-8 file name's bytes become U+FFFD)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def result_keys(paths):
    """A unique --out key prefix per input: its file name, or where two share one, the path
    as given (and a #N after a file given twice), as text that encodes."""
    names = [printable(os.path.basename(p)) for p in paths]
    counts = collections.Counter(names)
    keys, used = [], set()
    for path, name in zip(paths, names):
        key = name if counts[name] == 1 else printable(os.path.normpath(path))
        unique, n = key, 1
        while unique in used:
            n += 1
            unique = "%s#%d" % (key, n)
        used.add(unique)
        keys.append(unique)
    return keys


def save_outputs(out, arrays):
    """Write *arrays* to the .npz *out* whole or not at all (np.savez adds .npz when missing)."""
    import tempfile

    target = out if out.endswith(".npz") else out + ".npz"
    folder = os.path.dirname(os.path.abspath(target))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".infer-", suffix=".npz", dir=folder)
    except OSError as exc:
        raise BundleError("--out %s: cannot write there (%s); pass a writable path"
                          % (printable(out), exc.strerror or one_line(exc))) from None
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, target)
    except OSError as exc:
        os.remove(tmp)
        raise BundleError("--out %s: cannot write it (%s); free some space or pass another "
                          "path" % (printable(out), exc.strerror or one_line(exc))) from None
    except BaseException:
        os.remove(tmp)
        raise


def non_finite_notes(names, outputs):
    """A note per floating-point output holding NaN or infinity: JSON writes those as null
    (report.to_json), and a human reads "score nan" as a runner bug, not the model's answer."""
    notes = []
    for name, value in zip(names, outputs):
        if isinstance(value, np.ndarray) and value.dtype.kind in "fc":
            bad = int(value.size - np.count_nonzero(np.isfinite(value)))
            if bad:
                notes.append("output '%s' holds %d non-finite value(s) (NaN or infinity) of %d: "
                             "the model computed them from this input" % (name, bad, value.size))
    return notes


def answer(part, names, outputs, feed, raw, top, arrays=None, key="", body=None):
    """One sample's answer: {"task": result, "summary": text} in *part*'s task's terms, or with
    *raw* or no task, {"outputs": the tensors described}. A task's arrays (a segmentation map)
    go to *arrays* as KEY/task.map. When *body* (the input's bytes) is an image, a detector's
    boxes are also given in its pixels."""
    notes = non_finite_notes(names, outputs)
    if raw or task_kind(part.get("task")) == "raw":
        return dict({"outputs": describe_outputs(names, outputs, part.get("labels"), top)},
                    **({"notes": notes} if notes else {}))
    tasks = optional_module("tasks")   # shipped with a part that has a task
    result = tasks.part_result(part, names, outputs, feed)
    size = optional_module("images").image_size(body) if body is not None and part.get("preprocess") and \
        result["kind"] == "detect" else None
    if size and min(size) > 0:   # the header's size is the decoded one (no EXIF turn)
        tasks.head("detect").add_image_boxes(result, part["preprocess"], size)
    if arrays is not None:   # a task's arrays: a segmentation map, speech
        arrays.update(("%s/task.%s" % (key, k[1:]), result[k]) for k in ("_map", "_audio")
                      if k in result)
    return dict({"task": tasks.public(result), "summary": tasks.summary(part["task"], result)},
                **({"notes": notes} if notes else {}))


def model_calls(files, part, max_pixels):
    """(the files with their feeds, the feed to run, stacked?) per session.run, in file order.
    A .npy/.npz file runs alone, as does an image for a batch-1 part; for a part with a static
    batch of N > 1, N images run stacked in one call, the last call's spare rows filled with
    copies of its last image."""
    rows, images = image_batch(part), []
    for path in files:
        feed = load_input_file(path, part, max_pixels)
        if rows > 1 and path.lower().endswith(IMAGE_SUFFIXES):
            images.append((path, feed))
            if len(images) == rows:
                yield images, stack_images([f for _, f in images], rows), True
                images = []
            continue
        if images:   # a tensor file after images: they run first, in file order
            yield images, stack_images([f for _, f in images], rows), True
            images = []
        yield [(path, feed)], feed, False
    if images:
        yield images, stack_images([f for _, f in images], rows), True


def _too_long(part, feed):
    """'; ...' where a tts part whose length is open was refused a sentence longer than the
    build's: a model's own limit (Kokoro's attention has 512 places), said with the way on."""
    length = part.get("length") or {}
    tokens = feed.get(length.get("input"))
    if not length.get("dynamic") or tokens is None or tokens.ndim != 2 or \
            tokens.shape[1] <= length.get("static", 0):
        return ""
    return ("; the sentence has %d tokens, past what the model itself takes (the build "
            "checked up to %d): split it into shorter sentences"
            % (tokens.shape[1], max([length.get("static", 0)] + list(length.get("checked")
                                                                     or []))))


def batching_note(rows, images, calls, padded):
    """The one line saying how images ran stacked: 'batch 4: 10 images in 3 calls, the last
    padded'."""
    return "batch %d: %d image%s in %d call%s%s" % (
        rows, images, "" if images == 1 else "s", calls, "" if calls == 1 else "s",
        "" if not padded else ", the last padded" if padded == 1 else ", %d padded" % padded)


def cmd_infer(bundle, manifest, args):
    if wants_pipeline(manifest, args):   # the parts run as one cascade on each photo
        return optional_module("cascade").cmd_infer_pipeline(bundle, manifest, args, result_keys(args.files))
    require_intact(bundle, manifest)
    part = one_part(manifest, args.part)
    files = input_files(args.files, part)
    session, _ = open_session(bundle, manifest, part, args)
    names = [o.name for o in session.get_outputs()]
    results, arrays, keys = [], {}, iter(result_keys(files))
    rows, stacked_images, stacked_calls, padded = image_batch(part), 0, 0, 0
    max_pixels = args.max_megapixels * 1e6
    for group, feed, stacked in model_calls(files, part, max_pixels):
        try:
            outputs = session.run(names, feed)
        except Exception as exc:  # e.g. a token id past the vocabulary: the input's fault
            raise BundleError("%s: onnxruntime refused it: %s%s"
                              % (", ".join(printable(p) for p, _ in group), one_line(exc),
                                 _too_long(part, feed))) from None
        if stacked:
            stacked_images, stacked_calls = stacked_images + len(group), stacked_calls + 1
            padded += len(group) < rows
        for i, (path, one) in enumerate(group):   # each file's answer, as batch 1 gives it
            mine = image_row(outputs, i, rows) if stacked else outputs
            key = next(keys)
            for name, value in zip(names, mine):
                arrays["%s/%s" % (key, name)] = value
            body = np.fromfile(path, dtype=np.uint8) if path.lower().endswith(IMAGE_SUFFIXES) \
                else None
            entry = answer(part, names, mine, one, args.raw, args.top, arrays, key, body)
            entry.update(file=printable(path), key=key)
            results.append(entry)
    report = {"results": results, "providers": session.get_providers(), "passed": True}
    if args.out and task_kind(part.get("task")) == "tts":   # speech: a WAV file per input too,
        report["wav"] = optional_module("task_tts").write_wavs(args.out, arrays, part)   # first
    if args.out:   # (a WAV that cannot be written leaves no OUT.npz beside its exit 2)
        save_outputs(args.out, arrays)
    if args.out:   # np.savez's name: .npz added when missing, and said
        report["out"] = args.out if args.out.endswith(".npz") else args.out + ".npz"
    if stacked_calls:
        report["batching"] = batching_note(rows, stacked_images, stacked_calls, padded)
        if not getattr(args, "json", False):   # said once, before the answers
            print(report["batching"])
    return report


def print_infer(report):
    """infer's report as lines a person reads."""
    for entry in report["results"]:
        if "summary" in entry:   # a part with a task: its result in a few words
            print("%s: %s" % (entry["file"], entry["summary"]))
        for output, item in entry.get("outputs", {}).items():
            if "top" in item:
                best = item["top"][0]
                print("%s: %s = class %d%s (score %.4g)" % (
                    entry["file"], output, best["index"],
                    " '%s'" % best["label"] if best["label"] else "", best["score"]))
            else:
                print("%s: %s shape %s" % (entry["file"], output, item["shape"]))
        for note in entry.get("notes", ()):   # NaN or infinity in an output
            print("%s: %s" % (entry["file"], note))
        stages = entry.get("latency_ms")
        if isinstance(stages, dict) and stages:   # a pipeline's: each part, and the glue
            print("%s: %.3f ms = %s%s" % (
                entry["file"], sum(stages.values()), " + ".join(
                    "%s %.3f" % (k, v) for k, v in stages.items()),
                "; real-time factor %.3f (%.1fx real time), first audio after %.1f ms" % (
                    entry["real_time_factor"], entry["x_real_time"], entry["first_audio_ms"])
                if "x_real_time" in entry else ""))
    if report.get("out"):
        print("outputs written to %s%s" % (report["out"], " and %d WAV file(s) beside it" % len(
            report["wav"]) if report.get("wav") else ""))
