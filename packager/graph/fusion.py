"""Transformer fusion: onnxruntime's transformer optimizer before quantization, on CPU targets.

onnxruntime's `transformers.optimizer` (part of the onnxruntime wheel) rewrites attention,
residual LayerNorms and GELUs into its own contrib ops (Attention, SkipLayerNormalization,
BiasGelu...), which run faster on the CPU than the ops they replace, and whose MatMuls the dynamic
quantizer still quantizes. The number of heads and the hidden size come from the graph (the
LayerNorm width, and the rank-4 Reshape that splits it into heads), never from the user.

Fusion needs the graph as exported: after onnxsim's folding the attention pattern no longer
matches. So it runs on the static-shape graph before simplification. It is kept only when every
op it wrote exists in the target's oldest onnxruntime, and when the fused graph computes what the
unfused one does (checked by the pipeline on the held-out samples).

Before the optimizer runs, our own rewrite (packed_attention.py) turns the attention exports
that onnxruntime's patterns miss into the same contrib Attention op: `nn.MultiheadAttention`'s
(one packed QKV projection split into heads by Reshape/Transpose/Gather or Split) and today's
`transformers` BERT's (three projections, a boolean mask spread with And/Where, an IsNaN guard
after the Softmax). It needs onnxruntime 1.14 (Attention's mask_filter_value). Then our
residual-LayerNorm rewrite (skip_norm.py) writes SkipLayerNormalization from the graph's static
shapes, where the optimizer's own fusion needs its symbolic shape inference to type the whole
graph (a sentence encoder's normalising tail defeats it) and a MatMul beside each bias Add (onnxsim
makes Gemms of them).
"""

import contextlib
import io
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx import numpy_helper

from ..atomic import scratch_cwd
from .packed_attention import PACKED_ATTENTION, fuse_packed_attention
from .skip_norm import SKIP_NORM, fuse_skip_norms

# contrib ops the CPU provider implements, with the onnxruntime release that has them on the CPU
# in the form the optimizer writes (fusions producing anything else are not kept)
FUSED_OPS = {"Attention": "1.8", "SkipLayerNormalization": "1.8", "BiasGelu": "1.8",
             "FastGelu": "1.8", "Gelu": "1.8", "EmbedLayerNormalization": "1.8",
             "LayerNormalization": "1.8", "MultiHeadAttention": "1.15"}


@dataclass(frozen=True)
class Fusion:
    """What fusion did: the fused graph, the op counts it wrote, and the shape it found."""

    model: Any                                  # onnx.ModelProto
    heads: int
    hidden: int
    fused: dict[str, int] = field(default_factory=dict)
    packed_attention: int = 0                   # of the Attention ops, those our rewrite wrote
    skip_norms: int = 0                         # of the SkipLayerNormalizations, ours

    def record(self) -> dict[str, Any]:
        ours = [f"{what} ({n})" for what, n in (
            ("packed-QKV attention rewrite", self.packed_attention),
            ("residual LayerNorm rewrite", self.skip_norms)) if n]
        by = "onnxruntime.transformers.optimizer (model type bert)"
        if ours:
            by = f"edgepack's {' and '.join(ours)}, then {by}"
        return {"heads": self.heads, "hidden": self.hidden, "fused": dict(self.fused), "by": by}


def attention_shape(model: onnx.ModelProto) -> tuple[int, int]:
    """(heads, hidden) read from the graph: the most common LayerNorm width, and the Reshape to
    [batch, sequence, heads, head size] whose last two dims multiply to it. 0 where unknown."""
    inits = {i.name: i for i in model.graph.initializer}
    consts = {n.output[0]: n.attribute[0].t for n in model.graph.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    widths = Counter()
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and len(node.input) > 1 and \
                node.input[1] in inits:
            dims = list(inits[node.input[1]].dims)
            if len(dims) == 1:
                widths[dims[0]] += 1
    if not widths:
        return 0, 0
    hidden = widths.most_common(1)[0][0]
    heads = Counter()
    for node in model.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        tensor = inits.get(node.input[1]) or consts.get(node.input[1])
        if tensor is None:
            continue
        shape = [int(d) for d in numpy_helper.to_array(tensor).ravel()]
        # [batch, sequence, heads, head size] (Hugging Face), or [sequence, batch * heads, head
        # size] (nn.MultiheadAttention, batch 1)
        if len(shape) in (3, 4) and shape[-2] > 1 and shape[-1] > 1 and \
                shape[-2] * shape[-1] == hidden:
            heads[shape[-2]] += 1
        elif len(shape) == 4 and shape[-2] == -1 and 1 < shape[-1] < hidden and \
                hidden % shape[-1] == 0:   # [batch, sequence, -1, head size] (transformers)
            heads[hidden // shape[-1]] += 1
    if not heads:
        return 0, 0   # the optimizer's own detection
    return heads.most_common(1)[0][0], hidden


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".")[:2] if x.isdigit())


def fuse_transformer(model: onnx.ModelProto, min_onnxruntime: str) -> Fusion | None:
    """*model* with our attention rewrite (from onnxruntime 1.14), our residual-LayerNorm
    rewrite and onnxruntime's transformer fusions, or None when nothing fused or a fused op is
    newer than *min_onnxruntime*."""
    import onnxruntime.transformers
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.onnx_model_bert import BertOnnxModel

    heads, hidden = attention_shape(model)
    before = Counter(n.op_type for n in model.graph.node)
    packed = 0
    if _version(min_onnxruntime) >= _version(PACKED_ATTENTION):
        with contextlib.suppress(Exception):   # a graph our rewrite trips on: the optimizer's
            model = fuse_packed_attention(model)
        packed = sum(n.op_type == "Attention" for n in model.graph.node) - before["Attention"]
    skip_norms = 0
    if _version(min_onnxruntime) >= _version(SKIP_NORM):
        with contextlib.suppress(Exception):   # a graph our rewrite trips on: the optimizer's
            model = fuse_skip_norms(model)
        skip_norms = sum(n.op_type == "SkipLayerNormalization" for n in model.graph.node) - \
            before["SkipLayerNormalization"]
    options = FusionOptions("bert")
    # the optimizer logs each fusion it tries, under its package's name and, since it imports
    # its own modules by their bare names, under each of those (fusion_skiplayernorm...)
    folder = Path(onnxruntime.transformers.__path__[0])
    quiet = [logging.getLogger(name) for name in
             ["onnxruntime.transformers", *(p.stem for p in folder.glob("*.py"))]]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        # it prints its shape inference's output, and that inference can leave
        # sym_shape_infer_temp.onnx in the current folder: run it in a scratch one
        with contextlib.redirect_stdout(io.StringIO()), scratch_cwd():
            optimizer = BertOnnxModel(onnx.ModelProto.FromString(model.SerializeToString()),
                                      heads, hidden)
            optimizer.optimize(options)
            optimizer.topological_sort()
    except Exception:   # a pattern the optimizer trips on: ship the graph unfused
        return None
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    fused = optimizer.model
    if not any(o.domain == "com.microsoft" for o in fused.opset_import):
        fused.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    after = Counter(n.op_type for n in fused.graph.node)
    wrote = {op: after[op] - before.get(op, 0) for op in after
             if after[op] > before.get(op, 0) and any(n.op_type == op and n.domain ==
                                                      "com.microsoft" for n in fused.graph.node)}
    if not wrote:
        return None
    if any(op not in FUSED_OPS or _version(FUSED_OPS[op]) > _version(min_onnxruntime)
           for op in wrote):
        return None
    return Fusion(fused, heads, hidden, wrote, packed, skip_norms)
