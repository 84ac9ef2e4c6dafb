"""Graphs for the providers an INT8 graph does not serve well (FP16 for CUDA on a Jetson).

A QDQ INT8 graph runs INT8 under TensorRT and on CPUs, but under the CUDA provider onnxruntime
adds one Memcpy per quantized weight and it runs about 2x slower than FP32 (measured on an H100,
see targets/jetson-orin.toml). A GPU bundle is INT8 for TensorRT, so the CUDA provider, which a
device falls back to when TensorRT does not load, gets a float graph of its own.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import QuantizationError
from ..graph.execute import Sample
from ..quantization.budget import AccuracyBudget
from ..quantization.quantize import QuantConfig, quantize_file
from ..quantization.search import Candidate
from ..targets import Target


@dataclass(frozen=True)
class ProviderGraph:
    """A float graph shipped beside the part's INT8 graph, for *providers* only."""

    precision: str                  # "fp16" or "fp32"
    model: Path
    providers: tuple[str, ...]
    accuracy: dict[str, Any]        # against FP32 on the held-out samples, as the INT8 graph's
    note: str = ""                  # why it is not the precision the target asked for
    why: str = "a QDQ INT8 graph runs slower than float there"   # why the provider has its own


def provider_graphs(target: Target, config: QuantConfig, fp32: Path, folder: Path,
                    held: Sequence[Sample], budget: AccuracyBudget,
                    labels: Sequence[Any] | None, fp32_outputs: dict[str, Any],
                    log: Callable[[str], None],
                    built: Sequence[Candidate] = ()) -> tuple[ProviderGraph, ...]:
    """The target's providers with `instead_of_int8` get their own graph when *config* is INT8;
    FP16 that misses the budget (or does not convert) becomes FP32. An FP16 candidate the
    precision decision *built* and measured already is used as it is."""
    if config.precision != "int8":
        return ()
    wanted: dict[str, list[str]] = {}
    for provider in target.providers:
        if provider.instead_of_int8:
            wanted.setdefault(provider.instead_of_int8, []).append(provider.name)
    graphs = []
    for precision, providers in wanted.items():
        path, note, accuracy = fp32, "", None
        if precision == "fp16":
            path, accuracy, note = _fp16(config, fp32, folder, held, budget, labels,
                                         fp32_outputs, built)
            if note:
                precision, path, accuracy = "fp32", fp32, None
        if accuracy is None:
            accuracy = budget.evaluate(path, fp32, held, labels, fp32_outputs)
        names = ", ".join(p.replace("ExecutionProvider", "") for p in providers)
        log(f"graphs: {names} get{'s' if len(providers) == 1 else ''} an {precision.upper()} "
            f"graph of {'its' if len(providers) == 1 else 'their'} own (a QDQ INT8 graph runs "
            f"slower than float there){'; ' + note if note else ''}")
        graphs.append(ProviderGraph(precision, path, tuple(providers), accuracy, note))
    return tuple(graphs)


def _fp16(config: QuantConfig, fp32: Path, folder: Path, held: Sequence[Sample],
          budget: AccuracyBudget, labels: Sequence[Any] | None, fp32_outputs: dict[str, Any],
          built: Sequence[Candidate]) -> tuple[Path, dict[str, Any], str]:
    """(path, accuracy, why not) of the FP16 graph: the decision's own candidate when it built
    one, else converted and measured here."""
    done = next((c for c in built if c.config.precision == "fp16"), None)
    if done is not None and done.error:
        return fp32, {}, f"FP16 conversion failed ({done.error}): FP32 instead"
    if done is not None:
        path, accuracy = done.path, done.accuracy
    else:
        path = folder / "provider-fp16.onnx"
        try:
            quantize_file(fp32, path, config=replace(config, precision="fp16", exclude=()))
        except QuantizationError as exc:
            return fp32, {}, f"FP16 conversion failed ({exc.message}): FP32 instead"
        accuracy = budget.evaluate(path, fp32, held, labels, fp32_outputs)
    if not accuracy["budget"]["passed"]:
        return path, accuracy, ("FP16 misses the budget (" + "; ".join(
            accuracy["budget"]["failures"]) + "): FP32 instead")
    return path, accuracy, ""
