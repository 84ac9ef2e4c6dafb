"""The face cascade's glue (MTCNN), numpy only: P-Net proposes faces over a scale pyramid of the
photo, R-Net refines each proposal's 24x24 crop, O-Net gives the final box, its score and five
landmarks from a 48x48 crop. The steps and their defaults are facenet-pytorch's detect_face
(min_face 20, factor 0.709, thresholds 0.6/0.7/0.7, NMS 0.5 per level, 0.7 across levels, 0.7
after R-Net, 0.7 "Min" after O-Net), and so is every detail of its arithmetic: torch's "area"
resampling, the regression's +1 widths, crops clipped to the photo (1-based), the squaring.

A bundle's P-Net has one static input (H, W): each pyramid level's map is cut into blocks of at
most the cells one input holds, each block with the 10-pixel margin its cells see (so every
cell is computed from its own level's pixels, as on the whole level), and the blocks are packed
side by side into as few inputs as they fit. The pyramid stays the photo's own, so the faces
are the original's on any photo size; only a level's last cell row or column, where P-Net's
ceil-mode pooling sees one pixel past the level, sees that pixel repeated instead of nothing.

    pyramid_scales(width, height, min_face, factor)     the levels' scales, largest first
    level_size(width, height, scale)                    a level's (w, h) in pixels
    integral(image), area_region(table, ...)            torch's interpolate(mode="area") of
    area_resize(image, width, height)                   a region, from the photo's sums
    map_blocks(maps, in_h, in_w)                        the levels' maps cut, packed into inputs
    pyramid_maps(run, levels, spec)                     P-Net's map of each level through them
    proposals(prob, reg, scale, threshold)              P-Net cells -> boxes in photo pixels
    nms(boxes, scores, threshold, mode)                 "union" (torchvision) or "min" (facenet)
    regress(boxes, reg, plus_one), square(boxes)        bounding-box regression, squaring
    crop_box(image, box)                                a box's pixels, clipped to the photo
    landmarks(boxes, points)                            O-Net's points in photo pixels
    find_faces(cascade, image, timing)                  the cascade on one photo
    agreement(want, got)                                (faces wanted, found alike, found)
"""

import math

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import BundleError
from .images import normalise
from .task_detect import iou_matrix, matched_pairs

CELL, STRIDE = 12, 2      # P-Net: a cell sees 12x12 pixels, cells are 2 pixels apart
MARGIN = CELL - STRIDE    # the pixels a block of cells needs past 2 x its cells
MAX_LEVEL_PIXELS = 64e6   # all pyramid levels together (a tiny min_face on a big photo)


def pyramid_scales(width, height, min_face=20, factor=0.709):
    """The scales of facenet's pyramid: 12 / min_face, times *factor* while the level's short
    side is 12 pixels or more."""
    m = 12.0 / min_face
    minl = min(width, height) * m
    scales, scale = [], m
    while minl >= 12:
        scales.append(scale)
        scale, minl = scale * factor, minl * factor
    return scales


def level_size(width, height, scale):
    """(w, h) of a pyramid level, as facenet rounds it."""
    return int(width * scale + 1), int(height * scale + 1)


def integral(image):
    """The summed-area table of *image* (H, W, C): (H + 1, W + 1, C), zeros first. One a photo
    serves every level and crop. For uint8 pixels it is uint32 and wraps: a window's sum comes
    out exact as long as it is under 2^32 (16.8M pixels; a level or crop of 12x12 or more
    averages at most 1/144 of a photo, so any photo up to 2.4 GP); else float64."""
    kind = np.uint32 if image.dtype == np.uint8 else np.float64
    table = np.zeros((image.shape[0] + 1, image.shape[1] + 1, image.shape[2]), kind)
    np.cumsum(image, axis=0, dtype=kind, out=table[1:, 1:])
    np.cumsum(table[1:, 1:], axis=1, out=table[1:, 1:])
    return table


