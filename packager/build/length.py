"""Lengths that fit the model (a tts part): the build runs at one static token length, but a
sentence has its own. Measured on the original: does padding a shorter sentence to that length
change its speech? Where it does not, padded sentences speak within the budget; where it does
(a model without a mask input) and the original takes any length, the shipped graphs keep the
length axis open, each checked at a shorter and a longer length against the original there;
where that fails the bundle speaks exactly the build's length. The manifest's part["length"]
says which, with the measurements."""

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .._runtimes.runner.task_spec import settings
from .._runtimes.runner.task_tts import mel_distance, waveform
from ..errors import ModelError
from ..graph.inspection import graph_inputs
from ..graph.modelio import save_model
from ..graph.shapes import probe_session
from .plan import PartRequest
from .records import BuildContext, Frozen, PartData, PartPlan

PROBES = 4       # samples the padding is measured on
LENGTH = "length"   # the symbol a shipped graph's open axis gets


def token_axis(model: onnx.ModelProto) -> str | None:
    """The original's token input when it takes any length: an integer input of shape
    (1, T) whose T is not fixed; else None."""
    for value in graph_inputs(model):
        kind = value.type.tensor_type.elem_type
        dims = value.type.tensor_type.shape.dim
        if kind in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and len(dims) == 2 and \
                not dims[1].HasField("dim_value"):
            return value.name
    return None


def speak(session: Any, feed: dict[str, np.ndarray], conf: dict[str, Any]) -> np.ndarray:
    names = [o.name for o in session.get_outputs()]
    return waveform(conf, dict(zip(names, session.run(names, feed), strict=True)))


