"""The edgepack command line: parse, call the library, print. Errors become one line."""

import json
import sys
from pathlib import Path
from typing import Any

import click

from .errors import CheckFailed, PackagerError, SpecError

INPUT_HELP = "static input shape NAME:1x3x224x224[:dtype] (repeatable)"
QUANT_OPTIONS = ("precision", "mode", "format", "activation_type", "weight_type", "per_channel",
                 "reduce_range", "calibration_method", "exclude")


class Command(click.Command):
    """Notes --json in the context's meta (shared with the group) for error reporting."""

    def invoke(self, ctx: click.Context) -> Any:
        ctx.meta["edgepack.json"] = bool(ctx.params.get("as_json"))
        return super().invoke(ctx)


def fail(ctx: click.Context, message: str, hint: str, code: int) -> None:
    """One `error:` line on stderr (and, under --json, the same as JSON on stdout); exit."""
    click.echo(f"error: {message}; {hint}" if hint else f"error: {message}", err=True)
    if ctx.meta.get("edgepack.json"):
        click.echo(json.dumps({"error": message, "hint": hint, "exit_code": code}))
    ctx.exit(code)


class Group(click.Group):
    """Turns library errors and Ctrl-C into one line and an exit code, in one place."""

    command_class = Command

    def invoke(self, ctx: click.Context) -> Any:
        debug = ctx.params.get("debug", False)
        try:
            return super().invoke(ctx)
        except PackagerError as exc:
            if debug:
                raise
            fail(ctx, exc.message, exc.hint, exc.exit_code)
        except KeyboardInterrupt:
            note = ("a cut-off copy resumes on the next deploy" if ctx.invoked_subcommand ==
                    "deploy" else "nothing was written")
            click.echo(f"interrupted: {note}", err=True)
            ctx.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # a bug, not bad input: one line unless --debug
            if debug:
                raise
            text = " ".join(str(exc).split())[:300]
            fail(ctx, f"unexpected {type(exc).__name__}: {text}",
                 "this is a bug in edgepack: please report it with the command line "
                 "(rerun with --debug for the traceback)", 3)


def parse_shapes(values: tuple[str, ...]) -> dict[str, list[int]]:
    from .specs import parse_input, shapes_of

    return shapes_of([parse_input(v) for v in values])


def emit(data: Any, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str) if as_json else text)


def log(message: str) -> None:
    from .progress import echo

    echo(message)   # clears a status line first (progress.py) and draws it again after


def step_line(label: str, as_json: bool):
    """A status line for a long multi-step job: on a terminal only, and never under --json."""
    from .progress import Progress

    return None if as_json else Progress(label, stream=sys.stderr)


def progress_bar(label: str):
    """A callback drawing a progress bar on stderr (only on a terminal)."""
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if not sys.stderr.isatty():
            return
        if "bar" not in state or done == 1:
            if "bar" in state:
                state["bar"].render_finish()
            from .progress import clear

            clear()   # a step_line status line; its next step draws it again
            state["bar"] = click.progressbar(length=total, label=label, file=sys.stderr)
        state["bar"].update(1)
        if done == total:
            state["bar"].render_finish()

    return update


