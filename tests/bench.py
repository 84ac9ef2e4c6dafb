"""make bench: PyTorch eager vs ORT FP32 vs the INT8 bundle, ResNet-18- and MobileNetV2-class.

All engines run in this one process with 2 intra-op threads, batch 1, 224x224, interleaved in
blocks (alternating single calls between PyTorch and ORT makes their thread pools fight and
inflates PyTorch's latency). Figures are medians of every timed call; ratios are within this run.
"""

import argparse
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

THREADS = 2
warnings.filterwarnings("ignore", category=DeprecationWarning)
PREP = {"size": [224, 224], "resize": "stretch", "color": "rgb", "layout": "nchw",
        "scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
        "dtype": "float32", "pad": 114}


def resnet18():
    import torch.nn as nn

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.body(x) + self.skip(x))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
    return nn.Sequential(*layers)


def mobilenet_v2():
    import torch.nn as nn

    def cbr(cin, cout, k=3, s=1, groups=1, act=True):
        mods = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return mods + [nn.ReLU6()] if act else mods

    class Inverted(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hidden = cin * expand
            mods = cbr(cin, hidden, 1) if expand != 1 else []
            mods += cbr(hidden, hidden, 3, stride, groups=hidden) + cbr(hidden, cout, 1, act=False)
            self.body = nn.Sequential(*mods)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    layers, cin = cbr(3, 32, 3, 2), 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            layers.append(Inverted(cin, c, s if i == 0 else 1, t))
            cin = c
    layers += cbr(cin, 1280, 1) + [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000)]
    return nn.Sequential(*layers)


def init_bn(net, seed):
    """Give BatchNorm layers non-trivial statistics, as a trained network has."""
    import torch

    g = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            n = m.num_features
            m.weight.data = 0.5 + torch.rand(n, generator=g)
            m.bias.data = 0.1 * torch.randn(n, generator=g)
            m.running_mean = 0.1 * torch.randn(n, generator=g)
            m.running_var = 0.5 + torch.rand(n, generator=g)
    return net.eval()


def time_blocks(engines, rounds, block):
    times = {name: [] for name in engines}
    for fn in engines.values():  # warm-up
        for _ in range(5):
            fn()
    for _ in range(rounds):
        for name, fn in engines.items():
            for _ in range(block):
                t = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t) * 1000)
    return {k: float(np.median(v)) for k, v in times.items()}


def bench_model(name, net, work, rounds, block):
    import onnxruntime as ort
    import torch

    from packager.demo import make_dataset
    from packager.pipeline import build

    calib = work / "calib"
    if not calib.is_dir():
        make_dataset(work / "data", per_class={"calib": 10})
        calib = work / "data" / "calib"
    onnx_path = work / f"{name}.onnx"
    x = torch.randn(1, 3, 224, 224)
    torch.onnx.export(net, (x,), str(onnx_path), input_names=["image"], output_names=["logits"],
                      opset_version=17, dynamo=False)
    bundle = work / f"{name}-int8"
    built = build(onnx_path, bundle, target="x86_64-cpu", calib=calib, preprocess=PREP,
                  force=True)

    def session(path):
        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    fp32, int8 = session(onnx_path), session(bundle / "model.onnx")
    feed = {"image": x.numpy()}
    torch.set_num_threads(THREADS)

    def eager():
        with torch.inference_mode():
            net(x)

    medians = time_blocks({"PyTorch eager": eager, "ORT FP32": lambda: fp32.run(None, feed),
                           "bundle INT8": lambda: int8.run(None, feed)}, rounds, block)
    sizes = {"PyTorch eager": sum(p.numel() * 4 for p in net.parameters()),
             "ORT FP32": onnx_path.stat().st_size,
             "bundle INT8": (bundle / "model.onnx").stat().st_size}
    return medians, sizes, built.accuracy


def cpu_line():
    model, flags = platform.processor(), set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    feats = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    import os
    return f"{model or '?'} ({platform.machine()}, {os.cpu_count()} cores; {' '.join(feats)})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=20)
    args = parser.parse_args()
    import onnxruntime
    import torch

    print(f"CPU: {cpu_line()}")
    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, {THREADS} threads, "
          f"batch 1, 224x224, {args.rounds} rounds x {args.block} calls per engine, interleaved")
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgepack-bench-") as tmp:
        for seed, (name, factory) in enumerate((("resnet18", resnet18),
                                                ("mobilenetv2", mobilenet_v2))):
            import torch
            torch.manual_seed(seed)
            medians, sizes, acc = bench_model(name, init_bn(factory(), seed), Path(tmp),
                                              args.rounds, args.block)
            for engine, ms in medians.items():
                rows.append((name, engine, ms, medians["ORT FP32"] / ms,
                             medians["PyTorch eager"] / ms, sizes[engine] / 1e6,
                             f"{acc['cosine_min']:.4f}" if engine == "bundle INT8" else ""))
    print()
    print(f"| {'model':12} | {'engine':13} | {'median ms':>9} | {'vs ORT FP32':>11} | "
          f"{'vs eager':>8} | {'size MB':>7} | {'cosine':>6} |")
    print(f"|{'-' * 14}|{'-' * 15}|{'-' * 11}|{'-' * 13}|{'-' * 10}|{'-' * 9}|{'-' * 8}|")
    for model, engine, ms, vs_ort, vs_eager, mb, cos in rows:
        print(f"| {model:12} | {engine:13} | {ms:9.2f} | {vs_ort:10.2f}x | {vs_eager:7.2f}x | "
              f"{mb:7.2f} | {cos:>6} |")
    print("\ncosine: INT8 vs FP32 outputs on held-out calibration images (drawn by OpenCV).")


if __name__ == "__main__":
    main()
