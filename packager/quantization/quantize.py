"""Quantize an FP32 model: static INT8 from calibration samples, dynamic INT8, or FP16."""

import contextlib
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..atomic import atomic_file
from ..errors import ModelError, QuantizationError
from ..graph import modelio
from ..graph.execute import Sample
from ..graph.modelio import load_model, save_model
from ..graph.simplify import upgrade_opset
from ..targets import QuantPreset

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class QuantConfig(QuantPreset):
    """A target's preset plus per-build choices."""

    exclude: tuple[str, ...] = field(default_factory=tuple)
    op_types: tuple[str, ...] = field(default_factory=tuple)   # quantize only these op types
    # who places the Q/DQ pairs: "onnxruntime" (quantize_static) or "nncf" (nncf_generator.py,
    # its own placement and ranges: the calibration and placement fields above do not apply)
    generator: str = "onnxruntime"
    transformer: bool = False   # NNCF's transformer model type (SmoothQuant, fewer quantizers)
    nncf_ranges: str = "default"   # NNCF's activation ranges: its default estimator or "minmax"

    @property
    def streams(self) -> bool:
        """Whether its calibration reduces each sample's statistics as it goes (NNCF), so
        that it may take every calibration sample where onnxruntime's calibrator, which holds
        every tensor of every sample at once, takes what memory fits."""
        return self.precision == "int8" and self.mode == "static" and self.generator == "nncf"

    @classmethod
    def from_preset(cls, preset: QuantPreset, **overrides: Any) -> "QuantConfig":
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(cls(**asdict(preset)), **given)

    def describe(self) -> str:
        if self.precision == "auto":
            return "auto (fastest precision within the accuracy budget)"
        if self.precision != "int8":
            return self.precision.upper()
        if self.mode == "given":
            return "INT8 (as given)"
        if self.generator == "nncf":
            ranges = "" if self.nncf_ranges == "default" else f", {self.nncf_ranges} ranges"
            return (f"INT8 static QDQ by NNCF {'(transformer) ' if self.transformer else ''}"
                    f"(default preset, fast bias correction{ranges}){self._scope()}")
        if self.mode == "dynamic":
            return (f"INT8 dynamic ({'per-channel' if self.per_channel else 'per-tensor'} weights"
                    f"{self._scope()})")
        act = "U8" if self.activation_type == "uint8" else "S8"
        wt = "U8" if self.weight_type == "uint8" else "S8"
        extra = (", symmetric" if self.symmetric_activations else "") + \
            ("" if self.quantize_bias else ", float bias") + self._scope()
        return (f"INT8 static {self.format.upper()} {act}{wt}, "
                f"{'per-channel' if self.per_channel else 'per-tensor'}, {self.calibration_method}"
                f"{extra}")

    def _scope(self) -> str:
        text = ", 7-bit weights" if self.reduce_range else ""
        text += f", only {'/'.join(self.op_types)}" if self.op_types else ""
        if self.exclude:
            text += f", {len(self.exclude)} node{'s' if len(self.exclude) > 1 else ''} FP32"
        return text


class OverTime(QuantizationError):
    """Calibration stopped: at the pace of its first samples it would end past its deadline."""


class _Reader:
    """onnxruntime CalibrationDataReader over in-memory samples, reporting progress.

    With a *deadline* (time.perf_counter() seconds) it stops the calibration (OverTime) once the
    samples run so far say it would end later: onnxruntime runs every sample, then builds its
    ranges from all outputs at once, which costs about as much again (histograms: CenterFace's
    9 runs took 13 s, its histograms 11 s)."""

    def __init__(self, samples: Sequence[Sample], progress: Progress | None,
                 deadline: float | None = None):
        self.samples, self.progress, self.index = samples, progress, 0
        self.deadline, self.began = deadline, 0.0

    def get_next(self) -> Sample | None:
        if self.index >= len(self.samples):
            return None
        now = time.perf_counter()
        if self.index == 0:
            self.began = now
        elif self.deadline is not None and self.index >= 2:
            per = (now - self.began) / self.index
            end = now + per * (len(self.samples) - self.index) + per * len(self.samples)
            if end > self.deadline:
                raise OverTime(f"calibration stopped after {self.index} of {len(self.samples)} "
                               f"samples: at {per:.1f} s per sample it would end "
                               f"{end - self.deadline:.0f} s past the search's limit",
                               "raise --search-seconds to let it finish")
        sample = self.samples[self.index]
        self.index += 1
        if self.progress:
            self.progress(self.index, len(self.samples))
        return sample

    def rewind(self) -> None:
        self.index = 0


def _qtype(name: str):
    from onnxruntime.quantization import QuantType

    return QuantType.QUInt8 if name == "uint8" else QuantType.QInt8


