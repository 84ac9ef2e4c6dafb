"""A speech pipeline (kind "tts"): token ids to a waveform through two parts and the glue
between them, the length regulation of every duration-based TTS model:

    encode   text encoder and duration predictor: token ids (1, T) -> hidden states (1, T, D)
             and durations (1, T), frames per token
    (glue)   each token's hidden state repeated by its rounded duration: (F, D) frames
    vocode   decoder/vocoder: frames (1, C, D) -> samples (1, C x hop), run on chunks of C
             frames (its static length), `context` frames of overlap either side

Both parts keep static shapes: a sentence is padded with the `pad` id to the encoder's T
tokens (only its own tokens' rows are kept) and cut into pieces of T tokens when longer; the
frames are run C at a time. Exact where a token's outputs do not depend on the padding (a
per-token encoder, or one with a mask); the build judges the bundle end to end against the
model as it runs (its PyTorch forward(), or its parts unpadded), and where padding moves the
speech the encoder keeps its length open (its part's `length`): a sentence then runs whole.

    Speech(cascade)               .speak(tokens, timing) -> float32 samples; .stream(): pieces
    regulate(hidden, durations, max_repeat)
    vocode(frames, run, chunk, context)
    read_tokens(data, path)       a sentence's token ids from an .npy's bytes
    alike(conf, want, got)        {length_ratio, mel_db, snr_db, alike}: one sentence judged
"""

import io
import time

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import BundleError, one_line
from .task_tts import mel_distance, snr, write_wavs

MAX_TOKENS = 100000   # ids in one sentence file
MAX_FRAMES = 1 << 20  # frames one sentence may regulate to (x hop samples: hours of audio)
MAX_SNR = 200.0       # dB: the same samples (an infinite SNR, which JSON cannot hold)


