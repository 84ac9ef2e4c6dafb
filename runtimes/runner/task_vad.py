"""The vad head: speech probability per frame, and the frames that agree between two models.
"""

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .task_figures import share
from .tasks import pick


def vad_probabilities(conf, outputs):
    return np.asarray(pick(outputs, conf["output"]), np.float64).reshape(-1)


def read(conf, outputs, feed=None, part_labels=None):
    probs = vad_probabilities(conf, outputs)
    return {"speech": [bool(p >= conf["threshold"]) for p in probs],
            "probability": [float(p) for p in probs]}


def figures(conf, reference, candidate, feeds=None):
    ref = np.concatenate([vad_probabilities(conf, o) for o in reference] or [np.zeros(0)])
    got = np.concatenate([vad_probabilities(conf, o) for o in candidate] or [np.zeros(0)])
    flags_r, flags_g = ref >= conf["threshold"], got >= conf["threshold"]
    return {"frames": share(int(np.sum(flags_r == flags_g)), len(ref),
                            speech=int(flags_r.sum()), samples=len(reference))}


def summary(result):
    flags = result["speech"]
    return "speech in %d of %d frame(s)" % (sum(flags), len(flags))