def quant_options(func):
    """Options that override the target's quantization preset."""
    opts = [
        click.option("--precision", type=click.Choice(["int8", "fp16", "fp32", "auto"]),
                     default=None, help="force one precision (build's default, auto: the "
                     "fastest candidate that keeps the accuracy budget; forced INT8 that "
                     "misses it is an error)"),
        click.option("--mode", type=click.Choice(["static", "dynamic"]), default=None,
                     help="INT8 static (calibrated) or dynamic"),
        click.option("--format", "format_", type=click.Choice(["qdq", "qoperator"]), default=None,
                     help="QDQ (default) or QOperator graph"),
        click.option("--activation-type", type=click.Choice(["uint8", "int8"]), default=None),
        click.option("--weight-type", type=click.Choice(["uint8", "int8"]), default=None),
        click.option("--per-channel/--per-tensor", default=None, help="weight scales"),
        click.option("--reduce-range/--no-reduce-range", default=None,
                     help="7-bit weights (AVX2-only CPUs)"),
        click.option("--method", type=click.Choice(["minmax", "entropy", "percentile", "auto"]),
                     default=None, help="calibration method (auto: try all three, keep the "
                     "best within the budget)"),
        click.option("--exclude", multiple=True, help="node name to keep in FP32 (repeatable)"),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def budget_options(func):
    """The accuracy budget: what quantization may cost."""
    opts = [
        click.option("--min-cosine", type=float, default=None,
                     help="every held-out output's cosine to FP32 (default: the target's)"),
        click.option("--max-accuracy-drop", default=None, metavar="PERCENT",
                     help="e.g. 1%: accuracy may fall this much (top-1 agreement with FP32, "
                          "or --metric)"),
        click.option("--metric", default=None, metavar="FILE.py:FUNCTION",
                     help="your accuracy: FUNCTION(outputs, labels) -> float, higher is better"),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def budget_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    from .budget import check_min_cosine, load_metric, parse_drop

    drop, metric, cosine = kw.pop("max_accuracy_drop"), kw.pop("metric"), kw.pop("min_cosine")
    return {"min_cosine": check_min_cosine(cosine) if cosine is not None else None,
            "max_accuracy_drop": parse_drop(drop) if drop is not None else None,
            "metric": load_metric(metric) if metric else None}


def quant_overrides(kw: dict[str, Any]) -> dict[str, Any]:
    values = {"precision": kw.pop("precision"), "mode": kw.pop("mode"),
              "format": kw.pop("format_"), "activation_type": kw.pop("activation_type"),
              "weight_type": kw.pop("weight_type"), "per_channel": kw.pop("per_channel"),
              "reduce_range": kw.pop("reduce_range"), "calibration_method": kw.pop("method"),
              "exclude": tuple(kw.pop("exclude")) or None}
    return {k: v for k, v in values.items() if v is not None}


def preprocess_option(value: str | None) -> dict[str, Any] | None:
    from .preprocessing import parse_preprocess

    return parse_preprocess(value) if value else None


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="show tracebacks")
@click.version_option(package_name="edgepack")
def main(debug: bool) -> None:
    """Package ONNX models into verified bundles for edge devices."""


@main.command("inspect")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--nodes", is_flag=True, help="also list every node's name and op (for --exclude)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def inspect_cmd(model: Path, nodes: bool, as_json: bool) -> None:
    """Describe MODEL: opset, inputs/outputs, ops, parameters, FLOPs, quantization.

    \b
    Example:
        edgepack inspect model.onnx
        edgepack inspect model.onnx --nodes
    """
    from .inspection import inspect_model, node_list

    info = inspect_model(model)
    if nodes:
        info["node_list"] = node_list(model)
    io = "\n".join(f"  {kind} {v['name']}: {'x'.join(map(str, v['shape']))} {v['dtype']}"
                   for kind, key in (("in ", "inputs"), ("out", "outputs")) for v in info[key])
    ops = ", ".join(f"{k} {v}" for k, v in info["ops"].items())
    flops = f"{info['flops'] / 1e9:.3f} GFLOPs" if info["flops"] else "FLOPs unknown"
    emit(info, as_json,
         f"{model}: IR {info['ir_version']}, opset {info['opset']}, {info['nodes']} nodes, "
         f"{info['parameters']:,} parameters ({info['parameter_bytes'] / 1e6:.2f} MB), {flops}"
         f"{', quantized' if info['quantized'] else ''}"
         f"{', external data: ' + ', '.join(info['external_data']) if info['external_data'] else ''}"
         f"\n{io}\n  ops: {ops}" + "".join(f"\n  node {n['name'] or '(unnamed)'}: {n['op']}"
                                            for n in info.get("node_list", [])))


def export_options(func=None, *, dynamic: bool = True):
    """Options shared by export and build for PyTorch sources (build has no --dynamic)."""
    if func is None:
        return lambda f: export_options(f, dynamic=dynamic)
    opts = [
        click.option("--weights", type=click.Path(path_type=Path),
                     help=".safetensors, or .pt/.pth state dict (loaded weights_only)"),
        click.option("--factory-arg", "factory_args", multiple=True, metavar="KEY=VALUE",
                     help="keyword argument for the factory (repeatable; Python literals)"),
        click.option("--submodule", help="export only this attribute path, e.g. decoder.g_net"),
        click.option("--opset", type=int, default=None,
                     help="ONNX opset (default: the newest the target's oldest onnxruntime reads)"),
        click.option("--output-name", "output_names", multiple=True,
                     help="name of each output, in order (repeatable)"),
        click.option("--tolerance", type=float, default=None,
                     help="max error vs PyTorch, relative to the output's largest magnitude "
                          "(default 1e-3)"),
    ]
    if dynamic:
        opts.append(click.option("--dynamic", "dynamic", multiple=True,
                                 metavar="NAME:AXIS=label,...",
                                 help="keep these axes dynamic (bundles are always static)"))
    for opt in reversed(opts):
        func = opt(func)
    return func


def export_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    from .export import DEFAULT_TOLERANCE
    from .specs import parse_assignments, parse_dynamic
    from .torchload import parse_factory_args

    tolerance = kw.pop("tolerance")
    return {"weights": kw.pop("weights"), "dynamic": parse_dynamic(kw.pop("dynamic", ())),
            "factory_args": parse_factory_args(parse_assignments(kw.pop("factory_args"),
                                                                 "--factory-arg")),
            "submodule": kw.pop("submodule"),
            "opset": kw.pop("opset"), "output_names": list(kw.pop("output_names")),
            "tolerance": DEFAULT_TOLERANCE if tolerance is None else tolerance}


@main.command("export")
@click.argument("source")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True)
@click.option("--input", "inputs", multiple=True, metavar="NAME:1x3x224x224[:dtype]",
              help="one per forward() argument, in order (dtype: float32 unless given)")
