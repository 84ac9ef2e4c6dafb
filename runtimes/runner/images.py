"""Image inputs: read an image's size from its header, decode it (OpenCV), preprocess it.
Shipped only in a bundle with a part that takes images (a `preprocess` section) or a pipeline.

The packager calls these same functions for calibration, so host and device preprocess alike.
"""

import struct

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import IMAGE_SUFFIXES, MAX_PIXELS, BundleError, TooLarge  # noqa: F401 (the packager reads them here)

# The preprocessing vocabulary, defined once (the packager's preprocessing.py imports it).
RESIZE = ("stretch", "letterbox", "center-crop")
COLORS = ("rgb", "bgr", "gray")
LAYOUTS = ("nchw", "nhwc")
DTYPES = ("float32", "float16", "uint8")
MAX_SIDE = 16384   # a model input side: image models take at most a few thousand pixels


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        value == value and abs(value) != float("inf")


def preprocess_problem(spec):
    """What is wrong with a manifest's preprocessing *spec* (as the packager writes it), naming
    the field, or '': a size of two sides from 1 to MAX_SIDE, known resize/color/layout/dtype,
    finite numbers for scale and pad, one finite mean and one non-zero finite std a channel."""
    size = spec.get("size")
    if not isinstance(size, list) or len(size) != 2 or \
            not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIDE
                    for v in size):
        return "preprocess.size = %.60r is not [width, height] from 1 to %d" % (size, MAX_SIDE)
    for key, choices in (("resize", RESIZE), ("color", COLORS), ("layout", LAYOUTS),
                         ("dtype", DTYPES)):
        if key in spec and spec[key] not in choices:
            return "preprocess.%s = %.40r is not one of %s" % (key, spec[key], ", ".join(choices))
    for key in ("scale", "pad"):
        if key in spec and not _number(spec[key]):
            return "preprocess.%s = %.40r is not a number" % (key, spec[key])
    if "pad" in spec and not 0 <= spec["pad"] <= 255:
        return "preprocess.pad = %r is not a pixel value from 0 to 255" % spec["pad"]
    channels = 1 if spec.get("color") == "gray" else 3
    for key in ("mean", "std"):
        values = spec.get(key)
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != channels or \
                not all(_number(v) for v in values):
            return "preprocess.%s = %.60r is not %d finite numbers (one a channel)" % (
                key, values, channels)
        if key == "std" and any(v == 0 for v in values):
            return "preprocess.std = %r holds 0: every input would divide by zero" % (values,)
    return ""


def read_image(path, spec):
    """Decode an image file into an HxWxC uint8 array in the spec's colour order."""
    return decode_image(np.fromfile(str(path), dtype=np.uint8), spec, path)


# bytes per pixel OpenCV's IMREAD_UNCHANGED gives a PNG of each colour type (palette and
# grey+alpha come out as BGRA)
PNG_CHANNELS = {0: 1, 2: 3, 3: 4, 4: 4, 6: 4}
BYTES_PER_PIXEL = 3   # --max-megapixels counts 8-bit colour pixels: the decoded bytes' bound


def image_size(data):
    """(width, height) from a PNG, JPEG, BMP or WebP header in *data* (bytes-like), else None."""
    header = image_header(data)
    return header[:2] if header else None


def image_header(data):
    """(width, height, channels, bytes per sample) as decoding will give them, from a PNG,
    JPEG, BMP or WebP header in *data* (bytes-like), else None."""
    mv = memoryview(data).cast("B")
    head = mv[:32].tobytes()
    try:
        if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR":
            w, h, depth, kind = struct.unpack(">IIBB", head[16:26])
            return w, h, PNG_CHANNELS.get(kind, 4), 2 if depth > 8 else 1
        if head.startswith(b"BM"):
            if struct.unpack("<I", head[14:18])[0] == 12:   # OS/2 core header
                w, h = struct.unpack("<HH", head[18:22])
                return w, h, 3, 1
            w, h, _, bits = struct.unpack("<iiHH", head[18:30])
            return abs(w), abs(h), 4 if bits == 32 else 3, 1
        if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
            chunk = head[12:16]
            if chunk == b"VP8 ":
                w, h = struct.unpack("<HH", head[26:30])
                return w & 0x3FFF, h & 0x3FFF, 3, 1
            if chunk == b"VP8L":
                bits = struct.unpack("<I", head[21:25])[0]
                return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, 4, 1
            if chunk == b"VP8X":
                return (int.from_bytes(head[24:27], "little") + 1,
                        int.from_bytes(head[27:30], "little") + 1, 4, 1)
            return None
        if head.startswith(b"\xff\xd8"):
            i, segments = 2, 0
            while i + 9 <= len(mv) and segments < 1000:   # then OpenCV's own limit applies
                segments += 1
                if mv[i] != 0xFF:
                    return None
                marker = mv[i + 1]
                if marker == 0xFF:   # fill byte
                    i += 1
                    continue
                if marker == 0x01 or 0xD0 <= marker <= 0xD8:   # no length
                    i += 2
                    continue
                if marker in (0xD9, 0xDA):   # end of image, start of scan: no frame header
                    return None
                if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                    h, w = struct.unpack(">HH", mv[i + 5:i + 9].tobytes())
                    bits = mv[i + 4]
                    channels = mv[i + 9] if i + 10 <= len(mv) else 4
                    return w, h, max(1, min(channels, 4)), 2 if bits > 8 else 1
                i += 2 + struct.unpack(">H", mv[i + 2:i + 4].tobytes())[0]
    except struct.error:   # a header cut short: the decoder will say it is unreadable
        return None
    return None


