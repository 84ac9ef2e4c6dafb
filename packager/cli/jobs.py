"""The whole jobs: build, compare, targets, demo."""

from pathlib import Path
from typing import Any

import click

from .._runtimes.runner.contents import EXTRAS as RUNNER_EXTRAS
from ..errors import SpecError
from .base import (
    INPUT_HELP,
    budget_kwargs,
    budget_options,
    emit,
    export_kwargs,
    export_options,
    log,
    main,
    preprocess_option,
    progress_bar,
    quant_options,
    quant_overrides,
    read_labels,
    step_line,
)


def _device_timer(host: str | None, ssh_config: Path | None, python: str, target: str):
    if host is None:
        return None
    from ..device.inventory import parse_host
    from ..device.remote_timing import remote_timer
    from ..targets import load_target

    return remote_timer(parse_host(host), ssh_config=ssh_config, python=python,
                        providers=load_target(target).providers, log=log)


def extras_of(text: str) -> tuple[str, ...]:
    """--runner-extras: 'serve,tune' -> ("serve", "tune"); 'none' -> () (build() checks each);
    an empty list, or none beside an extra, is refused (it built no extras, silently)."""
    from ..errors import SpecError

    text = text.strip()
    if text.lower() == "none":
        return ()
    extras = tuple(x.strip() for x in text.split(",") if x.strip())
    if not extras:
        raise SpecError(f"--runner-extras {text!r}: names no extra", "give extras like "
                        "infer,serve, or none for the runner's core alone")
    if "none" in (x.lower() for x in extras):
        raise SpecError(f"--runner-extras {text}: none means no extras, and cannot be combined "
                        "with one", "give none alone, or the extras alone")
    return extras


def _tuner(tune: bool, host: str | None, ssh_config: Path | None, python: str, target: str):
    """build --tune's tuner: on the --time-on device, else here when this machine is one."""
    if not tune:
        return None
    import platform

    from .._runtimes.runner.sessions import GPU_PROVIDERS
    from ..device.inventory import parse_host
    from ..device.tuning import local_tuner, remote_tuner
    from ..targets import load_target

    if host is not None:
        return remote_tuner(parse_host(host), ssh_config=ssh_config, python=python, log=log)
    profile = load_target(target)
    gpu = any(p.name in GPU_PROVIDERS for p in profile.providers)
    if gpu or profile.arch != platform.machine():
        raise SpecError(f"--tune: {profile.name} is {profile.arch}{' with a GPU' if gpu else ''}"
                        f" and this host {platform.machine()}, so timings here say nothing "
                        "about it", "add --time-on HOST to tune on the device, or tune each "
                        "device after deploying: `edgepack deploy --tune` or `run.py bench "
                        "--tune` there")
    return local_tuner(log=log)


@main.command("build")
@click.argument("model", required=False)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True)
@click.option("--target", default="x86_64-cpu", show_default=True,
              help="profile name or path to a .toml")
@click.option("--calib", "calib", multiple=True, metavar="DIR | PART=DIR",
              help="images or .npy/.npz folder (per part: PART=DIR, repeatable)")
@click.option("--preprocess", help="image spec (key=value,...) or a .toml file")
@click.option("--input", "inputs", multiple=True, metavar="[PART/]NAME:1x3x224x224[:dtype]",
              help=INPUT_HELP)
@click.option("--const", "consts", multiple=True, metavar="NAME=VALUE",
              help="freeze an input to a value (number, [list] or .npy): it leaves the "
              "bundle's inputs and If branches on it fold away; for a PyTorch or TorchScript "
              "source NAME may be a forward() argument, passed to forward() as that value "
              "(repeatable)")
@click.option("--part", "parts", multiple=True, metavar="NAME=ATTR_OR_FACTORY",
              help="bundle this part of the PyTorch model as its own model (repeatable)")
@click.option("--part-precision", "part_precision", multiple=True, metavar="PART=PRECISION",
              help="int8, fp16 or fp32 for one part (repeatable)")
@click.option("--holdout", type=float, default=0.2, show_default=True,
              help="fraction of samples kept out of calibration to measure accuracy")
@click.option("--golden", type=int, default=None,
              help="golden samples the bundle keeps for the device's check (default: up to 8, "
                   "within 4 MB or half the model's size, whichever is larger; the build and "
                   "the bundle's page say what one costs)")
@click.option("--labels", type=click.Path(exists=True, path_type=Path),
              help="text file, one class name per line (default: the names the model's "
              "metadata holds, e.g. Ultralytics' names or Hugging Face's id2label, where they "
              "fit its class scores)")
