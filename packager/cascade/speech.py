"""A tts pipeline's build: its encoder and vocoder as two parts of one bundle (each its own
.onnx, or each a module of one PyTorch model with its weights, exported separately), the glue
between them shipped in the runner (runner/cascade_tts.py), the vocoder calibrated on the
frames the original encoder makes of the encode stage's sentences, and the whole judged end to
end on held-out sentences against the original parts run through the same glue, by how they
sound (length, log-mel distance); a few of those sentences and the original's speech kept in
the bundle (golden/pipeline/) for `run.py check`."""

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
from ..errors import CalibrationError
from .spec import PipelineSpec, Stage

MAX_FRAMES = 2000     # vocoder windows kept to calibrate on (the quantizer holds them at once)
GOLDEN_SENTENCES = 4  # held-out sentences a bundle keeps for `run.py check`


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
    return run


def _onnx_runner(model: Path) -> tuple[Any, list[str]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    name = session.get_inputs()[0].name
    return (lambda tensor: session.run(names, {name: tensor})), names


def original_speech(spec: PipelineSpec) -> Speech:
    """The runner's Speech over the pipeline's original parts: onnxruntime sessions on its
    .onnx files, or its PyTorch model's modules in eager mode (outputs named as the export
    names them: output, or output_0, output_1...)."""
    root = None
    if spec.model:
        from ..source.torchload import load_source, select_submodule

        root = load_source(spec.model, weights=spec.weights)
    parts, runs = [], {}
    for stage in spec.stages:
        assert stage.input is not None   # load_pipeline requires it of a tts stage
        if root is not None:
            module = select_submodule(root.module, stage.module or "", str(spec.model))
            run = _torch_runner(module.eval())
            outputs = run(np.zeros(stage.input.shape, stage.input.dtype))
            names = ["output"] if len(outputs) == 1 else [f"output_{i}" for i in
                                                         range(len(outputs))]
            shapes = [list(o.shape) for o in outputs]
        else:
            run, names = _onnx_runner(stage.model)
            shapes = [list(o.shape) for o in run(np.zeros(stage.input.shape, stage.input.dtype))]
        parts.append({"name": stage.part, "inputs": [{"name": stage.input.name,
                                                      "shape": list(stage.input.shape),
                                                      "dtype": stage.input.dtype}],
                      "outputs": [{"name": n, "shape": s} for n, s in zip(names, shapes,
                                                                           strict=True)]})
        runs[stage.part] = run
    return Speech(Cascade({"parts": parts, "pipeline": spec.section()},
                          lambda part, feed: runs[part["name"]](next(iter(feed.values())))))


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
    """The staged *bundle*'s speech on the *held* sentences against the original parts'
    through the same glue, each judged by the vocode stage's budget: every sentence must sound
    alike. The first GOLDEN_SENTENCES and the original's speech are written into the bundle's
    golden/pipeline/ (tokens.npz, audio.npz) for `run.py check`."""
    original = original_speech(spec)
    manifest = load_manifest(str(bundle))
    shipped = Speech(Cascade(manifest, session_runner(pipeline_sessions(str(bundle), manifest,
                                                                         None))))
    results, golden = [], []
    for path in held:
        tokens = read_sentence(path)
        want, got = original.speak(tokens, {}), shipped.speak(tokens, {})
        results.append(dict(alike(shipped.voc_conf, want, got), sentence=path.name))
        if len(golden) < GOLDEN_SENTENCES:
            golden.append((tokens, want, results[-1]["alike"]))
    figure = speech_figure(shipped.voc_conf, results, "held-out sentence(s)")
    figure["text"] = "end to end: " + figure["text"]
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
