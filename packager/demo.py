"""The built-in demo: draw a labelled image set with OpenCV, train a small CNN on it in seconds,
save its weights as safetensors, build FP32 and INT8 bundles for x86_64-cpu straight from the
PyTorch factory (`packager.demo:make_net` + the weights: export, validation against PyTorch,
simplify, quantize), verify both, compare.

Nothing is downloaded: the images are drawn here and the weights are trained here.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

CLASSES = ("circle", "square", "triangle", "cross")
IMAGE = 128   # drawn size; the model sees SIZE x SIZE after preprocessing
SIZE = 96
PREPROCESS = {"size": [SIZE, SIZE], "resize": "stretch", "color": "rgb", "layout": "nchw",
              "scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25],
              "dtype": "float32", "pad": 114}


def draw(label: int, rng: np.random.Generator) -> np.ndarray:
    """One BGR image of a shape of class *label* on a noisy, coloured background."""
    import cv2

    bg = rng.integers(0, 256, 3)
    img = np.clip(bg + rng.normal(0, 12, (IMAGE, IMAGE, 3)), 0, 255).astype(np.uint8)
    for _ in range(int(rng.integers(0, 4))):  # distractor lines
        p1, p2 = rng.integers(0, IMAGE, 2), rng.integers(0, IMAGE, 2)
        cv2.line(img, tuple(map(int, p1)), tuple(map(int, p2)),
                 tuple(int(c) for c in rng.integers(0, 256, 3)), 1)
    color = tuple(int((c + 128 + rng.integers(-40, 40)) % 256) for c in bg)
    r = int(rng.integers(18, 40))
    cx, cy = (int(v) for v in rng.integers(r + 4, IMAGE - r - 4, 2))
    thick = -1 if rng.random() < 0.8 else int(rng.integers(5, 9))
    if label == 0:
        cv2.circle(img, (cx, cy), r, color, thick, cv2.LINE_AA)
    elif label == 1:
        angle = rng.uniform(0, 90)
        box = cv2.boxPoints(((cx, cy), (1.6 * r, 1.6 * r), angle)).astype(np.int32)
        cv2.drawContours(img, [box], 0, color, thick, cv2.LINE_AA)
    elif label == 2:
        a0 = rng.uniform(0, 2 * np.pi)
        pts = np.array([[cx + r * np.cos(a0 + k * 2 * np.pi / 3),
                         cy + r * np.sin(a0 + k * 2 * np.pi / 3)] for k in range(3)], np.int32)
        cv2.drawContours(img, [pts], 0, color, thick, cv2.LINE_AA)
    else:
        w = max(4, r // 3)
        cv2.line(img, (cx - r, cy - r), (cx + r, cy + r), color, w, cv2.LINE_AA)
        cv2.line(img, (cx - r, cy + r), (cx + r, cy - r), color, w, cv2.LINE_AA)
    return img


def make_dataset(root: Path, *, per_class: dict[str, int], seed: int = 0) -> None:
    """Write root/{split}/{class}/NNNN.{png,jpg} (calib: unlabelled, flat)."""
    import cv2

    rng = np.random.default_rng(seed)
    for split, count in per_class.items():
        for label, name in enumerate(CLASSES):
            folder = root / split if split == "calib" else root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                ext = ".jpg" if i % 3 == 0 else ".png"  # both decoders get exercised
                cv2.imwrite(str(folder / f"{name}_{i:04d}{ext}"), draw(label, rng))


def load_labelled(root: Path) -> tuple[np.ndarray, np.ndarray]:
    from ._runtimes.runner.images import preprocess, read_image

    xs, ys = [], []
    for label, name in enumerate(CLASSES):
        for path in sorted((root / name).iterdir()):
            xs.append(preprocess(read_image(path, PREPROCESS), PREPROCESS))
            ys.append(label)
    return np.concatenate(xs), np.asarray(ys)


def make_net():
    """A small CNN: conv-BN-ReLU blocks with max pooling, global max pooling, linear head."""
    import torch.nn as nn

    def block(cin: int, cout: int, stride: int) -> list:
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(3, 32, 1), nn.MaxPool2d(2), *block(32, 32, 1), nn.MaxPool2d(2),
                         *block(32, 64, 1), nn.MaxPool2d(2), *block(64, 64, 1),
                         nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(64, len(CLASSES)))


def train(x: np.ndarray, y: np.ndarray, *, epochs: int, log: Callable[[str], None]):
    import torch

    torch.manual_seed(0)
    net = make_net()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=epochs *
                                                ((len(x) + 31) // 32))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(0)
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(len(xt), generator=gen)
        correct = 0
        for i in range(0, len(xt), 32):
            idx = order[i:i + 32]
            logits = net(xt[idx])
            loss = torch.nn.functional.cross_entropy(logits, yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            correct += int((logits.argmax(1) == yt[idx]).sum())
        log(f"demo: epoch {epoch + 1}/{epochs} train accuracy {100 * correct / len(xt):.1f}%")
    return net.eval()


def accuracy_on(model: Path, x: np.ndarray, y: np.ndarray) -> float:
    from .graph.execute import run_model

    scores = run_model(model, [{"image": x[i:i + 1]} for i in range(len(x))])["scores"]
    return float((scores.reshape(len(x), -1).argmax(axis=1) == y).mean())


def run_demo(work: Path, *, log: Callable[[str], None] = print, epochs: int = 6,
             runs: int = 200) -> dict[str, Any]:
    """Run the whole demo in *work*; return figures and a printable summary."""
    import torch
    from safetensors.torch import save_file

    from .device.verify import verify
    from .pipeline import ExportOptions, build
    from .source.specs import TensorSpec

    torch.set_num_threads(2)
    work = Path(work)
    data = work / "data"
    if not (data / "test").is_dir():
        log(f"demo: drawing images into {data}")
        make_dataset(data, per_class={"train": 300, "calib": 40, "test": 60})
    x_train, y_train = load_labelled(data / "train")
    x_test, y_test = load_labelled(data / "test")
    net = train(x_train, y_train, epochs=epochs, log=log)
    weights = work / "shapes_cnn.safetensors"
    save_file(net.state_dict(), str(weights))
    source = "packager.demo:make_net"   # what `edgepack build packager.demo:make_net` loads
    (work / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    prep = dict(PREPROCESS)
    results = {}
    for precision in ("fp32", "int8"):
        out = work / f"bundle-{precision}"
        log(f"demo: building {out}")
        built = build(source, out, target="x86_64-cpu", calib=data / "calib", preprocess=prep,
                      inputs=[TensorSpec("image", (1, 3, SIZE, SIZE))],
                      export_options=ExportOptions(weights=weights, output_names=["scores"]),
                      quant={"precision": precision}, labels=CLASSES, force=True, log=log)
        report = verify(out, runs=runs)
        results[precision] = {
            "bundle": str(out), "verified": report["passed"],
            "test_accuracy": accuracy_on(out / "model.onnx", x_test, y_test),
            "p50_ms": report["bench"]["parts"]["model"]["latency_ms"]["p50"],
            "p90_ms": report["bench"]["parts"]["model"]["latency_ms"]["p90"],
            "model_bytes": (out / "model.onnx").stat().st_size,
            "agreement_vs_fp32": built.parts[0].accuracy,
            "export_validation": built.parts[0].export["validation"],
        }
    fp32, int8 = results["fp32"], results["int8"]
    speedup = fp32["p50_ms"] / int8["p50_ms"]
    summary = "\n".join([
        f"demo: {len(y_test)} held-out labelled test images, {len(CLASSES)} classes",
        f"  FP32 bundle: accuracy {100 * fp32['test_accuracy']:.1f}%, p50 {fp32['p50_ms']:.3f} ms, "
        f"{fp32['model_bytes'] / 1024:.0f} KiB, verify {'passed' if fp32['verified'] else 'FAILED'}",
        f"  INT8 bundle: accuracy {100 * int8['test_accuracy']:.1f}%, p50 {int8['p50_ms']:.3f} ms, "
        f"{int8['model_bytes'] / 1024:.0f} KiB, verify {'passed' if int8['verified'] else 'FAILED'}",
        f"  INT8 speedup over FP32 (p50): {speedup:.2f}x; top-1 agreement with FP32 on held-out "
        f"calibration images: {100 * int8['agreement_vs_fp32'].get('top1_agreement', 0):.1f}%"
        + ("" if speedup >= 1.05 else " (too small a model for INT8 to pay on this CPU; "
           "without --precision, `edgepack build` ships INT8 only where it measures it 5% "
           "faster than FP32)"),
        f"  export vs PyTorch: max abs {int8['export_validation']['max_abs']:.2g}, cosine min "
        f"{int8['export_validation']['cosine_min']:.6f} on "
        f"{int8['export_validation']['samples']} inputs",
        f"  bundle: {int8['bundle']}/ and {int8['bundle']}.tar.gz",
    ])
    result = {"fp32": fp32, "int8": int8, "speedup_p50": speedup, "summary": summary,
              "passed": fp32["verified"] and int8["verified"]}
    (work / "demo.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result