def _windows(n, size):
    """torch's adaptive pooling windows of n samples to *size*: i covers floor(i * n / size) to
    ceil((i + 1) * n / size)."""
    i = np.arange(size)
    return (i * n) // size, -((-(i + 1) * n) // size)


def area_region(table, top, left, height, width, out_h, out_w):
    """The region (top, left, height, width) of the photo whose integral() is *table*, resized
    to out_w x out_h as torch's interpolate(mode="area") does (float32)."""
    y0, y1 = _windows(height, out_h)
    x0, x1 = _windows(width, out_w)
    y0, y1, x0, x1 = y0 + top, y1 + top, x0 + left, x1 + left
    rows1, rows0 = table[y1], table[y0]
    total = rows1[:, x1] - rows0[:, x1] - rows1[:, x0] + rows0[:, x0]   # uint32: wraps back
    count = ((y1 - y0)[:, None] * (x1 - x0)[None, :])[:, :, None]
    return (total / count.astype(np.float64)).astype(np.float32)


def area_resize(image, width, height):
    """*image* (H, W, C) resized to *width* x *height* as torch's interpolate(mode="area") does
    (float32)."""
    return area_region(integral(image), 0, 0, image.shape[0], image.shape[1], height, width)


def map_size(width, height):
    """P-Net's map (cols, rows) on a level of *width* x *height* pixels (its pooling rounds
    up)."""
    return max(0, -(-(width - MARGIN) // 2)), max(0, -(-(height - MARGIN) // 2))


def map_blocks(maps, in_h, in_w):
    """The levels' maps (a list of (rows, cols) cells) cut into blocks that fit P-Net's input
    (in_h, in_w) with their margin, all packed in shelves, the tallest first: a list of (input
    index, y, x, level, row0, col0, n rows, n cols); the block's pixels are the level's rows
    2*row0 .. 2*(row0 + n) + 10 (and its cols alike), placed at (y, x) of that input."""
    per_h, per_w = (in_h - MARGIN) // 2, (in_w - MARGIN) // 2
    blocks = [(k, r, c, min(per_h, rows - r), min(per_w, cols - c))
              for k, (rows, cols) in enumerate(maps)
              for r in range(0, rows, per_h) for c in range(0, cols, per_w)]
    blocks.sort(key=lambda b: (-b[3], -b[4]))
    placed, canvas, y, x, shelf = [], 0, 0, 0, 0
    for k, r, c, n, m in blocks:
        bh, bw = 2 * n + MARGIN, 2 * m + MARGIN
        if x + bw > in_w:
            y, x, shelf = y + shelf, 0, 0
        if y + bh > in_h:
            canvas, y, x, shelf = canvas + 1, 0, 0, 0
        placed.append((canvas, y, x, k, r, c, n, m))
        x, shelf = x + bw, max(shelf, bh)
    return placed


def block_pixels(level, row0, col0, n, m):
    """The level's pixels a block of n x m cells sees, the last row and column repeated past
    the level's edge."""
    h, w = level.shape[:2]
    rows = np.minimum(np.arange(2 * row0, 2 * (row0 + n) + MARGIN), h - 1)
    cols = np.minimum(np.arange(2 * col0, 2 * (col0 + m) + MARGIN), w - 1)
    return level[rows][:, cols]


def proposals(prob, reg, scale, threshold):
    """P-Net's cells at or over *threshold* as (N, 9) rows: x1 y1 x2 y2 in photo pixels (as
    facenet's generateBoundingBox floors them), score, the 4 regression values; *prob* (rows,
    cols), *reg* (4, rows, cols) of one level."""
    ys, xs = np.nonzero(prob >= threshold)
    if not len(ys):
        return np.zeros((0, 9), np.float32)
    cells = np.stack([xs, ys], axis=1).astype(np.float32)
    q1 = np.floor((STRIDE * cells + 1) / np.float32(scale))
    q2 = np.floor((STRIDE * cells + CELL) / np.float32(scale))
    return np.concatenate([q1, q2, prob[ys, xs][:, None], reg[:, ys, xs].T], axis=1) \
        .astype(np.float32)


def nms(boxes, scores, threshold, mode="union"):
    """Indices kept, best first. "union": torchvision's nms (IoU, areas without +1); "min":
    facenet's nms_numpy with "Min" (overlap over the smaller box, areas with +1, its order)."""
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    scores = np.asarray(scores, np.float32).reshape(-1)
    one = 1.0 if mode == "min" else 0.0
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    area = (x2 - x1 + one) * (y2 - y1 + one)
    order = np.argsort(scores)[::-1] if mode == "min" else np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(int(i))
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + one)
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + one)
        inter = w * h
        if mode == "min":
            over = inter / np.minimum(area[i], area[rest])
        else:
            over = inter / np.maximum(area[i] + area[rest] - inter, 1e-12)
        order = rest[over <= threshold]
    return np.asarray(keep, dtype=np.int64)


