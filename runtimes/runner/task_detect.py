"""The detect head: boxes decoded (YOLOv8, YOLOv5, CenterNet) and kept by NMS, or read off a DB
text map (PaddleOCR's detector: blobs over a threshold, boxed along their axis, grown by DB's
unclip); box recall and precision between two models, and boxes mapped back to the photo's own
pixels.
"""

import math

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .task_figures import share
from .tasks import label_of, named, pick

MAX_CANDIDATES = 30000   # boxes over the score line that NMS looks at (the highest first)
LOOSE = 0.6   # a box above the score line in one model is looked for above 0.6 x it in the other


def iou_matrix(a, b):
    """IoU of boxes *a* (N, 4) against *b* (M, 4), x1 y1 x2 y2."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-12)


def matched_pairs(want, got, threshold=0.5, classes=None):
    """[(i, j)]: each box of *want* with the box of *got* it overlaps most at IoU >= *threshold*,
    each of *got* matched once, the best-overlapping boxes of *want* first; with *classes*
    ((want's, got's) class ids) only boxes of the same class match."""
    if not len(want) or not len(got):
        return []
    iou = iou_matrix(want, got)
    if classes is not None:
        iou = iou * (np.asarray(classes[0])[:, None] == np.asarray(classes[1])[None, :])
    used, pairs = set(), []
    for i in np.argsort(-iou.max(axis=1), kind="stable"):
        for j in np.argsort(-iou[i], kind="stable"):
            if iou[i, j] < threshold:
                break
            if int(j) not in used:
                used.add(int(j))
                pairs.append((int(i), int(j)))
                break
    return pairs


def nms(boxes, scores, threshold, classes=None, limit=None):
    """Indices kept by greedy non-maximum suppression, best first (at most *limit*); with
    *classes*, a box only suppresses boxes of its own class."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    keep = []
    while order.size and (limit is None or len(keep) < limit):
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        overlap = iou_matrix(boxes[i:i + 1], boxes[rest])[0]
        drop = overlap >= threshold
        if classes is not None:
            drop &= classes[rest] == classes[i]
        order = rest[~drop]
    return keep


def xywh_to_xyxy(xywh):
    return np.concatenate([xywh[:, :2] - xywh[:, 2:4] / 2, xywh[:, :2] + xywh[:, 2:4] / 2], axis=1)


def yolo_candidates(conf, outputs):
    """(boxes xyxy, scores, classes) of every anchor of a YOLOv8 or YOLOv5 head."""
    pred = np.asarray(pick(outputs, conf["output"]), np.float64)
    pred = pred.reshape(pred.shape[-2:]) if pred.ndim >= 2 else pred.reshape(1, -1)
    if conf["decoder"] == "yolov8":
        # (4 + C, N) as exported; a (N, 4 + C) export (anchors first) is read the same way
        if pred.shape[0] > pred.shape[1]:
            pred = pred.T
        pred = pred.T
        cls = pred[:, 4:] if pred.shape[1] > 4 else np.ones((len(pred), 1))
    else:
        cls = pred[:, 4:5] * pred[:, 5:] if pred.shape[1] > 5 else pred[:, 4:5]
    return xywh_to_xyxy(pred[:, :4]), cls.max(axis=1), cls.argmax(axis=1)


def centernet_candidates(conf, outputs):
    """(boxes, scores, classes, landmarks or None) of a CenterFace-style head: heatmap peaks,
    box size exp(scale) * stride, centre offset, landmarks relative to the box."""
    names, arrays = named(outputs)
    refs = conf["outputs"] or list(range(min(4, len(arrays))))
    heat = np.asarray(pick(outputs, refs[0]), np.float64)
    heat = heat.reshape(heat.shape[-2:])
    scale = np.asarray(pick(outputs, refs[1]), np.float64)[0]
    offset = np.asarray(pick(outputs, refs[2]), np.float64)[0]
    marks = np.asarray(pick(outputs, refs[3]), np.float64)[0] if len(refs) > 3 else None
    stride = conf["stride"]
    ys, xs = np.nonzero(heat >= conf["floor"])
    h = np.exp(scale[0, ys, xs]) * stride
    w = np.exp(scale[1, ys, xs]) * stride
    x1 = np.maximum(0.0, (xs + offset[1, ys, xs] + 0.5) * stride - w / 2)
    y1 = np.maximum(0.0, (ys + offset[0, ys, xs] + 0.5) * stride - h / 2)
    boxes = np.stack([x1, y1, x1 + w, y1 + h], axis=1)
    points = None
    if marks is not None and marks.shape[0] >= 2:
        count = marks.shape[0] // 2
        lm = marks[:, ys, xs]   # (2 * count, K): y then x of each point, as box fractions
        points = np.stack([lm[1::2][:count].T * w[:, None] + x1[:, None],
                           lm[0::2][:count].T * h[:, None] + y1[:, None]], axis=2)
    return boxes, heat[ys, xs], np.zeros(len(ys), np.int64), points


# -- DB text maps (PaddleOCR's detector): blobs over a threshold, boxed ----------------------


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



