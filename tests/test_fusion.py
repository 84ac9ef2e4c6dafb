"""Transformer fusion before quantization on CPU targets: our attention rewrite for the exports
onnxruntime's patterns miss, then onnxruntime's optimizer, the heads and hidden size read from the
graph, kept only where the target's onnxruntime has the fused ops and the fused graph computes
what the unfused one does."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import run_py
from packager.build.job import build
from packager.graph.fusion import attention_shape, fuse_packed_attention, fuse_transformer
from packager.graph.simplify import simplify_proto
from packager.source.export import export
from packager.source.specs import parse_input

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


def shipped_fusion(precision: dict, said: list[str], shape: str) -> dict | None:
    """The manifest's fusion record; None when the build fused the graph (the three fusions,
    outputs matching) and then dropped it only because it timed slower here. These models
    run in about 0.2 ms, where fused and unfused are within a few % of each other and the
    interleaved timing may go either way on a shared CPU: the fusion itself was proven."""
    log = "\n".join(said)
    if "fusion" in precision:
        return precision["fusion"]
    assert ("fusion: Attention 2, BiasGelu 2, SkipLayerNormalization 4 " + shape) in log, log
    assert "fusion: dropped, it runs slower" in log, log
    return None


def test_a_hugging_face_layout_bert_fuses_attention_and_ships_it(tmp_path, tokens):
    out = tmp_path / "bert"
    said: list[str] = []
    build(f"{MODELS}:mini_bert", out, target="x86_64-cpu", calib=tokens, inputs=TOKENS,
          quant={"precision": "int8", "mode": "dynamic"}, min_cosine=0.9, log=said.append)
    part = json.loads((out / "manifest.json").read_text())["parts"][0]
    fusion = shipped_fusion(part["precision"], said, "(4 heads, hidden 64)")
    if fusion is None:
        return
    assert fusion["fused"] == {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    assert (fusion["heads"], fusion["hidden"]) == (4, 64)
    assert fusion["cosine_to_unfused"] >= 0.99999
    shipped = contrib_ops(out / "model.onnx")   # quantized around the fused ops
    assert shipped["SkipLayerNormalization"] == 4 and shipped["BiasGelu"] == 2
    assert shipped["Attention"] + shipped["QAttention"] == 2
    r = run_py(out, "check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_an_nn_transformer_encoder_fuses_attention_norms_and_gelus(tmp_path, tokens):
    """nn.MultiheadAttention exports one packed QKV projection, which onnxruntime's attention
    fusion does not match: our rewrite makes it Attention, and the optimizer does the rest."""
    out = tmp_path / "enc"
    said: list[str] = []
    build(f"{MODELS}:encoder", out, target="x86_64-cpu", calib=tokens, inputs=TOKENS,
          quant={"precision": "int8", "mode": "dynamic"}, min_cosine=0.9, log=said.append)
    precision = json.loads((out / "manifest.json").read_text())["parts"][0]["precision"]
    fusion = shipped_fusion(precision, said, "(4 heads, hidden 64)")
    if fusion is None:
        return
    assert fusion["fused"] == {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    assert fusion["by"].startswith("edgepack's packed-QKV attention rewrite (2)")
    assert fusion["cosine_to_unfused"] >= 0.99999
    shipped = contrib_ops(out / "model.onnx")   # the quantizer quantizes Attention's weights
    assert shipped["SkipLayerNormalization"] == 4 and shipped["BiasGelu"] == 2
    assert shipped["Attention"] + shipped["QAttention"] == 2
    r = run_py(out, "check")
    assert r.returncode == 0, r.stdout + r.stderr


def run_onnx(model: onnx.ModelProto, feeds: dict) -> list:
    import onnxruntime as ort

    options = ort.SessionOptions()   # the graph as written, not onnxruntime's own fusions
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def padded_tokens(batch: int, seq: int, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq)[None, :] < rng.integers(4, seq + 1, (batch, 1))).astype(np.int64)
    return {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64),
            "attention_mask": mask}


def exported(tmp_path, factory: str, args: dict, batch: int, seq: int = 32):
    inputs = [parse_input(f"input_ids:{batch}x{seq}:int64"),
              parse_input(f"attention_mask:{batch}x{seq}:int64")]
    out = export(f"{MODELS}:{factory}", tmp_path / "m.onnx", inputs=inputs, factory_args=args)
    model = onnx.load(str(out.path))
    return model, simplify_proto(model, out.path)[0]


@pytest.mark.parametrize(("factory", "args", "batch", "seq", "layers"), [
    ("encoder", {}, 1, 32, 2),                                   # the test model, biases zero
    ("torch_encoder", {}, 2, 32, 2),                             # batch 2: rows in order
    ("torch_encoder", {"batch_first": False}, 2, 32, 2),         # sequence-first
    ("torch_encoder", {"dim": 384, "heads": 12, "ffn": 1536, "layers": 1}, 1, 128, 1),  # MiniLM
    ("packed_attention", {}, 2, 32, 1),                          # view + permute + SDPA
])
def test_packed_qkv_attention_becomes_attention_and_computes_the_same(
        tmp_path, factory, args, batch, seq, layers):
    from packager.graph.inspection import estimate_flops

    feeds = padded_tokens(batch, seq)
    for model in exported(tmp_path, factory, args, batch, seq):   # as exported, and onnxsim'd
        fused = fuse_packed_attention(model)
        ops = Counter(n.op_type for n in fused.graph.node)
        assert ops["Attention"] == layers and not ops["Softmax"]
        for want, got in zip(run_onnx(model, feeds), run_onnx(fused, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
        assert estimate_flops(fused) == estimate_flops(model)
        onnx.checker.check_model(fused)


def test_a_transformers_bert_of_today_fuses_its_attention(tmp_path):
    """transformers' BertModel: three Linears of one input stand for the packed one, its
    boolean mask and the IsNaN guard after the Softmax are what Attention does anyway."""
    pytest.importorskip("transformers")
    feeds = padded_tokens(1, 32)
    for model in exported(tmp_path, "transformers_bert", {}, batch=1):
        fused = fuse_packed_attention(model)
        assert Counter(n.op_type for n in fused.graph.node)["Attention"] == 2
        for want, got in zip(run_onnx(model, feeds), run_onnx(fused, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize(("factory", "args"), [
    ("torch_encoder", {"causal": True}),        # a causal mask: not a key-padding mask
    ("packed_attention", {"scale": 1 / 16}),    # scale 1/head size, not 1/sqrt(head size)
])
def test_attention_the_rewrite_does_not_match_exactly_stays_as_exported(tmp_path, factory, args):
    feeds = padded_tokens(2, 32)
    for model in exported(tmp_path, factory, args, batch=2):
        assert fuse_packed_attention(model) is model
        fusion = fuse_transformer(model, "1.17")
        assert fusion is None or "Attention" not in fusion.fused
        if fusion is not None:
            for want, got in zip(run_onnx(model, feeds), run_onnx(fusion.model, feeds),
                                 strict=True):
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_the_rewrite_needs_onnxruntime_1_14(tmp_path):
    """The -inf padding mask needs Attention's mask_filter_value (onnxruntime 1.14)."""
    model, _ = exported(tmp_path, "encoder", {}, batch=1)
    assert "Attention" not in fuse_transformer(model, "1.13").fused
    assert fuse_transformer(model, "1.14").fused["Attention"] == 2


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
    from packager.graph.inspection import estimate_flops

    model = onnx.load(str(export(f"{MODELS}:mini_bert", tmp_path / "m.onnx",
                                 inputs=TOKENS).path))
    fused = fuse_transformer(model, "1.17").model
    assert estimate_flops(fused) == estimate_flops(model) > 0


