"""Measure NNCF's INT8 beside onnxruntime's on small trained CNNs (issue 33).

    .venv/bin/python tests/nncf_measure.py [--steps 600] [--train-size 112]
        [--models lcnet,resnet,yolo] [--out DIR] [--no-facts]

Three nets are built in plain PyTorch here (no downloads, no torchvision) and trained on a
synthetic task (600 steps at 112x112, then 100 at 224x224; 50-90 % on their task), so that their
weights, BatchNorm statistics and activation ranges are those of a trained net rather than a
random one (random nets give meaningless cosines):

- lcnet: PP-LCNet-shaped (depthwise 3x3/5x5 convs, HardSwish, SE blocks with a HardSigmoid
  multiply, a 1280-wide last conv), classifies which of 8 shapes is in the image;
- resnet: a ResNet-10-ish CNN (basic blocks, ReLU), the same task;
- yolo: a tiny YOLOv8-like detector (SiLU, C2f-ish blocks, two strides, a DFL decode by a fixed
  16-to-1 conv, sigmoid class scores, boxes and scores concatenated into one output), trained to
  find the shape and its box.

The images are natural-looking enough for calibration: a smooth low-frequency background with a
gradient, one coloured shape, pixel noise, ImageNet normalisation. Each net is exported (opset
17), simplified as `build` does, then quantized by onnxruntime's quantize_static (QDQ U8S8,
per-channel, MinMax and Percentile, through packager.quantization.quantize.quantize_file) and by
NNCF 3.4 (the project's path, quantization/nncf_generator.py: default preset, fast bias
correction; and nncf.quantize called directly for its mixed preset, full bias correction, MinMax
activation ranges and, on the detector, float Sigmoid/Softmax by op type). The detector also
gets both generators with its decode kept float, as `build` does (graph_facts.post_processing).
Accuracy: cosine (min, mean) of the outputs against FP32 and top-1 agreement on 16 held-out
images, on the CPU provider and under OpenVINO; latency: p50 with 2 threads on onnxruntime's
CPU provider (this venv) and under the OpenVINO EP (.venv-openvino, through packager.ort_builds).
Then a few facts about NNCF's ONNX backend (ignored scope by op type, SmoothQuant, accuracy
control) are checked on the trained models and printed.

Figures, not a test: about 20 minutes on 2 busy cores (training dominates), then a table.
Training runs on one thread: on shared cores a second one mostly waited.
"""

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZE = 224
CLASSES = 8
CALIB, HELD = 32, 16
MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
THREADS = 2


# ---------------------------------------------------------------- synthetic images

def _shape_mask(kind: int, dx: np.ndarray, dy: np.ndarray, r: float) -> np.ndarray:
    d = np.hypot(dx, dy)
    return [d < r,                                                      # disk
            np.maximum(abs(dx), abs(dy)) < 0.8 * r,                     # square
            (dy < 0.7 * r) & (abs(dx) < (dy + 0.9 * r) * 0.6),          # triangle
            (d < r) & (d > 0.6 * r),                                    # ring
            ((abs(dx) < 0.28 * r) | (abs(dy) < 0.28 * r)) & (np.maximum(abs(dx), abs(dy)) < r),
            abs(dx) + abs(dy) < r,                                      # diamond
            (d < r) & (np.sin(dx * 40 / r) > 0),                        # striped disk
            (abs(dx) < r) & (abs(dy) < 0.45 * r)][kind]                 # bar