def decode_boxes(conf, outputs, score=None):
    """(boxes, scores, classes, landmarks or None) after the score line and NMS, best first."""
    floor = conf["score"] if score is None else score
    conf = dict(conf, floor=floor)
    points = None
    if conf["decoder"] == "db":   # blobs do not overlap: no NMS; the best first
        boxes, scores = text_boxes(pick(outputs, conf["output"]), dict(conf, box_threshold=floor))
        order = np.argsort(-scores, kind="stable")[:conf["max_boxes"]]
        return boxes[order], scores[order], np.zeros(len(order), np.int64), None
    if conf["decoder"] == "centernet":
        boxes, scores, classes, points = centernet_candidates(conf, outputs)
    else:
        boxes, scores, classes = yolo_candidates(conf, outputs)
    pick_ = np.nonzero(scores >= floor)[0]
    if pick_.size > MAX_CANDIDATES:
        pick_ = pick_[np.argsort(-scores[pick_], kind="stable")[:MAX_CANDIDATES]]
    boxes, scores, classes = boxes[pick_], scores[pick_], classes[pick_]
    points = points[pick_] if points is not None else None
    keep = nms(boxes, scores, conf["iou"], None if conf["agnostic"] else classes,
               conf["max_boxes"])
    return (boxes[keep], scores[keep], classes[keep],
            points[keep] if points is not None else None)


def read(conf, outputs, feed=None, part_labels=None):
    boxes, scores, classes, points = decode_boxes(conf, outputs)
    labels = conf["labels"] or part_labels or (["text"] if conf["decoder"] == "db" else None)
    found = []
    for k in range(len(boxes)):
        item = {"box": [round(float(v), 2) for v in boxes[k]], "score": float(scores[k]),
                "class": int(classes[k]), "label": label_of(labels, int(classes[k]))}
        if points is not None:
            item["landmarks"] = [[round(float(x), 2), round(float(y), 2)] for x, y in points[k]]
        found.append(item)
    return {"boxes": found}


def match_count(ref, got, threshold=0.5):
    """Greedy one-to-one matches of boxes *ref* against *got* (each (boxes, classes)), same
    class and IoU >= *threshold*, the best-overlapping reference box first."""
    (rb, rc), (gb, gc) = ref, got
    return len(matched_pairs(rb, gb, threshold, (rc, gc)))


def figures(conf, reference, candidate, feeds=None):
    def boxes(outputs):
        firm = decode_boxes(conf, outputs)
        loose = decode_boxes(conf, outputs, score=LOOSE * conf["score"])
        return (firm[0], firm[2]), (loose[0], loose[2])
    ref = [boxes(o) for o in reference]
    got = [boxes(o) for o in candidate]
    hit_r = sum(match_count(r[0], g[1]) for r, g in zip(ref, got))
    hit_g = sum(match_count(g[0], r[1]) for r, g in zip(ref, got))
    n_ref = sum(len(r[0][0]) for r in ref)
    n_got = sum(len(g[0][0]) for g in got)
    return {"recall": share(hit_r, n_ref, samples=len(ref)),
            "precision": share(hit_g, n_got, samples=len(ref))}


def summary(result):
    shown = ["%s %.2f" % (b["label"] or "class %d" % b["class"], b["score"])
             for b in result["boxes"][:5]]
    return "%d box(es)%s%s" % (len(result["boxes"]), ": " if shown else "",
                               ", ".join(shown) + (", ..." if len(result["boxes"]) > 5 else ""))


def placement(spec, size):
    """(nw, nh, left, top): where *spec*'s resize (stretch, letterbox, center-crop) puts an
    image of *size* (w, h) in the model's input: its size there and its top-left corner."""
    width, height = spec["size"]
    w, h = size
    mode = spec.get("resize", "stretch")
    if mode == "letterbox":
        r = min(float(width) / w, float(height) / h)
        nw, nh = max(1, int(round(w * r))), max(1, int(round(h * r)))
        return nw, nh, (width - nw) // 2, (height - nh) // 2
    if mode == "center-crop":
        r = max(float(width) / w, float(height) / h)
        nw, nh = max(width, int(round(w * r))), max(height, int(round(h * r)))
        return nw, nh, -((nw - width) // 2), -((nh - height) // 2)
    return width, height, 0, 0


def input_to_image(spec, size):
    """A function taking (x, y) arrays in the model's input pixels to the original image's, by
    undoing *spec*'s resize (stretch, letterbox, center-crop) of an image of *size* (w, h)."""
    w, h = size
    nw, nh, left, top = placement(spec, size)

    def convert(x, y):
        return (np.clip((np.asarray(x, np.float64) - left) * w / nw, 0, w),
                np.clip((np.asarray(y, np.float64) - top) * h / nh, 0, h))
    return convert


def add_image_boxes(result, spec, size):
    """Each box of a detect *result* also in the original image's pixels ("image_box",
    "image_landmarks"), for an image of *size* (width, height) preprocessed by *spec*."""
    convert = input_to_image(spec, size)
    for item in result.get("boxes", ()):
        xs, ys = convert([item["box"][0], item["box"][2]], [item["box"][1], item["box"][3]])
        item["image_box"] = [round(float(v), 2) for v in (xs[0], ys[0], xs[1], ys[1])]
        if "landmarks" in item:
            xs, ys = convert([p[0] for p in item["landmarks"]], [p[1] for p in item["landmarks"]])
            item["image_landmarks"] = [[round(float(x), 2), round(float(y), 2)]
                                       for x, y in zip(xs, ys)]
    result["image_size"] = [int(size[0]), int(size[1])]
    return result
