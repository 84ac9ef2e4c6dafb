"""export(): PyTorch -> one self-contained ONNX file, checked against PyTorch on the same inputs."""

import contextlib
import io
import os
import re
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_file, check_free, output_lock
from ..errors import ExportError, ExportInvalid, PackagerError
from ..graph.compat import runtime_limits
from ..graph.execute import Sample, scaled_cosine
from ..graph.modelio import opset_of, save_model
from ..progress import Log
from ..targets import Target, load_target
from .forward_args import (
    Binding,
    article,
    bind,
    candidates,
    describe_params,
    forward_params,
    input_branches,
    plain,
    shown,
    traced,
)
from .specs import TensorSpec
from .torchload import LoadedModel, first_line, is_library_file, load_source, user_code

EXPORTER = "torch.onnx TorchScript exporter (dynamo=False)"
VALIDATION_SAMPLES = 8     # calibration samples the export is checked on (with the random draws)
EXPORTER_MAX_OPSET = 20     # torch.onnx's TorchScript exporter writes opsets 7..20
DEFAULT_TOLERANCE = 1e-3    # max |onnx - torch| relative to the output's largest magnitude
RANDOM_DRAWS = 3


@dataclass(frozen=True)
class ExportResult:
    path: Path
    source: str
    exporter: str
    opset: int
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    dynamic: dict[str, dict[int, str]]
    validation: dict[str, Any]
    nodes: int
    warnings: list[str] = field(default_factory=list)
    weights: dict[str, Any] | None = None
    # forward() arguments fixed by --const: {name: {"value": 16000, "passed_as": "int"}}
    consts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "path": str(self.path)}


def default_opset(target: Target | str | None) -> int:
    """The newest opset both the exporter and the target's oldest onnxruntime handle."""
    target = load_target(target or "x86_64-cpu") if not isinstance(target, Target) else target
    return min(runtime_limits(target.min_onnxruntime)[1], EXPORTER_MAX_OPSET)


def export(source: str | Path, output: Path, *, inputs: Sequence[TensorSpec] = (),
           consts: Mapping[str, Any] | None = None, weights: Path | None = None,
           factory_args: Mapping[str, Any] | None = None,
           submodule: str | None = None, dynamic: Mapping[str, Mapping[int, str]] | None = None,
           opset: int | None = None, target: Target | str | None = None,
           output_names: Sequence[str] = (), samples: Sequence[Sample] = (),
           tolerance: float = DEFAULT_TOLERANCE, force: bool = False,
           log: Log = lambda _: None) -> ExportResult:
    """Export the PyTorch model *source* to *output* (.onnx) and validate it against PyTorch.

    *source*: `file.py:factory`, `pkg.module:factory`, a TorchScript file or a `.pt2` program.
    *consts* fixes forward() arguments by name (`{"sr": 16000}`): forward() gets the value, the
    graph has no such input. Arguments neither fed nor fixed keep their Python defaults.
    """
    output = Path(output)
    sources = [Path(p) for p in (str(source).rsplit(":", 1)[0], str(source), weights)
               if p is not None and Path(p).exists()]
    with output_lock(output):   # from the check to the write: one run per -o at a time
        check_free(output, force=force, inputs=sources)
        loaded = load_source(str(source), factory_args=factory_args, weights=weights,
                             submodule=submodule)
        return export_loaded(loaded, output, inputs=inputs, consts=consts, dynamic=dynamic,
                             opset=opset, target=target, output_names=output_names,
                             samples=samples, tolerance=tolerance, force=force, log=log)