@click.option("--eval", "evaluate", type=click.Path(exists=True, file_okay=False,
                                                   path_type=Path), default=None,
              help="a labelled evaluation folder of images in class folders (eval/cat/1.jpg), "
              "apart from --calib: the labelled top-1 of FP32 and of the shipped graph is "
              "measured there, on images the build never calibrated on")
@click.option("--time-on", "time_on", default=None, metavar="HOST",
              help="time the precision candidates on this device over SSH")
@click.option("--ssh-config", type=click.Path(path_type=Path), help="ssh -F config for --time-on")
@click.option("--device-python", default="python3", show_default=True,
              help="the --time-on device's Python")
@click.option("--fuse/--no-fuse", default=True, show_default=True,
              help="transformers on CPU targets: onnxruntime's attention / LayerNorm / GELU "
                   "fusions before quantizing")
@click.option("--tune", is_flag=True,
              help="time thread counts, optimisation levels and the execution mode with the "
                   "finished bundle here (or on the --time-on device) and keep the fastest as "
                   "the manifest's session options")
@click.option("--offline-optimize", "offline", is_flag=True,
              help="CPU targets: also ship the graph optimised offline by this onnxruntime "
                   "(.onnx or ORT format, whichever loads faster) for a faster start; devices "
                   "with the same onnxruntime version family load it")
@click.option("--openvino", type=click.Choice(["auto", "yes", "no"]), default="auto",
              show_default=True,
              help="x86: also run the candidates under onnxruntime-openvino's OpenVINO provider "
                   "(from .venv-openvino, `make openvino`, or $EDGEPACK_OPENVINO_PYTHON) and list "
                   "it first where it measures faster at the same budget (auto), wherever a graph "
                   "keeps the budget under it (yes), or never (no); devices without it run the "
                   "CPU provider")
@click.option("--runner-extras", default=",".join(RUNNER_EXTRAS), show_default=True,
              metavar="EXTRA,... | none",
              help="what the bundle's runner carries beyond check and bench: infer (run.py "
              "infer, bench FILE), serve (run.py serve; brings infer), tune (bench --tune), "
              "profile (bench --profile), roofline (bench --roofline and its graphs: verify's "
              "share of the device's best rate); none ships only the core and what the bundle "
              "uses, for a smaller runner to audit (docs/commands.md)")
@click.option("--task", "tasks", multiple=True, metavar="[PART=]KIND[:key=value,...] | FILE.toml",
              help="what the model does: classify, detect, embed, ctc, segment, vad, "
              "multilabel, tts or raw (default); the candidates are also judged by the task's "
              "figure (top-1, box recall/precision, nearest neighbour, strings, pixels, speech "
              "frames, F1 of the labels on, log-mel distance of the waveform) and run.py "
              "infer answers in its terms; e.g. detect:decoder=yolov8,score=0.25 or "
              "ctc:alphabet=@chars.txt (docs/tasks.md)")
@click.option("--pipeline", type=click.Path(path_type=Path), default=None,
              metavar="PIPELINE.toml",
              help="instead of MODEL: build the parts a pipeline file names (their models, data, "
              "preprocessing, tasks and the glue between them) into one bundle that run.py infer "
              "runs as a cascade, e.g. an OCR detector, direction classifier and recogniser "
              "(docs/pipelines.md)")
@click.option("--keep", default=None, metavar="FIGURE=SHARE,...",
              help="what the task must keep against FP32 on the held-out samples, over its "
              "defaults (99%; box recall/precision 95%; CER at most 1%): e.g. top1=98%")
@click.option("--require-proof", is_flag=True,
              help="ship INT8 only where the samples could show its budget (else FP32), as a "
              "CI gate wants; by default the fastest candidate within budget on every sample "
              "ships and the build says how strong the evidence is (shown / not proven)")