@export_options
@click.option("--target", default="x86_64-cpu", show_default=True,
              help="decides the default opset")
@click.option("--calib", type=click.Path(path_type=Path),
              help="also validate on these samples (images or .npy/.npz)")
@click.option("--preprocess", help="image spec for --calib images")
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def export_cmd(source: str, output: Path, inputs: tuple[str, ...], target: str,
               calib: Path | None, preprocess: str | None, force: bool, as_json: bool,
               **kw: Any) -> None:
    """Export a PyTorch model to ONNX and check it against PyTorch on the same inputs.

    SOURCE is path/to/file.py:factory, pkg.module:factory (a callable returning an
    nn.Module), a TorchScript file, or a torch.export .pt2 file.

    \b
    Example:
        edgepack export models/net.py:build_net --weights net.safetensors \\
            --input image:1x3x224x224 -o net.onnx
    """
    from .export import export
    from .specs import parse_input

    specs = [parse_input(v) for v in inputs]
    samples = []
    if calib is not None:
        from .calibration import load_samples

        samples = load_samples(calib, inputs=[{"name": s.name, "shape": list(s.shape),
                                               "dtype": s.dtype} for s in specs],
                               preprocess=preprocess_option(preprocess))
    r = export(source, output, inputs=specs, target=target, samples=samples, force=force,
               log=log, **export_kwargs(kw))
    # export() logged the validation line already
    emit(r.to_dict(), as_json, f"{output}: opset {r.opset}, {r.nodes} nodes, {r.exporter}")


@main.command("simplify")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True)
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def simplify_cmd(model: Path, output: Path, force: bool, as_json: bool) -> None:
    """Simplify MODEL with onnxsim (ONNX Runtime's basic optimiser if onnxsim fails).

    Also upgrades models below opset 13 and folds Constant nodes into initializers.

    \b
    Example:
        edgepack simplify model.onnx -o model.sim.onnx
    """
    from .simplify import simplify

    r = simplify(model, output, force=force)
    if r.fallback_reason and not as_json:
        log(f"onnxsim not used, fell back to onnxruntime basic optimisation ({r.fallback_reason})")
    emit(r.__dict__, as_json, f"{output}: {r.nodes_before} -> {r.nodes_after} nodes "
         f"({r.simplifier}), opset {r.opset_before} -> {r.opset_after}")


@main.command("fix-shapes")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True)
@click.option("--input", "inputs", multiple=True, help=INPUT_HELP)
@click.option("--batch", type=int, default=1, show_default=True, help="size for a dynamic dim 0")
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def fix_shapes_cmd(model: Path, output: Path, inputs: tuple[str, ...], batch: int, force: bool,
                   as_json: bool) -> None:
    """Make every dim of MODEL static and infer static shapes for every tensor.

    \b
    Example:
        edgepack fix-shapes model.onnx --input image:1x3x224x224 -o model.static.onnx
    """
    from .shapes import fix_shapes

    r = fix_shapes(model, output, shapes=parse_shapes(inputs), batch=batch, force=force)
    emit(r.__dict__, as_json, f"{output}: " + ", ".join(
        f"{k} {'x'.join(map(str, v))}" for k, v in {**r.inputs, **r.outputs}.items()))


@main.command("quantize")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True)
@click.option("--target", default="x86_64-cpu", show_default=True, help="preset source")
@click.option("--calib", type=click.Path(path_type=Path), help="images or .npy/.npz folder")
@click.option("--preprocess", help="image spec (key=value,...) or a .toml file")
@click.option("--holdout", type=float, default=0.2, show_default=True,
              help="fraction of samples kept out of calibration to measure accuracy")
