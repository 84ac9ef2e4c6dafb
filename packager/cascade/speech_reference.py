"""The model as it runs: what a tts pipeline's bundle is judged against, so that what the
bundle's glue changes (padding a sentence to the encoder's static length, cutting it into
pieces, the vocoder's chunks) is measured, not hidden. Its PyTorch forward() on the whole
sentence where the pipeline's source is PyTorch; else, or where forward() gives no waveform,
its parts unpadded: the encoder on the whole sentence and the vocoder on all the frames at
once where the original takes any length, as the glue runs them where the original fixes it.

    Reference(speak, what)              .speak(tokens) -> float32 samples; what: said in logs
    reference_speech(spec, root, runs, original)
    padding_effect(reference, padded, sentences)   the glue's padding against the reference
    blame(wants, manifest, run_part, runs, held, parts)   the part that breaks it
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._runtimes.runner.cascade import Cascade
from .._runtimes.runner.cascade_tts import Speech, alike, regulate, vocode
from .spec import PipelineSpec


@dataclass(frozen=True)
class Reference:
    speak: Callable[[np.ndarray], np.ndarray]
    what: str   # "the PyTorch model's forward()", "the original parts, each sentence whole"...


def reference_speech(spec: PipelineSpec, root: Any, runs: dict[str, Any],
                     original: Speech) -> Reference:
    """The model as it runs (module doc): *root* the pipeline's PyTorch model (LoadedModel, or
    None for .onnx parts), *runs* its parts' runners (speech.original_parts), *original* its
    parts through the bundle's glue (speech.original_speech)."""
    probe = np.arange(1, 4, dtype=np.int64)
    if root is not None:
        forward = _forward(root.module)
        try:
            audio = forward(probe)
        except Exception:   # a forward() that is not the whole model: its parts then judge
            audio = None
        if audio is not None and audio.dtype.kind == "f":
            return Reference(forward, "the PyTorch model's forward()")
    encoder, decoder = (runs[original.encoder["name"]], runs[original.vocoder["name"]])
    enc_open, voc_open = getattr(encoder, "open", False), getattr(decoder, "open", False)
    dtype = original.encoder["inputs"][0].get("dtype", "int64")
    frame_type = original.vocoder["inputs"][0].get("dtype", "float32")

    def speak(tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        if enc_open:
            out = original.cascade.run(original.encoder, tokens[None].astype(dtype), {})
            frames = regulate(np.asarray(out[original.hidden])[0],
                              np.asarray(out[original.durations])[0],
                              original.enc_conf["max_repeat"])
        else:
            frames = original.frames(tokens, {})
        frames = frames.astype(frame_type)
        if not len(frames):
            return np.zeros(0, np.float32)
        if voc_open:
            return np.asarray(decoder(frames[None])[0], np.float32).reshape(-1)
        return vocode(frames, lambda window: decoder(window)[0], original.chunk,
                      original.voc_conf["context"])
    what = "the original parts, " + ("each sentence whole" if enc_open and voc_open else
                                      "the encoder on each sentence whole" if enc_open else
                                      "the vocoder on all the frames at once" if voc_open else
                                      "at the lengths they fix")
    return Reference(speak, what)


def _forward(module: Any) -> Callable[[np.ndarray], np.ndarray]:
    import torch

    def speak(tokens: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = module(torch.from_numpy(np.asarray(tokens, np.int64).reshape(1, -1)))
        first = out[0] if isinstance(out, (tuple, list)) else out
        return first.detach().cpu().numpy().reshape(-1)
    return speak


def padding_effect(reference: Reference, padded: Speech, sentences: Sequence[np.ndarray]
                   ) -> list[dict[str, Any]]:
    """{length_ratio, mel_db, snr_db, alike} of each sentence spoken by *padded* (the original
    parts through the bundle's glue at the encoder's static length) against *reference*."""
    return [alike(padded.voc_conf, reference.speak(tokens), padded.speak(tokens, {}))
            for tokens in sentences]


def blame(wants: Sequence[np.ndarray], manifest: dict[str, Any],
          run_part: Callable[[dict, dict], Any], runs: dict[str, Any],
          sentences: Sequence[np.ndarray], parts: Sequence[str]) -> list[str]:
    """Of *parts* (the bundle's parts below FP32), the one whose shipped graph breaks the
    end-to-end budget: the first whose original, run in its place (the others as the bundle
    runs them, *run_part*), lets every sentence sound alike with the reference's speech
    (*wants*, one a sentence, spoken once by the caller); all of them where none alone does."""
    for part in parts if len(parts) > 1 else ():
        mixed = Speech(Cascade(manifest, _swapped(run_part, runs, part)))
        if all(alike(mixed.voc_conf, want, mixed.speak(t, {}))["alike"]
               for want, t in zip(wants, sentences, strict=True)):
            return [part]
    return list(parts)


def _swapped(run_part: Callable[[dict, dict], Any], runs: dict[str, Any], part: str
             ) -> Callable[[dict, dict], Any]:
    """run_part with *part* run by its original (runs[part])."""
    def run(entry: dict, feed: dict) -> Any:
        if entry["name"] == part:
            return runs[part](next(iter(feed.values())))
        return run_part(entry, feed)
    return run
