"""The OCR cascade's glue, numpy only (OpenCV resizes when it is there): a DB probability map to
text boxes, crops from the photo, a crop fitted to a recogniser's input, the 180-degree turn.

    text_quads(prob, conf)                (quads: 4 corners x, y in map pixels, mean scores),
                                          each blob boxed along its principal axis
    text_boxes(prob, conf)                the same as axis-aligned boxes x1 y1 x2 y2
    components(mask)                      each 4-connected blob's bounding box and pixel count
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


def dilate(mask):
    """*mask* grown by a 2x2 kernel (OpenCV's dilate with np.ones((2, 2)), as DB uses it)."""
    out = mask.copy()
    out[1:, :] |= mask[:-1, :]
    out[:, 1:] |= mask[:, :-1]
    out[1:, 1:] |= mask[:-1, :-1]
    return out


def runs(row):
    """(starts, ends) of the runs of True in one row, ends exclusive."""
    edges = np.diff(np.concatenate([[0], row.astype(np.int8), [0]]))
    return np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]


def components(mask, labels=False):
    """Every 4-connected blob of True in *mask* (H, W): a list of (x1, y1, x2, y2, pixels),
    corners inclusive, top to bottom; with *labels*, also an (H, W) int32 map holding k + 1 on
    the pixels of blob k. Runs of each row are joined to the runs they touch in the row above
    (union-find over runs: a text map has a few dozen runs a row)."""
    parent = []

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    found = []   # (row, start, end) of each run
    previous = []   # run indices of the row above
    for y in range(mask.shape[0]):
        starts, ends = runs(mask[y])
        current = []
        j = 0
        for s, e in zip(starts.tolist(), ends.tolist()):
            index = len(found)
            found.append((y, s, e))
            parent.append(index)
            current.append(index)
            while j < len(previous) and found[previous[j]][2] <= s:
                j += 1
            k = j
            while k < len(previous) and found[previous[k]][1] < e:
                a, b = root(previous[k]), root(index)
                if a != b:
                    parent[max(a, b)] = min(a, b)
                k += 1
        previous = current
    boxes = {}
    roots = [root(index) for index in range(len(found))]
    for (y, s, e), r in zip(found, roots):
        box = boxes.get(r)
        if box is None:
            boxes[r] = [s, y, e - 1, y, e - s]
        else:
            box[0], box[2] = min(box[0], s), max(box[2], e - 1)
            box[3] = y
            box[4] += e - s
    order = sorted(boxes)
    blobs = [tuple(boxes[r]) for r in order]
    if not labels:
        return blobs
    number = dict((r, k + 1) for k, r in enumerate(order))
    image = np.zeros(mask.shape, np.int32)
    for (y, s, e), r in zip(found, roots):
        image[y, s:e] = number[r]
    return blobs, image


SNAP = math.radians(2.0)   # a blob tilted less than this is boxed axis-aligned


def oriented_rect(xs, ys):
    """(angle in (-45, 45] degrees as radians, u range, v range) of the rectangle around the
    points along their principal axis (the more horizontal one); 0 when nearly level. u runs
    along x cos a + y sin a, v along -x sin a + y cos a."""
    angle = 0.0
    if len(xs) >= 3:
        dx, dy = xs - xs.mean(), ys - ys.mean()
        angle = 0.5 * math.atan2(2.0 * float((dx * dy).mean()),
                                 float((dx * dx).mean() - (dy * dy).mean()))
        if angle > math.pi / 4:
            angle -= math.pi / 2
        elif angle <= -math.pi / 4:
            angle += math.pi / 2
        if abs(angle) < SNAP:
            angle = 0.0
    c, s = math.cos(angle), math.sin(angle)
    u, v = xs * c + ys * s, -xs * s + ys * c
    return angle, (float(u.min()), float(u.max())), (float(v.min()), float(v.max()))


def rect_corners(angle, us, vs):
    """The 4 corners (x, y) of a (u, v) rectangle: top-left, top-right, bottom-right,
    bottom-left as the text reads."""
    c, s = math.cos(angle), math.sin(angle)
    return np.asarray([[u * c - v * s, u * s + v * c] for u, v in (
        (us[0], vs[0]), (us[1], vs[0]), (us[1], vs[1]), (us[0], vs[1]))], np.float64)


def text_quads(prob, conf):
    """(quads (N, 4, 2) of corners x, y, scores (N,)) of a DB probability map (any shape ending
    in H, W), in map pixels: blobs over conf["threshold"], each boxed along its principal axis
    (axis-aligned when within 2 degrees of level), the box's mean probability over
    conf["box_threshold"], grown by DB's unclip distance, short sides of conf["min_size"]."""
    prob = np.asarray(prob, np.float64)
    prob = prob.reshape(prob.shape[-2:])
    mask = prob > conf["threshold"]
    if conf["dilate"]:
        mask = dilate(mask)
    height, width = prob.shape
    blobs, labels = components(mask, labels=True)
    found, scores = [], []
    for k, (x1, y1, x2, y2, _) in enumerate(blobs[:conf["max_boxes"]]):
        ys, xs = np.nonzero(labels[y1:y2 + 1, x1:x2 + 1] == k + 1)
        angle, us, vs = oriented_rect(xs.astype(np.float64), ys.astype(np.float64))
        w, h = us[1] - us[0], vs[1] - vs[0]   # between the outermost pixel centres
        if min(w, h) < conf["min_size"]:
            continue
        if angle == 0.0:
            score = float(prob[y1:y2 + 1, x1:x2 + 1].mean())
        else:   # the mean over the tilted rectangle's pixels
            gy, gx = np.mgrid[0:y2 - y1 + 1, 0:x2 - x1 + 1].astype(np.float64)
            u = gx * math.cos(angle) + gy * math.sin(angle)
            v = -gx * math.sin(angle) + gy * math.cos(angle)
            inside = (u >= us[0] - 0.5) & (u <= us[1] + 0.5) & (v >= vs[0] - 0.5) & \
                (v <= vs[1] + 0.5)
            score = float(prob[y1:y2 + 1, x1:x2 + 1][inside].mean())
        if score < conf["box_threshold"]:
            continue
        grow = w * h * conf["unclip"] / max(2.0 * (w + h), 1e-9)
        if min(w, h) + 2 * grow < conf["min_size"] + 2:
            continue
        quad = rect_corners(angle, (us[0] - grow, us[1] + grow), (vs[0] - grow, vs[1] + grow))
        quad += [x1, y1]
        quad[:, 0] = np.clip(quad[:, 0], 0.0, width)
        quad[:, 1] = np.clip(quad[:, 1], 0.0, height)
        found.append(quad)
        scores.append(score)
    return np.asarray(found, np.float64).reshape(-1, 4, 2), np.asarray(scores, np.float64)


def bounding_boxes(quads):
    """(N, 4) x1 y1 x2 y2 around each quad (N, 4, 2)."""
    quads = np.asarray(quads, np.float64).reshape(-1, 4, 2)
    return np.concatenate([quads.min(axis=1), quads.max(axis=1)], axis=1)


def text_boxes(prob, conf):
    """(boxes (N, 4) x1 y1 x2 y2 around text_quads' quads, scores)."""
    quads, scores = text_quads(prob, conf)
    return bounding_boxes(quads), scores


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