@contextlib.contextmanager
def _quiet_quantizer():
    """Keep onnxruntime's quantizer chatter out of the user's output."""
    # It logs "consider pre-processing" on the root logger (the graph was already simplified
    # and shape-inferred, which is that pre-processing), and the histogram calibrators print
    # progress to stdout (which belongs to --json output) many times over in a search.
    # numpy's overflow warnings (ranges holding -inf attention masks) show up as a low accuracy,
    # which the build reports with advice.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yield
    finally:
        root.setLevel(level)


def _cache_supported() -> bool:
    """Newer onnxruntime reuses calibrated ranges from a file (calibration_cache_path)."""
    import inspect

    from onnxruntime.quantization import quantize_static

    return "calibration_cache_path" in inspect.signature(quantize_static).parameters


def _static(src: Path, dst: Path, config: QuantConfig, samples: Sequence[Sample],
            progress: Progress | None, large: bool, cache: Path | None = None,
            deadline: float | None = None) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    if not samples:
        raise QuantizationError("static INT8 needs calibration data", "pass --calib")
    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[config.calibration_method]
    # ranges depend on the model, samples and method only: a search quantizing the same model
    # many ways calibrates once per method (the cache must be made by a run over all op types)
    extra = {"calibration_cache_path": str(cache)} if cache is not None and _cache_supported() \
        else {}
    with _quiet_quantizer():
        quantize_static(
            str(src), str(dst), _Reader(samples, progress, deadline), **extra,
            op_types_to_quantize=list(config.op_types) or None,
            quant_format=QuantFormat.QDQ if config.format == "qdq" else QuantFormat.QOperator,
            per_channel=config.per_channel, reduce_range=config.reduce_range,
            activation_type=_qtype(config.activation_type), weight_type=_qtype(config.weight_type),
            nodes_to_exclude=list(config.exclude) or None, calibrate_method=method,
            use_external_data_format=large,
            extra_options={"ActivationSymmetric": config.symmetric_activations,
                           "QuantizeBias": config.quantize_bias},
        )


def _dynamic(src: Path, dst: Path, config: QuantConfig, large: bool) -> None:
    from onnxruntime.quantization import quantize_dynamic

    with _quiet_quantizer():
        quantize_dynamic(str(src), str(dst), per_channel=config.per_channel,
                         reduce_range=config.reduce_range, weight_type=_qtype(config.weight_type),
                         nodes_to_exclude=list(config.exclude) or None,
                         op_types_to_quantize=list(config.op_types) or None,
                         use_external_data_format=large)


def _fp16(src: Path, dst: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    # keep_io_types: callers and golden data stay FP32; casts sit at the graph edges. The
    # converter appends the input Casts after the nodes that read them: sort the graph again.
    model = convert_float_to_float16(load_model(src), keep_io_types=True)
    modelio.sort_topologically(model.graph)
    save_model(model, dst)


def quantize_file(model: Path, output: Path, *, config: QuantConfig,
                  samples: Sequence[Sample] = (), progress: Progress | None = None,
                  location: str | None = None, cache: Path | None = None,
                  deadline: float | None = None) -> Path:
    """Quantize *model* into *output* (no overwrite checks; the pipeline's building block).

    *location* names the external data file (models above 2 GiB) when *output* is a temporary
    name for the final file. *deadline* (time.perf_counter() seconds): a calibration that would
    end later stops early (OverTime).
    """
    with tempfile.TemporaryDirectory(prefix="edgepack-q-") as tmp:
        src = Path(tmp) / "fp32.onnx"
        # below opset 13 the quantizer writes per-channel Q/DQ that onnxruntime refuses
        # (INVALID_GRAPH for every variant): upgrade first, as `simplify` and `build` do
        proto = upgrade_opset(load_model(model), Path(model))
        if config.precision == "int8" and config.mode == "static":
            unshare_biases(proto)
        large = modelio.is_large(proto)
        save_model(proto, src)  # a copy of our own: the quantizer rewrites paths
        del proto
        dst = Path(tmp) / "quantized.onnx"
        try:
            if config.precision == "fp32":
                shutil.copyfile(src, dst)
            elif config.precision == "fp16":
                _fp16(src, dst)
            elif config.mode == "dynamic":
                _dynamic(src, dst, config, large)
            elif config.generator == "nncf":
                from .nncf_generator import nncf_quantize

                nncf_quantize(src, dst, samples=samples, exclude=config.exclude,
                              transformer=config.transformer, ranges=config.nncf_ranges)
            else:
                _static(src, dst, config, samples, progress, large, cache, deadline)
        except QuantizationError:
            raise
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise QuantizationError(f"{model}: quantization failed ({first[:200]}){_where(exc)}",
                                    "exclude the failing node with --exclude NODE, or try "
                                    "--mode dynamic / --precision fp16") from None
        check_runs(dst, samples[:1])
        if modelio.has_external_data(load_model(dst, check=False, external_data=False)):
            # move the weights out of this temporary folder, named after the final file
            save_model(load_model(dst, check=False), Path(output), location=location)
        else:
            shutil.move(str(dst), output)
    return Path(output)


BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}