def export_loaded(loaded: LoadedModel, output: Path, *, inputs: Sequence[TensorSpec] = (),
                  consts: Mapping[str, Any] | None = None, other_consts: bool = False,
                  dynamic: Mapping[str, Mapping[int, str]] | None = None,
                  opset: int | None = None, target: Target | str | None = None,
                  output_names: Sequence[str] = (), samples: Sequence[Sample] = (),
                  tolerance: float = DEFAULT_TOLERANCE, force: bool = False,
                  log: Log = lambda _: None) -> ExportResult:
    """Export an already loaded model (see export()). With *other_consts*, a --const that
    names no forward() argument is left for the caller (a graph input, another part)."""
    import onnx

    output = Path(output)
    specs = list(inputs) or loaded.example_inputs
    specs, fixed = _check_inputs(loaded, specs, dict(consts or {}), other_consts)
    dynamic = _checked_dynamic(dynamic, specs)
    default = default_opset(target)
    opset = opset or default
    if not 7 <= opset <= EXPORTER_MAX_OPSET:
        raise ExportError(f"--opset {opset}: the TorchScript exporter writes opsets 7 to "
                          f"{EXPORTER_MAX_OPSET}", f"pick one in that range (default: {default})")
    feeds = [make_inputs(specs, loaded.module, seed=0)]
    # *module* is what the exporter traces; *run* what its graph must agree with
    module, run, binding, first = _bind_forward(loaded, specs, fixed, feeds[0])
    reference = [first]
    names = list(output_names) or (["output"] if len(reference[0]) == 1 else
                                   [f"output_{i}" for i in range(len(reference[0]))])
    if len(names) != len(reference[0]):
        raise ExportError(f"--output-name gave {len(names)} names, forward() returns "
                          f"{len(reference[0])} tensors", "give one name per output tensor")

    with tempfile.TemporaryDirectory(prefix="edgepack-export-") as tmp:
        raw = Path(tmp) / "raw.onnx"
        notes = _torch_export(module, specs, feeds[0], raw, names, dynamic, opset)
        if binding is not None:
            for name in binding.consts:
                log(f"const: {name}={shown(fixed[name])} passed to forward() as "
                    f"{article(binding.passed_as(name))} (not an input of the graph)")
        for note in notes:
            log(f"export warning: {note}")
        proto = onnx.load(str(raw), load_external_data=True)
    _check_exported(proto, opset, specs)

    for seed in range(1, RANDOM_DRAWS + 1):
        feeds.append(make_inputs(specs, loaded.module, seed=seed))
        reference.append(_run_torch(run, specs, feeds[-1], "random inputs"))
    kinds = ["random"] * len(feeds)
    for sample in samples[:VALIDATION_SAMPLES]:
        feed = [np.asarray(sample[s.name]).astype(s.dtype, copy=False) for s in specs]
        if [list(f.shape) for f in feed] != [list(s.shape) for s in specs]:
            continue  # calibration samples at another shape are checked by the build
        feeds.append(feed)
        reference.append(_run_torch(run, specs, feed, "a calibration sample"))
        kinds.append("calibration")
    validation = validate(proto, specs, feeds, reference, names, kinds)
    if dynamic:
        validation["dynamic"] = _check_dynamic(proto, run, specs, dynamic, names,
                                               vocab=_smallest_vocab(loaded.module))
    _judge_validation(validation, tolerance, log)
    with atomic_file(output, force=force) as tmp_out:
        save_model(proto, tmp_out, location=output.name + ".data")
    return ExportResult(
        path=output, source=loaded.description, exporter=EXPORTER, opset=opset,
        inputs=[{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in specs],
        outputs=[{"name": n, "shape": list(np.asarray(r).shape), "dtype": str(np.asarray(r).dtype)}
                 for n, r in zip(names, reference[0], strict=True)],
        dynamic={k: {int(a): v for a, v in d.items()} for k, d in dynamic.items()},
        validation=validation, nodes=len(proto.graph.node), warnings=notes,
        weights=loaded.weights,
        consts={k: {"value": plain(fixed[k]), "passed_as": binding.passed_as(k)}
                for k in (binding.consts if binding else {})})


def _checked_dynamic(dynamic: Mapping[str, Mapping[int, str]] | None,
                     specs: Sequence[TensorSpec]) -> dict[str, dict[int, str]]:
    """--dynamic's axes, each naming an input and an axis it has."""
    dynamic = {k: dict(v) for k, v in (dynamic or {}).items()}
    for name, axes in dynamic.items():
        spec = next((s for s in specs if s.name == name), None)
        if spec is None:
            raise ExportError(f"--dynamic {name}: no input of that name",
                              f"inputs: {', '.join(s.name for s in specs)}")
        bad = [a for a in axes if not 0 <= a < len(spec.shape)]
        if bad:
            raise ExportError(f"--dynamic {name}: axis {bad[0]} is out of range for "
                              f"{spec.describe()}", f"axes are 0..{len(spec.shape) - 1}")
    return dynamic


def _check_exported(proto: Any, opset: int, specs: Sequence[TensorSpec]) -> None:
    """ExportError unless the exporter wrote the opset asked for, every input, and a graph
    onnx's checker accepts."""
    import onnx

    if opset_of(proto) != opset:
        raise ExportError(f"the exporter wrote opset {opset_of(proto)}, not the {opset} asked for",
                          "pass --opset to match what the exporter can write")
    got_inputs = [i.name for i in proto.graph.input]
    dropped = [s.name for s in specs if s.name not in got_inputs]
    if dropped:
        raise ExportError(f"input {dropped[0]} is not used by forward(), so the exported graph "
                          "has no such input", "drop it from --input or use it in the model")
    try:
        onnx.checker.check_model(proto, full_check=False)
    except Exception as exc:
        raise ExportError(f"the exported graph is invalid ({first_line(exc)})",
                          "report this with --debug output; try another --opset") from None


def _judge_validation(validation: dict[str, Any], tolerance: float, log: Log) -> None:
    """Say the export's agreement with PyTorch; ExportInvalid for NaN or infinity in an
    output (such a model computes nothing), ExportError beyond *tolerance*."""
    worst = validation["max_rel"]
    broken = {n: e["nonfinite"] for n, e in validation["outputs"].items() if e["nonfinite"]}
    log(f"validation vs PyTorch on {validation['samples']} inputs: " + (
        f"{sum(broken.values())} NaN/inf output values" if broken else
        f"max abs {validation['max_abs']:.3g}, max rel {worst:.3g}, cosine min "
        f"{validation['cosine_min']:.6f}"))
    if broken:   # NaN == NaN is no agreement: such a model computes nothing
        name, count = next(iter(broken.items()))
        raise ExportInvalid(
            f"output '{name}' holds NaN or infinity ({count} values over the "
            f"{validation['samples']} validation inputs, in PyTorch and/or ONNX Runtime): "
            "the export cannot be validated", "check the weights (--weights) and the factory "
            "for NaN/inf, and forward() for divisions by zero or log of zero")
    if not worst <= tolerance:  # NaN fails too
        bad = max(validation["outputs"], key=lambda n: validation["outputs"][n]["max_rel"])
        raise ExportError(
            f"the ONNX graph disagrees with PyTorch: output '{bad}' max rel error {worst:.3g} > "
            f"tolerance {tolerance:g} (max abs {validation['max_abs']:.3g}, cosine min "
            f"{validation['cosine_min']:.4f})",
            "look for data-dependent Python control flow or in-place ops in forward(); "
            "--tolerance raises the limit")


# --------------------------------------------------------------------------- inputs


def _check_inputs(loaded: LoadedModel, specs: Sequence[TensorSpec], consts: dict[str, Any],
                  other_consts: bool) -> tuple[list[TensorSpec], dict[str, Any]]:
    """Check the --input count against forward(); return the specs the graph takes and the
    --const values that fix forward() arguments."""
    if not specs:
        raise ExportError("no --input given for a PyTorch model",
                          "give one per forward() argument: --input NAME:1x3x224x224[:dtype]")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ExportError(f"--input names repeat: {', '.join(names)}", "give each input once")
    params = forward_params(loaded.module) if loaded.kind != "exported-program" else None
    fixed = {k: v for k, v in consts.items() if params and k in {p.name for p in params}}
    unknown = [k for k in consts if k not in fixed and k not in names]
    if unknown and not other_consts:
        raise ExportError(f"--const {unknown[0]}: forward() has no argument '{unknown[0]}'",
                          f"forward() takes: {describe_params(params)}" if params else
                          "a .pt2 program fixed its non-tensor arguments when it was saved; "
                          "pass the factory (file.py:factory) instead")
    if fixed and all(p.name in fixed for p in params or () if p.positional or p.required):
        raise ExportError(f"--const fixes every input of forward() ({', '.join(fixed)})",
                          "leave at least one tensor input; a bundle needs an input to run on")
    both = [s.name for s in specs if s.name in fixed]
    if both:
        raise ExportError(f"--const {both[0]} and --input {both[0]} both given: a forward() "
                          "argument is either fixed or fed", f"drop --input {both[0]} to fix "
                          f"it, or --const {both[0]} to feed it")
    if params is None:
        return specs, fixed
    positional = [p for p in params if p.positional and p.name not in fixed]
    required = [p.name for p in positional if p.required]
    if not len(required) <= len(specs) <= len(positional):
        besides = f" besides --const {', '.join(fixed)}" if fixed else ""
        raise ExportError(f"forward({', '.join(p.name for p in positional)}) takes "
                          f"{len(required)}" + (f" to {len(positional)}" if len(positional) >
                                                len(required) else "")
                          + f" inputs{besides}, --input gave {len(specs)} "
                          f"({', '.join(s.name for s in specs)})",
                          "give one --input per forward() argument, in order"
                          + ("" if fixed or len(specs) > len(required) else
                             ", or fix one with --const NAME=VALUE"))
    bind(params, len(specs), fixed)   # a keyword-only argument without a value
    return specs, fixed


def _bind_forward(loaded: LoadedModel, specs: Sequence[TensorSpec], fixed: Mapping[str, Any],
                  feed: Sequence[np.ndarray]
                  ) -> tuple[Any, Any, Binding | None, list[np.ndarray]]:
    """The module the exporter traces (forward() called with the fed tensors only, each other
    argument a Python value: its --const or its default), the model the export must agree with
    (the original, called the same way), the binding, and the outputs on *feed*.

    A --const goes in as the Python value first where forward() does not say (an `if sr ==
    16000:`), then as a tensor (`sr.item()`): the first form forward() runs with is kept."""
    what = "--input " + " ".join(s.describe() for s in specs)
    params = forward_params(loaded.module) if loaded.kind != "exported-program" else None
    unfed = params is not None and len(params) > len(specs)
    if params is None or not fixed and (not unfed or loaded.kind != "factory"):
        return loaded.module, loaded.module, None, _run_torch(loaded.module, specs, feed, what)
    wants = {p.name: p.wants for p in params}
    forms = {k: candidates(v, wants[k]) for k, v in fixed.items()}
    failed: ExportError | None = None
    attempts = max([len(f) for f in forms.values()] + [1])
    for attempt in range(attempts):
        binding = bind(params, len(specs), {k: f[min(attempt, len(f) - 1)]
                                           for k, f in forms.items()})

        def run(*tensors: Any, b: Binding = binding) -> Any:
            return b.call(loaded.module, tensors)

        try:
            reference = _run_torch(run, specs, feed, what)
            return traced(loaded.module, binding, feed, what), run, binding, reference
        except ExportError as exc:
            failed = failed or exc
    assert failed is not None
    tried = ", ".join(f"{k}={shown(v)}" for k, v in fixed.items())
    raise ExportError(failed.message + f" (with --const {tried}" + (
        ", passed as a Python value and as a tensor)" if attempts > 1 else ")"),
        failed.hint) from None


def make_inputs(specs: Sequence[TensorSpec], module: Any, *, seed: int,
                vocab: int | None = None) -> list[np.ndarray]:
    """Random inputs: normal floats, token ids below the smallest embedding table, masks of 1."""
    rng = np.random.default_rng(seed)
    vocab = vocab or _smallest_vocab(module)
    feeds = []
    for s in specs:
        if s.dtype.startswith("float"):
            feeds.append(rng.standard_normal(s.shape).astype(s.dtype))
        elif s.dtype == "bool":
            feeds.append(np.ones(s.shape, dtype=bool))
        elif "mask" in s.name.lower():
            feeds.append(np.ones(s.shape, dtype=s.dtype))
        else:
            high = vocab or (2 if s.dtype in ("int64", "int32") else 255)
            feeds.append(rng.integers(0, high, size=s.shape).astype(s.dtype))
    return feeds


def _smallest_vocab(module: Any) -> int | None:
    if not hasattr(module, "modules"):
        return None
    sizes = [int(m.num_embeddings) for m in module.modules()
             if isinstance(getattr(m, "num_embeddings", None), int)]
    return min(sizes) if sizes else None


def _run_torch(module: Any, specs: Sequence[TensorSpec], feed: Sequence[np.ndarray],
               what: str) -> list[np.ndarray]:
    import torch

    from .torchload import user_location

    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in feed]
    try:
        with torch.no_grad(), user_code("forward()"):
            result = module(*tensors)
    except Exception as exc:
        where = user_location(exc.__traceback__)
        raise ExportError(f"forward() failed on {what}{' at ' + where if where else ''}: "
                          f"{first_line(exc)}",
                          "check that --input shapes and dtypes match what forward() expects"
                          ) from None
    flat = _flatten(result)
    if not flat:
        raise ExportError("forward() returned no tensors", "return a tensor or a tuple of tensors")
    return [t.detach().cpu().numpy() for t in flat]