@budget_options
@quant_options
@export_options(dynamic=False)
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def build_cmd(model: str | None, output: Path, target: str, calib: tuple[str, ...],
              preprocess: str | None, inputs: tuple[str, ...], consts: tuple[str, ...],
              parts: tuple[str, ...],
              part_precision: tuple[str, ...], holdout: float, golden: int | None,
              labels: Path | None, evaluate: Path | None, time_on: str | None,
              ssh_config: Path | None,
              device_python: str, fuse: bool, tune: bool, offline: bool, openvino: str,
              runner_extras: str, tasks: tuple[str, ...], pipeline: Path | None,
              keep: str | None, require_proof: bool, force: bool, as_json: bool,
              **kw: Any) -> None:
    """Build a bundle from MODEL for a target: export, simplify, fix shapes, quantize, bundle.

    MODEL is an .onnx file or a PyTorch model (file.py:factory, pkg.module:factory,
    TorchScript, .pt2; see `edgepack export`), or --pipeline FILE.toml names several.

    \b
    Example:
        edgepack build model.onnx --target x86_64-cpu --calib images/ \\
            --preprocess "size=224x224,resize=letterbox,color=rgb,scale=1/255" -o out/mynet
        edgepack build tts.py:load --part encoder=enc --part decoder=dec \\
            --input encoder/ids:1x32:int64 --input decoder/feats:1x32x32 \\
            --calib encoder=enc.npz --calib decoder=dec.npz -o out/tts
        edgepack build --pipeline ocr.toml -o out/ocr
    """
    from ..build.job import ExportOptions, build
    from ..quantization.request import QuantRequest
    from ..source.specs import parse_assignments, parse_consts, parse_input
    from ..tasks.declare import keep_of, parse_tasks

    opts = export_kwargs(kw)
    opts.pop("dynamic")
    if (model is None) == (pipeline is None):
        raise SpecError("build: give MODEL or --pipeline FILE.toml" if model is None else
                        f"build: MODEL {model} and --pipeline {pipeline} both given",
                        "build one model, or the parts a pipeline file names")
    if pipeline is not None:
        given = [n for n, v in (("--calib", calib), ("--preprocess", preprocess),
                                ("--input", inputs), ("--part", parts), ("--task", tasks),
                                ("--part-precision", part_precision), ("--labels", labels),
                                ("--eval", evaluate)) if v]
        if given:
            raise SpecError(f"{given[0]} with --pipeline: the pipeline file sets it per stage",
                            f"set it in {pipeline}'s [[stage]] tables (docs/pipelines.md)")
    single = [c for c in calib if "=" not in c or Path(c).exists()]
    if len(single) > 1 or (single and len(single) != len(calib)):
        raise SpecError("--calib: give one DIR, or PART=DIR for each part", "see --help")
    precisions = parse_assignments(part_precision, "--part-precision")
    for part, value in precisions.items():
        if value not in ("int8", "fp16", "fp32", "auto"):
            raise SpecError(f"--part-precision {part}={value}: not int8, fp16, fp32 or auto",
                            "pick one of those")
    part_names = list(parse_assignments(parts, "--part")) or ["model"]
    declared = parse_tasks(tasks, part_names)
    kept = keep_of(keep, None) if keep else None
    common = dict(target=target, quant=QuantRequest.of(quant_overrides(kw)), holdout=holdout, golden=golden,
                  timer=_device_timer(time_on, ssh_config, device_python, target),
                  force=force, log=log, progress=progress_bar("calibration"), fuse=fuse,
                  tune=_tuner(tune, time_on, ssh_config, device_python, target),
                  steps=step_line("build", as_json), offline=offline, openvino=openvino,
                  keep=kept, require_proof=require_proof, consts=parse_consts(consts),
                  runner_extras=extras_of(runner_extras),
                  export_options=ExportOptions(**opts), **budget_kwargs(kw))
    if pipeline is not None:
        from ..cascade.build import build_pipeline

        r, _ = build_pipeline(pipeline, output, **common)   # the figure: logged
    else:
        r = build(model, output, calib=Path(single[0]) if single else None,
                  part_calib={k: Path(v) for k, v in
                              parse_assignments([c for c in calib if c not in single],
                                                "--calib").items()},
                  preprocess=preprocess_option(preprocess),
                  inputs=[parse_input(v) for v in inputs],
                  parts=parse_assignments(parts, "--part"),
                  part_quant={k: QuantRequest(precision=v) for k, v in precisions.items()},
                  labels=read_labels(labels), tasks=declared, evaluate=evaluate, **common)
    emit({"directory": str(r.bundle.directory), "archive": str(r.bundle.archive),
          "digest": r.bundle.digest, "parts": [p.summary() for p in r.parts]}, as_json,
         f"built {r.bundle.directory}: " + "; ".join(
             (f"{p.name} " if len(r.parts) > 1 else "") + p.headline() for p in r.parts))


@main.command("compare")
@click.argument("model")
@click.option("--input", "inputs", multiple=True, metavar="NAME:1x3x224x224[:dtype]",
              help=INPUT_HELP)
@click.option("--calib", type=click.Path(path_type=Path),
              help="samples for calibration and accuracy (default: random inputs)")
@click.option("--preprocess", help="image spec for --calib images")
@click.option("--target", default="x86_64-cpu", show_default=True,
              help="quantization presets and threads")
