"""Target device profiles: TOML files in targets/, validated on load."""

import importlib.resources
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ._runtimes.runner.manifest import WHEN  # one vocabulary with the runner
from ._runtimes.runner.sessions import OPT_LEVELS as SESSION_LEVELS
from .errors import TargetError

PROVIDERS = (
    "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider",
    "OpenVINOExecutionProvider", "XnnpackExecutionProvider", "ArmNNExecutionProvider",
    "ACLExecutionProvider", "CoreMLExecutionProvider", "QNNExecutionProvider",
)
PRECISIONS = ("int8", "fp16", "fp32", "auto")
MODES = ("static", "dynamic")
FORMATS = ("qdq", "qoperator")
INT8_TYPES = ("uint8", "int8")
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")   # what the quantizer calibrates by
METHODS = CALIBRATION_METHODS + ("auto",)   # a target may leave the choice to the search
OPT_LEVELS = tuple(SESSION_LEVELS)   # the runner's: disabled, basic, extended, all
FASTER = ("OpenVINOExecutionProvider",)   # providers packager/ort_builds.py can time here
FAMILIES = ("transformer",)   # model families a profile can give their own preset


@dataclass(frozen=True)
class Provider:
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    # the precision of the graph this provider runs when the bundle is INT8 (None: the INT8
    # graph itself). Under CUDA a QDQ graph runs 2x slower than FP32 (a Memcpy per weight).
    instead_of_int8: str | None = None
    # "always": the bundle lists it; "faster": the build times the candidates under it too
    # (packager/ort_builds.py runs it) and the bundle lists it, first, only where it measured faster
    when: str = "always"


@dataclass(frozen=True)
class QuantPreset:
    """How a target wants its model quantized; every field can be overridden per build."""

    precision: str = "int8"
    mode: str = "static"
    format: str = "qdq"
    activation_type: str = "uint8"
    weight_type: str = "int8"
    per_channel: bool = True
    reduce_range: bool = False
    calibration_method: str = "minmax"
    symmetric_activations: bool = False   # zero point 0 for activations (TensorRT needs it)
    quantize_bias: bool = True            # False: biases stay float (TensorRT fuses them itself)


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    arch: str
    python: str
    batch: int
    runtime_package: str
    min_onnxruntime: str
    install: str
    providers: tuple[Provider, ...]
    session: dict[str, Any]
    quantization: QuantPreset
    latency_p90_ms: float | None
    min_cosine: float
    path: Path
    family_quantization: dict[str, QuantPreset] = field(default_factory=dict)
    max_accuracy_drop: float | None = None
    faster: tuple[Provider, ...] = ()   # providers with when = "faster"

    def with_provider(self, provider: Provider, package: str, install: str) -> "Target":
        """This target with *provider* tried first (a "faster" one the build chose); its
        package named for the device, the CPU provider still the fallback."""
        return replace(self, providers=(provider,) + self.providers, runtime_package=package,
                       install=install)

    def preset_for(self, family: str) -> QuantPreset:
        """The preset for a model family ('transformer', ...), else the default preset."""
        return self.family_quantization.get(family, self.quantization)


def builtin_dir() -> Path:
    return Path(str(importlib.resources.files("packager._targets")))


def list_targets() -> list[Target]:
    """Return every built-in target profile, sorted by name."""
    return [load_target(p) for p in sorted(builtin_dir().glob("*.toml"))]


