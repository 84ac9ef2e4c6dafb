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


def neighbours(vectors, k):
    """Each row's *k* nearest other rows by cosine, as sets."""
    sim = vectors @ vectors.T
    np.fill_diagonal(sim, -np.inf)
    return [set(row) for row in np.argsort(-sim, axis=1, kind="stable")[:, :k]]


def ranks(x):
    out = np.empty(len(x))
    out[np.argsort(x, kind="stable")] = np.arange(len(x))
    return out


def rank_correlation(ref, got):
    """Spearman's correlation of every pair's similarity under the two models: whether the
    candidate orders pairs as the reference does (what a search or a threshold reads)."""
    upper = np.triu_indices(len(ref), 1)
    a, b = ranks((ref @ ref.T)[upper]), ranks((got @ got.T)[upper])
    a, b = a - a.mean(), b - b.mean()
    scale = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / scale) if scale > 0 else 1.0


def figures(conf, reference, candidate, feeds=None):
    """retrieval1: the nearest other sample the same; recall5: the share of the reference's 5
    nearest others that the candidate's 5 nearest hold (pooled); rank: the rank correlation
    of all pairs' similarities; cosine_min: the lowest cosine of a sample's two vectors."""
    feeds = list(feeds) if feeds is not None else [None] * len(reference)
    conf = dict(conf, normalize=True)
    ref = np.stack([embedding(conf, o, f)[0] for o, f in zip(reference, feeds)])
    got = np.stack([embedding(conf, o, f)[0] for o, f in zip(candidate, feeds)])
    cosines = (ref * got).sum(axis=1)
    n = len(ref)
    same = int(np.sum(nearest(ref) == nearest(got))) if n >= 2 else 0
    found = {"retrieval1": share(same, n if n >= 2 else 0),
             "cosine_min": {"value": float(cosines.min()) if n else None, "n": n}}
    k = min(5, n - 1)
    if k >= 1:
        kept = sum(len(a & b) for a, b in zip(neighbours(ref, k), neighbours(got, k)))
        found["recall5"] = dict(share(kept, n * k), n=n)
    found["rank"] = {"value": rank_correlation(ref, got) if n >= 3 else None, "n": n}
    return found


def summary(result):
    return "embedding of %d (norm %.4g)" % (len(result["embedding"]), result["norm"])