@click.option("--batch", "batches", type=click.IntRange(min=1), multiple=True,
              help="batch sizes (default: 1 and 8)")
@click.option("--variant", "variants", multiple=True,
              help="only these variants (repeatable; default: all)")
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--block", type=click.IntRange(min=1), default=20, show_default=True,
              help="timed calls per row per round (fewer for larger batches)")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="intra-op threads for every row")
@click.option("--cold/--no-cold", default=True, show_default=True,
              help="also time import + load + first call in fresh processes")
@click.option("--chart", type=click.Path(path_type=Path), help="write a PNG bar chart here")
@click.option("--weights", type=click.Path(path_type=Path),
              help=".safetensors or weights-only .pt (PyTorch sources)")
@click.option("--factory-arg", "factory_args", multiple=True, metavar="KEY=VALUE")
@click.option("--submodule", help="compare only this attribute path")
@click.option("--bundle", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="a bundle built from MODEL: its shipped graph is one more row ('shipped')")
@click.option("--audio-rate", type=click.IntRange(min=1000, max=384000), default=None,
              metavar="HZ", help="the first output is speech at HZ: each row's real-time factor "
                                 "(seconds of audio per second of compute; default: a --bundle's "
                                 "tts rate)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def compare_cmd(model: str, inputs: tuple[str, ...], calib: Path | None, preprocess: str | None,
                target: str, batches: tuple[int, ...], variants: tuple[str, ...], rounds: int,
                block: int, threads: int | None, cold: bool, chart: Path | None,
                weights: Path | None, factory_args: tuple[str, ...], submodule: str | None,
                bundle: Path | None, audio_rate: int | None, as_json: bool) -> None:
    """Time every way to run MODEL on this machine, with accuracy: PyTorch eager and
    torch.compile, ONNX Runtime FP32 and optimised, INT8 static (QDQ U8S8 / S8S8, QOperator),
    INT8 dynamic, FP16; batch 1 and a larger batch; cold start apart.

    \b
    Example:
        edgepack compare models/net.py:build_net --weights net.safetensors \\
            --input image:1x3x224x224 --calib images/ --preprocess prep.toml --chart cmp.png
    """
    from ..compare import compare, markdown
    from ..source.specs import parse_assignments, parse_input
    from ..source.torchload import parse_factory_args

    if chart:   # before the minutes of timing, not after
        from ..chart import check_chart_path

        check_chart_path(chart)
    result = compare(model, inputs=[parse_input(v) for v in inputs], calib=calib,
                     preprocess=preprocess_option(preprocess), target=target,
                     batches=batches or (1, 8), rounds=rounds, block=block, threads=threads,
                     variants=variants or None, weights=weights,
                     factory_args=parse_factory_args(parse_assignments(factory_args,
                                                                       "--factory-arg")),
                     submodule=submodule, cold=cold, bundle=bundle, log=log,
                     audio_rate=audio_rate, steps=step_line("compare", as_json))
    if chart:
        from ..chart import render

        render(result, chart)
        result["chart"] = str(chart)
        log(f"chart: {chart}")
    emit(result, as_json, markdown(result).rstrip())


@main.command("targets")
@click.option("--target", metavar="NAME | FILE.toml",
              help="check and show only this profile (your own .toml: errors name the key)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def targets_cmd(target: str | None, as_json: bool) -> None:
    """List the built-in target profiles, or check one (--target).

    \b
    Example:
        edgepack targets
        edgepack targets --target my-board.toml
    """
    from ..targets import list_targets, load_target

    found = [load_target(target)] if target else list_targets()
    data = [{"name": t.name, "arch": t.arch, "description": t.description,
             "providers": [p.name for p in t.providers], "precision": t.quantization.precision,
             "min_onnxruntime": t.min_onnxruntime, "path": str(t.path)} for t in found]
    emit(data, as_json, "\n".join(
        f"{t.name:16} {t.arch:8} {t.quantization.precision:5} "
        f"{'>'.join(p.name.replace('ExecutionProvider', '') for p in t.providers):24} "
        f"{t.description}" for t in found))


@main.command("demo")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("build/demo"),
              show_default=True, help="work directory (data, model, bundle)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def demo_cmd(output: Path, as_json: bool) -> None:
    """Train a small CNN on drawn shapes, build and verify its INT8 bundle (needs torch).

    \b
    Example:
        edgepack demo -o build/demo
    """
    from ..demo import run_demo

    result = run_demo(output, log=log)
    emit(result, as_json, result["summary"])
