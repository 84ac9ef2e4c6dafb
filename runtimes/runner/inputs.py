"""Inputs from files and HTTP bodies (images, .npy, .npz, JSON) checked against a part's
inputs, with size limits read before decoding; outputs described for people."""

import io
import json
import math
import os
import zipfile

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import BundleError, TooLarge, one_line
from .images import IMAGE_SUFFIXES, MAX_PIXELS, decode_image, preprocess
from .metrics import looks_like_scores

MAX_UNPACKED = 256 * 1024 * 1024   # bytes an .npz may inflate to


def check_feed(feed, part, source):
    """Check names and shapes against the part's inputs; cast to its dtypes."""
    out = {}
    for spec in part["inputs"]:
        if spec["name"] not in feed:
            raise BundleError("%s: no input named %s (has: %s)"
                              % (source, spec["name"], ", ".join(sorted(feed)) or "none"))
        arr = np.asarray(feed[spec["name"]])
        if arr.dtype.kind == "c":   # a cast would drop the imaginary part without a word
            raise BundleError("%s: input %s is %s, the model wants %s; pass real values"
                              % (source, spec["name"], arr.dtype, spec["dtype"]))
        if arr.dtype.kind not in "biuf":
            raise BundleError("%s: input %s holds %s, not numbers; the model wants %s"
                              % (source, spec["name"], arr.dtype, spec["dtype"]))
        if list(arr.shape) != list(spec["shape"]):
            raise BundleError("%s: %s has shape %s, the model wants %s"
                              % (source, spec["name"], list(arr.shape), spec["shape"]))
        out[spec["name"]] = arr.astype(spec["dtype"], copy=False)
    return out


def image_feed(data, part, source, max_pixels=MAX_PIXELS):
    spec = part.get("preprocess")
    if not spec:
        raise BundleError("%s: %s has no image preprocessing; send .npy/.npz/JSON tensors"
                          % (source, part["name"]))
    image = decode_image(data, spec, source, max_pixels)
    return {part["inputs"][0]["name"]: preprocess(image, spec)}


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
    return check_feed(feed, part, path)


def read_npz_input(source, name):
    """{key: array} from an .npz (a path or a file object), refusing a zip bomb unread."""
    with np.load(source, allow_pickle=False) as f:
        unpacked = sum(info.file_size for info in f.zip.infolist())
        if unpacked > MAX_UNPACKED:
            raise TooLarge("%s: the .npz unpacks to %d MB, over the %d MB limit; send the "
                           "model's inputs only" % (name, unpacked // 2 ** 20,
                                                    MAX_UNPACKED // 2 ** 20))
        return {k: f[k] for k in f.files}


def npy_body(body, source):
    """An .npy held in *body*, its declared size checked against the bytes there first."""
    fp = io.BytesIO(body)
    version = np.lib.format.read_magic(fp)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
        np.lib.format.read_array_header_2_0
    shape, _, dtype = read_header(fp)
    needed = math.prod(shape) * dtype.itemsize
    if needed > len(body):
        raise BundleError("%s: the .npy header says shape %s %s (%d bytes), the body holds %d "
                          "bytes; send the whole file" % (source, list(shape), dtype, needed,
                                                          len(body)))
    fp.seek(0)
    return np.load(fp, allow_pickle=False)


IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8", b"BM", b"RIFF")
MAX_JSON_DEPTH = 64
NOT_JSON_SYNTAX = bytes(c for c in range(256) if c not in b'[]{}"')


def json_depth(text, limit=MAX_JSON_DEPTH):
    """How deep [ and { nest in JSON *text* (bytes), strings skipped, counted without recursion
    (json.loads recurses once per level) and stopping past *limit*."""
    # after \\ pairs go, a backslash left before a quote escapes it
    kept = text.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, NOT_JSON_SYNTAX)
    step = np.zeros(256, dtype=np.int64)
    step[list(b"[{")] = 1
    step[list(b"]}")] = -1
    deepest = depth = quotes = 0
    for start in range(0, len(kept), 1 << 20):
        chunk = np.frombuffer(kept[start:start + (1 << 20)], dtype=np.uint8)
        is_quote = chunk == ord('"')
        in_string = (quotes + np.cumsum(is_quote)) % 2 == 1
        levels = depth + np.cumsum(np.where(in_string, 0, step[chunk]))
        deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
        quotes += int(is_quote.sum())
        if deepest > limit:
            break
    return deepest


def decode_body(body, content_type, part, max_pixels=MAX_PIXELS):
    """An HTTP request body (image, .npy, .npz or JSON) as a checked feed for *part*."""
    source = "request body"
    ctype = content_type.split(";")[0].strip().lower()
    if not body:
        raise BundleError("empty request body; POST an image, a .npy/.npz file or JSON")
    try:
        if ctype.startswith("image/") or body.startswith(IMAGE_MAGIC):
            feed = image_feed(np.frombuffer(body, dtype=np.uint8), part, source, max_pixels)
        elif body.startswith(b"\x93NUMPY"):
            feed = single_input(npy_body(body, source), part, source)
        elif body.startswith(b"PK"):
            feed = read_npz_input(io.BytesIO(body), source)
        elif ctype == "application/json" or body.lstrip()[:1] in (b"{", b"["):
            if json_depth(body) > MAX_JSON_DEPTH:
                raise BundleError("the JSON body nests deeper than %d levels; send "
                                  "{\"inputs\": {name: nested list}}" % MAX_JSON_DEPTH)
            data = json.loads(body.decode("utf-8"))
            if isinstance(data, dict) and isinstance(data.get("inputs"), dict):
                data = data["inputs"]
            feed = (dict((k, np.asarray(v)) for k, v in data.items()) if isinstance(data, dict)
                    else single_input(np.asarray(data), part, source))
        else:
            raise BundleError("unsupported body (Content-Type %r); send an image, a .npy/.npz "
                              "file or JSON {\"inputs\": {name: nested list}}" % ctype)
    except BundleError:
        raise
    except MemoryError:
        raise TooLarge("the request body unpacks to more than this device can hold; send "
                       "the model's inputs only") from None
    except Exception as exc:  # whatever the bytes were, they were the client's
        raise BundleError("cannot decode the request body: %s" % one_line(exc)) from None
    return check_feed(feed, part, source)


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
        else:
            raise BundleError("%s: no such file or folder" % path)
    return files


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
