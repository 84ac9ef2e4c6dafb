"""make bench: `edgepack compare` for a ResNet-18-class CNN, a MobileNetV2-class CNN (224x224),
a MiniLM-L6-class sentence encoder (128 tokens) and a TTS pipeline (whole sentences, real-time
factors); prints the tables and writes BENCHMARKS.md.

Every row runs in one process per model, interleaved in blocks (packager/timing.py), at batch
1 and 8, with the target's threads, together with the roofline graphs (bundle/roofline.py): the
best of them per kind is the ceiling each ONNX Runtime row's GOP/s is a share of. Where a Python
with onnxruntime-openvino exists (`make openvino`; $EDGEPACK_OPENVINO_PYTHON), the OpenVINO rows
are timed there beside that onnxruntime's CPU provider. The encoder also gets the transformer-
fused rows (what `build` ships for it). Ratios are within one run; the machine is shared and noisy.
"""

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

THREADS = 2
# the instruction sets onnxruntime's and OpenVINO's kernels pick between
MATH_FLAGS = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
              "asimd", "asimddp", "i8mm", "sve"}
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


def resnet18_bn():
    import torch

    torch.manual_seed(0)
    return init_bn(resnet18(), 0)


def mobilenet_v2_bn():
    import torch

    torch.manual_seed(1)
    return init_bn(mobilenet_v2(), 1)


def encoder_files(work: Path, steps: int = 60):
    """MiniLM-L6-class (6 layers, 384 wide, 12 heads, 30522 tokens), briefly trained: a random
    encoder's pooled output is near-random and says nothing about quantization error."""
    import torch
    import torch_models
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = torch_models.Encoder(vocab=30522, dim=384, heads=12, layers=6, ffn=1536)
    torch_models.train_encoder(steps, net, batch=8, length=64)
    save_file(net.state_dict(), str(work / "minilm.safetensors"))
    ids, mask, _ = torch_models.topic_batch(torch.Generator().manual_seed(1), 40, 128, 30522)
    np.savez(work / "tokens.npz", input_ids=ids.numpy(), attention_mask=mask.numpy())
    return work / "minilm.safetensors", work / "tokens.npz"


def cpu_flags() -> set[str]:
    """Every flag /proc/cpuinfo lists (what lscpu shows); empty where it is missing."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_seconds() -> tuple[float, float, float] | None:
    """(wall clock, CPU seconds every process used, CPU seconds this one and its children used);
    None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:8]]
    except (OSError, ValueError):
        return None
    busy = sum(ticks) - ticks[3] - ticks[4]   # all but idle and iowait
    own = os.times()
    return (time.monotonic(), busy / os.sysconf("SC_CLK_TCK"),
            own.user + own.system + own.children_user + own.children_system)


def others_share(before, after) -> str:
    """What other processes took of the machine's cores between two cpu_seconds()."""
    if before is None or after is None:
        return "CPU use of other processes: unknown (no /proc/stat)."
    wall, total, own = (b - a for a, b in zip(before, after, strict=True))
    share = max(0.0, total - own) / (wall * (os.cpu_count() or 1))
    return (f"Other processes used {100 * share:.0f} % of the {os.cpu_count()} cores during this "
            "model's run (/proc/stat, less this run's own CPU time).")


def speech_section(work: Path, rounds: int) -> str:
    """A TTS pipeline from PyTorch parts (tests/tts_torch.py's AttentionParts: an attention
    encoder without a mask, a vocoder; docs/speech.md's recipe) built with `build --pipeline`
    and compared as a TTS user measures it: whole sentences, real-time factor, log-mel."""
    from click.testing import CliRunner
    from test_tts_pipeline import write_pipeline

    from packager.cli import main as cli
    from packager.compare import compare, markdown

    work.mkdir(parents=True)
    path = write_pipeline(work, factory="attention_parts")
    run = CliRunner().invoke(cli, ["build", "--pipeline", str(path), "-o", str(work / "out")])
    if run.exit_code != 0:
        return f"## Speech\n\nThe pipeline did not build: {run.output.strip()[-400:]}\n"
    result = compare(path, bundle=work / "out", rounds=max(rounds, 3))
    text = ("A TTS pipeline from PyTorch parts (tests/tts_torch.py's AttentionParts: an "
            "attention encoder without a mask and a vocoder, 16 kHz; docs/speech.md's recipe), "
            "built with `edgepack build --pipeline` and compared on its 15 sentences of 3-20 "
            "tokens (`edgepack compare tts.toml --bundle out`). Kokoro-82M's figures are in "
            f"docs/speech.md.\n\n{markdown(result)}")
    print(text, flush=True)
    return f"## Speech: a TTS pipeline, whole sentences\n\n{text}"


