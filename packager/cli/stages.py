"""The single-stage commands: inspect, export, simplify, fix-shapes, quantize, debug-quant, bundle."""

from pathlib import Path
from typing import Any

import click

from .base import (
    INPUT_HELP,
    budget_kwargs,
    budget_options,
    emit,
    export_kwargs,
    export_options,
    log,
    main,
    parse_shapes,
    preprocess_option,
    progress_bar,
    quant_options,
    quant_overrides,
    read_labels,
    step_line,
)


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
    from ..graph.inspection import inspect_model, node_list

    info = inspect_model(model)
    if nodes:
        info["node_list"] = node_list(model)
    io = "\n".join(f"  {kind} {v['name']}: {'x'.join(map(str, v['shape']))} {v['dtype']}"
                   for kind, key in (("in ", "inputs"), ("out", "outputs")) for v in info[key])
    ops = ", ".join(f"{k} {v}" for k, v in info["ops"].items())
    flops = f"{info['flops'] / 1e9:.3f} GFLOPs" if info["flops"] else "FLOPs unknown"
    emit(info, as_json,
         f"{model}: IR {info['ir_version']}, opset {info['opset']}, {info['nodes']} nodes, "
         f"{info['parameters']:,} parameters ({info['parameter_bytes'] / 1e6:.2f} MB"
         + (f", {info['parameters_in_constant_nodes']:,} in Constant nodes"
            if info['parameters_in_constant_nodes'] else "") + f"), {flops}"
         f"{', quantized' if info['quantized'] else ''}"
         f"{', external data: ' + ', '.join(info['external_data']) if info['external_data'] else ''}"
         f"\n{io}\n  ops: {ops}" + "".join(f"\n  node {n['name'] or '(unnamed)'}: {n['op']}"
                                            for n in info.get("node_list", [])))


@main.command("export")
@click.argument("source")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True)
@click.option("--input", "inputs", multiple=True, metavar="NAME:1x3x224x224[:dtype]",
              help="one per forward() argument, in order (dtype: float32 unless given)")
@click.option("--const", "consts", multiple=True, metavar="NAME=VALUE",
              help="fix a forward() argument to a value (number, [list] or .npy): forward() "
              "gets it, the graph has no such input (repeatable)")
@export_options
@click.option("--target", default="x86_64-cpu", show_default=True,
              help="decides the default opset")
@click.option("--calib", type=click.Path(path_type=Path),
              help="also validate on these samples (images or .npy/.npz)")
@click.option("--preprocess", help="image spec for --calib images")
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def export_cmd(source: str, output: Path, inputs: tuple[str, ...], consts: tuple[str, ...],
               target: str, calib: Path | None, preprocess: str | None, force: bool,
               as_json: bool, **kw: Any) -> None:
    """Export a PyTorch model to ONNX and check it against PyTorch on the same inputs.

    SOURCE is path/to/file.py:factory, pkg.module:factory (a callable returning an
    nn.Module), a TorchScript file, or a torch.export .pt2 file.

    \b
    Example:
        edgepack export models/net.py:build_net --weights net.safetensors \\
            --input image:1x3x224x224 -o net.onnx
        edgepack export vad.py:make --input x:1x512 --const sr=16000 -o vad.onnx
    """
    from ..source.export import export
    from ..source.specs import parse_consts, parse_input

    specs = [parse_input(v) for v in inputs]
    samples = []
    if calib is not None:
        from ..quantization.calibration import load_samples

        samples = load_samples(calib, inputs=[{"name": s.name, "shape": list(s.shape),
                                               "dtype": s.dtype} for s in specs],
                               preprocess=preprocess_option(preprocess))
    r = export(source, output, inputs=specs, consts=parse_consts(consts), target=target,
               samples=samples, force=force, log=log, **export_kwargs(kw))
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
    from ..graph.simplify import simplify

    r = simplify(model, output, force=force)
    if r.fallback_reason and not as_json:
        log(f"onnxsim not used, fell back to onnxruntime basic optimisation ({r.fallback_reason})")
    emit(r.__dict__, as_json, f"{output}: {r.nodes_before} -> {r.nodes_after} nodes "
         f"({r.simplifier}), opset {r.opset_before} -> {r.opset_after}")


@main.command("fix-shapes")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True)
@click.option("--input", "inputs", multiple=True, help=INPUT_HELP)
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="size for a dynamic dim 0")
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def fix_shapes_cmd(model: Path, output: Path, inputs: tuple[str, ...], batch: int, force: bool,
                   as_json: bool) -> None:
    """Make every dim of MODEL static and infer static shapes for every tensor.

    \b
    Example:
        edgepack fix-shapes model.onnx --input image:1x3x224x224 -o model.static.onnx
    """
    from ..graph.shapes import fix_shapes

    r = fix_shapes(model, output, shapes=parse_shapes(inputs), batch=batch, force=force)
    emit(r.__dict__, as_json, f"{output}: " + ", ".join(
        f"{k} {'x'.join(map(str, v))}" for k, v in {**r.inputs, **r.outputs}.items())
        + (f"; {len(r.dynamic)} tensor(s) have data-dependent shapes and stay dynamic ("
           + ", ".join(r.dynamic[:3]) + (", ..." if len(r.dynamic) > 3 else "") + ")"
           if r.dynamic else ""))


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
    from ..graph.modelio import load_model, opset_of
    from ..graph.simplify import MIN_OPSET
    from ..quantization.budget import accuracy_line, hygiene, measure_accuracy
    from ..quantization.calibration import check_holdout, samples_for_model, split_holdout
    from ..quantization.quantize import QuantConfig, quantize
    from ..targets import load_target

    check_holdout(holdout)
    profile = load_target(target)
    opset = opset_of(load_model(model, external_data=False))
    if opset < MIN_OPSET:
        log(f"quantize: {model} is opset {opset}; it is upgraded to opset {MIN_OPSET} first, as "
            "`edgepack simplify` does (per-channel Q/DQ needs it)")
    overrides = quant_overrides(kw)
    seconds = overrides.pop("search_seconds", None)
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
        from ..quantization.budget import AccuracyBudget
        from ..quantization.calibration import sample_labels
        from ..quantization.checked import quantize_checked

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
            search_seconds=seconds,
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
@click.option("--profile", is_flag=True,
              help="also time both graphs under onnxruntime's profiler: where INT8 loses time")