@quant_options
@budget_options
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def quantize_cmd(model: Path, output: Path, target: str, calib: Path | None,
                 preprocess: str | None, holdout: float, force: bool, as_json: bool,
                 **kw: Any) -> None:
    """Quantize a static-shaped MODEL (INT8 static/dynamic, FP16) and measure accuracy.

    The preset (QDQ, activation/weight types, per-channel, method) comes from --target;
    options override it.

    \b
    Example:
        edgepack quantize model.static.onnx --calib images/ \\
            --preprocess "size=224x224,scale=1/255" -o model.int8.onnx
    """
    from .accuracy import measure_accuracy
    from .budget import hygiene
    from .calibration import check_holdout, samples_for_model, split_holdout
    from .pipeline import accuracy_line
    from .quantize import QuantConfig, quantize
    from .targets import load_target

    check_holdout(holdout)
    profile = load_target(target)
    overrides = quant_overrides(kw)
    config = QuantConfig.from_preset(profile.quantization, **overrides)
    limits = budget_kwargs(kw)
    if config.precision == "auto":
        raise click.UsageError("--precision auto needs the whole build (it times candidates); "
                               "use `edgepack build` (auto is its default), or `edgepack "
                               "compare`")
    spec = preprocess_option(preprocess)
    calib_set, held = [], []
    if calib is not None:
        samples = samples_for_model(model, calib, preprocess=spec, command="quantize",
                                    progress=progress_bar("decoding"))
        calib_set, held = split_holdout(samples, fraction=holdout)
        if config.precision == "int8" and config.mode == "static":
            for note in hygiene(calib_set, held):
                log(f"warning: {note}")
    result: dict[str, Any] = {}
    wants_budget = any(v is not None for v in limits.values())
    if config.calibration_method == "auto" or wants_budget:
        from .budget import AccuracyBudget, quantize_checked
        from .calibration import sample_labels

        metric = limits["metric"]
        guard = AccuracyBudget(
            min_cosine=limits["min_cosine"] if limits["min_cosine"] is not None else
            (profile.min_cosine if not limits["max_accuracy_drop"] else None),
            max_drop=limits["max_accuracy_drop"], metric=metric[0] if metric else None,
            metric_name=metric[1] if metric else "")
        labels = sample_labels(calib, len(calib_set) + len(held), holdout) if metric and \
            calib is not None else None
        config, _, result["budget"] = quantize_checked(
            model, output, config=config, calib=calib_set, held=held, budget=guard,
            labels=labels, pinned=frozenset(overrides) - {"precision"}, force=force, log=log,
            progress=progress_bar("calibrating"), steps=step_line("quantize", as_json))
    else:
        quantize(model, output, config=config, samples=calib_set, force=force,
                 progress=progress_bar("calibrating"))
    result.update({"output": str(output), "config": config.describe(), "calibration_samples":
                   len(calib_set)})
    text = f"{output}: {config.describe()}"
    if held:
        result["accuracy"] = measure_accuracy(output, model, held)
        text += "\naccuracy vs FP32: " + accuracy_line(result["accuracy"])
    emit(result, as_json, text)


@main.command("debug-quant")
@click.argument("fp32", type=click.Path(path_type=Path))
@click.argument("quantized", type=click.Path(path_type=Path))
@click.option("--calib", type=click.Path(path_type=Path), required=True,
              help="samples to run both models on (images or .npy/.npz)")
@click.option("--preprocess", help="image spec for --calib images")
@click.option("--samples", type=int, default=8, show_default=True, help="samples compared")
@click.option("--top", type=int, default=20, show_default=True, help="rows shown")
@click.option("--damage", type=float, default=0.01, show_default=True,
              help="cosine a node may lose before it is a candidate for FP32")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def debug_quant_cmd(fp32: Path, quantized: Path, calib: Path, preprocess: str | None,
                    samples: int, top: int, damage: float, as_json: bool) -> None:
    """Per-layer error of QUANTIZED against FP32, worst first, and the nodes to keep in FP32.

    Every intermediate tensor of both graphs is compared on the same inputs (cosine, SQNR);
    a node's damage is the cosine it loses between its inputs and its output.

    \b
    Example:
        edgepack debug-quant model.static.onnx model.int8.onnx --calib images/ \\
            --preprocess prep.toml
    """
    from .calibration import samples_for_model
    from .sensitivity import check_pair, layer_errors, suggest

    loaded = samples_for_model(fp32, calib, preprocess=preprocess_option(preprocess),
                               command="debug-quant")
    check_pair(fp32, quantized)
    rows = layer_errors(fp32, quantized, loaded[:max(1, samples)])
    risky = [r for r in rows if r["damage"] >= damage]
    picks = suggest(risky, [], count=len(risky)) if risky else []
    result = {"samples": min(len(loaded), samples), "layers": rows,
              "would_exclude": [{"node": n, "why": why} for n, why in picks]}
    lines = ["| node | op | output cosine | SQNR dB | damage | quantized |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['node'] or r['output']} | {r['op']} | {r['cosine']:.5f} | "
              f"{r['sqnr_db']:.1f} | {r['damage']:.5f} | {'yes' if r['quantized'] else 'no'} |"
              for r in rows[:top]]
    lines.append("")
    lines.append("would keep in FP32: " + ("; ".join(f"{n} ({why})" for n, why in picks)
                                           if picks else f"nothing (no node loses {damage})"))
    emit(result, as_json, "\n".join(lines))


@main.command("bundle")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True)
@click.option("--target", default="x86_64-cpu", show_default=True)
@click.option("--reference", type=click.Path(path_type=Path),
              help="the FP32 model: golden outputs and the accuracy claim (without it the bundle "
                   "promises only to reproduce MODEL's outputs)")
@click.option("--calib", type=click.Path(path_type=Path), required=True,
              help="samples for golden inputs (the held-out ones, as in quantize)")