def _flatten(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flatten(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _flatten(v)]
    return []


# --------------------------------------------------------------------------- exporter


@contextlib.contextmanager
def _captured() -> Iterator[io.StringIO]:
    """Collect what the exporter prints (Python and C++ level) instead of flooding the terminal."""
    import sys

    buffer = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                yield buffer
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            buffer.write(sink.read())


def _torch_export(module: Any, specs: Sequence[TensorSpec], feed: Sequence[np.ndarray],
                  path: Path, names: Sequence[str], dynamic: Mapping[str, Mapping[int, str]],
                  opset: int) -> list[str]:
    """Run the TorchScript exporter; return warnings about the user's code; raise ExportError."""
    import torch

    args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in feed)
    axes = {**{k: dict(v) for k, v in dynamic.items()}}
    with warnings.catch_warnings(record=True) as caught, _captured() as printed, \
            user_code("forward() while exporting"):
        warnings.simplefilter("always")
        try:
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=opset,
                              input_names=[s.name for s in specs], output_names=list(names),
                              dynamic_axes=axes or None, do_constant_folding=True)
        except PackagerError:
            raise
        except Exception as exc:
            failure = exc
        else:
            failure = None
    if failure is not None:
        raise _export_error(failure, printed.getvalue(), opset) from None
    notes = []
    branches: list[set[tuple[str, int]] | None] = []
    for w in caught:
        if not issubclass(w.category, torch.jit.TracerWarning) or is_library_file(w.filename):
            continue
        where = f"{os.path.relpath(w.filename)}:{w.lineno}"
        message = str(w.message).split(".")[0]
        if "Python boolean" in message:
            if not branches:   # which branches read the inputs: one plain run, only when asked
                with user_code("forward()"):
                    branches.append(input_branches(module, args))
            if branches[0] is None or (os.path.abspath(w.filename), w.lineno) in branches[0]:
                raise ExportError(
                    f"data-dependent control flow at {where}: an if/while on a tensor value; "
                    "the exported graph would always take the branch taken for the example "
                    "input", "rewrite it with torch.where, or export the part without it "
                    "(--submodule)")
            notes.append(f"{where}: an if/while on a tensor that no input changes (a --const, "
                         "a default or a weight); the graph keeps the branch it takes")
            continue
        notes.append(f"{where}: {message}; the value is frozen for the example input")
    return notes


