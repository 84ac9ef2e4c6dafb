"""A tts pipeline's build: its encoder and vocoder as two parts of one bundle (each its own
.onnx, or each a module of one PyTorch model with its weights, exported separately), the glue
between them shipped in the runner (runner/cascade_tts.py), the vocoder calibrated on the
frames the original encoder makes of the encode stage's sentences, and the whole judged end to
end on held-out sentences against the original parts run through the same glue, by how they
sound (length, log-mel distance); a few of those sentences and the original's speech kept in
the bundle (golden/pipeline/) for `run.py check`."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._runtimes.runner.cascade import Cascade, pipeline_sessions, session_runner
from .._runtimes.runner.cascade_judge import GOLDEN_DIR
from .._runtimes.runner.cascade_tts import Speech, alike, read_tokens, speech_figure
from .._runtimes.runner.cascade_tts import pieces as sentence_pieces
from .._runtimes.runner.cascade_tts import windows as frame_windows
from .._runtimes.runner.errors import BundleError
from .._runtimes.runner.manifest import load_manifest
from ..errors import CalibrationError, SpecError
from .spec import PipelineSpec, Stage
from .speech_reference import blame, padding_effect, reference_speech

MAX_FRAMES = 2000     # vocoder windows kept to calibrate on (the quantizer holds them at once)
GOLDEN_SENTENCES = 4  # held-out sentences a bundle keeps for `run.py check`
PROBES = 4            # sentences the glue's padding is measured on before the build


def sentence_files(folder: Path) -> list[Path]:
    """The encode stage's sentences: .npy files of token ids, in name order."""
    return sorted(p for p in Path(folder).rglob("*.npy") if p.is_file())


def read_sentence(path: Path) -> np.ndarray:
    """(n,) int64 token ids of one sentence file (one line naming it when it is not one)."""
    try:
        return read_tokens(np.fromfile(path, dtype=np.uint8), str(path))
    except BundleError as exc:
        raise CalibrationError(str(exc), "save each sentence's token ids with numpy.save "
                               "(an (n,) or (1, n) integer array)") from None


def _torch_runner(module: Any) -> Any:
    """run(feed array) -> [numpy outputs] of a PyTorch module, in eager mode."""
    import torch

    def run(tensor: np.ndarray) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(torch.from_numpy(np.ascontiguousarray(tensor)))
        return [t.detach().cpu().numpy() for t in (out if isinstance(out, (tuple, list))
                                                   else (out,))]
    run.open = True   # type: ignore[attr-defined]  (eager modules take any length)
    return run


def _onnx_runner(model: Path) -> Any:
    """run(feed array) -> [numpy outputs] of an .onnx part on the CPU provider; run.names are
    its outputs' names, run.open whether its input's axis 1 takes any length."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    first = session.get_inputs()[0]

    def run(tensor: np.ndarray) -> list[np.ndarray]:
        return session.run(names, {first.name: tensor})
    run.names = names   # type: ignore[attr-defined]
    run.open = len(first.shape) > 1 and not isinstance(first.shape[1], int)  # type: ignore
    return run


def load_root(spec: PipelineSpec) -> Any:
    """The pipeline's PyTorch model (LoadedModel) with its weights, or None for .onnx parts."""
    if not spec.model:
        return None
    from ..source.torchload import load_source

    return load_source(spec.model, weights=spec.weights)


def original_parts(spec: PipelineSpec, root: Any = None) -> dict[str, Any]:
    """{part: run(feed array) -> [numpy outputs]} of the pipeline's original parts:
    onnxruntime sessions on its .onnx files, or its PyTorch model's (*root*) modules in eager
    mode; each runs any length its original takes."""
    runs = {}
    for stage in spec.stages:
        if root is not None:
            from ..source.torchload import select_submodule

            module = select_submodule(root.module, stage.module or "", str(spec.model))
            runs[stage.part] = _torch_runner(module.eval())
        else:
            runs[stage.part] = _onnx_runner(stage.model)
    return runs