def images(n: int, seed: int, size: int = SIZE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(normalised images (n, 3, size, size), labels (n,), boxes (n, 4) xyxy in pixels)."""
    import torch

    rng = np.random.default_rng(seed)
    coarse = torch.from_numpy(rng.uniform(0.1, 0.9, (n, 3, 5, 5)).astype(np.float32))
    back = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bicubic",
                                           align_corners=False).numpy()
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    x = np.empty((n, 3, size, size), np.float32)
    labels = rng.integers(0, CLASSES, n)
    boxes = np.zeros((n, 4), np.float32)
    for i in range(n):
        angle = rng.uniform(0, 2 * np.pi)
        grad = (np.cos(angle) * xx + np.sin(angle) * yy) * rng.uniform(0.0, 0.4)
        img = back[i] + grad[None]
        r = rng.uniform(0.1, 0.25)
        cx, cy = rng.uniform(r, 1 - r, 2)
        mask = _shape_mask(int(labels[i]), xx - cx, yy - cy, r)
        colour = rng.uniform(0, 1, 3).astype(np.float32)
        img = np.where(mask[None], colour[:, None, None] * 0.8 + img * 0.2, img)
        img += rng.normal(0, 0.03, img.shape).astype(np.float32)
        x[i] = np.clip(img, 0, 1)
        ys, xs = np.nonzero(mask)
        boxes[i] = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] if len(xs) else \
            np.array([cx - r, cy - r, cx + r, cy + r]) * size   # (a shape thinner than a pixel)
    return (x - MEAN) / STD, labels, boxes


# ---------------------------------------------------------------- the nets

def lcnet(scale: float = 1.0):
    """PP-LCNet's layout (NET_CONFIG of PaddleClas' PPLCNet): depthwise-separable blocks, SE in the
    last two, HardSwish everywhere, a 1280-wide 1x1 conv after the pooling."""
    from torch import nn

    def ch(c: int) -> int:
        return max(8, int(c * scale + 4) // 8 * 8)

    def cbh(i: int, o: int, k: int, s: int, groups: int = 1) -> list:
        return [nn.Conv2d(i, o, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(o),
                nn.Hardswish()]

    class SE(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Sequential(nn.Conv2d(c, c // 4, 1), nn.ReLU(), nn.Conv2d(c // 4, c, 1),
                                    nn.Hardsigmoid())

        def forward(self, x):
            return x * self.fc(self.pool(x))

    config = [(3, 16, 32, 1, False), (3, 32, 64, 2, False), (3, 64, 64, 1, False),
              (3, 64, 128, 2, False), (3, 128, 128, 1, False), (3, 128, 256, 2, False)] + \
        [(5, 256, 256, 1, False)] * 5 + [(5, 256, 512, 2, True), (5, 512, 512, 1, True)]
    layers = cbh(3, ch(16), 3, 2)
    for k, i, o, s, se in config:
        layers += cbh(ch(i), ch(i), k, s, groups=ch(i))
        layers += [SE(ch(i))] if se else []
        layers += cbh(ch(i), ch(o), 1, 1)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Conv2d(ch(512), 1280, 1),
                         nn.Hardswish(), nn.Flatten(), nn.Linear(1280, CLASSES))


def resnet():
    """ResNet-10-ish: a 7x7 stem, one basic block per stage (32-64-128-256 channels)."""
    from torch import nn

    class Basic(nn.Module):
        def __init__(self, i: int, o: int, s: int):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(i, o, 3, s, 1, bias=False), nn.BatchNorm2d(o),
                                      nn.ReLU(), nn.Conv2d(o, o, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(o))
            self.skip = nn.Identity() if (i, s) == (o, 1) else nn.Sequential(
                nn.Conv2d(i, o, 1, s, bias=False), nn.BatchNorm2d(o))
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.body(x) + self.skip(x))

    return nn.Sequential(nn.Conv2d(3, 32, 7, 2, 3, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1), Basic(32, 32, 1), Basic(32, 64, 2),
                         Basic(64, 128, 2), Basic(128, 256, 2), Basic(256, 256, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, CLASSES))


REG_MAX = 16
STRIDES = (8, 16)


def yolo():
    """A YOLOv8n-like detector: SiLU Conv-BN, C2f-ish blocks, P3/P4 heads with separate box
    (4 x 16 DFL bins) and class branches, decoded in the graph as ultralytics exports it."""
    import torch
    from torch import nn

    def cbs(i: int, o: int, k: int = 3, s: int = 1) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(i, o, k, s, k // 2, bias=False), nn.BatchNorm2d(o),
                             nn.SiLU())

    class C2f(nn.Module):
        def __init__(self, c: int, n: int = 1):
            super().__init__()
            self.cv1, self.cv2 = cbs(c, c, 1), cbs(c * (2 + n) // 2, c, 1)
            self.m = nn.ModuleList(nn.Sequential(cbs(c // 2, c // 2), cbs(c // 2, c // 2))
                                   for _ in range(n))

        def forward(self, x):
            y = list(self.cv1(x).chunk(2, 1))
            for m in self.m:
                y.append(y[-1] + m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.p3 = nn.Sequential(cbs(3, 16, 3, 2), cbs(16, 32, 3, 2), C2f(32), cbs(32, 64, 3, 2),
                                    C2f(64, 2))
            self.p4 = nn.Sequential(cbs(64, 128, 3, 2), C2f(128, 2))
            self.box = nn.ModuleList(nn.Sequential(cbs(c, 64), cbs(64, 64),
                                                   nn.Conv2d(64, 4 * REG_MAX, 1)) for c in (64, 128))
            self.cls = nn.ModuleList(nn.Sequential(cbs(c, 64), cbs(64, 64), nn.Conv2d(64, CLASSES, 1))
                                     for c in (64, 128))
            for head in self.cls:   # YOLOv8's prior: few anchors hold an object
                nn.init.constant_(head[-1].bias, -5.0)
            self.dfl = nn.Conv2d(REG_MAX, 1, 1, bias=False).requires_grad_(False)
            self.dfl.weight.data[:] = torch.arange(REG_MAX, dtype=torch.float32).view(1, -1, 1, 1)
            points, strides = [], []
            for s in STRIDES:
                g = SIZE // s
                yy, xx = torch.meshgrid(torch.arange(g) + 0.5, torch.arange(g) + 0.5, indexing="ij")
                points.append(torch.stack([xx, yy], -1).view(-1, 2))
                strides.append(torch.full((g * g, 1), float(s)))
            self.register_buffer("points", torch.cat(points).T.unsqueeze(0))    # (1, 2, A)
            self.register_buffer("strides", torch.cat(strides).T.unsqueeze(0))  # (1, 1, A)

        def raw(self, x):
            p3 = self.p3(x)
            feats = [p3, self.p4(p3)]
            out = [torch.cat([b(f), c(f)], 1).flatten(2)
                   for f, b, c in zip(feats, self.box, self.cls, strict=True)]
            return torch.cat(out, 2)                      # (N, 64 + K, A)

        def forward(self, x):
            raw = self.raw(x)
            box, cls = raw.split([4 * REG_MAX, CLASSES], 1)
            n, a = box.shape[0], box.shape[2]
            bins = box.view(n, 4, REG_MAX, a).transpose(2, 1).softmax(1)
            dist = self.dfl(bins).view(n, 4, a)
            lt, rb = dist.chunk(2, 1)
            xy1, xy2 = self.points - lt, self.points + rb
            boxes = torch.cat([(xy1 + xy2) / 2, xy2 - xy1], 1) * self.strides   # cx cy w h
            return torch.cat([boxes, cls.sigmoid()], 1)

    return Net()


# ---------------------------------------------------------------- training

def _anchors(size: int):
    """Anchor centres (pixels) and strides of both levels for a *size* x *size* input (training
    runs smaller than the export)."""
    import torch

    points, strides = [], []
    for s in STRIDES:
        g = size // s
        yy, xx = torch.meshgrid(torch.arange(g) + 0.5, torch.arange(g) + 0.5, indexing="ij")
        points.append(torch.stack([xx, yy], -1).view(-1, 2) * s)
        strides.append(torch.full((g * g,), float(s)))
    return torch.cat(points), torch.cat(strides)


def _yolo_loss(net, x, labels, boxes):
    import torch
    import torch.nn.functional as F

    raw = net.raw(x)
    box, cls = raw.split([4 * REG_MAX, CLASSES], 1)
    pts, stride = _anchors(x.shape[-1])                          # (A, 2) pixels, (A,)
    b = torch.from_numpy(boxes)
    centre = (b[:, :2] + b[:, 2:]) / 2
    half = (b[:, 2:] - b[:, :2]) / 2
    # positives: anchors within the central half of the box (a simple centre-region assigner)
    inside = ((pts[None] - centre[:, None]).abs() < half[:, None] * 0.5).all(-1)      # (N, A)
    target = torch.zeros_like(cls)
    target[torch.arange(len(labels))[:, None].expand_as(inside)[inside],
           torch.from_numpy(labels)[:, None].expand_as(inside)[inside],
           torch.nonzero(inside)[:, 1]] = 1.0
    npos = max(1, int(inside.sum()))
    loss = F.binary_cross_entropy_with_logits(cls, target, reduction="sum") / npos
    ltrb = torch.cat([pts[None] - b[:, None, :2], b[:, None, 2:] - pts[None]], -1)  # (N, A, 4)
    ltrb = (ltrb / stride[None, :, None]).clamp(0, REG_MAX - 1.01)[inside]          # (P, 4)
    logits = box.view(box.shape[0], 4, REG_MAX, -1).permute(0, 3, 1, 2)[inside]      # (P, 4, 16)
    left = ltrb.floor().long()
    w_right = ltrb - left
    logp = logits.log_softmax(-1)
    dfl = -(logp.gather(-1, left[..., None])[..., 0] * (1 - w_right)
            + logp.gather(-1, (left + 1)[..., None])[..., 0] * w_right)
    return loss + dfl.mean() * 4


def train(net, task: str, steps: int, size: int, seed: int = 0,
          log: Callable[[str], None] = print) -> None:
    """AdamW on fresh synthetic images (a pool regenerated as it goes): *steps* at *size* x
    *size* (batch 32), then a sixth as many at the exported size (batch 16), which also leaves
    BatchNorm's statistics those of that size. The nets are convolutional: the first phase at
    half the size costs a quarter (progressive resizing)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    phases = [(size, steps, 32), (SIZE, max(1, steps // 6), 16)] if size != SIZE else \
        [(SIZE, steps, 16)]
    total = sum(n for _, n, _ in phases)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=5e-3,
                            weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=total)
    net.train()
    began, done, pool = time.perf_counter(), 0, 256
    for px_size, count, batch in phases:
        for step in range(count):
            if step % (pool // batch) == 0:
                px, pl, pb = images(pool, seed=1000 + seed * 7919 + done, size=px_size)
            j = (step % (pool // batch)) * batch
            x = torch.from_numpy(px[j:j + batch])
            if task == "detect":
                loss = _yolo_loss(net, x, pl[j:j + batch], pb[j:j + batch])
            else:
                loss = F.cross_entropy(net(x), torch.from_numpy(pl[j:j + batch]).long())
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            done += 1
            if done % 100 == 0 or done == total:
                log(f"  step {done:4d}/{total} at {px_size}: loss {loss.item():.3f} "
                    f"({time.perf_counter() - began:.0f} s)")
    net.eval()


def task_accuracy(net, task: str) -> float:
    """Top-1 on 64 fresh images (classifiers), or how often the top detection has the right
    class and IoU >= 0.5 with the true box (the detector): that the net learned its task."""
    import torch

    x, labels, boxes = images(64, seed=99)
    with torch.inference_mode():
        out = net(torch.from_numpy(x)).numpy()
    if task == "classify":
        return float((out.argmax(1) == labels).mean())
    cls, box = _top_detection(out)
    return float(np.mean([c == want and _iou(b, t) >= 0.5 for c, b, want, t in
                          zip(cls, box, labels, boxes, strict=True)]))


# ---------------------------------------------------------------- export and metrics

def export(net, path: Path) -> Path:
    import torch

    from packager.graph.simplify import simplify

    raw = path.with_suffix(".raw.onnx")
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # (dynamo=False, as edgepack does)
        torch.onnx.export(net, (torch.zeros(1, 3, SIZE, SIZE),), str(raw), dynamo=False,
                          opset_version=17, input_names=["x"], output_names=["y"])
    simplify(raw, path, force=True)
    return path


def _top_detection(out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: the class and xyxy box of the highest-scoring anchor."""
    scores = out[:, 4:]                                              # (N, K, A)
    flat = scores.reshape(len(out), -1).argmax(1)
    cls, anchor = flat // scores.shape[2], flat % scores.shape[2]
    cxcywh = out[np.arange(len(out)), :4, anchor]
    xyxy = np.concatenate([cxcywh[:, :2] - cxcywh[:, 2:] / 2, cxcywh[:, :2] + cxcywh[:, 2:] / 2], 1)
    return cls, xyxy


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return float(w * h / union) if union > 0 else 0.0


def agreement(got: np.ndarray, ref: np.ndarray, task: str) -> dict[str, float]:
    """Cosine (min, mean) per sample, and top-1 agreement: the same class (classifiers), or
    the same class of top detection with IoU >= 0.9 to FP32's box (the detector)."""
    a, b = got.reshape(len(got), -1).astype(np.float64), ref.reshape(len(ref), -1)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)
    if task == "classify":
        top1 = float((got.argmax(-1) == ref.argmax(-1)).mean())
    else:   # (samples, 1, 4 + K, anchors) from run_model
        got, ref = got.reshape(len(got), 4 + CLASSES, -1), ref.reshape(len(ref), 4 + CLASSES, -1)
        (gc, gb), (rc, rb) = _top_detection(got), _top_detection(ref)
        top1 = float(np.mean([c == d and _iou(x, y) >= 0.9
                              for c, d, x, y in zip(gc, rc, gb, rb, strict=True)]))
        # the scores alone: YOLO's boxes (pixels) dominate the output's cosine
        sa, sb = got[:, 4:].reshape(len(got), -1), ref[:, 4:].reshape(len(ref), -1)
        scos = (sa * sb).sum(1) / (np.linalg.norm(sa, axis=1) * np.linalg.norm(sb, axis=1) + 1e-30)
        return {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()), "top1": top1,
                "score_cos_min": float(scos.min())}
    return {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()), "top1": top1}


# ---------------------------------------------------------------- the quantizers

Sample = dict[str, np.ndarray]


def ort_variant(method: str, exclude: Sequence[str] = ()):
    def make(src: Path, dst: Path, samples: Sequence[Sample]) -> Path:
        from packager.quantization.quantize import QuantConfig, quantize_file
        from packager.targets import load_target

        config = QuantConfig.from_preset(load_target("x86_64-cpu").quantization, precision="int8",
                                         mode="static", format="qdq", per_channel=True,
                                         calibration_method=method)
        return quantize_file(src, dst, config=replace(config, exclude=tuple(exclude)),
                             samples=samples)
    return make


def nncf_project(exclude: Sequence[str] = ()):
    """The project's path: quantize_file with generator="nncf" (nncf_generator.py)."""
    def make(src: Path, dst: Path, samples: Sequence[Sample]) -> Path:
        from packager.quantization.quantize import QuantConfig, quantize_file
        from packager.targets import load_target

        config = QuantConfig.from_preset(load_target("x86_64-cpu").quantization, precision="int8",
                                         mode="static", generator="nncf")
        return quantize_file(src, dst, config=replace(config, exclude=tuple(exclude)),
                             samples=samples)
    return make


def nncf_direct(preset: str | None = None, types: Sequence[str] = (), ranges: str = "",
                **kwargs):
    """nncf.quantize itself, for what nncf_generator does not expose (preset, bias correction,
    ignored op types, the activations' range estimator)."""
    def make(src: Path, dst: Path, samples: Sequence[Sample]) -> Path:
        import nncf
        import onnx
        from nncf.quantization.range_estimator import RangeEstimatorParametersSet

        extra = dict(kwargs)
        if ranges:   # NNCF's default is MEAN_MINMAX: the mean over samples of each one's min/max
            extra["advanced_parameters"] = nncf.AdvancedQuantizationParameters(
                activations_range_estimator_params=getattr(RangeEstimatorParametersSet, ranges))
        model = nncf.quantize(
            onnx.load(str(src)), nncf.Dataset(list(samples)), subset_size=len(samples),
            preset=nncf.QuantizationPreset(preset) if preset else None,
            ignored_scope=nncf.IgnoredScope(types=list(types)) if types else None, **extra)
        onnx.save(model, str(dst))
        return dst
    return make


def q_nodes(path: Path) -> int:
    import onnx

    return sum(n.op_type == "QuantizeLinear" for n in onnx.load(str(path)).graph.node)


# ---------------------------------------------------------------- timing and the table

def _timings(python: Path, rows, feed: Sample, chain) -> tuple[dict[str, float], dict[str, str]]:
    """p50 ms per graph, timed interleaved in blocks (runtimes/time_models.py), and the provider
    that really ran each."""
    from packager.ort_builds import time_plan

    timings, providers, _ = time_plan(python, [(k, p, chain) for k, p in rows], feed, THREADS,
                                      rounds=5, block=15, every=True)
    return {k: v["p50"] for k, v in timings.items()}, providers   # (ms)


def trained_graph(name: str, net, task: str, folder: Path, steps: int, size: int,
                  log=print) -> tuple[Path, float]:
    """Train *net* on its synthetic task, export and simplify it: the FP32 graph, and the
    net's accuracy on its task (task_accuracy)."""
    import torch

    # one thread: on shared cores a second one mostly waits (50x slower steps measured here)
    torch.set_num_threads(1)
    params = sum(p.numel() for p in net.parameters())
    log(f"{name}: {params / 1e6:.2f} M parameters, training {steps} steps at {size}x{size}, "
        f"{steps // 6} at {SIZE}x{SIZE}")
    train(net, task, steps, size, log=log)
    learned = task_accuracy(net, task)
    log(f"{name}: task accuracy after training {learned:.2f}")
    return export(net, folder / f"{name}.onnx"), learned


def variants(fp32: Path, task: str) -> dict[str, Callable]:
    import onnx

    from packager.quantization.graph_facts import post_processing

    made: dict[str, Callable] = {
        "ORT MinMax": ort_variant("minmax"),
        "ORT Percentile": ort_variant("percentile"),
        "NNCF default (edgepack)": nncf_project(),
        "NNCF mixed": nncf_direct(preset="mixed"),
        "NNCF full bias corr.": nncf_direct(fast_bias_correction=False),
        "NNCF, MINMAX ranges": nncf_direct(ranges="MINMAX"),
    }
    if task == "detect":   # the decode after the last heavy op, kept float as the build does
        tail = post_processing(onnx.load(str(fp32)).graph)
        made["ORT MinMax, head FP32"] = ort_variant("minmax", tail)
        made["NNCF, head FP32 (edgepack)"] = nncf_project(tail)
        made["NNCF, Sigmoid+Softmax FP32 (types)"] = nncf_direct(types=("Sigmoid", "Softmax"))
    return made


def quantize_all(name: str, fp32: Path, task: str, calib: Sequence[Sample], folder: Path,
                 log=print) -> tuple[dict[str, Path], dict[str, float]]:
    """Every variant's graph and how long it took to make (a failure is logged and left out)."""
    paths: dict[str, Path] = {"FP32": fp32}
    seconds: dict[str, float] = {"FP32": 0.0}
    for label, make in variants(fp32, task).items():
        stem = "".join(c if c.isalnum() else "_" for c in label.split(" (")[0])
        began = time.perf_counter()
        try:
            paths[label] = make(fp32, folder / f"{name}-{stem}.onnx", calib)
            seconds[label] = time.perf_counter() - began
        except Exception as exc:
            log(f"{name}: {label} failed: {type(exc).__name__}: {str(exc)[:200]}")
    return paths, seconds


def evaluate(name: str, task: str, paths: dict[str, Path], seconds: dict[str, float],
             held: Sequence[Sample]) -> list[dict]:
    """Agreement with FP32 (CPU EP, and under OpenVINO) and p50 latency under each provider."""
    from packager.graph.execute import run_model
    from packager.ort_builds import cpu_chain, openvino_chain, openvino_python, outputs_plan

    ref = run_model(paths["FP32"], held)["y"]
    ov = openvino_python()
    ov_out: dict[str, dict] = {}
    if ov:
        ov_out, _ = outputs_plan(ov, [(k, p, openvino_chain()) for k, p in paths.items()],
                                 held, THREADS)
    cpu_ms, _ = _timings(Path(sys.executable), paths.items(), held[0], cpu_chain())
    ov_ms, ov_prov = _timings(ov, paths.items(), held[0], openvino_chain()) if ov else ({}, {})
    rows = []
    for label, path in paths.items():
        row = {"model": name, "graph": label, "q": q_nodes(path), "made_s": seconds[label],
               **agreement(run_model(path, held)["y"], ref, task),
               "cpu_ms": cpu_ms.get(label), "ov_ms": ov_ms.get(label),
               "ov_provider": ov_prov.get(label, "")}
        if label in ov_out:
            row["ov_cos_min"] = agreement(ov_out[label]["y"], ref, task)["cos_min"]
        rows.append(row)
    return rows


def measure(name: str, net, task: str, folder: Path, steps: int, size: int) -> list[dict]:
    fp32, learned = trained_graph(name, net, task, folder, steps, size)
    cx, hx = images(CALIB, seed=7)[0], images(HELD, seed=8)[0]
    calib = [{"x": cx[i:i + 1]} for i in range(CALIB)]
    held = [{"x": hx[i:i + 1]} for i in range(HELD)]
    paths, seconds = quantize_all(name, fp32, task, calib, folder)
    rows = evaluate(name, task, paths, seconds, held)
    rows[0]["graph"] = f"FP32 (task {learned:.0%})"
    return rows


def cpu_facts() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((line.split(":", 1)[1].strip() for line in out.splitlines()
                      if line.startswith("Model name")), platform.processor())
    except OSError:
        model = platform.processor()
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    have = [f for f in ("avx512_vnni", "avx_vnni", "amx_int8", "amx_tile") if f in flags]
    return f"{model}, {os.cpu_count()} cores visible, flags: {', '.join(have) or 'no VNNI/AMX'}"


def _speed(value: float | None, fp32: float | None) -> str:
    """'p50 ms | x FP32' cells."""
    if value is None:
        return "- | -"
    return f"{value:.2f} | " + (f"{fp32 / value:.2f}x" if fp32 else "-")


def table(rows: list[dict]) -> str:
    head = ("| model | graph | Q nodes | made (s) | cos min | cos mean | top-1 | score cos min "
            "| cos min (OV) | CPU EP p50 ms | x FP32 | OpenVINO p50 ms | x FP32 |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    fp32 = {r["model"]: r for r in rows if r["graph"].startswith("FP32")}
    for r in rows:
        base = fp32.get(r["model"], {})
        score = f"{r['score_cos_min']:.4f}" if "score_cos_min" in r else "-"
        ov_cos = f"{r['ov_cos_min']:.4f}" if "ov_cos_min" in r else "-"
        lines.append(f"| {r['model']} | {r['graph']} | {r['q']} | {r['made_s']:.1f} | "
                     f"{r['cos_min']:.4f} | {r['cos_mean']:.4f} | {r['top1'] * 100:.0f} % | "
                     f"{score} | {ov_cos} | {_speed(r['cpu_ms'], base.get('cpu_ms'))} | "
                     f"{_speed(r['ov_ms'], base.get('ov_ms'))} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- NNCF's ONNX backend: facts

def _quantized(model) -> dict[str, int]:
    """Per op type: how many of its nodes read a DequantizeLinear output (run in INT8)."""
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    found: dict[str, int] = {}
    for n in model.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and set(n.input) & dq:
            found[n.op_type] = found.get(n.op_type, 0) + 1
    return found


def _first_line(exc: Exception) -> str:
    text = next((line for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {text.strip()[:140]}"


def placement_facts(name: str, model, calib, ort_graph: Path | None) -> list[str]:
    """Which op types each generator quantizes, and IgnoredScope by type and by name."""
    import nncf
    import onnx

    base = _quantized(nncf.quantize(model, calib, subset_size=CALIB))
    facts = [f"{name}: op types with INT8 inputs, NNCF default: {base}"]
    if ort_graph is not None:
        facts.append(f"{name}: ... onnxruntime MinMax: {_quantized(onnx.load(str(ort_graph)))}")
    for t in [t for t in base if t != "Conv"][:2] or ["Conv"]:
        kept = _quantized(nncf.quantize(model, calib, subset_size=CALIB,
                                        ignored_scope=nncf.IgnoredScope(types=[t])))
        facts.append(f"{name}: IgnoredScope(types=['{t}']): {t} nodes with INT8 inputs "
                     f"{base[t]} -> {kept.get(t, 0)}")
    for validate in (True, False):
        scope = nncf.IgnoredScope(names=["no_such_node"], validate=validate)
        try:
            nncf.quantize(model, calib, subset_size=CALIB, ignored_scope=scope)
            facts.append(f"{name}: IgnoredScope(names=[unknown], validate={validate}): accepted")
        except Exception as exc:
            facts.append(f"{name}: IgnoredScope(names=[unknown], validate={validate}) -> "
                         f"{_first_line(exc)}")
    return facts


def smooth_quant_facts(name: str, model, calib) -> list[str]:
    """SmoothQuant on the ONNX backend: the transformer model type, and alphas for convs."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedSmoothQuantParameters

    facts = []
    nodes = len(nncf.quantize(model, calib, subset_size=CALIB).graph.node)
    tries = {"model_type=TRANSFORMER": dict(model_type=nncf.ModelType.TRANSFORMER),
             "smooth_quant_alphas(convolution=0.5)": dict(
                 advanced_parameters=nncf.AdvancedQuantizationParameters(
                     smooth_quant_alphas=AdvancedSmoothQuantParameters(convolution=0.5)))}
    for label, kwargs in tries.items():
        try:
            began = time.perf_counter()
            made = nncf.quantize(model, calib, subset_size=CALIB, **kwargs)
            facts.append(f"{name}: {label}: ran in {time.perf_counter() - began:.1f} s, "
                         f"{len(made.graph.node)} nodes (default {nodes})")
        except Exception as exc:
            facts.append(f"{name}: {label} -> {_first_line(exc)}")
    return facts


def accuracy_control_fact(name: str, model, calib) -> str:
    """nncf.quantize_with_accuracy_control on the ONNX backend, judged by top-1 against the
    synthetic task's labels (max drop 1 %)."""
    import nncf
    import onnxruntime as ort

    hx, hl, _ = images(64, seed=8)
    val = nncf.Dataset([(hx[i:i + 1], int(hl[i])) for i in range(len(hx))])

    def validate(m, data) -> tuple[float, list[float]]:
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        hits = [float(sess.run(None, {"x": x})[0].argmax() == label) for x, label in data]
        return float(np.mean(hits)), hits

    began = time.perf_counter()
    try:
        made = nncf.quantize_with_accuracy_control(model, calib, val, validate, max_drop=0.01,
                                                   subset_size=CALIB)
    except Exception as exc:
        return f"{name}: quantize_with_accuracy_control -> {_first_line(exc)}"
    default = nncf.quantize(model, calib, subset_size=CALIB)
    return (f"{name}: quantize_with_accuracy_control (top-1 on 64 labelled images, max drop "
            f"1 %): ran in {time.perf_counter() - began:.0f} s; top-1 FP32 "
            f"{validate(model, val.get_data())[0]:.3f}, default INT8 "
            f"{validate(default, val.get_data())[0]:.3f}, controlled "
            f"{validate(made, val.get_data())[0]:.3f}; ops with INT8 inputs "
            f"{sum(_quantized(default).values())} -> {sum(_quantized(made).values())}")


def api_facts(folder: Path, models: dict[str, tuple[Path, str]], log=print) -> list[str]:
    """What NNCF's ONNX backend does with ignored scopes, SmoothQuant and accuracy control,
    checked on the trained graphs."""
    import nncf
    import onnx

    cx = images(CALIB, seed=7)[0]
    calib = nncf.Dataset([{"x": cx[i:i + 1]} for i in range(CALIB)])
    facts: list[str] = []
    for name, (path, task) in models.items():
        model = onnx.load(str(path))
        ort_graph = folder / f"{name}-ORT_MinMax.onnx"
        facts += placement_facts(name, model, calib, ort_graph if ort_graph.exists() else None)
        facts += smooth_quant_facts(name, model, calib)
        if task == "classify":
            facts.append(accuracy_control_fact(name, model, calib))
    for line in facts:
        log("  " + line)
    return facts


NETS = {"lcnet": (lcnet, "classify"), "resnet": (resnet, "classify"), "yolo": (yolo, "detect")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600,
                        help="training steps at --train-size (a sixth as many follow at 224)")
    parser.add_argument("--train-size", type=int, default=112, help="training image size")
    parser.add_argument("--models", default=",".join(NETS))
    parser.add_argument("--out", type=Path, default=None, help="keep the graphs here")
    parser.add_argument("--no-facts", action="store_true")
    args = parser.parse_args(argv)
    from packager.quantization.nncf_generator import unavailable

    why = unavailable()
    if why:
        print(f"nncf_measure: {why}")
        return 2
    import nncf
    import onnxruntime

    from packager.ort_builds import openvino_python, why_no_openvino

    folder = args.out or Path(tempfile.mkdtemp(prefix="nncf-measure-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    trained: dict[str, tuple[Path, str]] = {}
    for name in args.models.split(","):
        factory, task = NETS[name]
        rows += measure(name, factory(), task, folder, args.steps, args.train_size)
        trained[name] = (folder / f"{name}.onnx", task)
    facts = [] if args.no_facts else api_facts(folder, trained)
    ov = openvino_python()
    print(f"\nCPU: {cpu_facts()}")
    print(f"onnxruntime {onnxruntime.__version__} (CPU EP), nncf {nncf.__version__}, OpenVINO EP: "
          f"{ov or why_no_openvino()}; {THREADS} threads, batch 1, {SIZE}x{SIZE}, "
          f"{CALIB} calibration / {HELD} held-out images, {args.steps} training steps at "
          f"{args.train_size}x{args.train_size} + {args.steps // 6} at {SIZE}x{SIZE}\n")
    print(table(rows))
    if facts:
        print("\nNNCF's ONNX backend:\n" + "\n".join(f"- {f}" for f in facts))
    print(f"\ngraphs in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
