"""The embed head: one vector per sample (pooled, normalised), and nearest-neighbour agreement
and the lowest cosine between two models.
"""

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .task_figures import share
from .tasks import pick


def embedding(conf, outputs, feed=None):
    """(vector, norm before normalising) of one sample."""
    x = np.asarray(pick(outputs, conf["output"]), np.float64)
    pooling = conf["pooling"]
    if pooling != "none" and x.ndim >= 2:
        tokens = x.reshape((-1,) + x.shape[-2:])[0]   # (T, D) of the batch's one sample
        if pooling == "cls":
            x = tokens[0]
        else:
            mask = (feed or {}).get(conf["mask"])
            weight = np.ones(len(tokens)) if mask is None else \
                np.asarray(mask, np.float64).reshape(-1)[:len(tokens)]
            if weight.size != len(tokens):
                weight = np.ones(len(tokens))
            x = (tokens * weight[:, None]).sum(axis=0) / max(float(weight.sum()), 1e-9)
    x = x.reshape(-1)
    norm = float(np.linalg.norm(x))
    if conf["normalize"]:
        x = x / max(norm, 1e-12)
    return x, norm


def read(conf, outputs, feed=None, part_labels=None):
    x, norm = embedding(conf, outputs, feed)
    return {"embedding": [float(v) for v in x], "norm": norm}


def nearest(vectors):
    """Each row's nearest other row by cosine (rows are unit vectors)."""
    sim = vectors @ vectors.T
    np.fill_diagonal(sim, -np.inf)
    return sim.argmax(axis=1)


def figures(conf, reference, candidate, feeds=None):
    feeds = list(feeds) if feeds is not None else [None] * len(reference)
    conf = dict(conf, normalize=True)
    ref = np.stack([embedding(conf, o, f)[0] for o, f in zip(reference, feeds)])
    got = np.stack([embedding(conf, o, f)[0] for o, f in zip(candidate, feeds)])
    cosines = (ref * got).sum(axis=1)
    n = len(ref)
    same = int(np.sum(nearest(ref) == nearest(got))) if n >= 2 else 0
    return {"retrieval1": share(same, n if n >= 2 else 0),
            "cosine_min": {"value": float(cosines.min()) if n else None, "n": n}}


def summary(result):
    return "embedding of %d (norm %.4g)" % (len(result["embedding"]), result["norm"])