def regress(boxes, reg, plus_one=True):
    """Boxes (N, 4+) moved by the regression (N, 4) in units of their width and height (+1
    after R-Net and O-Net as facenet's bbreg; without it after P-Net)."""
    out = np.array(boxes, dtype=np.float32)
    one = np.float32(1.0 if plus_one else 0.0)
    w = out[:, 2] - out[:, 0] + one
    h = out[:, 3] - out[:, 1] + one
    out[:, :4] = out[:, :4] + reg[:, :4] * np.stack([w, h, w, h], axis=1)
    return out


def square(boxes):
    """Boxes made square on their longer side about their centre (facenet's rerec)."""
    out = np.array(boxes, dtype=np.float32)
    w, h = out[:, 2] - out[:, 0], out[:, 3] - out[:, 1]
    side = np.maximum(w, h)
    out[:, 0] = out[:, 0] + w * 0.5 - side * 0.5
    out[:, 1] = out[:, 1] + h * 0.5 - side * 0.5
    out[:, 2] = out[:, 0] + side
    out[:, 3] = out[:, 1] + side
    return out


def crop_region(box, width, height):
    """(top, left, height, width) of the photo's pixels inside *box*, as facenet's pad() cuts
    them: corners truncated, the box 1-based and clipped to the photo; None when nothing of it
    is inside."""
    x, y, ex, ey = [int(v) for v in np.trunc(np.asarray(box[:4], np.float32))]
    x, y, ex, ey = max(x, 1), max(y, 1), min(ex, width), min(ey, height)
    if ey <= y - 1 or ex <= x - 1:
        return None
    return y - 1, x - 1, ey - y + 1, ex - x + 1


def crop_box(image, box):
    """The photo's pixels inside *box* (crop_region's), or None."""
    region = crop_region(box, image.shape[1], image.shape[0])
    if region is None:
        return None
    top, left, height, width = region
    return image[top:top + height, left:left + width]


def landmarks(boxes, points):
    """O-Net's points (N, 10: x1..x5 then y1..y5, shares of the box) in photo pixels, (N, 5,
    2), as facenet maps them (before the box's own regression)."""
    w = boxes[:, 2] - boxes[:, 0] + 1
    h = boxes[:, 3] - boxes[:, 1] + 1
    xs = w[:, None] * points[:, :5] + boxes[:, 0:1] - 1
    ys = h[:, None] * points[:, 5:10] + boxes[:, 1:2] - 1
    return np.stack([xs, ys], axis=2)


def by_width(outputs, step, wanted):
    """The part's outputs picked by their channel count: {"prob": .., "reg": .., ...}."""
    found = {}
    for array in outputs.values():
        width = array.shape[1] if array.ndim >= 2 else -1
        for key, size in wanted.items():
            if width == size and key not in found:
                found[key] = array
                break
    missing = [k for k in wanted if k not in found]
    if missing:
        raise ValueError("the %s step's part has no %s output (%s): its outputs are %s"
                          % (step, missing[0], "%d channels" % wanted[missing[0]], ", ".join(
                              "%s %s" % (k, list(v.shape)) for k, v in outputs.items())))
    return found


