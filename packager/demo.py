"""The built-in demo: draw a labelled image set with OpenCV, train a CNN on it (once: later runs
reuse the weights), save them as safetensors, and `build` its bundle for x86_64-cpu straight from
the PyTorch factory (`packager.demo:make_net` + the weights: export, validation against PyTorch,
simplify, the precision decision with its candidates timed side by side), then verify it.

Nothing is downloaded: the images are drawn here and the weights are trained here.
"""

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

CLASSES = ("circle", "square", "triangle", "cross")
IMAGE = 128   # drawn size; the model sees SIZE x SIZE after preprocessing
SIZE = 64
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
    """Write root/{split}/{class}/NNNN.{png,jpg}: calibration in class folders too, so the build
    judges INT8 by the labelled top-1 it loses and the page shows a confusion matrix."""
    import cv2

    rng = np.random.default_rng(seed)
    for split, count in per_class.items():
        for label, name in enumerate(CLASSES):
            folder = root / split / name
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
    """A CNN wide enough for INT8 to pay on CPUs without VNNI (51 M multiply-adds at 64x64,
    3x3 convs of 32 to 128 channels: 1.8x FP32 here), quick to train (93 % after 6 epochs of
    600 images, 36 s on 2 busy cores): conv-BN-ReLU blocks with max pooling, global max
    pooling, a linear head."""
    import torch.nn as nn

    def block(cin: int, cout: int) -> list:
        return [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(3, 32), nn.MaxPool2d(2), *block(32, 64), nn.MaxPool2d(2),
                         *block(64, 128), nn.MaxPool2d(2), *block(128, 128),
                         nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(128, len(CLASSES)))