@click.option("--preprocess", help="image spec (key=value,...) or a .toml file")
@click.option("--holdout", type=float, default=0.2, show_default=True)
@click.option("--golden", type=int, default=8, show_default=True, help="golden samples to store")
@click.option("--labels", type=click.Path(exists=True, path_type=Path),
              help="text file, one class name per line")
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def bundle_cmd(model: Path, output: Path, target: str, reference: Path | None, calib: Path,
               preprocess: str | None, holdout: float, golden: int, labels: Path | None,
               force: bool, as_json: bool) -> None:
    """Write a bundle directory and .tar.gz for MODEL: runner, manifest, golden data.

    \b
    Example:
        edgepack bundle model.int8.onnx --reference model.static.onnx --calib images/ \\
            --preprocess prep.toml -o out/mynet
    """
    from .accuracy import measure_accuracy
    from .bundle import PartPayload, bundle, sha256
    from .calibration import check_golden, check_holdout, samples_for_model, split_holdout
    from .inspection import check_labels
    from .modelio import load_model
    from .sensitivity import check_pair
    from .targets import load_target

    check_holdout(holdout)
    check_golden(golden)
    spec = preprocess_option(preprocess)
    names = _labels(labels)
    if names:
        check_labels(names, load_model(model, check=False, external_data=False), model, labels)
    if reference is not None:
        check_pair(reference, model, same_graph=False)
    _, held = split_holdout(samples_for_model(reference or model, calib, preprocess=spec,
                                              command="bundle"), fraction=holdout)
    part = PartPayload("model", model, reference, held[:golden], _precision_of(model),
                       measure_accuracy(model, reference, held) if reference else None, spec,
                       names, {"file": Path(model).name, "sha256": sha256(Path(model))})
    r = bundle([part], output, target=load_target(target), force=force)
    if reference is None:
        log("no FP32 reference: the bundle promises to reproduce this host's outputs only, no "
            "accuracy; pass --reference FP32.onnx for that")
    emit({"directory": str(r.directory), "archive": str(r.archive), "digest": r.digest,
          "manifest": r.manifest}, as_json, f"{r.directory}/ and {r.archive}, digest {r.digest}")


def _device_timer(host: str | None, ssh_config: Path | None, python: str, target: str):
    if host is None:
        return None
    from .autoprecision import remote_timer
    from .inventory import parse_host
    from .targets import load_target

    return remote_timer(parse_host(host), ssh_config=ssh_config, python=python,
                        providers=load_target(target).providers, log=log)


def _tuner(tune: bool, host: str | None, ssh_config: Path | None, python: str, target: str):
    """build --tune's tuner: on the --time-on device, else here when this machine is one."""
    if not tune:
        return None
    import platform

    from .autoprecision import GPU_PROVIDERS
    from .inventory import parse_host
    from .targets import load_target
    from .tuning import local_tuner, remote_tuner

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


