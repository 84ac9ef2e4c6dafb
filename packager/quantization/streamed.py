"""A recurrent state judged through the frames it produces, streamed (issue 44, item 3).

A voice-activity model returns its state beside its speech probability, and the caller feeds
that state back with the next chunk. Judged sample by sample, each held-out sample carries
FP32's state, so the state output's own error never reaches a frame; its cosine gated instead
(silero-vad's INT8 with 5 nodes FP32: state cosine 0.955 < 0.98 while every frame but one
agreed). Here each model runs the held-out samples in their order as one stream, its own state
output fed to the next sample's state input (the first sample's state as given), and the task
judges the frames each produced; the state outputs' cosine is reported, not gated.

    state_pairs(model)                         (("state", "stateN"), ...)
    run_streamed(model, samples, pairs)        {output: stacked outputs}, one stream
"""

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from ..graph.execute import Sample

# how an output that carries an input's state onward is named: INPUT + one of these (silero
# state -> stateN, faster-whisper's VAD h -> hn, c -> cn, an LSTM export's h0 -> h0_out)
SUFFIXES = ("n", "N", "_n", "_out", "out", "_next", "_new", "new")
# or with these swapped in (a decoder's past_key_values.0.key -> present.0.key)
SWAPS = (("past_key_values", "present"), ("past", "present"), ("in", "out"))


def state_pairs(model: Path | onnx.ModelProto) -> tuple[tuple[str, str], ...]:
    """(input, output) pairs where the output is the input's state carried onward: named so
    (SUFFIXES, SWAPS) and of the same float type and static shape."""
    proto = model if isinstance(model, onnx.ModelProto) else \
        onnx.load(str(model), load_external_data=False)
    graph = proto.graph
    inits = {t.name for t in graph.initializer}

    def typed(values):
        found = {}
        for v in values:
            kind = v.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else None
                         for d in kind.shape.dim)
            if kind.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                                  onnx.TensorProto.DOUBLE) and dims and None not in dims:
                found[v.name] = (kind.elem_type, dims)
        return found

    inputs = {k: v for k, v in typed(graph.input).items() if k not in inits}
    outputs = typed(graph.output)
    pairs = []
    for name, facts in inputs.items():
        named = [name + s for s in SUFFIXES] + [name.replace(a, b, 1) for a, b in SWAPS
                                               if a in name]
        match = next((o for o in named if o != name and outputs.get(o) == facts), None)
        if match:
            pairs.append((name, match))
    return tuple(pairs)


def run_streamed(model: Path, samples: Sequence[Sample],
                 pairs: Sequence[tuple[str, str]]) -> dict[str, np.ndarray]:
    """*model*'s outputs over *samples* as one stream: each sample's state inputs (*pairs*)
    are the state outputs of the sample before (the first sample's as given); stacked per
    output name as run_model gives them."""
    import onnxruntime as ort

    from .._runtimes.runner.metrics import stack_or_ragged

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    carried: dict[str, np.ndarray] = {}
    rows: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for sample in samples:
        feed = {k: np.asarray(v) for k, v in sample.items() if k in wanted}
        feed.update(carried)
        got = dict(zip(names, session.run(names, feed), strict=True))
        for name in names:
            rows[name].append(got[name])
        carried = {i: got[o].astype(feed[i].dtype, copy=False) for i, o in pairs if i in feed}
    return {name: stack_or_ragged(values) for name, values in rows.items()}
