"""`serve`'s request bodies (an image, .npy, .npz or JSON) read as a checked feed for a part,
each refused by its size or depth before it is decoded."""

import io
import json
import math

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import MAX_PIXELS, BundleError, TooLarge, one_line
from .inputs import (
    MAX_UNPACKED,
    check_feed,
    image_feed,
    input_bytes,
    input_values,
    read_npz_input,
    single_input,
)

JSON_BYTES_PER_VALUE = 32          # "-0.12345678901234567, " is 22: a body over this is refused
JSON_SLACK = 1 << 20               # ...plus this much (keys, spaces, {"inputs": ...})


def json_limit(part):
    """The largest JSON body worth parsing for *part*: its values written out, with room."""
    return JSON_SLACK + JSON_BYTES_PER_VALUE * input_values(part)


def npz_limit(part):
    """The most an .npz body for *part* may unpack to: its inputs in 64-bit, with room."""
    return min(MAX_UNPACKED, (1 << 20) + 8 * input_values(part) + 2 * input_bytes(part))


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


def decode_body(body, content_type, part, max_pixels=MAX_PIXELS, clock=None):
    """An HTTP request body (image, .npy, .npz or JSON) as a checked feed for *part*; an
    image's decode and preprocess calls go through *clock* (inputs.image_feed) when given."""
    source = "request body"
    ctype = content_type.split(";")[0].strip().lower()
    if not body:
        raise BundleError("empty request body; POST an image, a .npy/.npz file or JSON")
    try:
        if is_image_body(body, content_type):
            feed = image_feed(np.frombuffer(body, dtype=np.uint8), part, source, max_pixels,
                              **({"clock": clock} if clock else {}))
        elif body.startswith(b"\x93NUMPY"):
            feed = single_input(npy_body(body, source), part, source)
        elif body.startswith(b"PK"):
            feed = read_npz_input(io.BytesIO(body), source, npz_limit(part))
        elif ctype == "application/json" or body.lstrip()[:1] in (b"{", b"["):
            if len(body) > json_limit(part):
                raise TooLarge("the JSON body is %d bytes, over the %d this model's inputs can "
                               "take; send its inputs only, or send them as .npy/.npz"
                               % (len(body), json_limit(part)))
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
    return check_feed(feed, part, source, 1 if is_image_body(body, content_type) else None)


def is_image_body(body, content_type):
    """Whether decode_body reads *body* as an image (one image: a batch axis of 1)."""
    ctype = content_type.split(";")[0].strip().lower()
    return ctype.startswith("image/") or body.startswith(IMAGE_MAGIC)