def _labels(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise SpecError(f"--labels {path}: not a text file (byte {exc.start} is not UTF-8)",
                        "give a text file with one class name per line") from None
    labels = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not labels:
        raise SpecError(f"--labels {path}: no class names in the file",
                        "one class name per line")
    return labels


def _precision_of(model: Path) -> dict[str, Any]:
    from .inspection import inspect_model

    info = inspect_model(model)
    if info["quantized"]:
        kind = "int8"
    elif any(i["dtype"] == "float16" for i in info["inputs"]) or "Cast" in info["ops"]:
        kind = "unknown"
    else:
        kind = "fp32"
    return {"precision": kind, "description": f"{kind.upper()} (prebuilt model)"}


@main.command("verify")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--runs", type=int, default=100, show_default=True)
@click.option("--warmup", type=int, default=10, show_default=True)
@click.option("--threads", type=int, default=None, help="override the session's threads")
@click.option("--tune", is_flag=True,
              help="first time thread counts, optimisation levels and the execution mode "
                   "here (run.py bench --tune) and keep the fastest for this machine")
@click.option("--latency-budget-ms", type=float, default=None, help="p90 ceiling")
@click.option("--python", default=sys.executable, show_default="this Python",
              help="interpreter that runs run.py")
@click.option("--expect-digest", metavar="SHA256",
              help="refuse unless the bundle's digest (printed by build) is this one")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def verify_cmd(bundle: Path, runs: int, warmup: int, threads: int | None, tune: bool,
               latency_budget_ms: float | None, python: str, expect_digest: str | None,
               as_json: bool) -> None:
    """Run BUNDLE's own run.py as the device would: integrity, accuracy, latency, memory.

    Writes BUNDLE/reports/report.json and report.md. Exit 0 pass, 1 a check failed, 2 bad input.

    \b
    Example:
        edgepack verify out/mynet --runs 200
    """
    from .verify import verify

    report = verify(bundle, python=python, runs=runs, warmup=warmup, threads=threads,
                    latency_budget_ms=latency_budget_ms, expect_digest=expect_digest, tune=tune)
    if as_json:
        emit(report, True, "")
    else:
        from .verify import render_markdown

        click.echo(render_markdown(report).rstrip())
    if not report["passed"]:
        raise CheckFailed(f"{bundle}: verification failed",
                          f"see {bundle}/reports/report.md")


@main.command("deploy")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("hosts", nargs=-1)
@click.option("--hosts", "inventory", type=click.Path(path_type=Path),
              help="inventory: one host per line, or Ansible INI")
@click.option("--port", type=int, help="ssh port (default: ssh's, or ~/.ssh/config)")
@click.option("--identity", type=click.Path(path_type=Path), help="private key for ssh -i")
@click.option("--ssh-config", type=click.Path(path_type=Path), help="ssh -F config file")
@click.option("--remote-dir", help="where the bundle goes (default ~/edgepack/NAME)")
@click.option("--python", "remote_python", default="python3", show_default=True,
              help="the device's Python")
@click.option("--transfer", type=click.Choice(["auto", "rsync", "scp"]), default="auto",
              show_default=True, help="rsync when both ends have it, else scp")
@click.option("--checksum", is_flag=True, help="compare contents, not size and time (rsync)")
@click.option("--bwlimit", type=int, default=None, metavar="KB/S",
              help="limit the copy's bandwidth (slow or metered links)")
@click.option("--runs", type=int, default=100, show_default=True)
@click.option("--warmup", type=int, default=10, show_default=True)
@click.option("--threads", type=int, default=None, help="override the session's threads")
@click.option("--tune", is_flag=True,
              help="first time thread counts, optimisation levels and the execution mode on "
                   "each device (run.py bench --tune) and keep the fastest there")
@click.option("--latency-budget-ms", type=float, default=None, help="p90 ceiling")
@click.option("--require-provider", default=None, help="fail unless this provider runs")
@click.option("--allow-fallback", is_flag=True,
              help="run even when the device lacks the target's providers")
@click.option("--parallel", type=int, default=4, show_default=True,
              help="devices deployed at once (Ansible's forks)")
@click.option("--timeout", type=float, default=900.0, show_default=True,
              help="seconds per remote step")
@click.option("--expect-digest", metavar="SHA256",
              help="refuse unless the bundle's digest (printed by build) is this one")
@click.option("--engine", type=click.Choice(["ssh", "ansible"]), default="ssh", show_default=True,
              help="ssh: edgepack's own fan-out; ansible: ansible-playbook with the "
                   "edgepack_bundle role (pip install 'edgepack[fleet]')")
@click.option("--limit", metavar="PATTERN", help="Ansible host pattern within --hosts")
@click.option("--canary", type=int, default=0, metavar="N",
              help="deploy and verify N hosts first; stop if any fails")
@click.option("--batch", metavar="N|P%", help="rolling batches of N hosts or P% of them")
@click.option("--max-fail", metavar="P%",
              help="stop the rollout once more than P% of the hosts done so far failed")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def deploy_cmd(bundle: Path, hosts: tuple[str, ...], inventory: Path | None, port: int | None,
               identity: Path | None, ssh_config: Path | None, remote_dir: str | None,
               remote_python: str, transfer: str, checksum: bool, bwlimit: int | None,
               runs: int, warmup: int,
               threads: int | None, tune: bool, latency_budget_ms: float | None,
               require_provider: str | None, allow_fallback: bool, parallel: int,
               timeout: float, expect_digest: str | None, engine: str, limit: str | None,
               canary: int, batch: str | None, max_fail: str | None, as_json: bool) -> None:
    """Copy BUNDLE to devices, check them, verify there, bring the reports back.

    Each version goes to DIR/releases/ID on the device and DIR/current points at it only once
    it passed its check there; DIR/previous keeps the one before (a host that fails keeps the
    release it had). Uses your OpenSSH client and ~/.ssh/config, or with --engine ansible your
    inventory and ansible.cfg; host keys are checked strictly and no password is ever used.
    Reports land in BUNDLE/reports/HOST/.
    Exit 0 all passed, 1 a check failed, 2 a device was unreachable or failed preflight.

    \b
    Example:
        edgepack deploy out/net.tar.gz pi@raspberrypi.local
        edgepack deploy out/net --hosts devices.ini --parallel 8 --json > fleet.json
        edgepack deploy out/net.tar.gz --hosts fleet.yml --engine ansible \\
            --canary 2 --batch 25% --max-fail 10%
    """
    from .deploy import DeployOptions, deploy, summary_table
    from .inventory import parse_host
    from .rollout import Rollout, parse_batch, parse_percent

    plan = Rollout(canary=canary, batch=parse_batch(batch),
                   max_fail=parse_percent(max_fail, "--max-fail"))
    if limit and not inventory:
        raise PackagerError("--limit selects hosts of an inventory", "add --hosts INVENTORY")
    if engine == "ansible" and (transfer != "auto" or bwlimit):
        raise PackagerError(f"--{'transfer' if transfer != 'auto' else 'bwlimit'} is for "
                            "--engine ssh; Ansible copies the archive with its own settings",
                            "drop the option, or set it in ansible.cfg")
    targets = [parse_host(h) for h in hosts] + (
        resolve_inventory(inventory, limit, engine) if inventory else [])
    options = DeployOptions(remote_dir=remote_dir, python=remote_python, ssh_config=ssh_config,
                            port=port, identity=identity, transfer=transfer, checksum=checksum,
                            bwlimit_kbps=bwlimit,
                            runs=runs, warmup=warmup, threads=threads, tune=tune,
                            latency_budget_ms=latency_budget_ms,
                            require_provider=require_provider, allow_fallback=allow_fallback,
                            timeout=timeout, expect_digest=expect_digest)
    results = deploy(bundle, targets, options=options, parallel=parallel, log=log, engine=engine,
                     rollout=plan, inventories=[inventory] if inventory else [])
    code = max(r.exit_code for r in results)
    stopped = next((r.skipped for r in results if r.skipped), "")
    if as_json:
        emit({"passed": code == 0, "engine": engine, "stopped": stopped,
              "hosts": [r.to_dict() for r in results]}, True, "")
    else:
        if len(results) == 1 and results[0].report:
            from .verify import render_markdown

            click.echo(render_markdown(results[0].report).rstrip())
        click.echo(summary_table(results))
    if code:
        click.get_current_context().exit(code)


def resolve_inventory(path: Path, limit: str | None, engine: str) -> list:
    """Hosts of an inventory as Ansible sees them when ansible-core is installed (YAML, groups,
    host_vars, --limit: both engines get the same hosts), else edgepack's INI reader."""
    from .fleet import INSTALL, ansible_tool, inventory_hosts
    from .inventory import read_inventory

    try:
        ansible_tool("ansible-inventory")
    except PackagerError:
        if engine == "ansible":
            raise
        if limit or path.suffix in (".yml", ".yaml") or path.is_dir():
            raise PackagerError(f"--hosts {path}: "
                                + ("--limit" if limit else "a YAML inventory or folder")
                                + " needs ansible-core to read it", INSTALL) from None
        return read_inventory(path)
    return inventory_hosts([path], limit)


@main.command("ansible-role")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("roles"),
              show_default=True, help="the roles/ folder of your playbooks")
