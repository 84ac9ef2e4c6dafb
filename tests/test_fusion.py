"""Transformer fusion before quantization on CPU targets: onnxruntime's optimizer, the heads and
hidden size read from the graph, kept only where the target's onnxruntime has the fused ops and
the fused graph computes what the unfused one does."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import run_py
from packager.export import export
from packager.fusion import attention_shape, fuse_transformer
from packager.pipeline import build
from packager.specs import parse_input

MODELS = Path(__file__).parent / "torch_models.py"
TOKENS = [parse_input("input_ids:1x32:int64"), parse_input("attention_mask:1x32:int64")]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, (40, 1, 32)).astype(np.int64)
    mask = np.ones((40, 1, 32), np.int64)
    for i in range(40):
        mask[i, 0, rng.integers(8, 33):] = 0
    path = tmp_path_factory.mktemp("tokens") / "tokens.npz"
    np.savez(path, input_ids=ids, attention_mask=mask)
    return path


def contrib_ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node
                   if n.domain == "com.microsoft")


@pytest.mark.parametrize("factory", ["mini_bert", "encoder"])
def test_heads_and_hidden_size_come_from_the_graph(tmp_path, factory):
    out = export(f"{MODELS}:{factory}", tmp_path / "m.onnx", inputs=TOKENS)
    assert attention_shape(onnx.load(str(out.path))) == (4, 64)


def test_a_hugging_face_layout_bert_fuses_attention_and_ships_it(tmp_path, tokens):
    out = tmp_path / "bert"
    build(f"{MODELS}:mini_bert", out, target="x86_64-cpu", calib=tokens, inputs=TOKENS,
          quant={"precision": "int8", "mode": "dynamic"}, min_cosine=0.9)
    part = json.loads((out / "manifest.json").read_text())["parts"][0]
    fusion = part["precision"]["fusion"]
    assert fusion["fused"] == {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    assert (fusion["heads"], fusion["hidden"]) == (4, 64)
    assert fusion["cosine_to_unfused"] >= 0.99999
    shipped = contrib_ops(out / "model.onnx")   # quantized around the fused ops
    assert shipped["SkipLayerNormalization"] == 4 and shipped["BiasGelu"] == 2
    assert shipped["Attention"] + shipped["QAttention"] == 2
    r = run_py(out, "check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_an_nn_transformer_encoder_fuses_its_norms_and_gelus(tmp_path, tokens):
    """nn.MultiheadAttention exports one packed QKV projection, which onnxruntime's attention
    fusion does not match: its residual LayerNorms and GELUs still fuse."""
    out = tmp_path / "enc"
    build(f"{MODELS}:encoder", out, target="x86_64-cpu", calib=tokens, inputs=TOKENS,
          quant={"precision": "fp32"})
    fusion = json.loads((out / "manifest.json").read_text())["parts"][0]["precision"]["fusion"]
    assert fusion["fused"] == {"SkipLayerNormalization": 4, "BiasGelu": 2}
    assert contrib_ops(out / "model.onnx") == Counter(fusion["fused"])
    assert run_py(out, "check").returncode == 0


def test_no_fusion_when_asked_or_where_the_target_cannot_run_it(tmp_path, tokens):
    out = tmp_path / "plain"
    build(f"{MODELS}:mini_bert", out, target="x86_64-cpu", calib=tokens, inputs=TOKENS,
          quant={"precision": "fp32"}, fuse=False)
    part = json.loads((out / "manifest.json").read_text())["parts"][0]
    assert "fusion" not in part["precision"] and not contrib_ops(out / "model.onnx")
    # a runtime older than the fused ops: nothing is fused
    model = onnx.load(str(export(f"{MODELS}:mini_bert", tmp_path / "m.onnx",
                                 inputs=TOKENS).path))
    assert fuse_transformer(model, "1.7") is None
    assert fuse_transformer(model, "1.17").fused["Attention"] == 2
    # GPU targets: TensorRT runs no contrib ops, so the graph stays standard
    gpu = tmp_path / "orin"
    build(f"{MODELS}:mini_bert", gpu, target="jetson-orin", calib=tokens, inputs=TOKENS)
    assert not contrib_ops(gpu / "model.onnx")


def test_heads_from_a_reshape_to_minus_one_and_head_size():
    """transformers' BertSelfAttention views to (batch, sequence, -1, head size)."""
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 384])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 12, 32])
    inits = [numpy_helper.from_array(np.ones(384, np.float32), "w"),
             numpy_helper.from_array(np.zeros(384, np.float32), "b"),
             numpy_helper.from_array(np.array([1, 4, -1, 32], np.int64), "shape")]
    nodes = [helper.make_node("LayerNormalization", ["x", "w", "b"], ["n"], axis=-1),
             helper.make_node("Reshape", ["n", "shape"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits))
    assert attention_shape(model) == (12, 384)


def test_fused_attention_counts_the_operations_it_replaced(tmp_path):
    from packager.inspection import estimate_flops

    model = onnx.load(str(export(f"{MODELS}:mini_bert", tmp_path / "m.onnx",
                                 inputs=TOKENS).path))
    fused = fuse_transformer(model, "1.17").model
    assert estimate_flops(fused) == estimate_flops(model) > 0