def _export_error(exc: Exception, printed: str, opset: int) -> ExportError:
    from .torchload import user_location

    text = str(exc)
    op = re.search(r"operator '([\w:.]+)'", text)
    if op:
        where = _op_location(op.group(1), printed + "\n" + text)
        return ExportError(
            f"{op.group(1)} cannot be exported to ONNX opset {opset}"
            + (f" (used at {where})" if where else ""),
            f"try --opset {EXPORTER_MAX_OPSET} if lower, replace the op, or export the parts "
            "around it (--submodule / --part)")
    head = re.split(r"\s+\[Caused by", text.strip().splitlines()[0] if text.strip() else "")[0]
    where = user_location(exc.__traceback__) or _first_user_location(printed + "\n" + text)
    return ExportError(f"export failed{' at ' + where if where else ''}: "
                       f"{type(exc).__name__}: {head[:240]}",
                       "replace the construct, or export the parts around it (--submodule / "
                       "--part); --debug shows the traceback")


_LOCATION = re.compile(r"# (\S+?\.py):(\d+):\d+")


def _op_location(op: str, text: str) -> str:
    for line in text.splitlines():
        if f"{op}(" in line:
            for path, lineno in _LOCATION.findall(line):
                if not is_library_file(path):
                    return f"{os.path.relpath(path)}:{lineno}"
    return _first_user_location(text)