def pyramid_maps(run, levels, spec):
    """P-Net's face probability (rows, cols) and regression (4, rows, cols) over each whole
    level (h, w, C pixels), P-Net run by *run(tensor)* -> {name: output} on inputs of *spec*'s
    size holding the levels' blocks (map_blocks)."""
    in_w, in_h = spec["size"]
    sizes = [map_size(level.shape[1], level.shape[0])[::-1] for level in levels]
    maps = [(np.zeros((rows, cols), np.float32), np.zeros((4, rows, cols), np.float32))
            for rows, cols in sizes]
    blocks = map_blocks(sizes, in_h, in_w)
    for canvas in range(blocks[-1][0] + 1 if blocks else 0):
        pixels = np.zeros((in_h, in_w, levels[0].shape[2]), np.float32)
        mine = [b for b in blocks if b[0] == canvas]
        for _, y, x, k, r, c, n, m in mine:
            pixels[y:y + 2 * n + MARGIN, x:x + 2 * m + MARGIN] = block_pixels(levels[k], r, c,
                                                                              n, m)
        out = by_width(run(normalise(pixels, spec)), "propose", {"prob": 2, "reg": 4})
        for _, y, x, k, r, c, n, m in mine:
            prob, reg = maps[k]
            prob[r:r + n, c:c + m] = out["prob"][0, 1, y // 2:y // 2 + n, x // 2:x // 2 + m]
            reg[:, r:r + n, c:c + m] = out["reg"][0, :, y // 2:y // 2 + n, x // 2:x // 2 + m]
    return maps


def propose(cascade, table, conf, timing):
    """P-Net over the pyramid of the photo whose integral() is *table*: (N, 5) boxes x1 y1 x2
    y2 score after its NMS, moved by the regression and squared."""
    part, _ = cascade.stage("propose")
    spec = part["preprocess"]
    h, w = table.shape[0] - 1, table.shape[1] - 1
    scales = pyramid_scales(w, h, conf["min_face"], conf["factor"])
    if sum(level_size(w, h, s)[0] * level_size(w, h, s)[1] for s in scales) > MAX_LEVEL_PIXELS:
        raise BundleError("the photo's pyramid at min_face %s is over %d MP; pass a smaller "
                          "photo, or rebuild with a larger min_face"
                          % (conf["min_face"], MAX_LEVEL_PIXELS // 1e6))
    levels = [area_region(table, 0, 0, h, w, *level_size(w, h, scale)[::-1])
              for scale in scales]
    maps = pyramid_maps(lambda tensor: cascade.run(part, tensor, timing), levels, spec)
    found = []
    for scale, (prob, reg) in zip(scales, maps):
        boxes = proposals(prob, reg, scale, conf["threshold"])
        found.append(boxes[nms(boxes[:, :4], boxes[:, 4], conf["nms"])])
    boxes = np.concatenate(found) if found else np.zeros((0, 9), np.float32)
    boxes = boxes[nms(boxes[:, :4], boxes[:, 4], conf["nms_all"])]
    moved = regress(boxes[:, :4], boxes[:, 5:9], plus_one=False)
    return square(np.concatenate([moved, boxes[:, 4:5]], axis=1))


def run_crops(cascade, step, table, boxes, wanted, timing):
    """The *step*'s part on each box's crop (resized as torch's "area", normalised per its
    preprocess), in batches of its static batch (the last one padded): (the boxes that have a
    crop, {output key: (N, k)})."""
    part, _ = cascade.stage(step)
    spec = part["preprocess"]
    in_w, in_h = spec["size"]
    batch = part["inputs"][0]["shape"][0]
    batch = batch if isinstance(batch, int) and batch > 0 else 1
    kept, tensors = [], []
    for k, box in enumerate(boxes):
        region = crop_region(box, table.shape[1] - 1, table.shape[0] - 1)
        if region is not None:
            kept.append(k)
            tensors.append(normalise(area_region(table, *(region + (in_h, in_w))), spec))
    got = dict((key, []) for key in wanted)
    for start in range(0, len(tensors), batch):
        chunk = tensors[start:start + batch]
        feed = np.concatenate(chunk + [np.zeros_like(chunk[0])] * (batch - len(chunk)))
        out = by_width(cascade.run(part, feed, timing), step, wanted)
        for key in wanted:
            got[key].append(np.asarray(out[key], np.float32).reshape(batch, -1)[:len(chunk)])
    return boxes[kept], dict((key, np.concatenate(v) if v else np.zeros((0, wanted[key]),
                                                                       np.float32))
                             for key, v in got.items())


def find_faces(cascade, image, timing):
    """{"faces": [{"box", "score", "landmarks"}], "image_size"} of one photo (H, W, C in the
    P-Net's colour order), best first; each part's milliseconds added to *timing*."""
    _, pconf = cascade.stage("propose")
    _, rconf = cascade.stage("refine")
    _, oconf = cascade.stage("output")
    table = integral(image)   # every level and crop is an average over its sums
    boxes = propose(cascade, table, pconf, timing)
    faces = []
    if len(boxes):
        boxes, out = run_crops(cascade, "refine", table, boxes, {"prob": 2, "reg": 4}, timing)
        ok = out["prob"][:, 1] > rconf["threshold"]
        boxes = np.concatenate([boxes[ok, :4], out["prob"][ok, 1:2]], axis=1)
        reg = out["reg"][ok]
        pick = nms(boxes[:, :4], boxes[:, 4], rconf["nms"])
        boxes = square(regress(boxes[pick], reg[pick]))
    if len(boxes):
        boxes, out = run_crops(cascade, "output", table, boxes,
                               {"prob": 2, "reg": 4, "points": 10}, timing)
        ok = out["prob"][:, 1] > oconf["threshold"]
        boxes = np.concatenate([boxes[ok, :4], out["prob"][ok, 1:2]], axis=1)
        points = landmarks(boxes, out["points"][ok])
        boxes = regress(boxes, out["reg"][ok])
        for k in nms(boxes[:, :4], boxes[:, 4], oconf["nms"], mode="min"):
            faces.append({"box": [round(float(v), 2) for v in boxes[k, :4]],
                          "score": round(float(boxes[k, 4]), 5),
                          "landmarks": [[round(float(x), 2), round(float(y), 2)]
                                        for x, y in points[k]]})
    return {"faces": faces, "image_size": [int(image.shape[1]), int(image.shape[0])]}


def summary(result):
    """The faces found, one a line: 'face 0.99 at [x1, y1, x2, y2]'."""
    if not result["faces"]:
        return "no face found"
    return "%d face(s): %s" % (len(result["faces"]), "; ".join(
        "%.2f at [%s]" % (f["score"], ", ".join("%.0f" % v for v in f["box"]))
        for f in result["faces"]))


def agreement(want, got):
    """(faces in *want*, those a face of *got* matches at box IoU >= 0.5, faces in *got*);
    *want* and *got* are the cascade's answers ({"faces": [...]}), each face of *got* matched
    once, the best overlap first."""
    a, b = want.get("faces") or [], got.get("faces") or []
    return len(a), len(matched_pairs([f["box"] for f in a], [f["box"] for f in b])), len(b)


def landmark_error(want, got):
    """The largest distance in pixels between a landmark of *want*'s faces and the same
    landmark of the *got* face matched to it (IoU >= 0.5), or None when none match."""
    a, b = want.get("faces") or [], got.get("faces") or []
    if not a or not b:
        return None
    iou = iou_matrix([f["box"] for f in a], [f["box"] for f in b])
    worst = None
    for i in range(len(a)):
        j = int(iou[i].argmax())
        if iou[i, j] >= 0.5:
            d = max(math.hypot(p[0] - q[0], p[1] - q[1])
                    for p, q in zip(a[i]["landmarks"], b[j]["landmarks"]))
            worst = d if worst is None else max(worst, d)
    return worst