@click.option("--force", is_flag=True, help="replace an edgepack_bundle role that differs")
def ansible_role_cmd(output: Path, force: bool) -> None:
    """Write the edgepack_bundle Ansible role into OUTPUT/edgepack_bundle.

    The role deploys a bundle's .tar.gz and verifies it on each device before putting it in
    use, with ansible-core's built-in modules only; a second run with the same bundle changes
    nothing. Its variables are in OUTPUT/edgepack_bundle/defaults/main.yml, its README says
    how to use it.

    \b
    Example:
        edgepack ansible-role -o roles/
        ansible-playbook -i fleet.yml site.yml -e edgepack_bundle=out/net.tar.gz
    """
    from .ansible_role import write_role

    dest, changed = write_role(output, force=force)
    click.echo(f"wrote {dest}/" if changed else f"{dest}/ is already this edgepack's role; "
               "nothing changed")


@main.command("build")
@click.argument("model")
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
              "bundle's inputs and If branches on it fold away (repeatable)")
@click.option("--part", "parts", multiple=True, metavar="NAME=ATTR_OR_FACTORY",
              help="bundle this part of the PyTorch model as its own model (repeatable)")
@click.option("--part-precision", "part_precision", multiple=True, metavar="PART=PRECISION",
              help="int8, fp16 or fp32 for one part (repeatable)")
@click.option("--holdout", type=float, default=0.2, show_default=True,
              help="fraction of samples kept out of calibration to measure accuracy")