def original_speech(spec: PipelineSpec, root: Any = None, open_encoder: bool = False,
                    runs: dict[str, Any] | None = None) -> Speech:
    """The runner's Speech over the pipeline's original parts (original_parts(): outputs named
    as the export names them, output or output_0, output_1...), run as the bundle's glue runs
    them: the encoder on padded pieces of its static length (the whole sentence with
    *open_encoder*), the vocoder on chunks."""
    runs = runs if runs is not None else original_parts(spec, root)
    parts = []
    for stage in spec.stages:
        assert stage.input is not None   # load_pipeline requires it of a tts stage
        outputs = runs[stage.part](np.zeros(stage.input.shape, stage.input.dtype))
        names = getattr(runs[stage.part], "names", None) or (
            ["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))])
        part = {"name": stage.part, "inputs": [{"name": stage.input.name,
                                                "shape": list(stage.input.shape),
                                                "dtype": stage.input.dtype}],
                "outputs": [{"name": n, "shape": list(o.shape)} for n, o in zip(names, outputs,
                                                                                 strict=True)]}
        if open_encoder and stage.step == "encode":
            part["length"] = {"input": stage.input.name, "axis": 1, "dynamic": True}
        parts.append(part)
    return Speech(Cascade({"parts": parts, "pipeline": spec.section()},
                          lambda part, feed: runs[part["name"]](next(iter(feed.values())))))


def speech_lengths(spec: PipelineSpec, sentences: list[Path], log: Callable[[str], None]
                   ) -> tuple[Speech, str]:
    """(the original parts as the bundle will run them, the encoder input kept open or ''):
    on up to PROBES of *sentences*, the original parts through the glue at the encoder's static
    length against the model as it runs (speech_reference); where that misses the vocode
    stage's budget and the encoder takes any length, it keeps its length open (a sentence then
    runs whole), said in one line with the measured figures either way."""
    encode = stage_of(spec, "encode")
    assert encode.input is not None   # load_pipeline requires it of a tts stage
    root = load_root(spec)
    runs = original_parts(spec, root)
    padded = original_speech(spec, root, runs=runs)
    static, pad = int(encode.input.shape[1]), padded.enc_conf["pad"]
    try:
        runs[encode.part](np.full((1, static), pad, encode.input.dtype))
    except Exception as exc:   # e.g. an id past the embedding: the user's pad, said so
        raise SpecError(f"{spec.path}: stage[{spec.stages.index(encode)}].pad = {pad}: the "
                        f"original {encode.part} refuses it ({' '.join(str(exc).split())[:160]})",
                        "pad with a token id the encoder knows (0 by default)") from None
    reference = reference_speech(spec, root, runs, padded)
    probes = [read_sentence(p) for p in sentences[:PROBES]]
    said = f"length: against {reference.what} on {len(probes)} sentence(s), padding to " \
        f"{static} tokens (longer sentences in pieces of {static})"
    effect = _worst(padding_effect(reference, padded, probes))
    if effect["alike"]:
        log(f"{said} keeps the speech within the budget ({_said(effect)}): the encoder "
            f"runs at {static} tokens")
        return padded, ""
    if not getattr(runs[encode.part], "open", False):
        log(f"{said} moves the speech ({_said(effect)}, over the budget), and the encoder's "
            "original fixes its length: the end-to-end judge decides")
        return padded, ""
    whole = original_speech(spec, root, open_encoder=True, runs=runs)
    opened = _worst(padding_effect(reference, whole, probes))
    log(f"{said} moves the speech ({_said(effect)}, over the budget; the encoder has no mask "
        f"for it): the encoder keeps {encode.input.name}'s length open, a sentence runs whole "
        f"({_said(opened)}" + ("" if opened["alike"] else "; still over: the vocoder's chunks, "
                               "raise the vocode stage's context") + ")")
    return whole, encode.input.name


def _worst(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The sentences' figures as one: the worst distance and length, all alike or not."""
    return {"mel_db": max([r["mel_db"] for r in results] or [0.0]),
            "length": max([abs(r["length_ratio"] - 1) for r in results] or [0.0]),
            "alike": all(r["alike"] for r in results)}


def _said(effect: dict[str, Any]) -> str:
    return f"worst {effect['mel_db']:.2f} dB, length off by {100 * effect['length']:.1f} %"


def speech_calibration(spec: PipelineSpec, original: Speech, sentences: list[np.ndarray],
                       folder: Path) -> dict[str, Path]:
    """{part: folder of one .npz} for both stages: the encoder's padded pieces of the
    sentences, and the vocoder's windows of the frames the original encoder makes of them."""
    encode, vocode = spec.stages
    pieces, windows = [], []
    for tokens in sentences:   # cut as the runner's glue cuts them (cascade_tts)
        pieces += [feed for feed, _ in sentence_pieces(tokens, original.tokens,
                                                       original.enc_conf["pad"],
                                                       encode.input.dtype)]
        windows += [window for window, _ in frame_windows(
            original.frames(tokens, {}).astype(vocode.input.dtype), original.chunk,
            original.voc_conf["context"])]
    if not windows:
        raise CalibrationError(f"{encode.calib}: the original encoder gives no frames for its "
                               "sentences (every duration rounds to 0)",
                               "check the sentences' token ids and the encode stage's "
                               "durations output")
    out = {}
    for stage, arrays in ((encode, pieces), (vocode, windows[::max(1, len(windows) //
                                                                   MAX_FRAMES)][:MAX_FRAMES])):
        target = folder / f"{stage.part}-calib"
        target.mkdir(parents=True)
        np.savez(target / "samples.npz", **{stage.input.name: np.concatenate(arrays)})
        out[stage.part] = target
    return out


def speech_end_to_end(spec: PipelineSpec, bundle: Path, held: list[Path]) -> dict[str, Any]:
    """The staged *bundle*'s speech on the *held* sentences against the model as it runs
    (speech_reference: its PyTorch forward(), or its parts unpadded), each judged by the vocode
    stage's budget: every sentence must sound alike. Where one does not, `blame` names the
    part below FP32 that breaks it (speech_reference.blame). The first GOLDEN_SENTENCES and
    the reference's speech are written into the bundle's golden/pipeline/ (tokens.npz,
    audio.npz) for `run.py check`."""
    root = load_root(spec)
    runs = original_parts(spec, root)
    reference = reference_speech(spec, root, runs, original_speech(spec, root, runs=runs))
    manifest = load_manifest(str(bundle))
    run_part = session_runner(pipeline_sessions(str(bundle), manifest, None))
    shipped = Speech(Cascade(manifest, run_part))
    results, golden, sentences, wants = [], [], [], []
    for path in held:
        sentences.append(read_sentence(path))
        want, got = reference.speak(sentences[-1]), shipped.speak(sentences[-1], {})
        wants.append(want)
        results.append(dict(alike(shipped.voc_conf, want, got), sentence=path.name))
        if len(golden) < GOLDEN_SENTENCES:
            golden.append((sentences[-1], want, results[-1]["alike"]))
    figure = speech_figure(shipped.voc_conf, results, "held-out sentence(s)")
    figure["text"] = f"end to end: against {reference.what}: " + figure["text"]
    figure["reference"] = reference.what
    lower = [p["name"] for p in manifest["parts"]
             if (p.get("precision") or {}).get("precision") != "fp32"]
    if not figure["passed"] and lower:
        figure["below"] = lower
        figure["blame"] = blame(wants, manifest, run_part, runs, sentences, lower)
    if golden:
        figure["golden"] = write_speech_golden(bundle, golden)
    return figure


def write_speech_golden(bundle: Path, golden: list[tuple[np.ndarray, np.ndarray, bool]]
                        ) -> dict[str, Any]:
    """golden/pipeline/tokens.npz and audio.npz (sentence0, sentence1...) in *bundle*, and the
    manifest's entry for them."""
    folder = Path(bundle) / GOLDEN_DIR
    folder.mkdir(parents=True, exist_ok=True)
    keys = [f"sentence{k}" for k in range(len(golden))]
    np.savez_compressed(folder / "tokens.npz", **dict(zip(keys, (g[0] for g in golden),
                                                          strict=True)))
    np.savez_compressed(folder / "audio.npz", **dict(zip(keys, (g[1] for g in golden),
                                                         strict=True)))
    return {"tokens": f"{GOLDEN_DIR}/tokens.npz", "audio": f"{GOLDEN_DIR}/audio.npz",
            "count": len(golden), "wanted": len(golden), "same": sum(g[2] for g in golden)}


def speech_sources(spec: PipelineSpec) -> dict[str, Any]:
    """build()'s source, parts and weights for the stages: the PyTorch model with each
    stage's module, or each stage's .onnx."""
    if spec.model:
        return {"source": spec.model, "parts": {s.part: s.module for s in spec.stages},
                "weights": spec.weights}
    return {"source": spec.path, "parts": {s.part: str(s.model) for s in spec.stages}}


def stage_of(spec: PipelineSpec, step: str) -> Stage:
    found = spec.stage(step)
    assert found is not None   # load_pipeline requires both steps of a tts pipeline
    return found