def read_tokens(data, path):
    """A sentence's token ids, (n,) int64, from an .npy file's bytes (*data*: a uint8 array)."""
    try:
        tokens = np.load(io.BytesIO(bytes(data)), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BundleError("%s: not an .npy of token ids (%s); save them with numpy.save"
                          % (path, one_line(exc))) from None
    if tokens.dtype.kind not in "iu" or tokens.size < 1 or tokens.size > MAX_TOKENS or \
            tokens.ndim > 2 or (tokens.ndim == 2 and tokens.shape[0] != 1):
        raise BundleError("%s: an array of %s %s, not one sentence's token ids ((n,) or (1, n) "
                          "integers, 1 to %d)" % (path, tokens.dtype, list(tokens.shape),
                                                  MAX_TOKENS))
    return tokens.reshape(-1).astype(np.int64)


def regulate(hidden, durations, max_repeat=0):
    """(F, D) frames: row i of *hidden* (T, D) repeated round(durations[i]) times (negative as
    0; at most *max_repeat* when it is not 0)."""
    counts = np.rint(np.nan_to_num(np.asarray(durations, np.float64).reshape(-1)))
    counts = np.maximum(counts, 0).astype(np.int64)
    if max_repeat:
        counts = np.minimum(counts, int(max_repeat))
    if int(counts.sum()) > MAX_FRAMES:
        raise BundleError("the durations ask for %d frames, over %d: not a sentence's"
                          % (int(counts.sum()), MAX_FRAMES))
    return np.repeat(np.asarray(hidden), counts, axis=0)


def pieces(tokens, length, pad, dtype):
    """(the (1, *length*) feed, its tokens' count) for each piece of a sentence's *tokens*:
    *length* at a time, the last padded with *pad*."""
    for start in range(0, len(tokens), length):
        piece = tokens[start:start + length]
        feed = np.full((1, length), pad, dtype)
        feed[0, :len(piece)] = piece
        yield feed, len(piece)


def windows(frames, chunk, context=0):
    """(the (1, chunk, D) window, the frames of its middle to keep) over *frames* (F, D):
    stepping chunk - 2 x context, zeros past either end."""
    count, width = frames.shape
    step = chunk - 2 * context
    for start in range(0, count, step):
        window = np.zeros((chunk, width), frames.dtype)
        lo, hi = start - context, start - context + chunk
        window[max(lo, 0) - lo:min(hi, count) - lo] = frames[max(lo, 0):min(hi, count)]
        yield window[None], min(step, count - start)


def vocoded(frames, run, chunk, context=0):
    """The waveform of *frames* (F, D) piece by piece (a generator of float32 samples), as
    run((1, chunk, D) frames) makes each window's: its middle kept."""
    hop = None
    for window, keep in windows(frames, chunk, context):
        samples = np.asarray(run(window)).reshape(-1)
        if hop is None:
            if samples.size % chunk:
                raise BundleError("the vocoder gave %d samples for %d frames: not a whole "
                                  "number a frame" % (samples.size, chunk))
            hop = samples.size // chunk
        yield samples[context * hop:(context + keep) * hop].astype(np.float32)


def vocode(frames, run, chunk, context=0):
    """The waveform of *frames* (F, D) whole: vocoded()'s pieces joined."""
    parts = list(vocoded(frames, run, chunk, context))
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def encoder_outputs(part, conf):
    """(hidden output name, durations output name) of the encode *part*: `durations` names
    the latter, else it is the output of 2 dimensions and the hidden states the one of 3."""
    outputs = part["outputs"]
    named = conf.get("durations")
    durations = named or next((o["name"] for o in outputs if len(o.get("shape") or ()) == 2),
                              None)
    hidden = next((o["name"] for o in outputs if o["name"] != durations and
                   len(o.get("shape") or ()) == 3), None)
    return hidden, durations


class Speech(object):
    """A tts pipeline over a Cascade's parts and run (cascade.py)."""

    def __init__(self, cascade):
        self.cascade = cascade
        self.encoder, self.enc_conf = cascade.stage("encode")
        self.vocoder, self.voc_conf = cascade.stage("vocode")
        self.hidden, self.durations = encoder_outputs(self.encoder, self.enc_conf)
        self.tokens = self.encoder["inputs"][0]["shape"][1]
        # an encoder whose padding moves the speech keeps its length open: a sentence runs whole
        self.open = bool((self.encoder.get("length") or {}).get("dynamic"))
        self.chunk = self.vocoder["inputs"][0]["shape"][1]
        if 2 * self.voc_conf["context"] >= self.chunk:   # windows() would step by 0 or less
            raise BundleError("the vocode stage's context %d leaves nothing of its %d-frame "
                              "chunk; rebuild the bundle with a smaller context"
                              % (self.voc_conf["context"], self.chunk))

    def frames(self, tokens, timing):
        """(F, D) frames of one sentence: the encoder on pieces of its T tokens, padded (on the
        whole sentence where its length is open)."""
        rows = []
        for feed, count in pieces(tokens, len(tokens) if self.open else self.tokens,
                                  self.enc_conf["pad"],
                                  self.encoder["inputs"][0].get("dtype", "int64")):
            out = self.cascade.run(self.encoder, feed, timing)
            clock = _Clock(timing, "glue")
            rows.append(regulate(np.asarray(out[self.hidden])[0, :count],
                                 np.asarray(out[self.durations])[0, :count],
                                 self.enc_conf["max_repeat"]))
            clock.stop()
        return np.concatenate(rows)

    def stream(self, tokens, timing):
        """One sentence's waveform piece by piece as the vocoder makes it (a generator of
        float32 samples: `serve` sends each as it comes), each stage's milliseconds added to
        *timing* (encoder and vocoder by part name, and glue) while it runs."""
        frames = self.frames(np.asarray(tokens, np.int64).reshape(-1), timing)
        dtype = self.vocoder["inputs"][0].get("dtype", "float32")
        name = self.vocoder["name"]
        pieces = vocoded(frames.astype(dtype),
                         lambda window: list(self.cascade.run(self.vocoder, window,
                                                              timing).values())[0],
                         self.chunk, self.voc_conf["context"])
        while True:   # the windows cut and joined are glue; the vocoder's runs are its own
            clock, ran = _Clock(timing, "glue"), timing.get(name, 0.0)
            piece = next(pieces, None)
            clock.stop()
            timing["glue"] -= timing.get(name, 0.0) - ran
            if piece is None:
                return
            yield piece

    def speak(self, tokens, timing):
        """The waveform (float32 samples) of one sentence's token ids: stream()'s pieces."""
        parts = list(self.stream(tokens, timing))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)