STAND_IN = Path(__file__).parent / "zoo_minilm.py"


def stand_in_feeds(seq: int = 32, seed: int = 2) -> list[dict]:
    """Padded sentences, one of them with no padding, one with token type 1 after a cut."""
    rng = np.random.default_rng(seed)
    feeds = []
    for length in (seq, 9, 20):
        mask = (np.arange(seq) < length).astype(np.int64)[None]
        types = (np.arange(seq) >= length // 2).astype(np.int64)[None] * mask
        feeds.append({"input_ids": rng.integers(0, 1000, (1, seq)).astype(np.int64) * mask,
                      "attention_mask": mask, "token_type_ids": types})
    return feeds


def stand_in(tmp_path, seq: int = 32):
    """zoo_minilm's stand-in for all-MiniLM-L6-v2, as exported and as onnxsim leaves it."""
    inputs = [parse_input(f"{n}:1x{seq}:int64")
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    out = export(f"{STAND_IN}:stand_in", tmp_path / "m.onnx", inputs=inputs)
    model = onnx.load(str(out.path))
    return model, simplify_proto(model, out.path)[0]


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_the_real_minilm_export_fuses_attention_residual_norms_and_gelus(tmp_path):
    """The export of today's transformers BertModel with mean pooling and F.normalize: a
    boolean mask with an IsNaN guard (our attention rewrite), and a ReduceL2 whose axes are an
    input, which onnxruntime's symbolic shape inference cannot type, so that its own
    SkipLayerNormalization fusion does nothing (our residual-LayerNorm rewrite)."""
    exported_, simplified = stand_in(tmp_path)
    ops = Counter(n.op_type for n in exported_.graph.node)
    assert ops["IsNaN"] == 2 and ops["And"] and ops["ReduceL2"] == 1   # the real patterns
    fusion = fuse_transformer(exported_, "1.17")
    assert fusion.fused == {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    assert (fusion.heads, fusion.hidden, fusion.skip_norms) == (4, 64, 4)
    assert "residual LayerNorm rewrite (4)" in fusion.record()["by"]
    left = Counter(n.op_type for n in fusion.model.graph.node)
    assert left["LayerNormalization"] == 1 and not left["Softmax"]   # the embeddings' stays
    for feeds in stand_in_feeds():
        want, = run_onnx(exported_, feeds)
        got, = run_onnx(fusion.model, feeds)
        assert cosine(got, want) >= 0.9999
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    onnx.checker.check_model(fusion.model)
    # what onnxsim keeps of a fused graph: the fused ops, nothing left for a second pass
    again = simplify_proto(fusion.model, tmp_path / "m.onnx")[0]
    assert contrib_ops_of(again) == Counter(fusion.fused)


def contrib_ops_of(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft")


def test_residual_norms_after_a_gemm_between_reshapes_fuse_as_the_matmul_it_was(tmp_path):
    """onnxsim writes each Linear of a (batch, sequence, hidden) tensor as Reshape -> Gemm ->
    Reshape (the FFN as Reshape -> Gemm -> Gelu -> Gemm -> Reshape): the Gemm before a
    residual norm is the MatMul + Add of its rows split back, and the optimizer then takes that
    bias into the SkipLayerNormalization."""
    from packager.graph.skip_norm import fuse_skip_norms

    _, simplified = stand_in(tmp_path)
    assert Counter(n.op_type for n in simplified.graph.node)["Gemm"] == 12
    fused = fuse_skip_norms(simplified)
    ops = Counter(n.op_type for n in fused.graph.node)
    assert ops["SkipLayerNormalization"] == 4 and ops["Gemm"] == 8
    fusion = fuse_transformer(simplified, "1.17")
    assert fusion.fused == {"Attention": 2, "SkipLayerNormalization": 4}
    assert all(len(n.input) == 5 for n in fusion.model.graph.node   # the Gemms' biases
               if n.op_type == "SkipLayerNormalization")
    for feeds in stand_in_feeds():
        want, = run_onnx(simplified, feeds)
        for model in (fused, fusion.model):
            got, = run_onnx(model, feeds)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_norms_that_are_not_a_residual_of_the_same_shape_stay(tmp_path):
    """A residual broadcast from (1, 1, hidden), and an Add another node also reads (pre-norm
    residual streams) are not SkipLayerNormalization's input + skip: left as they are."""
    from onnx import TensorProto, helper, numpy_helper

    from packager.graph.skip_norm import fuse_skip_norms

    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n)
            for n, s in (("w", (8, 8)), ("b", (8,)), ("g", (8,)), ("beta", (8,)))]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    r = helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 1, 8])

    def model(nodes, outputs):
        return helper.make_model(helper.make_graph(
            nodes, "g", [x, r], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                 for o in outputs], init),
            opset_imports=[helper.make_opsetid("", 17)])

    linear = [helper.make_node("MatMul", ["x", "w"], ["m"]),
              helper.make_node("Add", ["m", "b"], ["l"])]
    broadcast = model(linear + [helper.make_node("Add", ["l", "r"], ["s"]),
                                helper.make_node("LayerNormalization", ["s", "g", "beta"],
                                                 ["y"])], ["y"])
    assert fuse_skip_norms(broadcast) is broadcast
    shared = model(linear + [helper.make_node("Add", ["l", "x"], ["s"]),
                             helper.make_node("LayerNormalization", ["s", "g", "beta"], ["y"]),
                             helper.make_node("Add", ["s", "y"], ["z"])], ["z"])
    assert fuse_skip_norms(shared) is shared
    plain = model(linear + [helper.make_node("Add", ["l", "x"], ["s"]),
                            helper.make_node("LayerNormalization", ["s", "g", "beta"], ["y"],
                                             epsilon=1e-3)], ["y"])
    fused = fuse_skip_norms(plain)
    skip, = [n for n in fused.graph.node if n.domain == "com.microsoft"]
    assert skip.op_type == "SkipLayerNormalization" and \
        [a.f for a in skip.attribute if a.name == "epsilon"] == [pytest.approx(1e-3)]
    feeds = {"x": rng.normal(size=(1, 4, 8)).astype(np.float32),
             "r": rng.normal(size=(1, 1, 8)).astype(np.float32)}
    np.testing.assert_allclose(run_onnx(fused, feeds)[0], run_onnx(plain, feeds)[0],
                               rtol=0, atol=1e-5)


