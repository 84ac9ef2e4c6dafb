"""Tasks: a part's outputs read in its task's terms (labels, boxes, vectors, text, speech) by the
head of its kind, task_<kind>.py, which a bundle ships only when one of its parts has that task.

A part's task is the manifest's `parts[i].task`, a JSON object; absent or {"kind": "raw"} means
tensors. The host's decision and the device's `infer`/`serve` call the same functions:

    task_problem(task, outputs)                 '' or one line naming the key that is wrong
                                                (outputs: names, or {"name", "shape"} objects)
    apply(task, outputs, feed=None, labels=None)  one sample's result as JSON-able data
    part_result(part, names, outputs, feed)     a manifest part's result, with its "kind"
    head(kind)                                  the module task_<kind>.py: read(conf, outputs,
                                                feed, labels), figures(conf, reference,
                                                candidate, feeds), summary(result)

*outputs* is one sample's session outputs (batch 1): a dict {output name: array} in the
session's order, or a list of arrays in that order (then a task can name outputs by index
only). *feed* is the sample's inputs (embed's mean pooling reads its mask there). Keys of a
result starting with '_' hold arrays (a segmentation map) that `public` leaves out of JSON.
"""

import collections

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .contents import optional_module
from .errors import BundleError, one_line
from .task_spec import (  # noqa: F401  (task_problem, KINDS...: this module's API too)
    DECODERS,
    KINDS,
    PARAMETERS,
    POOLINGS,
    is_count,
    settings,
    task_kind,
    task_problem,
)

# ---------------------------------------------------------------------------------------------
# Helpers


def named(outputs):
    """(names or None, arrays) of one sample's outputs (a dict or a list)."""
    if isinstance(outputs, dict):
        return list(outputs), [np.asarray(v) for v in outputs.values()]
    return None, [np.asarray(v) for v in outputs]


def pick(outputs, ref):
    """The output *ref* (an index or a name) of one sample's outputs."""
    names, arrays = named(outputs)
    if is_count(ref):
        return arrays[ref]
    if names is None or ref not in names:
        raise ValueError("output %r is not among the outputs given" % (ref,))
    return arrays[names.index(ref)]


def softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def is_distribution(x, axis=-1):
    """Whether every row along *axis* is already probabilities summing to 1."""
    x = np.asarray(x, np.float64)
    return bool(x.size and x.min() >= 0.0 and x.max() <= 1.0 and
                np.allclose(x.sum(axis=axis), 1.0, atol=1e-3))


def as_probabilities(x, mode, axis=-1):
    if mode is True or (mode == "auto" and not is_distribution(x, axis)):
        return softmax(x, axis)
    return np.asarray(x, np.float64)


def label_of(labels, index):
    return labels[index] if labels and 0 <= index < len(labels) else None


def public(result):
    """*result* without the keys that hold arrays (those starting with '_'), for JSON."""
    return dict((k, v) for k, v in result.items() if not str(k).startswith("_"))


# ---------------------------------------------------------------------------------------------
# Heads


def head(kind):
    """The head of a task *kind* (not raw): the module task_<kind>.py, shipped only in a bundle
    with a part of that kind (one line, exit 2, when this bundle's runner lacks it)."""
    return optional_module("task_" + kind)


def apply(task, outputs, feed=None, labels=None):
    """One sample's result in *task*'s terms (see the module's docstring for *outputs* and
    *feed*; *labels* are the part's own, used when the task names none):

    classify {"top": [{"class", "label", "score"}]}; detect {"boxes": [{"box": [x1, y1, x2,
    y2] in the model's input pixels, "score", "class", "label"[, "landmarks": [[x, y]]]}]};
    embed {"embedding", "norm"}; ctc {"text" (None without an alphabet, then "ids"),
    "confidence"}; segment {"classes": {id: pixel share}, "shape", "_map"}; vad {"speech",
    "probability"}; multilabel {"outputs": [{"output", "threshold", "frames", "classes",
    "on": [{"frame", "on": [label or index]}] (frames with a label on only)}]}; raw {}.
    """
    conf = settings(task)
    if conf["kind"] == "raw":
        return {}
    return head(conf["kind"]).read(conf, outputs, feed, labels)


class TaskMisfit(BundleError):
    """The bundle's task cannot read its model's outputs (exit 2; in `serve`, 500: the
    bundle's fault, not the request's)."""

    status = 500


def part_result(part, names, outputs, feed=None):
    """*part*'s task result for one sample: {"kind", ...apply's keys}. A head that cannot read
    the outputs (a task that does not fit the model) is a BundleError, not a crash."""
    task = part.get("task")
    try:
        result = apply(task, collections.OrderedDict(zip(names, outputs)), feed,
                       part.get("labels"))
    except Exception as exc:
        raise TaskMisfit("the %s task of %s cannot read the model's outputs (%s); pass --raw "
                          "for the tensors, or rebuild the bundle with a task that fits"
                          % (task_kind(task), part.get("name"), one_line(exc))) from None
    result["kind"] = task_kind(task)
    return result



def summary(task, result):
    """The result in a few words for a person: 'cat 0.93', '3 boxes: face 0.91, ...'."""
    kind = task_kind(task)
    return "" if kind == "raw" else head(kind).summary(result)