def latency_section(work: Path) -> str:
    """One bundle (the demo's INT8 CNN) timed by the build's decision, by `verify` and by its own
    `run.py bench`: the figures agree when each p50 lies inside the p10-p90 the others state."""
    import json

    from latency_agreement import demo_bundle, disagreements, measure, table

    print("== One latency answer: build, verify and run.py bench on one bundle", flush=True)
    out = demo_bundle(work)
    rows = measure(out)
    shipped = json.loads((out / "manifest.json").read_text())["parts"][0]["precision"]
    verdict = ("Each p50 lies inside the p10-p90 the measures state (5 % either side)."
               if not disagreements(rows) else "They disagree: " + "; ".join(disagreements(rows)) + ".")
    text = (f"The demo's CNN ({shipped['description']}), 200 timed calls each for verify and "
            f"run.py bench, each with the session options the manifest names "
            f"(tests/latency_agreement.py). {verdict}\n\n{table(rows)}")
    print(text, flush=True)
    return f"## One latency answer: build, verify and run.py bench on one bundle\n\n{text}\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block", type=int, default=12)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent /
                        "BENCHMARKS.md")
    args = parser.parse_args()
    import torch

    from packager.compare import compare, markdown
    from packager.demo import make_dataset
    from packager.progress import Progress, echo
    from packager.source.specs import parse_input
    from packager.timing import machine, machine_line

    here = Path(__file__).resolve().parent
    threads = 2
    sections = []
    with tempfile.TemporaryDirectory(prefix="edgepack-bench-") as tmp:
        work = Path(tmp)
        make_dataset(work / "data", per_class={"calib": 10})
        weights, tokens = encoder_files(work)
        image = [parse_input("image:1x3x224x224")]
        runs = [
            ("ResNet-18-class CNN, 224x224", f"{here / 'bench.py'}:resnet18_bn",
             dict(inputs=image, calib=work / "data" / "calib", preprocess=PREP)),
            ("MobileNetV2-class CNN, 224x224", f"{here / 'bench.py'}:mobilenet_v2_bn",
             dict(inputs=image, calib=work / "data" / "calib", preprocess=PREP)),
            ("MiniLM-L6-class sentence encoder, 128 tokens (briefly trained)",
             f"{here / 'torch_models.py'}:Encoder",
             dict(inputs=[parse_input("input_ids:1x128:int64"),
                          parse_input("attention_mask:1x128:int64")], calib=tokens,
                  weights=weights, factory_args={"vocab": 30522, "dim": 384, "heads": 12,
                                                 "layers": 6, "ffn": 1536})),
        ]
        for i, (title, source, kw) in enumerate(runs, 1):
            print(f"== {title}", flush=True)
            # a status line with the time left on a terminal (stderr), nothing in a log file
            steps = Progress(f"bench {i}/{len(runs)} {title.split(',')[0]}")
            before = cpu_seconds()
            result = compare(source, batches=(1, 8), rounds=args.rounds, block=args.block,
                             threads=threads, log=lambda m: echo(m, err=False), steps=steps,
                             **kw)
            # other jobs on a shared machine slow some blocks more than others: say how busy
            load = f"{others_share(before, cpu_seconds())}\n\n"
            table = markdown(result)
            print(load + table, flush=True)
            sections.append(f"## {title}\n\n{load}{table}")
        sections.append(speech_section(work / "speech", args.rounds))
        sections.append(latency_section(work / "latency"))
    info = machine()
    flags = set(info["flags"]) | cpu_flags()
    integer = ("AMX-INT8 and VNNI" if "amx_int8" in flags else
               "VNNI" if {"avx512_vnni", "avx_vnni"} & flags else
               "no VNNI: u8s8 products go through AVX2's 16-bit vpmaddubsw path"
               if "avx2" in flags else "no AVX2")
    from packager import ort_builds

    python = ort_builds.openvino_python()
    openvino = (f"OpenVINO rows: onnxruntime-openvino in {python}." if python else
                f"No OpenVINO rows: {ort_builds.why_no_openvino()}.")
    text = f"""# Benchmarks

Written by `make bench` (tests/bench.py, which runs `edgepack compare` on each model). Every
variant of a model was timed in one process, interleaved in blocks, with {threads} intra-op
threads; p50/p90 are over all timed calls. Cold start (import + load + first call) was measured
in fresh processes. Accuracy is cosine / top-1 agreement against PyTorch on held-out calibration
data. The CNNs have random weights with non-trivial BatchNorm statistics and see images drawn by
OpenCV; the encoder was trained for 60 steps on a synthetic task.

GOP/s is the model's operations per call (2 x the multiply-adds of Conv, Gemm and MatMul, counted
on the FP32 graph, the same count for every row of a batch) over its p50. % of ceiling compares
that with this machine's best rate of the row's kind, with the same threads: the fastest of the
roofline graphs a bundle ships for `run.py bench --roofline` (MatMuls of five shapes, square and
im2col-like; a 3x3 Conv and the model's three heaviest convs as Conv and QLinearConv; the
bundle's integer MatMulInteger and QLinearMatMul), timed in the same blocks as the rows and, where
it exists, under the OpenVINO provider too. INT8 rows are against the best integer graph, FP32,
FP16 and OpenVINO FP32 rows against the best FP32 one; PyTorch rows get GOP/s only. A single
512x512 MatMul was the ceiling before: convolutions beat it (an INT8 ResNet-18-class CNN at 127 %
on an AVX2 EPYC), so it said nothing about how much is left; now a share above 100 % would mean a
kernel doing fewer multiplies than counted (Winograd) and is printed as measured with a note.
"OpenVINO FP32" and "OpenVINO INT8 (QDQ)" are the ORT FP32 graph and the INT8 QDQ U8S8 graph under
onnxruntime-openvino's OpenVINO execution provider, in that package's own Python; their "vs ORT
FP32" is against "ORT FP32 (OpenVINO's onnxruntime)", the same graph under that onnxruntime's CPU
provider in the same blocks. "ORT FP32 fused" is the graph `build`
ships for a model with attention (onnxruntime's transformer fusions; the fused op counts follow
the table) and "INT8 dynamic fused" its dynamic INT8; they appear only where something fused.

Machine: {machine_line(info)} ({integer}); Python {info['python']}, torch {torch.__version__}.
CPU flags (lscpu, those that matter here): {', '.join(sorted(flags & MATH_FLAGS)) or 'none'}.
{openvino} The machine is shared, so compare ratios within one table, not across runs.

""" + "\n".join(sections)
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