@click.option("--golden", type=int, default=8, show_default=True, help="golden samples to store")
@click.option("--labels", type=click.Path(exists=True, path_type=Path),
              help="text file, one class name per line")
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
@budget_options
@quant_options
@export_options(dynamic=False)
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def build_cmd(model: str, output: Path, target: str, calib: tuple[str, ...],
              preprocess: str | None, inputs: tuple[str, ...], consts: tuple[str, ...],
              parts: tuple[str, ...],
              part_precision: tuple[str, ...], holdout: float, golden: int,
              labels: Path | None, time_on: str | None, ssh_config: Path | None,
              device_python: str, fuse: bool, tune: bool, offline: bool, force: bool,
              as_json: bool, **kw: Any) -> None:
    """Build a bundle from MODEL for a target: export, simplify, fix shapes, quantize, bundle.

    MODEL is an .onnx file or a PyTorch model (file.py:factory, pkg.module:factory,
    TorchScript, .pt2; see `edgepack export`).

    \b
    Example:
        edgepack build model.onnx --target x86_64-cpu --calib images/ \\
            --preprocess "size=224x224,resize=letterbox,color=rgb,scale=1/255" -o out/mynet
        edgepack build tts.py:load --part encoder=enc --part decoder=dec \\
            --input encoder/ids:1x32:int64 --input decoder/feats:1x32x32 \\
            --calib encoder=enc.npz --calib decoder=dec.npz -o out/tts
    """
    from .pipeline import ExportOptions, build
    from .specs import parse_assignments, parse_consts, parse_input

    opts = export_kwargs(kw)
    opts.pop("dynamic")
    single = [c for c in calib if "=" not in c or Path(c).exists()]
    if len(single) > 1 or (single and len(single) != len(calib)):
        raise SpecError("--calib: give one DIR, or PART=DIR for each part", "see --help")
    precisions = parse_assignments(part_precision, "--part-precision")
    for part, value in precisions.items():
        if value not in ("int8", "fp16", "fp32", "auto"):
            raise SpecError(f"--part-precision {part}={value}: not int8, fp16, fp32 or auto",
                            "pick one of those")
    r = build(model, output, target=target,
              calib=Path(single[0]) if single else None,
              part_calib={k: Path(v) for k, v in
                          parse_assignments([c for c in calib if c not in single],
                                            "--calib").items()},
              preprocess=preprocess_option(preprocess),
              inputs=[parse_input(v) for v in inputs], quant=quant_overrides(kw),
              consts=parse_consts(consts), parts=parse_assignments(parts, "--part"),
              part_quant={k: {"precision": v} for k, v in precisions.items()},
              export_options=ExportOptions(**opts), holdout=holdout, golden=golden,
              timer=_device_timer(time_on, ssh_config, device_python, target),
              **budget_kwargs(kw),
              labels=_labels(labels), force=force, log=log, progress=progress_bar("calibration"),
              fuse=fuse, tune=_tuner(tune, time_on, ssh_config, device_python, target),
              steps=step_line("build", as_json), offline=offline)
    emit({"directory": str(r.bundle.directory), "archive": str(r.bundle.archive),
          "digest": r.bundle.digest, "parts": [p.summary() for p in r.parts]}, as_json,
         f"built {r.bundle.directory}: " + "; ".join(
             (f"{p.name} " if len(r.parts) > 1 else "") + p.config.describe() for p in r.parts))


@main.command("compare")
@click.argument("model")
@click.option("--input", "inputs", multiple=True, metavar="NAME:1x3x224x224[:dtype]",
              help=INPUT_HELP)
@click.option("--calib", type=click.Path(path_type=Path),
              help="samples for calibration and accuracy (default: random inputs)")
@click.option("--preprocess", help="image spec for --calib images")
@click.option("--target", default="x86_64-cpu", show_default=True,
              help="quantization presets and threads")
@click.option("--batch", "batches", type=int, multiple=True,
              help="batch sizes (default: 1 and 8)")
@click.option("--variant", "variants", multiple=True,
              help="only these variants (repeatable; default: all)")
@click.option("--rounds", type=int, default=5, show_default=True)
@click.option("--block", type=int, default=20, show_default=True,
              help="timed calls per engine per round (fewer for larger batches)")
@click.option("--threads", type=int, default=None, help="intra-op threads for every engine")
@click.option("--cold/--no-cold", default=True, show_default=True,
              help="also time import + load + first call in fresh processes")
@click.option("--chart", type=click.Path(path_type=Path), help="write a PNG bar chart here")
@click.option("--weights", type=click.Path(path_type=Path),
              help=".safetensors or weights-only .pt (PyTorch sources)")
@click.option("--factory-arg", "factory_args", multiple=True, metavar="KEY=VALUE")
@click.option("--submodule", help="compare only this attribute path")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def compare_cmd(model: str, inputs: tuple[str, ...], calib: Path | None, preprocess: str | None,
                target: str, batches: tuple[int, ...], variants: tuple[str, ...], rounds: int,
                block: int, threads: int | None, cold: bool, chart: Path | None,
                weights: Path | None, factory_args: tuple[str, ...], submodule: str | None,
                as_json: bool) -> None:
    """Time every way to run MODEL on this machine, with accuracy: PyTorch eager and
    torch.compile, ONNX Runtime FP32 and optimised, INT8 static (QDQ U8S8 / S8S8, QOperator),
    INT8 dynamic, FP16; batch 1 and a larger batch; cold start apart.

    \b
    Example:
        edgepack compare models/net.py:build_net --weights net.safetensors \\
            --input image:1x3x224x224 --calib images/ --preprocess prep.toml --chart cmp.png
    """
    from .compare import compare, markdown
    from .specs import parse_assignments, parse_input
    from .torchload import parse_factory_args

    if chart:   # before the minutes of timing, not after
        from .chart import check_chart_path

        check_chart_path(chart)
    result = compare(model, inputs=[parse_input(v) for v in inputs], calib=calib,
                     preprocess=preprocess_option(preprocess), target=target,
                     batches=batches or (1, 8), rounds=rounds, block=block, threads=threads,
                     variants=variants or None, weights=weights,
                     factory_args=parse_factory_args(parse_assignments(factory_args,
                                                                       "--factory-arg")),
                     submodule=submodule, cold=cold, log=log,
                     steps=step_line("compare", as_json))
    if chart:
        from .chart import render

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
    from .targets import list_targets, load_target

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
    from .demo import run_demo

    result = run_demo(output, log=log)
    emit(result, as_json, result["summary"])


if __name__ == "__main__":
    main()