class _Clock(object):
    """Milliseconds from its start to stop() added to timing[key]."""

    def __init__(self, timing, key):
        self.timing, self.key, self.start = timing, key, time.perf_counter()

    def stop(self):
        self.timing[self.key] = self.timing.get(self.key, 0.0) + \
            (time.perf_counter() - self.start) * 1000.0


def alike(conf, want, got):
    """One sentence's waveform *got* against the original's *want*, by the vocode stage's
    budget: {length_ratio, mel_db, snr_db, alike}."""
    want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
    ratio = float(len(got)) / max(len(want), 1)
    mel = mel_distance(want, got, conf["rate"]) if len(want) and len(got) else 0.0
    out = {"length_ratio": ratio, "mel_db": mel, "snr_db": min(snr(want, got), MAX_SNR)}
    out["alike"] = abs(ratio - 1.0) <= conf["length_tolerance"] and mel <= conf["mel_db"]
    return out


def speech_figure(conf, results, where):
    """The sentences' {alike...} judged: every one alike (length, log-mel distance), with the
    worst distance and SNR, and a one-line text."""
    same = sum(1 for r in results if r["alike"])
    worst = max([r["mel_db"] for r in results] or [0.0])
    low = min([r["snr_db"] for r in results] or [MAX_SNR])
    passed = same == len(results)
    text = "%d of %d %s sound alike (length within %.0f%%, log-mel distance <= %.2f dB): " \
           "worst %.3f dB, lowest SNR %.1f dB" % (
               same, len(results), where, 100 * conf["length_tolerance"], conf["mel_db"],
               worst, low)
    return {"sentences": len(results), "same": same, "worst_mel_db": worst, "lowest_snr_db": low,
            "value": float(same) / len(results) if results else None, "keep": 1.0,
            "shown": bool(results), "passed": passed,
            "text": text + ("" if passed else ": FAILED")}


def answer(speech, tokens, timing):
    """One sentence spoken: ({samples, seconds, rate, peak, first_audio_ms, summary}, the
    float32 samples); first_audio_ms: until the vocoder's first piece (what a listener waits
    for where the audio streams)."""
    start, first, parts = time.perf_counter(), None, []
    for piece in speech.stream(tokens, timing):
        first = (time.perf_counter() - start) * 1000.0 if first is None else first
        parts.append(piece)
    audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    rate = speech.voc_conf["rate"]
    result = {"tokens": int(len(tokens)), "samples": int(len(audio)),
              "seconds": len(audio) / float(rate), "rate": rate,
              "peak": float(np.abs(audio).max()) if len(audio) else 0.0,
              "first_audio_ms": round(first or 0.0, 3)}
    result["summary"] = "%.2f s of speech at %d Hz from %d token(s) (%d samples)" % (
        result["seconds"], rate, result["tokens"], result["samples"])
    return result, audio


def write_speech(out, audios, rate):
    """infer --out of a tts pipeline: OUT.npz with each sentence's samples (KEY/audio, whole
    or not at all: infer.save_outputs) and OUT.KEY.wav beside it (task_tts.write_wavs).
    Returns (the .npz written, the WAV files)."""
    from .infer import save_outputs  # loaded here: a bundle without infer checks pipelines

    save_outputs(out, dict(("%s/audio" % key, audio) for key, audio in audios))
    return (out if out.endswith(".npz") else out + ".npz",
            write_wavs(out, dict(("%s/task.audio" % key, audio) for key, audio in audios),
                       {"task": {"kind": "tts", "rate": rate}}))