def load_target(name_or_path: str | Path) -> Target:
    """Load a built-in target by name, or a profile file by path; raise TargetError if invalid."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = builtin_dir() / f"{name_or_path}.toml"
        if not path.is_file():
            known = ", ".join(p.stem for p in sorted(builtin_dir().glob("*.toml")))
            raise TargetError(f"unknown target '{name_or_path}'",
                              f"use one of: {known}, or a path to your own .toml profile")
    if not path.is_file():
        raise TargetError(f"{path}: no such target profile", "check the path")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TargetError(f"{path}: not valid TOML ({exc})", "fix the syntax") from None
    return _parse(data, path)


def _get(table: dict, key: str, kind: type | tuple, where: str, default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            raise TargetError(f"{where}: missing key '{key}'", "add it (see targets/x86_64-cpu.toml)")
        return default
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TargetError(f"{where}: '{key}' must be {getattr(kind, '__name__', kind)}, "
                          f"got {value!r}", "fix the value")
    return value


def _choice(table: dict, key: str, choices: tuple, where: str, default: Any) -> Any:
    value = _get(table, key, str, where, default)
    if value not in choices and not (value is None and default is None):
        raise TargetError(f"{where}: {key} = '{value}' is not one of {', '.join(choices)}",
                          "fix the value")
    return value


def _unknown(table: dict, allowed: set, where: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise TargetError(f"{where}: unknown key '{extra[0]}'",
                          f"allowed keys: {', '.join(sorted(allowed))}")


def _preset(q: dict, base: QuantPreset, w: str) -> QuantPreset:
    """Read a [quantization] table; keys it leaves out come from *base*."""
    if w.endswith(FAMILIES):
        _unknown(q, set(QuantPreset.__dataclass_fields__), w)
    return QuantPreset(
        precision=_choice(q, "precision", PRECISIONS, w, base.precision),
        mode=_choice(q, "mode", MODES, w, base.mode),
        format=_choice(q, "format", FORMATS, w, base.format),
        activation_type=_choice(q, "activation_type", INT8_TYPES, w, base.activation_type),
        weight_type=_choice(q, "weight_type", INT8_TYPES, w, base.weight_type),
        per_channel=_get(q, "per_channel", bool, w, base.per_channel),
        reduce_range=_get(q, "reduce_range", bool, w, base.reduce_range),
        calibration_method=_choice(q, "calibration_method", METHODS, w, base.calibration_method),
        symmetric_activations=_get(q, "symmetric_activations", bool, w,
                                   base.symmetric_activations),
        quantize_bias=_get(q, "quantize_bias", bool, w, base.quantize_bias),
    )


def _parse(data: dict, path: Path) -> Target:
    f = str(path)
    _unknown(data, {"name", "description", "arch", "python", "batch", "runtime", "providers",
                    "session", "quantization", "budget"}, f)
    runtime = _get(data, "runtime", dict, f)
    _unknown(runtime, {"package", "min_version", "install"}, f"{f}: runtime")
    providers = []
    for i, entry in enumerate(_get(data, "providers", list, f)):
        where = f"{f}: providers[{i}]"
        if not isinstance(entry, dict):
            raise TargetError(f"{where}: must be a table", "use [[providers]] with name = ...")
        _unknown(entry, {"name", "options", "instead_of_int8", "when"}, where)
        name = _get(entry, "name", str, where)
        if name not in PROVIDERS:
            raise TargetError(f"{where}: unknown provider '{name}'",
                              f"use one of: {', '.join(PROVIDERS)}")
        instead = _choice(entry, "instead_of_int8", ("fp16", "fp32"), where, None)
        when = _choice(entry, "when", WHEN, where, "always")
        if when == "faster" and name not in FASTER:
            raise TargetError(f"{where}: when = 'faster' is for {', '.join(FASTER)}",
                              "the build can time only those on this host; list the "
                              "provider without 'when'")
        providers.append(Provider(name, dict(_get(entry, "options", dict, where, {})), instead,
                                  when))
    faster = tuple(p for p in providers if p.when == "faster")
    providers = [p for p in providers if p.when != "faster"]
    if not providers:
        raise TargetError(f"{f}: providers is empty", "list at least CPUExecutionProvider")
    session = _get(data, "session", dict, f, {})
    _unknown(session, {"intra_op_threads", "inter_op_threads", "graph_optimization_level",
                       "execution_mode"}, f"{f}: session")
    _get(session, "intra_op_threads", int, f"{f}: session", 0)
    _choice(session, "graph_optimization_level", OPT_LEVELS, f"{f}: session", "all")
    _choice(session, "execution_mode", ("sequential", "parallel"), f"{f}: session", "sequential")
    q = _get(data, "quantization", dict, f, {})
    w = f"{f}: quantization"
    _unknown(q, set(QuantPreset.__dataclass_fields__) | set(FAMILIES), w)
    preset = _preset(q, QuantPreset(), w)
    families = {fam: _preset(_get(q, fam, dict, w), preset, f"{w}.{fam}")
                for fam in FAMILIES if fam in q}
    budget = _get(data, "budget", dict, f, {})
    _unknown(budget, {"latency_p90_ms", "min_cosine", "max_accuracy_drop"}, f"{f}: budget")
    drop = _get(budget, "max_accuracy_drop", float, f"{f}: budget", None)
    if drop is not None and not 0 <= drop < 1:  # NaN fails this too
        raise TargetError(f"{f}: budget: max_accuracy_drop = {drop} is not a fraction in [0, 1)",
                          "write 0.01 for 1%")
    min_cosine = _get(budget, "min_cosine", float, f"{f}: budget", 0.98)
    if not 0 <= min_cosine <= 1:
        raise TargetError(f"{f}: budget: min_cosine = {min_cosine} is not a cosine in [0, 1]",
                          "write e.g. 0.98 (every held-out output's cosine to FP32)")
    latency = _get(budget, "latency_p90_ms", float, f"{f}: budget", None)
    if latency is not None and not 0 < latency < float("inf"):
        raise TargetError(f"{f}: budget: latency_p90_ms = {latency} is not a positive time",
                          "write milliseconds, e.g. 20.0")
    batch = _get(data, "batch", int, f, 1)
    if batch < 1:
        raise TargetError(f"{f}: batch must be >= 1", "fix the value")
    return Target(
        name=_get(data, "name", str, f), description=_get(data, "description", str, f, ""),
        arch=_get(data, "arch", str, f), python=_get(data, "python", str, f, "3.8"), batch=batch,
        runtime_package=_get(runtime, "package", str, f"{f}: runtime"),
        min_onnxruntime=_get(runtime, "min_version", str, f"{f}: runtime"),
        install=_get(runtime, "install", str, f"{f}: runtime", ""),
        providers=tuple(providers), session=dict(session), quantization=preset,
        family_quantization=families,
        latency_p90_ms=latency, min_cosine=min_cosine, path=path,
        max_accuracy_drop=drop, faster=faster,
    )