def _first_user_location(text: str) -> str:
    for path, lineno in _LOCATION.findall(text):
        if not is_library_file(path):
            return f"{os.path.relpath(path)}:{lineno}"
    return ""


# --------------------------------------------------------------------------- validation


def _session(proto: Any) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), sess_options=so,
                                providers=["CPUExecutionProvider"])


def validate(proto: Any, specs: Sequence[TensorSpec], feeds: Sequence[Sequence[np.ndarray]],
             reference: Sequence[Sequence[np.ndarray]], names: Sequence[str],
             kinds: Sequence[str]) -> dict[str, Any]:
    """ONNX Runtime vs PyTorch on the same inputs: max abs / rel error and cosine per output."""
    session = _session(proto)
    per_output: dict[str, dict[str, float]] = {n: {"max_abs": 0.0, "max_rel": 0.0,
                                                   "cosine_min": 1.0, "nonfinite": 0}
                                               for n in names}
    for feed, ref in zip(feeds, reference, strict=True):
        got = session.run(list(names), {s.name: a for s, a in zip(specs, feed, strict=True)})
        for name, g, r in zip(names, got, ref, strict=True):
            stats = agreement(np.asarray(g), np.asarray(r))
            entry = per_output[name]
            entry["max_abs"] = max(entry["max_abs"], stats["max_abs"])
            entry["max_rel"] = max(entry["max_rel"], stats["max_rel"])
            entry["cosine_min"] = min(entry["cosine_min"], stats["cosine"])
            entry["nonfinite"] += int(np.size(g) - np.isfinite(np.asarray(g, np.float64)).sum()
                                      + np.size(r) - np.isfinite(np.asarray(r, np.float64)).sum())
    return {"samples": len(feeds), "random": kinds.count("random"),
            "calibration": kinds.count("calibration"),
            "max_abs": max(e["max_abs"] for e in per_output.values()),
            "max_rel": max(e["max_rel"] for e in per_output.values()),
            "cosine_min": min(e["cosine_min"] for e in per_output.values()),
            "outputs": per_output}