def unshare_biases(proto: Any) -> None:
    """Give every Conv/Gemm its own bias initializer.

    onnxruntime's QDQ quantizer copies a shared bias itself, naming the copy NAME + a number,
    and never checks that against activation names: tf2onnx names a Conv's bias
    'conv1d_25' and its output 'conv1d_252', so the copy overwrote the output and the
    quantized graph failed to load (basic-pitch: "Transpose ... input shape = {36}").
    """
    users: dict[str, int] = {}
    inits = {i.name: i for i in proto.graph.initializer}
    names = set(inits) | {o for n in proto.graph.node for o in n.output} | {
        i.name for i in proto.graph.input}
    for node in proto.graph.node:
        slot = BIAS_INPUT.get(node.op_type)
        if slot is None or len(node.input) <= slot or node.input[slot] not in inits:
            continue
        name = node.input[slot]
        users[name] = users.get(name, 0) + 1
        if users[name] == 1:
            continue
        fresh = f"{name}.edgepack_bias_{users[name]}"
        while fresh in names:
            fresh += "_"
        copy = proto.graph.initializer.add()
        copy.CopyFrom(inits[name])
        copy.name = fresh
        names.add(fresh)
        node.input[slot] = fresh


def _where(exc: BaseException) -> str:
    """' at node 'X'' / ' at tensor 'Y'': what the quantizer was working on when it raised
    (from its frames' locals), so that a retry can keep that node in float."""
    import onnx

    found = []
    tb = exc.__traceback__
    while tb is not None:
        local = tb.tb_frame.f_locals
        node = local.get("node")
        if isinstance(node, onnx.NodeProto) and node.name:
            found.append(f"node '{node.name}'")
        for key in ("bias_name", "weight_name", "tensor_name", "input_name"):
            if isinstance(local.get(key), str) and local[key]:
                found.append(f"tensor '{local[key]}'")
        tb = tb.tb_next
    innermost = list(dict.fromkeys(reversed(found)))[:2]
    return f" at {', '.join(innermost)}" if innermost else ""


def check_runs(model: Path, samples: Sequence[Sample]) -> None:
    """Load the quantized model in ONNX Runtime (and run one sample) or raise."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        for sample in samples:
            session.run(None, sample)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise QuantizationError(f"the quantized model does not run in onnxruntime ({first[:200]})",
                                "exclude the offending node with --exclude, or use "
                                "--precision fp16") from None


def check_exclude(names: Sequence[str], graph: Any, model: Path | str) -> None:
    """Raise unless every --exclude name is a node of *graph* (the quantizer ignores the rest).

    *model* names the graph's file, or describes it (an export of a PyTorch model)."""
    known = {n.name for n in graph.node if n.name}
    unknown = [n for n in names if n not in known]
    if unknown:
        some = f"it has {len(known)} named nodes, e.g. {', '.join(sorted(known)[:3])}" if known \
            else "its nodes have no names"
        raise QuantizationError(f"--exclude {unknown[0]}: {model} has no node of that name "
                                f"({some})", "list the node names with `edgepack inspect "
                                f"{model if Path(model).is_file() else 'MODEL.onnx'} --nodes`")


def check_float(model: Path) -> None:
    """A model that is quantized already is refused (ModelError): quantizing its INT8 again
    adds error and no speed."""
    from ..graph.quantized import quantized_ops, quantized_summary

    found = quantized_ops(load_model(model, external_data=False).graph)
    if found:
        raise ModelError(f"{model} is quantized already ({quantized_summary(found)}): quantizing "
                         "it again adds error and no speed", f"bundle it as it is: edgepack "
                         f"build {model} ships its INT8 as given")


def quantize(model: Path, output: Path, *, config: QuantConfig, samples: Sequence[Sample] = (),
             progress: Progress | None = None, force: bool = False) -> Path:
    """Quantize *model* into *output* as *config* says, calibrating on *samples*."""
    check_float(model)
    if config.exclude:
        check_exclude(config.exclude, load_model(model, external_data=False).graph, model)
    with atomic_file(Path(output), force=force, inputs=(model,)) as tmp:
        quantize_file(model, tmp, config=config, samples=samples, progress=progress,
                      location=Path(output).name + ".data")
    return Path(output)