@click.option("--threads", type=click.IntRange(min=0), default=0, show_default=True,
              help="intra-op threads for --profile (the target's; 0 = onnxruntime's choice)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def debug_quant_cmd(fp32: Path, quantized: Path, calib: Path, preprocess: str | None,
                    samples: int, top: int, damage: float, profile: bool, threads: int,
                    as_json: bool) -> None:
    """Per-layer error of QUANTIZED against FP32, worst first, and the nodes to keep in FP32.

    Every intermediate tensor of both graphs is compared on the same inputs (cosine, SQNR);
    a node's damage is the cosine it loses between its inputs and its output. With --profile,
    onnxruntime's profiler times both graphs per op type: where the INT8 graph loses its time
    (Q/DQ, float islands between integer ops, kernels slower than FP32's).

    \b
    Example:
        edgepack debug-quant model.static.onnx model.int8.onnx --calib images/ \\
            --preprocess prep.toml --profile --threads 2
    """
    from ..quantization.calibration import samples_for_model
    from ..quantization.sensitivity import check_pair, layer_errors, suggest

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
    if profile:
        from ..quantization.profile import profile_pair, profile_rows, table

        pair = profile_pair(fp32, quantized, loaded[0], threads=threads)
        result["profile"] = profile_rows(*pair)
        lines += ["", table(*pair)]
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
@click.option("--min-cosine", type=float, default=None,
              help="with --reference: the budget MODEL must keep (default: the target's)")
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def bundle_cmd(model: Path, output: Path, target: str, reference: Path | None, calib: Path,
               preprocess: str | None, holdout: float, golden: int, labels: Path | None,
               min_cosine: float | None, force: bool, as_json: bool) -> None:
    """Write a bundle directory and .tar.gz for MODEL: runner, manifest, golden data.

    \b
    Example:
        edgepack bundle model.int8.onnx --reference model.static.onnx --calib images/ \\
            --preprocess prep.toml -o out/mynet
    """
    from ..bundle.assemble import PartPayload, bundle
    from ..errors import BudgetMissed
    from ..graph.inspection import check_labels
    from ..graph.modelio import load_model
    from ..hashing import sha256
    from ..quantization.budget import check_min_cosine, measure_accuracy
    from ..quantization.calibration import check_golden, check_holdout, samples_for_model, split_holdout
    from ..quantization.sensitivity import check_pair
    from ..targets import load_target

    check_holdout(holdout)
    check_golden(golden)
    spec = preprocess_option(preprocess)
    names = read_labels(labels)
    if names:
        check_labels(names, load_model(model, check=False, external_data=False), model, labels)
    if reference is not None:
        check_pair(reference, model, same_graph=False, needs_quantized=False)
    profile = load_target(target)
    budget = check_min_cosine(min_cosine) if min_cosine is not None else profile.min_cosine
    _, held = split_holdout(samples_for_model(reference or model, calib, preprocess=spec,
                                              command="bundle"), fraction=holdout)
    precision = _precision_of(model)
    accuracy = measure_accuracy(model, reference, held) if reference else None
    if accuracy is not None:
        # the bundle promises the budget, never the figure it happens to reach
        if not accuracy["cosine_min"] >= budget:
            raise BudgetMissed(
                f"{model} keeps cosine {accuracy['cosine_min']:.4f} to {reference} on "
                f"{accuracy['samples']} held-out samples, below the budget {budget:g} ("
                + ("--min-cosine" if min_cosine is not None else f"{profile.name}'s") + ")",
                "pass --min-cosine to promise less, or let `edgepack build` choose a precision "
                "that keeps it")
        precision["budget_min_cosine"] = budget
    part = PartPayload("model", model, reference, held[:golden], precision, accuracy, spec,
                       names, {"file": Path(model).name, "sha256": sha256(Path(model))})
    r = bundle([part], output, target=profile, force=force)
    if reference is None:
        log("no FP32 reference: the bundle promises to reproduce this host's outputs only, no "
            "accuracy; pass --reference FP32.onnx for that")
    emit({"directory": str(r.directory), "archive": str(r.archive), "digest": r.digest,
          "manifest": r.manifest}, as_json, f"{r.directory}/ and {r.archive}, digest {r.digest}")


def _precision_of(model: Path) -> dict[str, Any]:
    from ..graph.inspection import inspect_model

    info = inspect_model(model)
    if info["quantized"]:
        kind = "int8"
    elif any(i["dtype"] == "float16" for i in info["inputs"]) or "Cast" in info["ops"]:
        kind = "unknown"
    else:
        kind = "fp32"
    return {"precision": kind, "description": f"{kind.upper()} (prebuilt model)"}
