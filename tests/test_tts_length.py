"""Issue 37, item 6: lengths that fit the model. A TTS model without a mask input (every
token's frames depend on all the tokens: padding changes the whole waveform) builds at a static
length of 8 tokens; the build measures what padding does on the original, keeps the length
axis open in the shipped graph, checks it at other lengths, and the bundle then speaks a
sentence of any length as the original does. A model whose tokens do not see each other keeps
its static length (padding moves nothing), and says so."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from test_tts import regulated_waveform, tts_constants

from conftest import save, spoken
from packager._runtimes.runner.task_tts import mel_distance
from packager.cli import main

RATE, VOCAB = 16000, 32


def tts_any_length(path: Path, mixed: bool, by_shape: bool = False) -> Path:
    """tokens (1, T), T free -> frames, durations (1-3 a token) -> length regulation -> 256
    samples a frame. *mixed*: each token's state is added 8 times the mean of all of them (a
    model without a mask: padding changes every frame); *by_shape*: that mean is the sum over
    the token count read from the input's shape (which simplification at a static length folds
    into a constant)."""
    t, n = TensorProto, helper.make_node
    const = [*tts_constants(np.random.default_rng(7)),
             helper.make_tensor("onef", t.FLOAT, [], [1.0]),
             helper.make_tensor("mix", t.FLOAT, [], [8.0])]
    nodes = [n("Gather", ["emb", "tokens"], ["e"], axis=0), n("Squeeze", ["e", "ax0"], ["h0"])]
    if mixed and by_shape:
        nodes += [n("ReduceSum", ["h0", "ax0"], ["sum"], keepdims=1),
                  n("Shape", ["tokens"], ["shape"]), n("Gather", ["shape", "one"], ["count"]),
                  n("Cast", ["count"], ["countf"], to=t.FLOAT),
                  n("Div", ["sum", "countf"], ["mean"])]
    elif mixed:
        nodes += [n("ReduceMean", ["h0"], ["mean"], axes=[0], keepdims=1)]
    if mixed:
        nodes += [n("Mul", ["mean", "mix"], ["mean3"]), n("Add", ["h0", "mean3"], ["h"])]
    else:
        nodes += [n("Identity", ["h0"], ["h"])]
    nodes += [n("MatMul", ["h", "v"], ["dv"]), n("Relu", ["dv"], ["dr"]),
              n("Max", ["dr", "onef"], ["dl"]), *regulated_waveform("dl")]
    graph = helper.make_graph(
        nodes, "tts_any_length", [helper.make_tensor_value_info("tokens", t.INT64, [1, "T"])],
        [helper.make_tensor_value_info("waveform", t.FLOAT, [1, "samples"])], const)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def build(root: Path, mixed: bool, *options: str, by_shape: bool = False,
          task: str | None = f"tts:rate={RATE}"):
    model = tts_any_length(root / "tts.onnx", mixed, by_shape)
    (root / "calib").mkdir()
    np.save(root / "calib" / "tokens.npy",
            np.random.default_rng(1).integers(1, VOCAB, (40, 1, 8)).astype(np.int64))
    run = CliRunner().invoke(main, ["build", str(model), "--input", "tokens:1x8:int64",
                                    "--calib", str(root / "calib"),
                                    *(["--task", task] if task else []), *options,
                                    "-o", str(root / "out")],
                             catch_exceptions=False)
    return model, run


def test_a_waveform_from_tokens_is_judged_as_speech_without_task(tmp_path):
    """Kokoro-82M (tokens, style, speed -> audio) built without --task was judged raw and
    shipped at 64 tokens, where padding moved its speech 16 dB. A model whose one output is a
    float waveform by its name, its length fixed by no input, spoken from integer tokens, is
    judged as speech by default, said in one line, and keeps its length open where padding
    moves the speech; --task raw opts out."""
    import json

    (tmp_path / "auto").mkdir()
    _, run = build(tmp_path / "auto", True, task=None)
    assert run.exit_code == 0, run.output
    assert "task: tts, applied by default: output 'waveform' is a waveform" in run.output
    part = json.loads((tmp_path / "auto" / "out" / "manifest.json").read_text())["parts"][0]
    assert part["task"]["kind"] == "tts" and part["length"]["dynamic"] is True
    (tmp_path / "raw").mkdir()
    _, run = build(tmp_path / "raw", True, task="raw")
    assert run.exit_code == 0, run.output
    assert "applied by default" not in run.output
    part = json.loads((tmp_path / "raw" / "out" / "manifest.json").read_text())["parts"][0]
    assert (part.get("task") or {}).get("kind", "raw") == "raw" and "length" not in part


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("tts_mixed")
    return root, *build(root, True)


def original(model: Path, tokens: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"tokens": tokens})[0].reshape(-1)


def test_a_model_without_a_mask_keeps_its_length_open_and_speaks_any_sentence(mixed, tmp_path):
    root, model, run = mixed
    assert run.exit_code == 0, run.output
    assert "the bundle keeps tokens's length open in the shipped graph, checked at" in \
        run.output, run.output
    manifest = json.loads((root / "out" / "manifest.json").read_text())
    length = manifest["parts"][0]["length"]
    assert length["dynamic"] is True and length["input"] == "tokens" and length["static"] == 8
    assert length["padding_mel_db"] > 2.0 and length["worst_mel_db"] < 0.5
    check = subprocess.run([sys.executable, str(root / "out" / "run.py"), "check"],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    for count in (3, 8, 21):   # shorter, the build's and longer sentences, none padded
        tokens = np.random.default_rng(count).integers(1, VOCAB, (1, count)).astype(np.int64)
        got = spoken(root / "out", tokens, tmp_path, f"t{count}", "waveform")
        want = original(model, tokens)
        assert len(got) == len(want) and mel_distance(want, got, RATE) < 0.5


def test_padding_such_a_model_changes_its_speech(mixed):
    """What the build measured: the original on 6 tokens against the same 6 padded to 8."""
    _, model, _ = mixed
    tokens = np.random.default_rng(5).integers(1, VOCAB, (1, 8)).astype(np.int64)
    short = original(model, tokens[:, :6])
    padded = np.concatenate([tokens[:, :6], np.zeros((1, 2), np.int64)], axis=1)
    assert mel_distance(short, original(model, padded)[:len(short)], RATE) > 2.0


def test_a_model_whose_tokens_do_not_see_each_other_keeps_its_static_length(tmp_path):
    _, run = build(tmp_path, False)
    assert run.exit_code == 0, run.output
    assert "length: padding a sentence to 8 tokens moves its speech" in run.output, run.output
    length = json.loads((tmp_path / "out" / "manifest.json").read_text())["parts"][0]["length"]
    assert length["dynamic"] is False and length["padding_mel_db"] <= 2.0


def test_a_length_section_that_is_not_one_is_refused_in_one_line(mixed, tmp_path):
    import shutil

    from test_runner import resign

    root, _, _ = mixed
    bundle = tmp_path / "b"
    shutil.copytree(root / "out", bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["parts"][0]["length"]["input"] = "nothing"
    resign(bundle, manifest)
    r = subprocess.run([sys.executable, str(bundle / "run.py"), "check"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "parts[0].length is not {input: one of the part's inputs" in \
        r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_length_folded_by_simplification_ships_the_original_graph_open(tmp_path):
    """The mean over the tokens divides by the count read from the input's shape: simplified
    at 8 tokens, the shipped graph divides by 8 at every length, which the check at other
    lengths catches; an FP32 bundle then ships the original graph itself with its length
    open, and speaks a 13-token sentence as the original does."""
    model, run = build(tmp_path, True, "--precision", "fp32", by_shape=True)
    assert run.exit_code == 0, run.output
    part = json.loads((tmp_path / "out" / "manifest.json").read_text())["parts"][0]
    length = part["length"]
    assert length["dynamic"] is True
    if part["precision"]["fp32_graph"]["chosen"] == "onnxsim":   # the length folded in it
        assert length["graph"] == "original" and "keeps tokens's length open in the original " \
            "graph (unsimplified: the simplified one at 4 tokens it speaks" in run.output, \
            run.output
    else:   # timing picked the unsimplified FP32 graph, whose Shape nodes still run: it ships
        assert length["graph"] == "shipped", run.output
    tokens = np.random.default_rng(13).integers(1, VOCAB, (1, 13)).astype(np.int64)
    np.save(tmp_path / "t13.npy", tokens)
    r = subprocess.run([sys.executable, str(tmp_path / "out" / "run.py"), "infer",
                        str(tmp_path / "t13.npy"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = np.load(tmp_path / "o.npz")["t13.npy/waveform"].reshape(-1)
    want = original(model, tokens)
    assert len(got) == len(want) and mel_distance(want, got, RATE) < 0.5
    check = subprocess.run([sys.executable, str(tmp_path / "out" / "run.py"), "check"],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]


def test_compare_speaks_whole_sentences_in_real_time_factors(mixed, tmp_path):
    """Issue 45 item 6: compare on a speech model times whole sentences at their own lengths
    (3, 8 and 21 tokens, none padded) as the model's own package runs it and as the bundle
    does, in real-time factors (compute / audio), with the cold start and a log-mel column
    against the model as given; OpenVINO's rows where its Python exists, else a note."""
    from packager.compare import compare, markdown

    root, model, _ = mixed
    for count in (3, 8, 21):
        np.save(tmp_path / f"s{count:02d}.npy",
                np.random.default_rng(count).integers(1, VOCAB, count).astype(np.int64))
    result = compare(model, calib=tmp_path, bundle=root / "out", rounds=2)
    assert result["kind"] == "speech"
    rows = {r["variant"].split(" (")[0]: r for r in result["rows"]}
    assert {"ORT as given", "shipped"} <= set(rows), rows
    for name in ("ORT as given", "shipped"):
        r = rows[name]
        assert r["sentences"] == 3 and r["same_length"] == 3 and r["worst_mel_db"] < 0.5, r
        assert 0 < r["rtf"] < 1 and abs(r["rtf"] * r["x_real_time"] - 1) < 1e-6, r
        assert r["cold_start_ms"] > r["p50_ms"], r   # import + load + the first sentence
    under = [r for r in result["rows"] if "under OpenVINO" in r["variant"]]
    assert under or any(n.startswith("OpenVINO rows") for n in result["notes"])
    for r in under:
        assert r["same_length"] == 3 and r["provider"], r
    table = markdown(result)
    assert "| real-time factor |" in table and "| log-mel dB (worst) |" in table


def test_compare_of_a_speech_model_without_sentences_is_one_line(mixed):
    root, model, _ = mixed
    run = CliRunner().invoke(main, ["compare", str(model)])
    assert run.exit_code == 2 and "compared on sentences" in run.output and \
        "Traceback" not in run.output, run.output
