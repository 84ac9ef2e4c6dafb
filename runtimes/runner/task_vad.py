"""The vad head: speech probability per frame, and the frames that agree between two models.
"""

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .task_figures import flip_words, share
from .tasks import pick


def vad_probabilities(conf, outputs):
    return np.asarray(pick(outputs, conf["output"]), np.float64).reshape(-1)


def read(conf, outputs, feed=None, part_labels=None):
    probs = vad_probabilities(conf, outputs)
    return {"speech": [bool(p >= conf["threshold"]) for p in probs],
            "probability": [float(p) for p in probs]}


def figures(conf, reference, candidate, feeds=None):
    """frames: the share of frames on the same side of the threshold; frame_drop: the frames
    the candidate is expected to lose under the reference's own probability (a flipped
    frame costs |2p - 1|: what the reference was sure of), averaged over the frames."""
    ref = np.concatenate([vad_probabilities(conf, o) for o in reference] or [np.zeros(0)])
    got = np.concatenate([vad_probabilities(conf, o) for o in candidate] or [np.zeros(0)])
    flags_r, flags_g = ref >= conf["threshold"], got >= conf["threshold"]
    flipped = np.nonzero(flags_r != flags_g)[0]
    margins = np.abs(2.0 * np.clip(ref[flipped], 0.0, 1.0) - 1.0)
    n = len(ref)
    flips = [{"frame": int(i), "fp32": float(ref[i]), "candidate": float(got[i]),
              "margin": float(m)} for i, m in zip(flipped, margins)]
    return {"frames": share(int(np.sum(flags_r == flags_g)), n,
                            speech=int(flags_r.sum()), samples=len(reference)),
            "frame_drop": {"value": float(margins.sum()) / n if n else None, "n": n,
                           "matched": n - len(flipped), "flips": flips,
                           "detail": flip_words(flips)}}


def summary(result):
    flags = result["speech"]
    return "speech in %d of %d frame(s)" % (sum(flags), len(flags))