def padding_effect(session: Any, name: str, samples: list[dict[str, np.ndarray]],
                   conf: dict[str, Any], pad: int) -> float:
    """The worst log-mel distance (dB) padding moves a sentence's speech by: the original on a
    sample's first 3/4 of its tokens, against the same tokens padded back to its length (the
    padded speech's first part, as long as the unpadded one's)."""
    worst = 0.0
    for sample in samples[:PROBES]:
        tokens = np.asarray(sample[name])
        count = max(1, 3 * tokens.shape[1] // 4)
        short = speak(session, dict(sample, **{name: tokens[:, :count]}), conf)
        padded = np.full_like(tokens, pad)
        padded[:, :count] = tokens[:, :count]
        long = speak(session, dict(sample, **{name: padded}), conf)
        if len(short) and len(long):
            worst = max(worst, mel_distance(short, long[:len(short)], conf["rate"]))
    return worst


def reopened(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """*model* with input *name*'s length axis (1) open and no stored intermediate shapes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in out.graph.input:
        if value.name == name:
            value.type.tensor_type.shape.dim[1].Clear()
            value.type.tensor_type.shape.dim[1].dim_param = LENGTH
    del out.graph.value_info[:]
    return out


class Spoken:
    """The original's speech on one feed, run when first asked for and kept (a graph that
    fails at its first length never costs the original's runs: Kokoro-82M's are 1.5 s each)."""

    def __init__(self, original: Any, feed: dict[str, np.ndarray], conf: dict[str, Any]):
        self.original, self.feed, self.conf, self.audio = original, feed, conf, None

    def __call__(self) -> np.ndarray:
        if self.audio is None:
            self.audio = speak(self.original, self.feed, self.conf)
        return self.audio


def other_lengths(original: Any, name: str, samples: list[dict[str, np.ndarray]],
                  conf: dict[str, Any]) -> list[tuple[int, dict[str, np.ndarray], Spoken]]:
    """[(token count, feed, the original's speech there, run once when asked for)] at half and
    one and a half times each probe's length: what every graph kept open is checked against."""
    out = []
    for sample in samples[:PROBES]:
        tokens = np.asarray(sample[name])
        for count in (max(1, tokens.shape[1] // 2), tokens.shape[1] * 3 // 2):
            feed = dict(sample, **{name: np.resize(tokens[0], count)[None].astype(tokens.dtype)})
            out.append((count, feed, Spoken(original, feed, conf)))
    return out


def at_other_lengths(model: onnx.ModelProto, wanted: list[tuple[int, dict, Spoken]],
                     conf: dict[str, Any]) -> tuple[list[int], float, str]:
    """(the lengths tried, the worst log-mel distance to the original there, what failed or
    ''): *model* run on other_lengths()'s feeds."""
    try:
        session = probe_session(model)
    except Exception as exc:   # a graph whose shapes were fixed at build time
        return [], 0.0, f"onnxruntime cannot load it with the length open ({cause(exc)})"
    tried, worst = [], 0.0
    for count, feed, spoken in wanted:
        try:
            got = speak(session, feed, conf)
        except Exception as exc:
            return tried, worst, f"it fails at {count} tokens ({cause(exc)})"
        want = spoken()
        if abs(len(got) - len(want)) > conf["length_tolerance"] * max(1, len(want)):
            return tried, worst, f"at {count} tokens it speaks {len(got)} samples, the " \
                f"original {len(want)}"
        worst = max(worst, mel_distance(want, got, conf["rate"]) if len(want) else 0.0)
        tried.append(count)
    if worst > conf["mel_db"]:
        return tried, worst, f"its speech is {worst:.2f} dB from the original's there"
    return tried, worst, ""


def cause(exc: BaseException) -> str:
    """onnxruntime's error in a few words: the node and its message, without the source file
    and the check that failed ('Add node /encoder/bert/embeddings/Add: Attempting to broadcast
    an axis by a dimension other than 1. 32 by 64')."""
    text = " ".join(str(exc).split())
    node = re.search(r"running (\S+) node\. Name:'([^']*)'", text)
    message = text.split("Status Message:", 1)[-1]
    message = re.sub(r"^\s*\S+\.(?:h|cc|cpp):\d+\s+", "", message)
    message = message.split(" was false. ", 1)[-1].strip()
    return ((f"{node.group(1)} node {node.group(2)}: " if node else "") + message)[:200]


def length_part(plan: PartPlan, frozen: Frozen, data: PartData, graphs: list[Path],
                ctx: BuildContext, original_fits: bool = False) -> dict[str, Any] | None:
    """The manifest's part["length"] for a tts part whose original takes any length (else
    None); where padding changes the answer, *graphs* (the shipped files) are rewritten with
    the length open when each keeps the budget at other lengths. *original_fits*: the part
    ships the original's own arithmetic (FP32, or quantized as given) in one graph, so where
    the shipped graph cannot keep the length open (simplified at the static length) the
    original graph itself ships in its place, checked the same way."""
    if (plan.task or {}).get("kind") != "tts":
        return None
    task = settings(plan.task)
    name = token_axis(frozen.proto)
    if name is None:
        return None
    original = probe_session(frozen.proto)
    samples = (data.held or data.samples)[:PROBES]
    length = int(np.asarray(samples[0][name]).shape[1])
    pad = int(task.get("pad", 0))
    effect = padding_effect(original, name, samples, task, pad)
    section: dict[str, Any] = {"input": name, "axis": 1, "static": length,
                               "padding_mel_db": round(effect, 4), "pad": pad}
    if effect <= task["mel_db"]:
        ctx.log(f"length: padding a sentence to {length} tokens moves its speech {effect:.2f} "
                f"dB at most (within {task['mel_db']} dB): the bundle takes {length} tokens, "
                f"shorter sentences padded with {pad}")
        return dict(section, dynamic=False, why="padding keeps the speech within the budget")
    opened = [reopened(onnx.load(str(path)), name) for path in graphs]
    tried, worst, problem = checked(opened, other_lengths(original, name, samples, task), task)
    graph, where = "shipped", f", checked at {', '.join(map(str, sorted(set(tried))))} tokens " \
        f"against the original (worst {worst:.2f} dB)"
    if problem and original_fits and len(graphs) == 1:
        # the original itself: its length is open, and it is what the checks compare against
        graph, where = "original", f" (unsimplified: the simplified one {problem}), the " \
            "graph the checks compare against"
        opened, tried, worst, problem = [frozen.proto], [], 0.0, ""
    if problem:
        ctx.log(f"length: padding moves the speech {effect:.2f} dB (over {task['mel_db']}; "
                f"the model has no mask for it), but the shipped graph cannot keep the "
                f"length open: {problem}; the bundle speaks exactly {length} tokens")
        return dict(section, dynamic=False, why=problem)
    for path, model in zip(graphs, opened, strict=True):
        save_model(model, path)
    ctx.log(f"length: padding moves the speech {effect:.2f} dB (over {task['mel_db']}; the "
            f"model has no mask for it): the bundle keeps {name}'s length open in the {graph} "
            f"graph{where}")
    return dict(section, dynamic=True, checked=sorted(set(tried)), worst_mel_db=round(worst, 4),
                graph=graph, why="padding changes the speech: the model has no mask input")


def checked(models: list[onnx.ModelProto], wanted: list[tuple[int, dict, Spoken]],
            conf: dict[str, Any]) -> tuple[list[int], float, str]:
    """at_other_lengths() of every model in *models*: the first problem, or the lengths tried
    and the worst distance."""
    tried, worst = [], 0.0
    for model in models:
        tried, found, problem = at_other_lengths(model, wanted, conf)
        worst = max(worst, found)
        if problem:
            return tried, worst, problem
    return tried, worst, ""


def open_part(req: PartRequest, frozen: Frozen, data: PartData, graphs: list[Path],
              ctx: BuildContext, original_fits: bool = False) -> dict[str, Any] | None:
    """The manifest's part["length"] of a part asked to keep *req.open_length*'s axis 1 open
    (a tts pipeline's encoder whose padding moves the speech: cascade/speech.py measured it);
    else None. The shipped *graphs* are rewritten with that axis open, each run at half and
    one and a half times the build's length, where it must give the original's output shapes
    (the pipeline's end-to-end judge then hears the sentences at their own lengths); where a
    shipped graph cannot, the original graph ships in its place when *original_fits* (FP32),
    else ModelError names the part and what failed."""
    name = req.open_length
    if not name:
        return None
    if token_axis(frozen.proto) != name:
        raise ModelError(f"{req.label()}its input {name} does not take any length in the "
                        "original, so the shipped graph cannot keep it open",
                        "export the encoder with its token axis open, or give it a mask input")
    samples = (data.held or data.samples)[:PROBES]
    static = int(np.asarray(samples[0][name]).shape[1])
    original = probe_session(frozen.proto)
    wanted = []
    for count in (max(1, static // 2), static * 3 // 2):
        feed = dict(samples[0], **{name: np.resize(np.asarray(samples[0][name])[0], count)[None]
                                   .astype(np.asarray(samples[0][name]).dtype)})
        wanted.append((count, feed, [o.shape for o in original.run(None, feed)]))
    opened = [reopened(onnx.load(str(path)), name) for path in graphs]
    problem, graph = _runs_open(opened, wanted), "shipped"
    if problem and original_fits and len(graphs) == 1:
        opened, graph = [frozen.proto], f"original (unsimplified: the simplified one {problem})"
        problem = _runs_open(opened, wanted)
    if problem:
        raise ModelError(f"{req.label()}padding moves the pipeline's speech, but its shipped "
                        f"graph cannot keep {name}'s length open: {problem}",
                        "set the stage's precision = \"fp32\" (the original graph then ships)")
    for path, model in zip(graphs, opened, strict=True):
        save_model(model, path)
    tried = [count for count, _, _ in wanted]
    ctx.log(f"length: the bundle keeps {name}'s length open in the {graph} graph (checked at "
            f"{', '.join(map(str, tried))} tokens): a sentence runs whole, unpadded")
    return {"input": name, "axis": 1, "static": static, "dynamic": True, "checked": tried,
            "graph": graph.split(" ", 1)[0], "why": "padding moves the pipeline's speech: the encoder has no "
            "mask input"}


def _runs_open(models: list[onnx.ModelProto],
               wanted: list[tuple[int, dict[str, np.ndarray], list[tuple[int, ...]]]]) -> str:
    """What fails ('' if nothing) when each of *models* runs *wanted*'s feeds: it must load
    and give the original's output shapes there."""
    for model in models:
        try:
            session = probe_session(model)
        except Exception as exc:
            return f"onnxruntime cannot load it with the length open ({cause(exc)})"
        for count, feed, shapes in wanted:
            try:
                got = [o.shape for o in session.run(None, feed)]
            except Exception as exc:
                return f"it fails at {count} tokens ({cause(exc)})"
            if got != shapes:
                return f"at {count} tokens it gives shapes {got}, the original {shapes}"
    return ""