def agreement(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    if got.shape != ref.shape:
        return {"max_abs": float("inf"), "max_rel": float("inf"), "cosine": 0.0}
    a = got.astype(np.float64).ravel()
    b = ref.astype(np.float64).ravel()
    if not (np.isfinite(a) == np.isfinite(b)).all():
        return {"max_abs": float("nan"), "max_rel": float("nan"), "cosine": 0.0}
    finite = np.isfinite(b)
    a, b = a[finite], b[finite]
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    scale = float(np.abs(b).max()) if b.size else 0.0
    return {"max_abs": diff, "max_rel": diff / scale if scale > 0 else diff,
            "cosine": scaled_cosine(a, b)}


def _check_dynamic(proto: Any, module: Any, specs: Sequence[TensorSpec],
                   dynamic: Mapping[str, Mapping[int, str]], names: Sequence[str], *,
                   vocab: int | None) -> dict:
    """Run once more with every dynamic axis grown by 3: a traced constant shape shows up here."""
    grown = [TensorSpec(s.name, tuple(d + 3 if a in dynamic.get(s.name, {}) else d
                                      for a, d in enumerate(s.shape)), s.dtype) for s in specs]
    shapes = ", ".join(g.describe() for g in grown if g.name in dynamic)
    feed = make_inputs(grown, module, seed=99, vocab=vocab)
    try:
        ref = _run_torch(module, grown, feed, f"the grown shapes {shapes}")
    except ExportError as exc:
        return {"checked": False, "shapes": shapes, "reason": exc.message}
    try:
        session = _session(proto)
        got = session.run(list(names), {s.name: a for s, a in zip(grown, feed, strict=True)})
    except Exception as exc:
        raise ExportError(f"--dynamic axes do not work in the exported graph: onnxruntime failed "
                          f"at {shapes} ({first_line(exc, 160)})",
                          "the trace froze a size (a reshape or view built from a Python int); "
                          "export with static shapes (drop --dynamic) or fix that line") from None
    worst = max(agreement(np.asarray(g), np.asarray(r))["max_rel"]
                for g, r in zip(got, ref, strict=True))
    if not worst <= DEFAULT_TOLERANCE:
        raise ExportError(f"--dynamic axes give wrong results at {shapes}: max rel error "
                          f"{worst:.3g} vs PyTorch",
                          "the trace froze a size; export with static shapes (drop --dynamic)")
    return {"checked": True, "shapes": shapes, "max_rel": worst}
