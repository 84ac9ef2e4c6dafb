"""Image inputs: read an image's size from its header, decode it (OpenCV), preprocess it.

The packager calls these same functions for calibration, so host and device preprocess alike.
"""

import struct

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import BundleError, TooLarge

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")

# A 1 MB PNG can decode to 20000x20000 (1.2 GB): images are measured from their header first.
MAX_PIXELS = 50 * 1000 * 1000


def read_image(path, spec):
    """Decode an image file into an HxWxC uint8 array in the spec's colour order."""
    return decode_image(np.fromfile(str(path), dtype=np.uint8), spec, path)


def image_size(data):
    """(width, height) from a PNG, JPEG, BMP or WebP header in *data* (bytes-like), else None."""
    mv = memoryview(data).cast("B")
    head = mv[:32].tobytes()
    try:
        if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR":
            return struct.unpack(">II", head[16:24])
        if head.startswith(b"BM"):
            if struct.unpack("<I", head[14:18])[0] == 12:   # OS/2 core header
                return struct.unpack("<HH", head[18:22])
            w, h = struct.unpack("<ii", head[18:26])
            return abs(w), abs(h)
        if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
            chunk = head[12:16]
            if chunk == b"VP8 ":
                w, h = struct.unpack("<HH", head[26:30])
                return w & 0x3FFF, h & 0x3FFF
            if chunk == b"VP8L":
                bits = struct.unpack("<I", head[21:25])[0]
                return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
            if chunk == b"VP8X":
                return (int.from_bytes(head[24:27], "little") + 1,
                        int.from_bytes(head[27:30], "little") + 1)
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
                    return w, h
                i += 2 + struct.unpack(">H", mv[i + 2:i + 4].tobytes())[0]
    except struct.error:   # a header cut short: the decoder will say it is unreadable
        return None
    return None


def decode_image(data, spec, path, max_pixels=MAX_PIXELS):
    """Decode encoded image bytes (a uint8 array) named *path* in messages; refuse an image
    over *max_pixels* before decoding it."""
    size = image_size(data)
    if size is not None and size[0] * size[1] > max_pixels:
        raise TooLarge("%s: the image is %dx%d (%.0f MP), over the %.0f MP limit; resize it, "
                       "or raise --max-megapixels" % (path, size[0], size[1],
                                                      size[0] * size[1] / 1e6, max_pixels / 1e6))
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
        image = cv2.imdecode(data, cv2.IMREAD_UNCHANGED) if data.size else None
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
    channels = 1 if image.ndim == 2 else image.shape[2]
    color = spec.get("color", "rgb")
    if color == "gray":
        if channels != 1:
            raise BundleError("%s: %d channels, but the preprocessing spec says color=gray; "
                              "convert the image to grayscale or use color=rgb" % (path, channels))
        return image[:, :, None]
    if channels == 4:  # drop alpha: RGBA PNGs are the common case, not an error
        image = image[:, :, :3]
        channels = 3
    if channels != 3:
        raise BundleError("%s: %d channel(s), but the preprocessing spec says color=%s "
                          "(3 channels); convert the image or use color=gray"
                          % (path, channels, color))
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
    out = out.reshape(height, width, -1)
    dtype = spec.get("dtype", "float32")
    if dtype == "uint8":
        tensor = out
    else:
        tensor = out.astype(np.float32) * np.float32(spec.get("scale", 1.0))
        if spec.get("mean") is not None:
            tensor = tensor - np.asarray(spec["mean"], dtype=np.float32)
        if spec.get("std") is not None:
            tensor = tensor / np.asarray(spec["std"], dtype=np.float32)
    if spec.get("layout", "nchw") == "nchw":
        tensor = tensor.transpose(2, 0, 1)
    return np.ascontiguousarray(tensor[None].astype(dtype))