def test_a_build_of_the_real_minilm_export_ships_its_fused_graph(tmp_path):
    """Through `build`: the fusion record names our two rewrites, the fused graph matches the
    unfused one, and the quantized bundle keeps SkipLayerNormalization, BiasGelu, Attention."""
    samples = [stand_in_feeds(seed=i) for i in range(8)]
    calib = tmp_path / "tokens.npz"
    np.savez(calib, **{k: np.concatenate([f[k] for s in samples for f in s])
                       for k in ("input_ids", "attention_mask", "token_type_ids")})
    out, said = tmp_path / "minilm", []
    build(f"{STAND_IN}:stand_in", out, target="x86_64-cpu", calib=calib,
          inputs=[parse_input(f"{n}:1x32:int64")
                  for n in ("input_ids", "attention_mask", "token_type_ids")],
          quant={"precision": "int8", "mode": "dynamic"}, min_cosine=0.9, log=said.append)
    fusion = shipped_fusion(json.loads((out / "manifest.json").read_text())["parts"][0]
                            ["precision"], said, "(4 heads, hidden 64)")
    if fusion is None:
        return
    assert fusion["fused"] == {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    assert "attention rewrite (2) and residual LayerNorm rewrite (4)" in fusion["by"]
    assert fusion["cosine_to_unfused"] >= 0.99999
    shipped = contrib_ops(out / "model.onnx")
    assert shipped["SkipLayerNormalization"] == 4 and shipped["BiasGelu"] == 2
    assert shipped["Attention"] + shipped["QAttention"] == 2


def test_a_gemm_with_its_weight_transposed_between_reshapes_becomes_its_matmul():
    """Gemm(transB=1) of the rows of a (1, 4, 8) tensor, split back: MatMul by the weight's
    transpose, then the bias Add, then the SkipLayerNormalization."""
    from onnx import TensorProto, helper, numpy_helper

    from packager.graph.skip_norm import fuse_skip_norms

    rng = np.random.default_rng(1)
    init = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n)
            for n, s in (("w", (8, 16)), ("b", (8,)), ("g", (8,)), ("beta", (8,)))] + \
        [numpy_helper.from_array(np.array(s, np.int64), n)
         for n, s in (("rows", [4, 16]), ("back", [1, 4, 8]))]
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["flat"]),
             helper.make_node("Gemm", ["flat", "w", "b"], ["gemm"], transB=1),
             helper.make_node("Reshape", ["gemm", "back"], ["l"]),
             helper.make_node("Add", ["r", "l"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "beta"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16]),
                     helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], init),
        opset_imports=[helper.make_opsetid("", 17)])
    fused = fuse_skip_norms(model)
    assert [n.op_type for n in fused.graph.node] == ["MatMul", "Add", "SkipLayerNormalization"]
    feeds = {"x": rng.normal(size=(1, 4, 16)).astype(np.float32),
             "r": rng.normal(size=(1, 4, 8)).astype(np.float32)}
    np.testing.assert_allclose(run_onnx(fused, feeds)[0], run_onnx(model, feeds)[0],
                               rtol=0, atol=1e-5)
    onnx.checker.check_model(fused)
