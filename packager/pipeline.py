"""build(): every stage in order for one target, driven by the target profile."""

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .accuracy import measure_accuracy
from .atomic import check_free
from .bundle import BundleResult, archive_path, bundle
from .calibration import list_sources, load_samples, peek_shapes, split_holdout
from .errors import CalibrationError
from .inspection import dims_of, graph_inputs, io_specs
from .modelio import load_model, save_model
from .preprocessing import check_fits, spec_shape
from .quantize import QuantConfig, quantize_file
from .shapes import fix_shapes_proto
from .simplify import simplify_proto
from .targets import Target, load_target

Log = Callable[[str], None]


@dataclass(frozen=True)
class BuildResult:
    bundle: BundleResult
    nodes_before: int
    nodes_after: int
    simplifier: str
    fallback_reason: str
    accuracy: dict[str, Any]
    config: QuantConfig
    calibration_samples: int


def _shapes_for(model, shapes: Mapping[str, Sequence[int]], preprocess, calib: Path | None,
                batch: int) -> dict[str, list[int]]:
    """--input shapes first, then the preprocessing size, then the first calibration tensor."""
    resolved = {k: list(v) for k, v in shapes.items()}
    inputs = graph_inputs(model)
    dynamic = [i for i in inputs if i.name not in resolved and
               not all(isinstance(d, int) and d > 0 for d in dims_of(i))]
    if not dynamic:
        return resolved
    if preprocess and len(inputs) == 1:
        resolved[inputs[0].name] = spec_shape(preprocess, batch)
    elif calib is not None:
        peeked = peek_shapes(calib)
        for value in dynamic:
            shape = peeked.get(value.name) or (peeked.get("") if len(inputs) == 1 else None)
            if shape and len(shape) == len(dims_of(value)):
                resolved[value.name] = shape
    return resolved


def build(model: Path, output: Path, *, target: Target | str, calib: Path | None = None,
          preprocess: dict[str, Any] | None = None, shapes: Mapping[str, Sequence[int]] = {},
          quant: Mapping[str, Any] = {}, holdout: float = 0.2, golden: int = 8,
          labels: Sequence[str] | None = None, name: str | None = None, force: bool = False,
          log: Log = lambda _: None,
          progress: Callable[[int, int], None] | None = None) -> BuildResult:
    """Simplify, fix shapes, quantize (calibrated on *calib*), measure, bundle for *target*.

    *quant* overrides fields of the target's quantization preset (precision, mode, format,
    activation_type, weight_type, per_channel, reduce_range, calibration_method, exclude).
    """
    target = load_target(target) if isinstance(target, str | Path) else target
    output = Path(output)
    check_free(output, force=force)
    check_free(archive_path(output), force=force)
    config = QuantConfig.from_preset(target.quantization, **quant)
    needs_calib = config.precision == "int8" and config.mode == "static"
    if needs_calib and calib is None:
        raise CalibrationError("static INT8 needs calibration data",
                               "pass --calib DIR (images or .npy/.npz), or --mode dynamic")

    if calib is not None:
        list_sources(calib)  # fail before the slow stages when the folder is empty or missing
    proto = load_model(model)
    before = len(proto.graph.node)
    if preprocess:  # before fixing shapes, so a misfit reads as a preprocessing error
        first = io_specs(graph_inputs(proto))[0]
        check_fits(preprocess, first["name"], first["shape"], first["dtype"])
    fixed = fix_shapes_proto(proto, _shapes_for(proto, shapes, preprocess, calib, target.batch),
                             batch=target.batch)
    simplified, simplifier, reason = simplify_proto(fixed, Path(model))
    log(f"simplify: {before} -> {len(simplified.graph.node)} nodes ({simplifier})")
    if reason:
        log(f"simplify: onnxsim not used, fell back to onnxruntime basic optimisation ({reason})")
    inputs = io_specs(graph_inputs(simplified))
    log("shapes: " + ", ".join(f"{i['name']} {'x'.join(map(str, i['shape']))}" for i in inputs))
    if preprocess:
        check_fits(preprocess, inputs[0]["name"], inputs[0]["shape"], inputs[0]["dtype"])

    samples = []
    if calib is not None:
        samples = load_samples(calib, inputs=inputs, preprocess=preprocess, progress=progress)
    if not samples:
        raise CalibrationError("no calibration or evaluation samples",
                               "pass --calib DIR: samples are needed for golden data and accuracy")
    calib_set, held_out = split_holdout(samples, fraction=holdout)
    log(f"calibration: {len(calib_set)} samples, {len(held_out)} held out for accuracy")

    with tempfile.TemporaryDirectory(prefix="edgepack-build-") as tmp:
        fp32 = save_model(simplified, Path(tmp) / "fp32.onnx")
        candidate = Path(tmp) / "model.onnx"
        log(f"quantize: {config.describe()}")
        quantize_file(fp32, candidate, config=config, samples=calib_set, progress=progress)
        accuracy = measure_accuracy(candidate, fp32, held_out)
        log("accuracy vs FP32 on held-out samples: " + accuracy_line(accuracy))
        if accuracy["cosine_min"] < target.min_cosine:
            log(f"warning: cosine {accuracy['cosine_min']:.4f} is below the target's "
                f"min_cosine {target.min_cosine}; try --method entropy/percentile, --exclude "
                "sensitive nodes, or --precision fp16")
        precision = {**config.__dict__, "exclude": list(config.exclude),
                     "description": config.describe(),
                     "calibration_samples": len(calib_set) if needs_calib else 0}
        result = bundle(candidate, output, target=target, reference=fp32,
                        golden_samples=held_out[:golden], precision=precision,
                        accuracy=accuracy, preprocess=preprocess, labels=labels, name=name,
                        source=Path(model), force=force)
    log(f"bundle: {result.directory} and {result.archive}")
    return BuildResult(result, before, len(simplified.graph.node), simplifier, reason, accuracy,
                       config, len(calib_set))


def accuracy_line(acc: dict[str, Any]) -> str:
    text = f"cosine min {acc['cosine_min']:.4f} mean {acc['cosine_mean']:.4f}, " \
           f"max abs {acc['max_abs']:.4g}"
    if "top1_agreement" in acc:
        text += f", top-1 agreement {100 * acc['top1_agreement']:.1f}%"
    return text + f" ({acc['samples']} samples)"
