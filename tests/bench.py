"""make bench: PyTorch eager vs ORT FP32 vs the INT8 bundle: ResNet-18- and MobileNetV2-class
CNNs (224x224) and a MiniLM-L6-class sentence encoder (128 tokens).

All engines run in this one process with 2 intra-op threads, batch 1, interleaved in blocks
(alternating single calls between PyTorch and ORT makes their thread pools fight and inflates
PyTorch's latency). Figures are medians of every timed call; ratios are within this run.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

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


def session(path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def bench_model(name, net, work, rounds, block):
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
    cosine = {"bundle INT8": built.parts[0].accuracy["cosine_min"]}
    return medians, sizes, cosine, {"bundle INT8": built.parts[0].config.describe()}


def bench_encoder(work, rounds, block, steps=60):
    """MiniLM-L6-class: 6 layers, 384 wide, 12 heads, 30522 tokens; briefly trained, because a
    random encoder's pooled output is near-random and says nothing about quantization error."""
    import torch
    import torch_models
    from safetensors.torch import save_file

    from packager.pipeline import ExportOptions, build
    from packager.specs import parse_input

    torch.manual_seed(0)
    net = torch_models.Encoder(vocab=30522, dim=384, heads=12, layers=6, ffn=1536)
    torch_models.train_encoder(steps, net, batch=8, length=64)
    save_file(net.state_dict(), str(work / "minilm.safetensors"))
    g = torch.Generator().manual_seed(1)
    ids, mask, _ = torch_models.topic_batch(g, 40, 128, 30522)
    np.savez(work / "tokens.npz", input_ids=ids.numpy(), attention_mask=mask.numpy())
    factory = Path(torch_models.__file__).as_posix() + ":Encoder"
    args = dict(target="x86_64-cpu", calib=work / "tokens.npz", force=True,
                inputs=[parse_input("input_ids:1x128:int64"),
                        parse_input("attention_mask:1x128:int64")],
                export_options=ExportOptions(
                    weights=work / "minilm.safetensors",
                    factory_args={"vocab": 30522, "dim": 384, "heads": 12, "layers": 6,
                                  "ffn": 1536}))
    fp32 = build(factory, work / "minilm-fp32", quant={"precision": "fp32"}, **args)
    default = build(factory, work / "minilm-int8", **args)       # the target's transformer preset
    static = build(factory, work / "minilm-static", quant={"mode": "static"}, **args)
    feed = {"input_ids": ids[:1].numpy(), "attention_mask": mask[:1].numpy()}
    sessions = {"ORT FP32": session(work / "minilm-fp32" / "model.onnx"),
                "bundle INT8": session(work / "minilm-int8" / "model.onnx"),
                "static QDQ INT8": session(work / "minilm-static" / "model.onnx")}
    torch.set_num_threads(THREADS)
    t_ids, t_mask = ids[:1], mask[:1]

    def eager():
        with torch.inference_mode():
            net(t_ids, t_mask)

    engines = {"PyTorch eager": eager}
    engines.update({k: (lambda s=s: s.run(None, feed)) for k, s in sessions.items()})
    medians = time_blocks(engines, rounds, block)
    sizes = {"PyTorch eager": sum(p.numel() * 4 for p in net.parameters())}
    sizes.update({k: (work / d / "model.onnx").stat().st_size for k, d in
                  (("ORT FP32", "minilm-fp32"), ("bundle INT8", "minilm-int8"),
                   ("static QDQ INT8", "minilm-static"))})
    cosine = {"bundle INT8": default.parts[0].accuracy["cosine_min"],
              "static QDQ INT8": static.parts[0].accuracy["cosine_min"]}
    del fp32
    return medians, sizes, cosine, {"bundle INT8": default.parts[0].config.describe(),
                                    "static QDQ INT8": static.parts[0].config.describe()}


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
          f"batch 1, {args.rounds} rounds x {args.block} calls per engine, interleaved")
    rows, notes = [], {}
    with tempfile.TemporaryDirectory(prefix="edgepack-bench-") as tmp:
        runs = [(name, lambda n=net, s=seed, w=Path(tmp): bench_model(
                    n.__name__, init_bn(n(), s), w, args.rounds, args.block))
                for seed, (name, net) in enumerate((("resnet18", resnet18),
                                                    ("mobilenetv2", mobilenet_v2)))]
        runs.append(("minilm-l6", lambda w=Path(tmp): bench_encoder(w, args.rounds, args.block)))
        for seed, (name, run) in enumerate(runs):
            import torch
            torch.manual_seed(seed)
            medians, sizes, cosine, how = run()
            notes.update({f"{name} {k}": v for k, v in how.items()})
            for engine, ms in medians.items():
                rows.append((name, engine, ms, medians["ORT FP32"] / ms,
                             medians["PyTorch eager"] / ms, sizes[engine] / 1e6,
                             f"{cosine[engine]:.4f}" if engine in cosine else ""))
    print()
    print(f"| {'model':12} | {'engine':15} | {'median ms':>9} | {'vs ORT FP32':>11} | "
          f"{'vs eager':>8} | {'size MB':>7} | {'cosine':>6} |")
    print(f"|{'-' * 14}|{'-' * 17}|{'-' * 11}|{'-' * 13}|{'-' * 10}|{'-' * 9}|{'-' * 8}|")
    for model, engine, ms, vs_ort, vs_eager, mb, cos in rows:
        print(f"| {model:12} | {engine:15} | {ms:9.2f} | {vs_ort:10.2f}x | {vs_eager:7.2f}x | "
              f"{mb:7.2f} | {cos:>6} |")
    print("\ncosine: INT8 vs FP32 outputs on held-out calibration data (images drawn by OpenCV; "
          "token sequences). CNNs 224x224, encoder 1x128 tokens.")
    for key, value in notes.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
