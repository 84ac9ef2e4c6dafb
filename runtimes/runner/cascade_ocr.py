"""The OCR cascade's glue, numpy only (OpenCV resizes when it is there): crops from the photo, a
crop fitted to a recogniser's input, the 180-degree turn. A DB probability map's text boxes
(text_quads, text_boxes) are the detect head's decoder db (runner/task_detect.py).

    crop(image, box), crop_quad(image, quad)   the photo's pixels inside a box or a tilted
                                          quad, upright (a tall crop turns a quarter)
    fit_crop(crop, spec)                  a crop as the model's tensor: the height fitted, the
                                          aspect ratio kept, zeros padding the width
    fit_image(image, spec)                a photo as the model's tensor per its preprocess
    reading_order(boxes)                  top to bottom, left to right on one line
"""

import math

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .images import normalise


def resize(image, width, height):
    """*image* (H, W, C) resized to *width* x *height*, bilinear with pixel centres aligned as
    OpenCV's INTER_LINEAR does (OpenCV itself when it is installed)."""
    try:
        import cv2
    except ImportError:
        cv2 = None
    if cv2 is not None:
        out = cv2.resize(np.ascontiguousarray(image), (width, height),
                         interpolation=cv2.INTER_LINEAR)
        return out.reshape(height, width, -1)
    h, w = image.shape[:2]
    ys = np.clip((np.arange(height) + 0.5) * (float(h) / height) - 0.5, 0, h - 1)
    xs = np.clip((np.arange(width) + 0.5) * (float(w) / width) - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(np.int64), np.floor(xs).astype(np.int64)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    src = image.astype(np.float32).reshape(h, w, -1)
    top = src[y0][:, x0] * (1 - fx) + src[y0][:, x1] * fx
    bottom = src[y1][:, x0] * (1 - fx) + src[y1][:, x1] * fx
    out = top * (1 - fy) + bottom * fy
    if image.dtype == np.uint8:
        return np.clip(np.round(out), 0, 255).astype(np.uint8)
    return out.astype(image.dtype)


def fit_image(image, spec):
    """A photo (H, W, C) as the detector's tensor: *spec*'s resize (stretch, letterbox or
    center-crop) to its size, then its normalisation."""
    width, height = spec["size"]
    h, w = image.shape[:2]
    mode = spec.get("resize", "stretch")
    if mode == "letterbox":
        r = min(float(width) / w, float(height) / h)
        nw, nh = max(1, int(round(w * r))), max(1, int(round(h * r)))
        out = np.full((height, width, image.shape[2]), spec.get("pad", 114), dtype=image.dtype)
        top, left = (height - nh) // 2, (width - nw) // 2
        out[top:top + nh, left:left + nw] = resize(image, nw, nh)
    elif mode == "center-crop":
        r = max(float(width) / w, float(height) / h)
        nw, nh = max(width, int(round(w * r))), max(height, int(round(h * r)))
        top, left = (nh - height) // 2, (nw - width) // 2
        out = resize(image, nw, nh)[top:top + height, left:left + width]
    else:
        out = resize(image, width, height)
    return normalise(out, spec)


def fit_crop(crop, spec):
    """A text crop (h, w, C) as a recogniser's or direction classifier's tensor, as PaddleOCR's
    resize_norm_img makes it: resized to the input's height with its aspect ratio kept (at
    most the input's width), normalised, then padded on the right with zeros."""
    width, height = spec["size"]
    h, w = crop.shape[:2]
    rw = max(1, min(width, int(math.ceil(height * float(w) / max(h, 1)))))
    tensor = normalise(resize(crop, rw, height), spec)
    out = np.zeros((1, tensor.shape[1], height, width) if spec.get("layout", "nchw") == "nchw"
                   else (1, height, width, tensor.shape[-1]), dtype=tensor.dtype)
    if spec.get("layout", "nchw") == "nchw":
        out[:, :, :, :rw] = tensor
    else:
        out[:, :, :rw, :] = tensor
    return out


def rotate180(image):
    return np.ascontiguousarray(image[::-1, ::-1])


def reading_order(boxes, tolerance=10.0):
    """Indices of *boxes* (x1 y1 x2 y2) top to bottom, and left to right among boxes whose tops
    are within *tolerance* pixels (PaddleOCR's sorted_boxes)."""
    order = sorted(range(len(boxes)), key=lambda i: (boxes[i][1], boxes[i][0]))
    for i in range(len(order) - 1):
        for j in range(i, -1, -1):
            a, b = boxes[order[j]], boxes[order[j + 1]]
            if abs(b[1] - a[1]) < tolerance and b[0] < a[0]:
                order[j], order[j + 1] = order[j + 1], order[j]
            else:
                break
    return order


def crop_quad(image, quad):
    """The pixels of *image* inside *quad* (4 corners x, y as text_quads orders them, image
    pixels) sampled upright (bilinear, edges repeated), or None when under 2 pixels a side; an
    axis-aligned quad is cut out as crop() does."""
    quad = np.asarray(quad, np.float64)
    if abs(quad[0, 1] - quad[1, 1]) < 1e-6 and abs(quad[0, 0] - quad[3, 0]) < 1e-6:
        return crop(image, [quad[0, 0], quad[0, 1], quad[2, 0], quad[2, 1]])
    across, down = quad[1] - quad[0], quad[3] - quad[0]
    w, h = int(round(math.hypot(*across))), int(round(math.hypot(*down)))
    if w < 2 or h < 2:
        return None
    i = (np.arange(w) + 0.5) / w
    j = (np.arange(h) + 0.5) / h
    xs = quad[0, 0] + i[None, :] * across[0] + j[:, None] * down[0] - 0.5
    ys = quad[0, 1] + i[None, :] * across[1] + j[:, None] * down[1] - 0.5
    H, W = image.shape[:2]
    xs, ys = np.clip(xs, 0, W - 1), np.clip(ys, 0, H - 1)
    x0, y0 = np.floor(xs).astype(np.int64), np.floor(ys).astype(np.int64)
    x1, y1 = np.minimum(x0 + 1, W - 1), np.minimum(y0 + 1, H - 1)
    fx, fy = (xs - x0)[..., None], (ys - y0)[..., None]
    src = image.astype(np.float32).reshape(H, W, -1)
    out = (src[y0, x0] * (1 - fx) + src[y0, x1] * fx) * (1 - fy) + \
        (src[y1, x0] * (1 - fx) + src[y1, x1] * fx) * fy
    piece = np.clip(np.round(out), 0, 255).astype(np.uint8)
    if piece.shape[0] >= 1.5 * piece.shape[1]:
        piece = np.rot90(piece)
    return np.ascontiguousarray(piece)


def crop(image, box):
    """The pixels of *image* (H, W, C) inside *box* (x1 y1 x2 y2, image pixels), or None when
    it holds under 2 pixels a side; a crop 1.5 times taller than wide is turned a quarter
    (vertical text, as PaddleOCR's get_rotate_crop_image does)."""
    h, w = image.shape[:2]
    x1, y1 = int(max(0, math.floor(box[0]))), int(max(0, math.floor(box[1])))
    x2, y2 = int(min(w, math.ceil(box[2]))), int(min(h, math.ceil(box[3])))
    if x2 - x1 < 2 or y2 - y1 < 2:
        return None
    piece = image[y1:y2, x1:x2]
    if piece.shape[0] >= 1.5 * piece.shape[1]:
        piece = np.rot90(piece)
    return np.ascontiguousarray(piece)


def ink(piece):
    """Each column's ink: its mean distance from the crop's background (its median level)."""
    grey = piece.astype(np.float32).mean(axis=2) if piece.ndim == 3 else \
        piece.astype(np.float32)
    return np.abs(grey - np.median(grey)).mean(axis=0)


def split_line(piece, height, width):
    """A text crop wider than a recogniser's input takes without squeezing (*width* at
    *height*) cut into pieces that fit, each cut at the palest column near its even share
    (between words where there is room): [(piece, blank columns around its left cut)]."""
    h, w = piece.shape[:2]
    fits = max(1, int(width * float(h) / height))   # crop pixels one input width holds
    if w <= fits:
        return [(piece, 0)]
    profile = ink(piece)
    smooth = np.convolve(profile, np.ones(3, np.float32) / 3, mode="same")
    faint = profile <= 0.1 * max(float(profile.max()), 1e-6)
    out, start, left_gap = [], 0, 0
    # each column's faint run: its length, and where it starts
    run, begin = np.zeros(w, np.int64), np.zeros(w, np.int64)
    k = 0
    while k < w:
        end = k
        while end < w and faint[end]:
            end += 1
        if end > k:
            run[k:end], begin[k:end] = end - k, k
            k = end
        else:
            k += 1
    while w - start > fits:
        low, high = start + fits // 2, start + fits   # never a piece under half the width
        if run[low:high].max() > 0:   # the middle of the widest pale gap (between words)
            at = low + int(np.argmax(run[low:high]))
            cut = min(max(int(begin[at] + run[at] // 2), low), high - 1)
            gap = int(run[at])
        else:
            cut, gap = low + int(np.argmin(smooth[low:high])), 0
        out.append((piece[:, start:cut], left_gap))
        start, left_gap = cut, gap
    out.append((piece[:, start:], left_gap))
    return [(p, g) for p, g in out if p.shape[1] >= 2]
