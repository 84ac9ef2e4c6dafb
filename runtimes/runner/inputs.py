"""Inputs from files (images, .npy, .npz) checked against a part's inputs, with size limits
read before decoding; outputs described for people. (HTTP bodies: serve_body.py.)"""

import io
import os
import stat
import struct
import zipfile

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .contents import optional_module
from .errors import IMAGE_SUFFIXES, MAX_PIXELS, BundleError, TooLarge, one_line
from .metrics import looks_like_scores

MAX_UNPACKED = 256 * 1024 * 1024   # bytes an .npz may inflate to
MAX_NPZ_MEMBERS = 256              # arrays in one .npz (100,000 took 16 s of CPU to list)
SHOWN_KEYS = 10                    # names echoed in a message about a body's keys
MAX_LENGTH = 1 << 16               # tokens in one sentence, where a part keeps its length open


def input_values(part):
    """How many numbers *part*'s inputs hold in all."""
    return sum(int(np.prod(spec["shape"], dtype=np.int64)) for spec in part["inputs"])


def input_bytes(part):
    return sum(int(np.prod(spec["shape"], dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize
               for spec in part["inputs"])


def some_keys(keys):
    """A few of *keys* for a message, each cut short: never every key a client sent."""
    keys = sorted(str(k) for k in keys)
    shown = ", ".join(k[:40] for k in keys[:SHOWN_KEYS]) or "none"
    return shown + (" and %d more" % (len(keys) - SHOWN_KEYS) if len(keys) > SHOWN_KEYS else "")


def image_batch(part):
    """N where *part* reads images into a static batch of N > 1 (infer and serve stack N images,
    or copies of one, into a call), else 1."""
    shape = part["inputs"][0]["shape"] if part.get("preprocess") and part["inputs"] else ()
    return shape[0] if shape and isinstance(shape[0], int) and shape[0] > 1 else 1


def stack_images(feeds, rows):
    """Image *feeds* (a batch axis of 1 each) as one feed of *rows* rows: the last image repeated
    to fill the rows left over."""
    feeds = list(feeds) + [feeds[-1]] * (rows - len(feeds))
    return dict((name, np.concatenate([f[name] for f in feeds])) for name in feeds[0])


def image_row(outputs, i, rows):
    """Row *i* of each output with a batch axis of *rows*, kept as a batch of 1: what a batch-1
    model gives for that image (an output without that axis is kept whole)."""
    return [v[i:i + 1] if getattr(v, "ndim", 0) and v.shape[0] == rows else v for v in outputs]


def check_feed(feed, part, source, rows=None):
    """Check names and shapes against the part's inputs, with *rows* as the batch axis where given
    (1: one image, to be stacked for a part with a batch of N); cast to its dtypes."""
    out, length = {}, part.get("length") or {}
    for spec in part["inputs"]:
        want = list(spec["shape"])
        if rows is not None and want:
            want[0] = rows
        arr = feed.get(spec["name"])
        if length.get("dynamic") and spec["name"] == length["input"] and \
                len(getattr(arr, "shape", ())) == len(want) and \
                1 <= arr.shape[1] <= MAX_LENGTH:   # a sentence of its own length
            want[1] = arr.shape[1]
        if spec["name"] not in feed:
            raise BundleError("%s: no input named %s (has: %s)"
                              % (source, spec["name"], some_keys(feed)))
        arr = np.asarray(feed[spec["name"]])
        if arr.dtype.kind == "c":   # a cast would drop the imaginary part without a word
            raise BundleError("%s: input %s is %s, the model wants %s; pass real values"
                              % (source, spec["name"], arr.dtype, spec["dtype"]))
        if arr.dtype.kind not in "biuf":
            raise BundleError("%s: input %s holds %s, not numbers; the model wants %s"
                              % (source, spec["name"], arr.dtype, spec["dtype"]))
        if list(arr.shape) != want:
            raise BundleError("%s: %s has shape %s, the model wants %s%s"
                              % (source, spec["name"], list(arr.shape), want,
                                 _static_speech(part, spec, arr)))
        out[spec["name"]] = arr.astype(spec["dtype"], copy=False)
    return out


def _static_speech(part, spec, arr):
    """'; ...' the way to speak a sentence of another length with a tts part built static,
    or ''."""
    if (part.get("task") or {}).get("kind") != "tts" or len(spec["shape"]) != 2 or \
            arr.ndim != 2 or arr.shape[0] != 1 or arr.shape[1] == spec["shape"][1]:
        return ""
    length = part.get("length") or {}
    if "pad" in length and arr.shape[1] < spec["shape"][1]:
        return ("; this bundle speaks exactly %d tokens (%s): pad the sentence with %s to "
                "%d tokens" % (spec["shape"][1], length.get("why", "built static"),
                               length["pad"], spec["shape"][1]))
    return ("; this bundle speaks exactly %d tokens: pad a shorter sentence to them, or build "
            "from a model whose token length is open (an .onnx that takes any length, or a "
            "PyTorch model with --task tts: the build keeps it open where padding moves the "
            "speech)" % spec["shape"][1])


def _untimed(stage, call, *args):
    return call(*args)


def image_feed(data, part, source, max_pixels=MAX_PIXELS, clock=_untimed):
    """{input: tensor} of one image's bytes; *clock(stage, call, *args)* may time the
    "decode" and "preprocess" calls (serve's answer says both)."""
    spec = part.get("preprocess")
    if not spec:
        raise BundleError("%s: %s has no image preprocessing; send .npy/.npz/JSON tensors"
                          % (source, part["name"]))
    images = optional_module("images")   # shipped with a part that has preprocessing
    image = clock("decode", images.decode_image, data, spec, source, max_pixels)
    return {part["inputs"][0]["name"]: clock("preprocess", images.preprocess, image, spec)}


def single_input(arr, part, source):
    if len(part["inputs"]) != 1:
        raise BundleError("%s: %s has %d inputs (%s); send an .npz or JSON keyed by input name"
                          % (source, part["name"], len(part["inputs"]),
                             ", ".join(i["name"] for i in part["inputs"])))
    return {part["inputs"][0]["name"]: arr}


def load_input_file(path, part, max_pixels=MAX_PIXELS):
    """Return {input name: tensor} for one .npy/.npz/image file."""
    lower = path.lower()
    try:
        if lower.endswith(".npz"):
            feed = read_npz_input(path, path)
        elif lower.endswith(".npy"):
            feed = single_input(np.load(path, allow_pickle=False), part, path)
        elif lower.endswith(IMAGE_SUFFIXES):
            feed = image_feed(np.fromfile(path, dtype=np.uint8), part, path, max_pixels)
        else:
            raise BundleError("%s: unsupported input (use an image, .npy or .npz)" % path)
    except MemoryError:
        raise TooLarge("%s: too large to load here; pass a smaller input" % path) from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:   # truncated, damaged
        raise BundleError("%s: cannot read it (%s); save it again with numpy.save/savez"
                          % (path, one_line(exc))) from None
    return check_feed(feed, part, path, 1 if lower.endswith(IMAGE_SUFFIXES) else None)


def megabytes(count):
    """*count* bytes in MB (2**20) for a message: '300', or '1.5' under 10."""
    mb = count / 2.0 ** 20
    return "%d" % mb if mb >= 10 or mb == int(mb) else "%.1f" % mb


def zip_members(fp):
    """The member count a zip's end record declares (fp: a seekable binary file), or None when
    it has none (then the zip reader says what is wrong); read before the directory is."""
    fp.seek(0, io.SEEK_END)
    size = fp.tell()
    fp.seek(max(0, size - (1 << 16) - 22))
    tail = fp.read()
    fp.seek(0)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None
    return struct.unpack("<H", tail[at + 10:at + 12])[0]   # 0xFFFF: a zip64, over any bound


def read_npz_input(source, name, max_unpacked=MAX_UNPACKED):
    """{key: array} from an .npz (a path or a file object), refusing a zip bomb unread."""
    fp = open(source, "rb") if isinstance(source, str) else source
    try:
        members = zip_members(fp)
        if members is None:
            raise ValueError("not an .npz archive (no zip directory at its end)")
        if members > MAX_NPZ_MEMBERS:
            raise TooLarge("%s: the .npz holds %d arrays, over the %d limit; send the model's "
                           "inputs only" % (name, members, MAX_NPZ_MEMBERS))
        with np.load(fp, allow_pickle=False) as f:
            unpacked = sum(info.file_size for info in f.zip.infolist())
            if unpacked > max_unpacked:
                raise TooLarge("%s: the .npz unpacks to %s MB, over the %s MB limit; send "
                               "the model's inputs only" % (name, megabytes(unpacked),
                                                            megabytes(max_unpacked)))
            return {k: f[k] for k in f.files}
    finally:
        if fp is not source:
            fp.close()


def input_files(paths, part):
    """*paths* with each folder replaced by its supported files, in sorted order."""
    suffixes = (".npy", ".npz") + (IMAGE_SUFFIXES if part.get("preprocess") else ())
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(os.path.join(path, name) for name in os.listdir(path)
                           if name.lower().endswith(suffixes) and
                           os.path.isfile(os.path.join(path, name)))
            if not found:
                raise BundleError("%s: a folder with no %s files; pass a folder or files this "
                                  "model reads" % (path, "/".join(s[1:] for s in suffixes)))
            files.extend(found)
        elif os.path.isfile(path):
            files.append(path)
        elif os.path.lexists(path):   # a FIFO would block the read, /dev/zero never ends
            raise BundleError("%s: not a regular file (%s); pass an image, .npy or .npz file"
                              % (path, file_kind(path)))
        else:
            raise BundleError("%s: no such file or folder" % path)
    return files


def file_kind(path):
    """What *path* is, in words, when it is not a regular file or a folder."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a link to nothing"
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what + (", through a link" if os.path.islink(path) else "")
    return "not a file"


def describe_outputs(names, outputs, labels, top):
    """Per output: shape, plus top classes for class scores or the values otherwise."""
    result = {}
    for name, value in zip(names, outputs):
        item = {"shape": list(value.shape)}
        if looks_like_scores(value[None]):
            order = np.argsort(-value[0])[:top]
            item["top"] = [{"index": int(i), "score": float(value[0][i]),
                            "label": labels[i] if labels and i < len(labels) else None}
                           for i in order]
        else:
            item["values"] = value.tolist()
        result[name] = item
    return result
