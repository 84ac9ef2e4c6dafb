"""The tts head: a waveform whose length follows the text, and how close two models' speech is:
the same length (within a tolerance), the log-mel spectral distance (dB, the mean over frames
of the RMS difference over 80 mel bands, what a listener hears) and the waveform's SNR (dB,
strict: a phase shift the ear ignores lowers it). Python 3.8, numpy only; WAV through the
standard library's wave module."""

import io
import os
import tempfile
import wave

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .errors import BundleError, one_line
from .task_figures import share
from .task_spec import settings
from .tasks import pick

FRAME, HOP, BANDS = 1024, 256, 80
FLOOR_DB = 80.0   # a mel band more than this below the loudest counts as that (silence)


def waveform(conf, outputs):
    return np.asarray(pick(outputs, conf["output"]), np.float64).reshape(-1)


def mel_filters(rate, bands=BANDS, frame=FRAME):
    """Triangular filters on the mel scale (HTK), (bands, frame // 2 + 1)."""
    def mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    edges = 700.0 * (10 ** (np.linspace(mel(0.0), mel(rate / 2.0), bands + 2) / 2595.0) - 1)
    bins = np.linspace(0.0, rate / 2.0, frame // 2 + 1)
    low, mid, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (bins - low) / np.maximum(mid - low, 1e-9)
    down = (high - bins) / np.maximum(high - mid, 1e-9)
    return np.maximum(0.0, np.minimum(up, down))


def log_mel(audio, rate):
    """(frames, BANDS) log-mel power in dB, floored FLOOR_DB below the loudest band."""
    x = np.pad(np.asarray(audio, np.float64), (FRAME // 2, FRAME // 2))
    count = 1 + (len(x) - FRAME) // HOP
    frames = x[np.arange(FRAME)[None, :] + HOP * np.arange(count)[:, None]]
    power = np.abs(np.fft.rfft(frames * np.hanning(FRAME), axis=1)) ** 2
    db = 10.0 * np.log10(np.maximum(power.dot(mel_filters(rate).T), 1e-12))
    return np.maximum(db, db.max() - FLOOR_DB)


def mel_distance(ref, got, rate):
    """Mean over frames of the RMS over mel bands of the dB difference (the shorter's frames)."""
    a, b = log_mel(ref, rate), log_mel(got, rate)
    n = min(len(a), len(b))
    return float(np.mean(np.sqrt(np.mean((a[:n] - b[:n]) ** 2, axis=1))))


def snr(ref, got):
    """10 log10 of the reference's energy over the difference's, over the shorter length."""
    n = min(len(ref), len(got))
    noise = float(np.sum((ref[:n] - got[:n]) ** 2))
    signal = float(np.sum(ref[:n] ** 2))
    return float("inf") if noise == 0 else 10.0 * np.log10(max(signal, 1e-30) / noise)


def read(conf, outputs, feed=None, part_labels=None):
    audio = waveform(conf, outputs)
    return {"samples": int(len(audio)), "seconds": len(audio) / float(conf["rate"]),
            "rate": conf["rate"], "peak": float(np.abs(audio).max()) if len(audio) else 0.0,
            "_audio": audio.astype(np.float32)}


def wav_bytes(audio, rate):
    """A mono 16-bit PCM WAV file of *audio* (floats in [-1, 1], clipped)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(int(rate))
        f.writeframes(pcm16(audio))
    return out.getvalue()


def pcm16(audio):
    """Little-endian 16-bit PCM bytes of *audio* (floats in [-1, 1], clipped; NaN silent)."""
    audio = np.nan_to_num(np.asarray(audio, np.float64), nan=0.0, posinf=1.0, neginf=-1.0)
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def wav_stream_header(rate):
    """The 44-byte header of a mono 16-bit WAV whose length is not known yet (a stream: the
    RIFF and data sizes 0xFFFFFFFF, as streaming servers send them)."""
    import struct

    return b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, 1, 1, int(rate), int(rate) * 2, 2, 16) + b"data" + \
        struct.pack("<I", 0xFFFFFFFF)


def write_wavs(out, arrays, part):
    """Beside infer's --out OUT.npz, OUT.KEY.wav for each input's speech (KEY: the input's
    file name); each written whole or not at all. Returns the files written."""
    rate = settings(part.get("task"))["rate"]
    base = out[:-4] if out.endswith(".npz") else out
    written = []
    for key, audio in sorted(arrays.items()):
        if not key.endswith("/task.audio"):
            continue
        name = key[:-len("/task.audio")].replace(os.sep, "_").replace("/", "_")
        path = "%s.%s.wav" % (base, name)
        tmp = None
        try:   # a fresh name of our own (mkstemp), never a link someone left at PATH.tmp
            fd, tmp = tempfile.mkstemp(prefix=".wav-", suffix=".tmp",
                                       dir=os.path.dirname(path) or ".")
            with os.fdopen(fd, "wb") as f:
                f.write(wav_bytes(audio, rate))
            os.replace(tmp, path)
        except OSError as exc:
            if tmp and os.path.exists(tmp):
                os.remove(tmp)
            raise BundleError("%s: cannot write it (%s); free some space or pass another --out"
                              % (path, exc.strerror or one_line(exc))) from None
        written.append(path)
    return written


def figures(conf, reference, candidate, feeds=None):
    rate, tolerance = conf["rate"], conf["length_tolerance"]
    pairs = [(waveform(conf, r), waveform(conf, c)) for r, c in zip(reference, candidate)]
    lengths = [abs(len(c) - len(r)) <= tolerance * max(1, len(r)) for r, c in pairs]
    mels = [mel_distance(r, c, rate) for r, c in pairs]
    snrs = [snr(r, c) for r, c in pairs]
    return {"length": share(sum(lengths), len(pairs), samples=len(pairs)),
            "mel": share(sum(m <= conf["mel_db"] for m in mels), len(pairs), samples=len(pairs),
                         worst_db=max(mels) if mels else None),
            "snr": share(sum(s >= conf["snr_db"] for s in snrs), len(pairs), samples=len(pairs),
                         worst_db=min(snrs) if snrs else None)}


def summary(result):
    return "%.2f s of speech at %d Hz (%d samples, peak %.2f)" % (
        result["seconds"], result["rate"], result["samples"], result["peak"])


def real_time(session, part, feed, latency):
    """`bench`'s speech figures: the seconds of audio *feed* speaks (one more run) and the
    real-time factor, compute over audio (lower is better, as Piper, Coqui and ESPnet)."""
    conf = settings(part.get("task"))
    names = [o.name for o in session.get_outputs()]
    seconds = len(waveform(conf, dict(zip(names, session.run(names, feed))))) / float(conf["rate"])
    if not seconds:
        return {}
    return {"audio_s": seconds, "real_time_factor": latency["p50"] / 1000.0 / seconds}