def train(x: np.ndarray, y: np.ndarray, *, epochs: int, log: Callable[[str], None]):
    import torch

    torch.manual_seed(0)
    net = make_net()
    opt = torch.optim.AdamW(net.parameters(), lr=4e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=4e-3, total_steps=epochs *
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


TRAIN_PER_CLASS, EPOCHS = 150, 6


def trained_weights(work: Path, data: Path, log: Callable[[str], None]) -> tuple[Path, float]:
    """The demo CNN's weights (trained once; a later run reuses them when the net, the data
    and the recipe are the same) and its PyTorch accuracy on the test images."""
    import hashlib
    import inspect

    import torch
    from safetensors.torch import load_file, save_file

    weights, stamp = work / "shapes_cnn.safetensors", work / "shapes_cnn.json"
    key = hashlib.sha256((inspect.getsource(make_net) + inspect.getsource(train) + inspect.getsource(draw)
                          + f"{TRAIN_PER_CLASS} {EPOCHS} {SIZE} {IMAGE}").encode()).hexdigest()[:16]
    x_test, y_test = load_labelled(data / "test")
    net = make_net()
    if weights.is_file() and stamp.is_file() and json.loads(stamp.read_text()).get("key") == key:
        net.load_state_dict(load_file(str(weights)))
        log(f"demo: reusing the CNN trained by an earlier run ({weights}; delete it to train "
            "again)")
    else:
        x_train, y_train = load_labelled(data / "train")
        log(f"demo: training the CNN on {len(y_train)} images, {EPOCHS} epochs (once: later "
            "runs reuse it)")
        net = train(x_train, y_train, epochs=EPOCHS, log=log)
        save_file(net.state_dict(), str(weights))
        stamp.write_text(json.dumps({"key": key}) + "\n")
    with torch.no_grad():
        scores = net.eval()(torch.from_numpy(x_test))
    return weights, float((scores.argmax(1).numpy() == y_test).mean())


def decision_table(decision: dict[str, Any]) -> list[str]:
    """The build's candidates as table rows: what was tried, its accuracy and speed."""
    rows = ["  candidate                                   cosine    p50 ms  within budget"]
    for c in decision.get("candidates", []):
        cosine = "-" if c.get("cosine_min") is None else f"{c['cosine_min']:.4f}"
        p50 = "-" if c.get("p50_ms") is None else f"{c['p50_ms']:.3f}"
        rows.append(f"  {c['label'][:42]:42}  {cosine:>7}  {p50:>8}  "
                    f"{'yes' if c.get('meets_budget') else 'no'}")
    return rows


def run_demo(work: Path, *, log: Callable[[str], None] = print,
             runs: int = 100) -> dict[str, Any]:
    """Run the whole demo in *work*; return figures and a printable summary."""
    import torch

    from .build.job import ExportOptions, build
    from .device.verify import verify
    from .source.specs import TensorSpec
    from .tasks.declare import parse_tasks

    torch.set_num_threads(2)
    work = Path(work)
    data = work / "data"
    if not (data / "test").is_dir() or not (data / "calib" / CLASSES[0]).is_dir():
        shutil.rmtree(data, ignore_errors=True)   # (an older demo drew calib/ flat)
        log(f"demo: drawing images into {data}")
        make_dataset(data, per_class={"train": TRAIN_PER_CLASS, "calib": 125, "test": 60})
    weights, torch_accuracy = trained_weights(work, data, log)
    x_test, y_test = load_labelled(data / "test")
    source = "packager.demo:make_net"   # what `edgepack build packager.demo:make_net` loads
    (work / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    out = work / "bundle"
    prep = (f"size={SIZE}x{SIZE},resize=stretch,color=rgb,layout=nchw,scale=1/255,"
            "mean=0.5/0.5/0.5,std=0.25/0.25/0.25")
    log(f"demo: edgepack build {source} --weights {weights} --input image:1x3x{SIZE}x{SIZE} "
        f"--output-name scores --calib {data / 'calib'} --preprocess {prep} "
        f"--labels {work / 'labels.txt'} --task classify -o {out} --force")
    built = build(source, out, target="x86_64-cpu", calib=data / "calib", preprocess=dict(PREPROCESS),
                  inputs=[TensorSpec("image", (1, 3, SIZE, SIZE))],
                  export_options=ExportOptions(weights=weights, output_names=["scores"]),
                  labels=CLASSES, tasks=parse_tasks(["classify"], ["model"]), force=True, log=log)
    log(f"demo: edgepack verify {out}")
    report = verify(out, runs=runs)
    manifest = json.loads((out / "manifest.json").read_text())
    decision = manifest["parts"][0]["precision"]["decision"]
    shipped = built.parts[0].config.describe()
    accuracy = accuracy_on(out / manifest["parts"][0]["model"]["file"], x_test, y_test)
    fp32 = next((c for c in decision["candidates"] if c["label"] == "FP32"), {})
    chosen = next((c for c in decision["candidates"] if c["label"] == decision["label"]), {})
    speedup = (fp32["p50_ms"] / chosen["p50_ms"]
               if fp32.get("p50_ms") and chosen.get("p50_ms") else None)
    latency = report["bench"]["parts"]["model"]["latency_ms"]
    summary = "\n".join([
        f"demo: {len(y_test)} held-out test images, {len(CLASSES)} classes",
        f"  PyTorch: accuracy {100 * torch_accuracy:.1f}%; bundle ({shipped}): accuracy "
        f"{100 * accuracy:.1f}%",
        "  the build's candidates, measured on held-out images and timed side by side:",
        *decision_table(decision),
        f"  shipped: {decision['reason']}",
        f"  budget: {decision['budget']}; evidence: "
        f"{(decision.get('evidence') or {}).get('verdict') or 'FP32 ships (nothing to prove)'}",
        f"  verify: {report.get('verdict') or ('passed' if report['passed'] else 'failed')}; "
        f"the bundle's own runner: p50 "
        f"{latency['p50']:.3f} ms, p90 {latency['p90']:.3f} ms",
        f"  bundle: {out}/ and {out}.tar.gz",
        f"  page: {out}/reports/index.html (open it in a browser: what shipped and why, speed, "
        "where the time goes, size)",
    ])
    result = {"bundle": str(out), "shipped": shipped, "torch_accuracy": torch_accuracy,
              "test_accuracy": accuracy, "speedup_p50": speedup, "verified": report["passed"],
              "p50_ms": latency["p50"], "decision": decision, "summary": summary,
              "passed": report["passed"]}
    (work / "demo.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result
