"""Assemble a bundle directory and its .tar.gz: model, manifest, runner, golden data, docs."""

import copy
import gzip
import importlib.metadata
import math
import os
import platform
import re
import shutil
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from .._runtimes.runner.cascade_judge import GOLDEN_DIR
from .._runtimes.runner.contents import EXTRAS
from .._runtimes.runner.manifest import read_npz
from .._runtimes.runner.metrics import npz_arrays
from ..atomic import atomic_pair, check_free, check_named
from ..errors import BundleError
from ..graph.compat import fit_to_runtime
from ..graph.execute import Sample, compare_outputs, run_model, stack
from ..graph.inspection import dims_of, graph_inputs, io_specs
from ..graph.modelio import load_model, opset_of, save_model
from ..graph.offline import offline_graph
from ..hashing import sha256
from ..targets import Target
from .manifest import MANIFEST, NAME_RULE, Manifest, name_problem, safe_name
from .roofline import write_roofline

# the staged bundle folder -> the manifest's "tuning" record (its "chosen" is the session)
Tuner = Callable[[Path], dict[str, Any]]


@dataclass(frozen=True)
class BundleResult:
    directory: Path
    archive: Path
    manifest: dict[str, Any]
    digest: str = ""        # "sha256:" + the manifest's sha256: the bundle's identity


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in ("edgepack", "onnx", "onnxruntime", "onnxsim", "numpy", "torch",
                 "opencv-python-headless"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def runner_sources(manifest: Mapping[str, Any], extras: Sequence[str] = EXTRAS
                   ) -> dict[str, Path]:
    """The runner's files a bundle with *manifest* holds (run.py, runner/...), by their source
    here: the core, and what its parts, providers and pipeline use, with its *extras* (serve,
    tune, profile; contents.runner_files)."""
    from .. import _runtimes
    from .._runtimes.runner.contents import runner_files

    here = Path(_runtimes.__file__).parent
    return {rel: here / rel for rel in runner_files(manifest, extras)}


def archive_path(directory: Path) -> Path:
    directory = check_named(directory)
    if directory.name.endswith((".tar.gz", ".tgz")):
        stem = directory.name.removesuffix(".gz").removesuffix(".tar").removesuffix(".tgz")
        raise BundleError(f"-o {directory}: names the bundle folder; its archive is written "
                          f"beside it as {directory.name}.tar.gz",
                          f"pass -o {directory.with_name(stem)} (that writes "
                          f"{directory.with_name(stem)}/ and {directory.with_name(stem)}.tar.gz)")
    return directory.with_name(directory.name + ".tar.gz")


def _tolerance(cosine_min: float) -> float:
    """Device-side floor: the host's golden cosine less a margin for other kernels/CPUs."""
    return float(np.floor(max(0.0, min(cosine_min, 1.0) - 0.01) * 1e4) / 1e4)


def _budget(part: "PartPayload") -> float | None:
    """The accuracy budget the bundle keeps (min cosine to FP32): the build's decision's, or
    the one `edgepack bundle` checked a prebuilt model against."""
    value = (part.precision.get("decision") or {}).get("budget_min_cosine",
                                                        part.precision.get("budget_min_cosine"))
    return float(value) if value is not None else None


# `run.py check` fails a device whose outputs of the shipped model are further from the host's
# (1 - cosine, per sample) than the host's own kernels are from exact arithmetic plus a margin.
# Measured with onnxruntime 1.32 and 1.19 on the test CNN and encoder and 12 zoo models, host
# x86 AVX2 against aarch64 Cortex-A72 and A76 (qemu), 1 and 2 threads, every optimisation level:
# - FP32: threads change nothing; optimisation levels and CPUs move 1 - cosine by < 1e-9
#   (max abs by <= 1.4e-4 of the output's range). Margin 1e-4.
# - FP16: the A76's native FP16 arithmetic against x86: <= 7.3e-4 (basic-pitch).
# - INT8: a CPU family reproduces itself bit for bit, but x86 AVX2 without VNNI saturates u8 x s8
#   sums in 16 bits (vpmaddubsw) where ARM (and VNNI, says onnxruntime) does not: 7.8e-3 between
#   them for the test CNN (static QDQ), 1.4e-2 for MiniLM (dynamic INT8), as much as quantization
#   itself costs. So the host measures that distance for its own kernels (`_exact_proto`); ARM
#   stays within 3.1e-5 of exact for static QDQ and 2.4e-3 for its fused dynamic INT8 MatMul.
#   Margin for INT8 and FP16: 5e-3, twice the largest.
# Max abs is reported, not judged: across INT8 kernel families single values moved by 48 % of
# the output's range (nudenet) while the cosine moved by 3e-3.
FP32_MARGIN, OTHER_MARGIN = 1e-4, 5e-3
HOST_PROVIDER = "CPUExecutionProvider"   # the host's golden runs; other providers differ by design
# the integer-arithmetic ops whose sums x86 AVX2 saturates (exactly computed in float below)
SUMMING_OPS = ("MatMulInteger", "ConvInteger")


def _reproduce_floor(part: "PartPayload", exact_cosine: float) -> float:
    margin = FP32_MARGIN if part.precision.get("precision") == "fp32" else OTHER_MARGIN
    return math.floor(round((exact_cosine - margin) * 1e4, 4)) / 1e4   # 1 - 1e-10 counts as 1


def _exact_proto(proto: Any) -> Any:
    """*proto* with MatMulInteger/ConvInteger computed in float32: the exact integer sums that
    ARM and VNNI kernels compute (float32 holds them to 2**24), without x86 AVX2's saturation.

    QDQ graphs need no change: run unoptimised, they compute in float already.
    """
    from onnx import TensorProto, helper

    if not any(n.op_type in SUMMING_OPS for n in proto.graph.node):
        return proto
    proto = copy.deepcopy(proto)
    nodes = []
    for node in proto.graph.node:
        if node.op_type not in SUMMING_OPS:
            nodes.append(node)
            continue
        out, operands, given = node.output[0], [], [*node.input, "", ""]
        for i, (value, zero) in enumerate(((given[0], given[2]), (given[1], given[3]))):
            name = f"{out}/exact{i}"
            nodes.append(helper.make_node("Cast", [value], [name], to=TensorProto.FLOAT))
            if zero:   # onnxruntime takes scalar zero points here (per column for MatMul B)
                nodes += [helper.make_node("Cast", [zero], [name + "/zero"], to=TensorProto.FLOAT),
                          helper.make_node("Sub", [name, name + "/zero"], [name + "/centred"])]
                name += "/centred"
            operands.append(name)
        op = helper.make_node("MatMul" if node.op_type == "MatMulInteger" else "Conv", operands,
                              [out + "/exact"])
        op.attribute.extend(node.attribute)
        nodes += [op, helper.make_node("Cast", [out + "/exact"], [out], to=TensorProto.INT32)]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return proto


def _run_host(model: Path | bytes, inputs: dict[str, np.ndarray],
              opt_level: str) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    from .._runtimes.runner.sessions import run_samples, session_options

    options = session_options(ort, {"graph_optimization_level": opt_level})
    session = ort.InferenceSession(model if isinstance(model, bytes) else str(model),
                                   sess_options=options, providers=[HOST_PROVIDER])
    return run_samples(session, inputs)


def _floor(part: "PartPayload", cosine_min: float) -> float:
    """What `run.py check` demands on the device: near the host's figure, and never below the
    budget the bundle promises (the golden samples are held-out samples that kept it)."""
    budget = _budget(part)
    if budget is None or cosine_min < budget:
        # under the budget on the host: a task's head judged that output and its cosine was
        # reported, not gated (the device's task figure judges it; the floor is the host's own)
        return _tolerance(cosine_min)
    return max(_tolerance(cosine_min), budget)


PART_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class PartPayload:
    """One model of a bundle (most bundles have one, named "model")."""

    name: str
    model: Path                       # the model to ship (quantized or not)
    reference: Path | None            # the FP32 model whose outputs the device is judged against;
    #                                   None: there is none, the bundle promises reproduction only
    golden_samples: Sequence[Sample]
    precision: dict[str, Any]
    accuracy: dict[str, Any] | None = None
    preprocess: dict[str, Any] | None = None
    labels: Sequence[str] | None = None
    source: dict[str, Any] = field(default_factory=dict)   # file, sha256, export validation
    graphs: Sequence[Any] = ()        # ProviderGraph: float graphs for providers INT8 serves badly
    task: dict[str, Any] | None = None   # the declared task with what it keeps (tasks/part.py)
    golden_bound: str | None = None   # why fewer golden samples than the default were kept
    length: dict[str, Any] | None = None   # a tts part's token length: open or fixed, and why


def _io_lines(values: Sequence[dict[str, Any]]) -> str:
    return "\n".join(f"- `{v['name']}`: {'x'.join(map(str, v['shape']))} {v['dtype']}"
                     for v in values)


def _accuracy_text(acc: dict[str, Any]) -> str:
    if not acc:
        return "not measured"
    text = f"cosine {acc['cosine_min']:.4f} (min) to FP32 on {acc['samples']} held-out samples"
    if acc.get("data") == "random":
        text += " (random inputs: no calibration data was given)"
    if "top1_agreement" in acc:
        text += f", top-1 agreement {100 * acc['top1_agreement']:.1f}%"
    return text


def _provider_text(p: Any) -> str:
    name = p.name.replace("ExecutionProvider", "")
    notes = [label for key, label in (("trt_fp16_enable", "FP16"), ("trt_int8_enable", "INT8 from "
                                      "the QDQ graph")) if p.options.get(key)]
    if p.options.get("trt_engine_cache_enable"):
        notes.append("engines cached in cache/trt/, built on first run")
    if p.when == "faster":
        notes.append("measured faster at build; needs onnxruntime-openvino, else the next "
                     "provider runs")
    return name + (f" ({', '.join(notes)})" if notes else "")


def _graphs_text(p: dict[str, Any]) -> str:
    lines = [f"\n`{g['file']}` ({g['precision'].upper()}, accuracy "
             f"{_accuracy_text(g['accuracy'])}) serves "
             f"{', '.join(n.replace('ExecutionProvider', '') for n in g['providers'])} instead: "
             f"{g.get('why') or 'a QDQ INT8 graph runs slower than float there'}. The runner "
             "picks the graph of the "
             "provider that starts.\n" for g in p.get("graphs", [])]
    return "".join(lines)


def device_python(install: str) -> str:
    """The Python the device runs run.py with after the target's install line: its venv's
    (`python3 -m venv ~/ort && ~/ort/bin/pip ...` -> ~/ort/bin/python), else python3."""
    found = re.search(r"python3 -m venv (\S+) &&", install or "")
    return f"{found.group(1)}/bin/python" if found else "python3"


def _readme(m: Manifest, target: Target) -> str:
    sections = []
    for p in m.parts:
        sections.append(f"""### {p['name']} (`{p['model']['file']}`)

{p['precision']['description']}; accuracy {_accuracy_text(p['accuracy'])}.
{_graphs_text(p)}
Inputs:
{_io_lines(p['inputs'])}

Outputs:
{_io_lines(p['outputs'])}
""")
    several = len(m.parts) > 1
    part_arg = f" --part {m.parts[0]['name']}" if several else ""
    providers = " → ".join(_provider_text(p) for p in target.providers)
    py = device_python(target.install)
    return f"""# {m.name}

Bundle for **{target.name}** ({target.description}), built by edgepack
{m.tools.get('edgepack', '')}{f", {len(m.parts)} models" if several else ""}.

## Install on the device

Python {target.python}+ and:

    {target.install}

(`requirements.txt` lists the same.) Nothing else is needed; `run.py` installs nothing.{
    "" if py == "python3" else f" Run it with that venv's Python, `{py}` (below; or activate it)."}

Execution providers, tried in this order: {providers}. The runner prints which one runs;
`--require-provider NAME` makes a fallback an error.

## Run

    {py} run.py check                  # file hashes, the host's outputs reproduced{
        ", accuracy vs FP32" if any(p["golden"]["reference"] == "fp32" for p in m.parts)
        else " (no FP32 reference)"}
    {py} run.py bench --runs 200       # latency p50/p90/p99, throughput, peak memory{
        " (each model)" if several else ""}
    {py} run.py bench --json           # the same as one JSON object
    {py} run.py infer{part_arg} input.npy --json # or an image file when it has preprocessing
    {py} run.py serve --port 8080      # HTTP: POST /infer, GET /health, GET /metadata

{"Every command takes `--part NAME` to run one model only. " if several else ""}Exit codes: 0
passed, 1 a check failed, 2 bad input or a broken bundle.

## {"Models" if several else "Model"}

{chr(10).join(sections)}
`manifest.json` holds everything else: preprocessing, providers, session options,
quantization settings, checksums and tool versions.
"""


def bundle(parts: Sequence[PartPayload], output: Path, *, target: Target,
           name: str | None = None, force: bool = False,
           inputs: Sequence[Path | str] = (), tune: Tuner | None = None,
           offline: bool = False, pipeline: dict[str, Any] | None = None,
           judge: Callable[[Path], dict[str, Any]] | None = None,
           extras: Sequence[str] = EXTRAS) -> BundleResult:
    """Write *output*/ and *output*.tar.gz for *target*, holding every part's model.

    Each part's golden data is its samples, the shipped model's outputs on them run here, and
    its FP32 reference's outputs when it has one. *tune* (tuning.local_tuner or remote_tuner)
    times session options with the staged bundle's own runner; the manifest keeps the fastest.
    *offline*: also ship each part's graph optimised offline by this onnxruntime where it loads
    faster (offline.py); the runner loads it under the same onnxruntime version family.
    *pipeline*: the manifest's section that runs the parts as one cascade (cascade/spec.py);
    *judge* measures the staged bundle's pipeline end to end (cascade/judge.py), recorded as
    its `accuracy` (judge raises to publish nothing). *extras*: what the runner carries beyond
    check, bench and infer (serve, tune, profile).
    """
    output = Path(output)
    archive = archive_path(output)
    name = bundle_name(name, output, parts)
    check_free(output, force=force, inputs=inputs)
    check_free(archive, force=force, inputs=inputs)
    names = [p.name for p in parts]
    if not parts or len(set(names)) != len(names):
        raise BundleError(f"part names must be unique and non-empty, got {names}",
                          "give each --part its own name")
    for part_name in names:
        if not PART_NAME.match(part_name):
            raise BundleError(f"part name {part_name!r} is not usable as a file name",
                              "use letters, digits, '-' and '_', starting with a letter")
    protos = [fit_to_runtime(load_model(p.model), target.min_onnxruntime) for p in parts]
    created = build_time()
    with atomic_pair(output, archive, force=force, inputs=inputs) as (tmp, tar_tmp):
        (tmp / "golden").mkdir()
        entries = []
        level = target.session.get("graph_optimization_level", "all")
        for part, proto in zip(parts, protos, strict=True):
            entry = _write_part(tmp, part, proto, level, target.min_onnxruntime)
            if offline:   # against the golden inputs and the outputs just computed for them
                golden = entry["golden"]
                entry["offline"] = offline_graph(
                    tmp, entry["model"]["file"], read_npz(str(tmp), golden["inputs"]), level,
                    read_npz(str(tmp), golden["shipped"]))
            entries.append(entry)
        _write_runner(tmp, parts, target, pipeline, extras)
        manifest = Manifest(
            name=name,
            created=created.isoformat(timespec="seconds"),
            target={"name": target.name, "arch": target.arch, "python": target.python,
                    "runtime_package": target.runtime_package,
                    "min_onnxruntime": target.min_onnxruntime, "install": target.install},
            parts=entries,
            providers=[{"name": p.name, "options": p.options,
                        **({"when": "faster"} if p.when == "faster" else {})}
                       for p in target.providers],
            session=target.session,
            budget={"latency_p90_ms": target.latency_p90_ms, "min_cosine": target.min_cosine},
            roofline=write_roofline(tmp, parts, target) if "roofline" in extras else {},
            tools=tool_versions(),
            pipeline=dict(pipeline or {}),
        )
        (tmp / "README.md").write_text(_readme(manifest, target))
        files = {p.relative_to(tmp).as_posix(): sha256(p) for p in sorted(tmp.rglob("*"))
                 if p.is_file()}
        manifest = Manifest(**{**manifest.__dict__, "files": files})
        manifest.write(tmp / MANIFEST)
        if tune is not None:
            tuning = tune(tmp)
            _remove_unlisted(tmp, files)   # e.g. cache folders a GPU provider made
            manifest = Manifest(**{**manifest.__dict__, "session": tuning["chosen"],
                                   "tuning": tuning})
            manifest.write(tmp / MANIFEST)
        if judge is not None:
            manifest = _judged(tmp, manifest, judge)
        write_archive(tmp, tar_tmp, output.name, created)
    return BundleResult(output, archive, manifest.to_dict(),
                        "sha256:" + sha256(output / MANIFEST))


def _judged(tmp: Path, manifest: Manifest, judge: Callable[[Path], dict[str, Any]]) -> Manifest:
    """The staged bundle's pipeline judged end to end: its accuracy in the manifest, and the
    photos and answers the judge keeps for `run.py check` listed and hashed."""
    accuracy = judge(tmp)
    files = dict(sorted({**manifest.files, **{p.relative_to(tmp).as_posix(): sha256(p) for p in
                                              (tmp / GOLDEN_DIR).rglob("*") if p.is_file()}
                         }.items()))
    _remove_unlisted(tmp, files)
    manifest = Manifest(**{**manifest.__dict__, "files": files,
                           "pipeline": {**manifest.pipeline, "accuracy": accuracy}})
    manifest.write(tmp / MANIFEST)
    return manifest


def _write_runner(tmp: Path, parts: Sequence["PartPayload"], target: Target,
                  pipeline: dict[str, Any] | None, extras: Sequence[str]) -> None:
    """The runner's files the bundle uses, and its requirements.txt."""
    uses = {"parts": [{"task": p.task, "preprocess": p.preprocess} for p in parts],
            "pipeline": pipeline or {}, "providers": [{"name": p.name} for p in target.providers]}
    for rel, source in runner_sources(uses, extras).items():
        (tmp / rel).parent.mkdir(exist_ok=True)
        shutil.copyfile(source, tmp / rel)
    reqs = [f"{target.runtime_package}>={target.min_onnxruntime}", "numpy"]
    if any(p.preprocess for p in parts):
        reqs.append("opencv-python-headless  # image inputs only")
    (tmp / "requirements.txt").write_text("\n".join(reqs) + "\n")


def bundle_name(name: str | None, output: Path, parts: Sequence["PartPayload"]) -> str:
    """The manifest's name: *name* when given (BundleError unless it is one safe path component:
    devices keep the bundle in ~/edgepack/NAME), else the output folder's name, else the first
    model's source file name (its stem), made safe ('-' for other characters), else "bundle"."""
    if name is not None:
        problem = name_problem(name)
        if problem:
            raise BundleError(f"bundle {problem}", f"use {NAME_RULE}")
        return name
    stems = [output.name] + [Path(str(p.source.get("file") or "")).stem for p in parts[:1]]
    return next((safe for safe in map(safe_name, stems) if safe), "bundle")


def _remove_unlisted(folder: Path, files: dict[str, str]) -> None:
    """Remove what a run of the staged bundle left in it beyond its files and manifest."""
    for path in sorted(folder.rglob("*"), reverse=True):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel not in files and rel != MANIFEST:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def build_time() -> datetime:
    """Now, or SOURCE_DATE_EPOCH when set (reproducible builds: the same inputs give the same
    bundle and archive, byte for byte)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch:
        try:
            return datetime.fromtimestamp(int(epoch), UTC)
        except (ValueError, OverflowError, OSError):
            raise BundleError(f"SOURCE_DATE_EPOCH={epoch!r} is not a Unix time in seconds",
                              "set it to an integer such as $(git log -1 --format=%ct), or "
                              "unset it") from None
    return datetime.now(UTC)


def write_archive(folder: Path, path: Path, arcname: str, when: datetime) -> None:
    """A reproducible .tar.gz of *folder*: sorted members, one mtime (*when*), owner root,
    modes 0644/0755, and no name or time in the gzip header."""
    mtime = int(when.timestamp())

    def member(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "root", "root"
        info.mode = 0o755 if info.isdir() else 0o644
        return info

    # level 1, not gzip's default 9: on CenterFace's 53 MB bundle 9 took 12.6 s, 6 2.1 s; on
    # MiniLM's 128 MB 6 took 3.8 s and 1 3.0 s for an archive 1% larger (float weights and
    # golden tensors hardly compress)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                  mtime=mtime, compresslevel=1) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(folder, arcname=arcname, recursive=False, filter=member)
        for item in sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")):
            tar.add(folder / item, arcname=f"{arcname}/{item}", recursive=False, filter=member)


def _operations(part: PartPayload, proto: Any) -> dict[str, Any]:
    """Operations per call (2 x the multiply-adds of Conv, Gemm, MatMul and fused attention),
    counted on the FP32 graph: what `run.py bench` divides by its latency for GOP/s."""
    from ..graph.inspection import estimate_flops

    source = load_model(part.reference, check=False) if part.reference is not None else proto
    return {"per_call": estimate_flops(source),
            "counted": "2 x multiply-adds of Conv, ConvTranspose, Gemm, MatMul, Attention"}




def _write_part(tmp: Path, part: PartPayload, proto: Any, opt_level: str,
                min_ort: str) -> dict[str, Any]:
    """Write the part's model and golden data into *tmp*; return its manifest entry."""
    model_file = f"{part.name}.onnx"
    save_model(proto, tmp / model_file)
    golden: dict[str, Any] = {"inputs": f"golden/{part.name}.inputs.npz",
                              "shipped": f"golden/{part.name}.shipped.npz",
                              "shipped_provider": HOST_PROVIDER,
                              "samples": len(part.golden_samples),
                              **({"capped": part.golden_bound} if part.golden_bound else {})}
    samples = stack(part.golden_samples)
    np.savez(tmp / golden["inputs"], **samples)
    shipped = _run_host(tmp / model_file, samples, opt_level)
    np.savez(tmp / golden["shipped"], **npz_arrays(shipped))
    exact = _exact_proto(proto)
    exact_run = _run_host(tmp / model_file if exact is proto else exact.SerializeToString(),
                          samples, "disabled")
    golden["exact_cosine"] = min(o["cosine_min"] for o in
                                 compare_outputs(shipped, exact_run).values())
    golden["reproduce_min_cosine"] = _reproduce_floor(part, golden["exact_cosine"])
    reference = None
    if part.reference is None:   # the shipped model is its own reference: no accuracy claim
        golden.update(reference="shipped", min_cosine=_floor(part, golden["exact_cosine"]),
                      budget_min_cosine=_budget(part))
    else:
        reference = run_model(part.reference, part.golden_samples)
        golden["outputs"] = f"golden/{part.name}.outputs.npz"
        np.savez(tmp / golden["outputs"], **npz_arrays(reference))
        own = compare_outputs(shipped, reference)
        golden.update(reference="fp32", budget_min_cosine=_budget(part), host=own,
                      min_cosine=_floor(part, min(o["cosine_min"] for o in own.values())))
    inputs = graph_inputs(proto)
    entry_graphs = [_write_graph(tmp, part, graph, golden, min_ort, reference)
                    for graph in part.graphs]
    return {
        "name": part.name,
        "model": {"file": model_file, "sha256": sha256(tmp / model_file),
                  "bytes": (tmp / model_file).stat().st_size, "ir_version": proto.ir_version,
                  "opset": opset_of(proto)},
        "inputs": [{**s, "shape": _recorded_dims(v, part.length)} for s, v in
                   zip(io_specs(inputs), inputs, strict=True)],
        "outputs": io_specs(proto.graph.output),
        "preprocess": part.preprocess,
        "labels": list(part.labels) if part.labels else None,
        **({"task": part.task} if part.task else {}),
        "precision": part.precision,
        "accuracy": part.accuracy or {},
        "golden": golden,
        "operations": _operations(part, proto),
        "source": part.source,
        **({"graphs": entry_graphs} if entry_graphs else {}),
        **({"length": part.length} if part.length else {}),
    }


def _recorded_dims(value: Any, length: dict[str, Any] | None) -> list[int | str]:
    """An input's dims for the manifest: an open length axis (length.py) as the build's static
    length, which the golden data have; the manifest's `length` says the axis is open."""
    dims = dims_of(value)
    if length and length.get("dynamic") and value.name == length["input"]:
        dims[length["axis"]] = length["static"]
    return dims


def _write_graph(tmp: Path, part: PartPayload, graph: Any, golden: dict[str, Any],
                 min_ort: str, reference: dict[str, np.ndarray] | None) -> dict:
    """A provider's own graph beside the part's model, and the floor `run.py check` holds it to
    (its host cosine to the FP32 *reference* outputs on the golden samples, less the margin,
    never below the budget)."""
    model_file = f"{part.name}.{graph.precision}.onnx"
    save_model(fit_to_runtime(load_model(graph.model), min_ort), tmp / model_file)
    entry = {"file": model_file, "sha256": sha256(tmp / model_file),
             "bytes": (tmp / model_file).stat().st_size, "precision": graph.precision,
             "providers": list(graph.providers), "accuracy": graph.accuracy, "why": graph.why}
    if graph.note:
        entry["note"] = graph.note
    if reference is not None:
        host = compare_outputs(run_model(tmp / model_file, part.golden_samples), reference)
        entry["host"] = host
        # a graph measured under its own provider (OpenVINO) holds the lower of both figures
        ran = min([o["cosine_min"] for o in host.values()] +
                  [graph.accuracy.get("cosine_min", 1.0)])
        entry["min_cosine"] = _floor(part, ran)
    else:
        entry["min_cosine"] = golden["min_cosine"]
    return entry