def decode_image(data, spec, path, max_pixels=MAX_PIXELS):
    """Decode encoded image bytes (a uint8 array) named *path* in messages; refuse an image
    over *max_pixels* before decoding it."""
    header = image_header(data)
    color = spec.get("color", "rgb")
    flags = None   # imported below: cv2.IMREAD_UNCHANGED
    if header is not None:
        w, h, channels, sample = header
        if w * h > max_pixels:
            raise TooLarge("%s: the image is %dx%d (%.0f MP), over the %.0f MP limit; resize "
                           "it, or raise --max-megapixels" % (path, w, h, w * h / 1e6,
                                                              max_pixels / 1e6))
        if channels == 4 and sample == 1 and color != "gray":
            channels, flags = 3, "color"   # alpha dropped by the decoder, not after it
        decoded = w * h * channels * sample
        if decoded > max_pixels * BYTES_PER_PIXEL:
            raise TooLarge("%s: the image is %dx%d with %d channel(s) of %d bit(s), %.0f MB "
                           "once decoded, over the %.0f MB that --max-megapixels %g allows "
                           "(%d bytes a pixel); resize it or save it with 8 bits a channel"
                           % (path, w, h, channels, 8 * sample, decoded / 1e6,
                              max_pixels * BYTES_PER_PIXEL / 1e6, max_pixels / 1e6,
                              BYTES_PER_PIXEL))
    try:
        import cv2
    except ImportError:
        raise BundleError("image input needs OpenCV: pip install opencv-python-headless "
                          "(or pass .npy/.npz tensors)") from None
    if hasattr(cv2, "setLogLevel"):
        cv2.setLogLevel(0)  # a broken file gets our one-line message, not decoder noise
    elif hasattr(getattr(cv2, "utils", None), "logging"):   # OpenCV 5 moved it
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    try:
        image = cv2.imdecode(data, cv2.IMREAD_COLOR if flags == "color" else
                             cv2.IMREAD_UNCHANGED) if data.size else None
    except cv2.error as exc:
        if "MAX_IMAGE_PIXELS" in str(exc):
            raise TooLarge("%s: the image is over the %.0f MP limit; resize it, or raise "
                           "--max-megapixels" % (path, max_pixels / 1e6)) from None
        image = None
    if image is None:
        raise BundleError("%s: not a readable image (corrupt or unsupported format); "
                          "remove it or re-save it as PNG/JPEG" % path)
    if image.dtype != np.uint8:
        image = cv2.convertScaleAbs(image, alpha=255.0 / max(float(image.max()), 1.0))
    return to_color(image, color, cv2)


def to_color(image, color, cv2):
    """*image* as decoded (grey HxW or HxWx1, grey+alpha, BGR or BGRA) in the colours the model
    wants: HxWx1 for color=gray, HxWx3 RGB or BGR otherwise. Converted, never refused: a grey
    scan fed to a colour model, a colour photo fed to a grey OCR model, an RGBA PNG (its alpha
    dropped) all run, as OpenCV's or PIL's convert would make them."""
    if image.ndim == 2:
        image = image[:, :, None]
    channels = image.shape[2]
    if channels == 2:    # grey + alpha
        image, channels = image[:, :, :1], 1
    elif channels > 4:
        image, channels = image[:, :, :3], 3
    if color == "gray":
        if channels == 1:
            return np.ascontiguousarray(image)
        code = cv2.COLOR_BGRA2GRAY if channels == 4 else cv2.COLOR_BGR2GRAY
        return cv2.cvtColor(np.ascontiguousarray(image), code)[:, :, None]
    if channels == 1:
        image = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_GRAY2BGR)
    elif channels == 4:  # drop alpha: RGBA PNGs are the common case
        image = image[:, :, :3]
    if color == "rgb":
        image = image[:, :, ::-1]
    return np.ascontiguousarray(image)


def preprocess(image, spec):
    """Turn an HxWxC uint8 image into a model input tensor with a batch axis of 1."""
    import cv2

    width, height = spec["size"]
    h, w = image.shape[:2]
    mode = spec.get("resize", "stretch")
    if mode == "stretch":
        out = cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)
    elif mode == "letterbox":
        r = min(float(width) / w, float(height) / h)
        nw, nh = max(1, int(round(w * r))), max(1, int(round(h * r)))
        resized = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)
        out = np.full((height, width, image.shape[2]), spec.get("pad", 114), dtype=np.uint8)
        top, left = (height - nh) // 2, (width - nw) // 2
        out[top:top + nh, left:left + nw] = resized.reshape(nh, nw, -1)
    elif mode == "center-crop":
        r = max(float(width) / w, float(height) / h)
        nw, nh = max(width, int(round(w * r))), max(height, int(round(h * r)))
        resized = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)
        top, left = (nh - height) // 2, (nw - width) // 2
        out = resized[top:top + height, left:left + width]
    else:
        raise BundleError("unknown resize mode %r (stretch, letterbox, center-crop)" % mode)
    return normalise(out.reshape(height, width, -1), spec)


def normalise(pixels, spec):
    """(H, W, C) pixels as a tensor with a batch axis of 1, per *spec*'s dtype, scale, mean,
    std and layout (preprocess after its resize; the OCR cascade's crops too)."""
    dtype = spec.get("dtype", "float32")
    if dtype == "uint8":
        tensor = pixels
    else:
        tensor = pixels.astype(np.float32) * np.float32(spec.get("scale", 1.0))
        if spec.get("mean") is not None:
            tensor = tensor - np.asarray(spec["mean"], dtype=np.float32)
        if spec.get("std") is not None:
            tensor = tensor / np.asarray(spec["std"], dtype=np.float32)
    if spec.get("layout", "nchw") == "nchw":
        tensor = tensor.transpose(2, 0, 1)
    return np.ascontiguousarray(tensor[None].astype(dtype))
