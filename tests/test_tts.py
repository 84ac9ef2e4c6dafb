"""The speech task (issue 37, item 2): a TTS-like ONNX model (token ids -> durations -> length
regulation -> a vocoder's 256 samples a frame), its waveform's length following the text, built
with --task tts and judged as speech (same length, log-mel distance, SNR); run.py infer writes
WAV files and serve answers audio/wav."""

import io
import json
import subprocess
import sys
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from conftest import save, spoken, start_server
from packager._runtimes.runner import task_tts
from packager.cli import main
from packager.device.verify import verify

RATE, HOP, VOCAB = 16000, 256, 32


def tts_constants(rng):
    """The tiny TTS models' weights (embedding, encoder, durations, vocoder) and constants."""
    t = TensorProto
    return [helper.make_tensor("emb", t.FLOAT, [VOCAB, 8],
                               rng.standard_normal((VOCAB, 8)).ravel()),
            helper.make_tensor("w1", t.FLOAT, [8, 8], rng.standard_normal((8, 8)).ravel() * .5),
            helper.make_tensor("v", t.FLOAT, [8, 1], rng.standard_normal(8) * .8),
            helper.make_tensor("w2", t.FLOAT, [8, HOP],
                               rng.standard_normal((8, HOP)).ravel() * .4),
            helper.make_tensor("s88", t.INT64, [2], [8, 8]),
            helper.make_tensor("flat", t.INT64, [2], [1, -1]),
            helper.make_tensor("three", t.FLOAT, [], [3.0]),
            helper.make_tensor("half", t.FLOAT, [], [0.5]),
            helper.make_tensor("zero", t.INT64, [], [0]),
            helper.make_tensor("one", t.INT64, [], [1]),
            helper.make_tensor("ax0", t.INT64, [1], [0]),
            helper.make_tensor("ax1", t.INT64, [1], [1])]


def regulated_waveform(durations):
    """Nodes from hidden states "h" (T, 8) and *durations* ((T, 1) floats, frames a token, at
    most 3) to the waveform: frames, durations rounded up, the frames repeated by them (a
    cumulative sum), 256 samples a frame."""
    t, n = TensorProto, helper.make_node
    return [n("MatMul", ["h", "w1"], ["f"]), n("Tanh", ["f"], ["frames8"]),
            n("Min", [durations, "three"], ["dm"]), n("Ceil", ["dm"], ["dc"]),
            n("Cast", ["dc"], ["d2"], to=t.INT64), n("Squeeze", ["d2", "ax1"], ["dur"]),
            n("CumSum", ["dur", "zero"], ["ends"]),
            n("ReduceSum", ["dur"], ["total"], keepdims=0),
            n("Range", ["zero", "total", "one"], ["pos"]),
            n("Unsqueeze", ["pos", "ax1"], ["pos2"]),
            n("GreaterOrEqual", ["pos2", "ends"], ["past"]),
            n("Cast", ["past"], ["pasti"], to=t.INT64),
            n("ReduceSum", ["pasti", "ax1"], ["idx"], keepdims=0),
            n("Gather", ["frames8", "idx"], ["frames"], axis=0),
            n("MatMul", ["frames", "w2"], ["voc"]), n("Tanh", ["voc"], ["vt"]),
            n("Mul", ["vt", "half"], ["vh"]), n("Reshape", ["vh", "flat"], ["waveform"])]


def tiny_tts(path):
    """tokens (1, 8) int64 -> embeddings -> 8 frames and a duration each (0-3) -> frames
    repeated by their durations -> 256 samples a frame: waveform (1, 256 x sum of durations)."""
    t, n = TensorProto, helper.make_node
    nodes = [n("Gather", ["emb", "tokens"], ["e"], axis=0), n("Reshape", ["e", "s88"], ["h"]),
             n("MatMul", ["h", "v"], ["dv"]), n("Relu", ["dv"], ["dr"]),
             *regulated_waveform("dr")]
    graph = helper.make_graph(
        nodes, "tiny_tts", [helper.make_tensor_value_info("tokens", t.INT64, [1, 8])],
        [helper.make_tensor_value_info("waveform", t.FLOAT, [1, "samples"])],
        tts_constants(np.random.default_rng(0)))
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def tokens(seed, count=1):
    return np.random.default_rng(seed).integers(0, VOCAB, (count, 1, 8)).astype(np.int64)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tts")
    model = tiny_tts(root / "tts.onnx")
    (root / "calib").mkdir()
    np.save(root / "calib" / "tokens.npy", tokens(1, 40))
    run = CliRunner().invoke(main, ["build", str(model), "--calib", str(root / "calib"),
                                    "--task", f"tts:rate={RATE}", "-o", str(root / "out")],
                             catch_exceptions=False)
    return root, run


def test_speech_figures_see_what_a_listener_hears():
    t = np.arange(RATE) / RATE
    voice = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 30)) * 0.1
    assert task_tts.mel_distance(voice, voice, RATE) == 0.0
    assert task_tts.mel_distance(voice, 0.9 * voice, RATE) == pytest.approx(0.92, abs=0.05)
    other = sum(np.sin(2 * np.pi * 180 * k * t) / k for k in range(1, 30)) * 0.1
    assert task_tts.mel_distance(voice, other, RATE) > 5    # another pitch: far
    assert task_tts.snr(voice, voice * 0.99) == pytest.approx(40.0, abs=0.1)
    with wave.open(io.BytesIO(task_tts.wav_bytes(voice, RATE))) as f:
        assert (f.getframerate(), f.getnchannels(), f.getsampwidth()) == (RATE, 1, 2)
        assert f.getnframes() == len(voice)


def test_a_tts_model_builds_judged_as_speech(built):
    root, run = built
    assert run.exit_code == 0, run.output
    part = json.loads((root / "out" / "manifest.json").read_text())["parts"][0]
    assert part["task"]["kind"] == "tts" and part["task"]["rate"] == RATE
    # the budget held to the original's own spread between 1 thread and all, and said
    assert part["task"]["mel_spread_db"] >= 0 and part["task"]["mel_db"] >= \
        3 * part["task"]["mel_spread_db"]
    assert "speech: the original against itself (1 thread vs all, 8 held-out samples)" in \
        run.output
    task = part["accuracy"]["task"]
    assert set(task["figures"]) == {"length", "mel"} and task["passed"], task
    assert "the same length (within the task's tolerance) on" in task["text"]
    report = verify(root / "out", runs=5, warmup=1)
    assert report["passed"], report["checks"]
    # speech is held to real time, not to the target's ceiling for one answer (Kokoro-82M
    # took 1.82 s at p90 for 5.00 s of audio and failed the 1000 ms budget); RTF = compute/audio
    bench = next(iter(report["bench"]["parts"].values()))
    golden = np.load(root / "out" / "golden" / "model.inputs.npz")
    samples = ort_samples(root / "tts.onnx", {k: golden[k][0] for k in golden.files})
    assert abs(bench["audio_s"] - samples / RATE) < 1e-9
    assert abs(bench["real_time_factor"] - bench["latency_ms"]["p50"] / 1000 / bench["audio_s"]
               ) < 1e-9
    [latency] = [c for c in report["checks"] if c["name"] == "latency"]
    assert f"the {bench['audio_s']:.2f} s of audio it speaks (real-time factor" in \
        latency["detail"]
    strict = verify(root / "out", runs=3, warmup=1, latency_budget_ms=1e-6)
    [latency] = [c for c in strict["checks"] if c["name"] == "latency"]
    assert not latency["passed"] and "budget 1e-06 ms" in latency["detail"]


def ort_samples(model, feed):
    import onnxruntime as ort

    return ort.InferenceSession(str(model)).run(None, feed)[0].shape[-1]


def test_infer_writes_a_wav_per_input_at_its_own_length(built, tmp_path):
    root, _ = built
    for seed in (3, 4):
        np.save(tmp_path / f"s{seed}.npy", tokens(seed)[0])
    proc = subprocess.run([sys.executable, "-I", "run.py", "infer", str(tmp_path / "s3.npy"),
                           str(tmp_path / "s4.npy"), "--out", str(tmp_path / "speech.npz"),
                           "--json"], cwd=root / "out", capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    import onnxruntime as ort

    session = ort.InferenceSession(str(root / "tts.onnx"))
    assert report["wav"] == [str(tmp_path / f"speech.s{s}.npy.wav") for s in (3, 4)]
    for seed, path, result in zip((3, 4), report["wav"], report["results"], strict=True):
        samples = session.run(None, {"tokens": tokens(seed)[0]})[0].shape[1]
        with wave.open(path) as f:
            assert f.getframerate() == RATE and f.getnframes() == samples
        assert result["task"]["samples"] == samples
        assert result["summary"].startswith(f"{samples / RATE:.2f} s of speech at {RATE} Hz "
                                            f"({samples} samples, peak ")


def test_infer_never_writes_through_a_link_left_at_a_wav_s_temporary_name(built, tmp_path):
    """hostile-cases-turn5 #3 (data loss): a link at OUT.KEY.wav.tmp made infer write the WAV
    into whatever it pointed at; the WAV now goes through a fresh name of its own."""
    root, _ = built
    np.save(tmp_path / "s3.npy", tokens(3)[0])
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "o.s3.npy.wav.tmp").symlink_to(victim)
    proc = subprocess.run([sys.executable, str(root / "out" / "run.py"), "infer",
                           str(tmp_path / "s3.npy"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "keep"
    with wave.open(str(tmp_path / "o.s3.npy.wav")) as f:
        assert f.getframerate() == RATE and f.getnframes() > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".wav-")]


def test_a_wav_that_cannot_be_written_leaves_no_npz_and_nan_speech_is_silent(built, tmp_path):
    """hostile-cases-turn5 (seen, not counted): a WAV that could not be written left OUT.npz
    beside the exit 2; NaN speech was written with numpy's cast warning printed."""
    root, _ = built
    np.save(tmp_path / "s3.npy", tokens(3)[0])
    (tmp_path / "o.s3.npy.wav").mkdir()   # a folder where the WAV goes: it cannot be replaced
    proc = subprocess.run([sys.executable, str(root / "out" / "run.py"), "infer",
                           str(tmp_path / "s3.npy"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "o.s3.npy.wav: cannot write it" in proc.stderr, proc.stderr
    assert not (tmp_path / "o.npz").exists()
    import warnings

    from runtimes.runner import task_tts
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pcm = np.frombuffer(task_tts.pcm16([np.nan, 2.0, -np.inf, 0.5]), "<i2")
    assert pcm.tolist() == [0, 32767, -32767, 16383]


def test_serve_answers_audio_wav_and_json_when_asked(built, tmp_path):
    root, _ = built
    proc, url = start_server(root / "out", tmp_path / "serve.log")
    try:
        body = io.BytesIO()
        np.save(body, tokens(5)[0])
        request = urllib.request.Request(url + "/infer", data=body.getvalue(), headers={
            "Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            kind, audio = answer.headers["Content-Type"], answer.read()
            stages = json.loads(answer.headers["X-Edgepack-Stages-Ms"])
        request.add_header("Accept", "application/json")
        with urllib.request.urlopen(request, timeout=30) as answer:
            as_json = json.loads(answer.read())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert kind == "audio/wav" and set(stages) == {"decode", "preprocess", "model", "post"}
    with wave.open(io.BytesIO(audio)) as f:
        assert f.getframerate() == RATE and f.getnframes() == as_json["task"]["samples"]
    assert as_json["task"]["kind"] == "tts" and "_wav" not in as_json


def test_compare_times_speech_in_real_time_factors(built):
    """compare on the TTS model: outputs of different lengths agree zero-padded, each row
    says how many seconds of speech it makes per second of compute (the rate from the
    bundle's task), warm; the cold start is its own column."""
    from packager.compare import compare, markdown

    root, _ = built
    result = compare(root / "tts.onnx", calib=root / "calib", batches=(1, 8), rounds=2,
                     block=3, cold=False, bundle=root / "out",
                     variants=["ORT FP32", "INT8 QDQ U8S8"])
    assert result["audio_rate"] == RATE
    # the model runs at batch 1 only (a Reshape to 8x8): batch 8's rows say so, batch 1 stands
    assert all(r["error"].startswith("the model does not run at batch 8")
               for r in result["rows"] if r["batch"] == 8)
    assert any(n.startswith("batch 8: input 'tokens' is declared 1x8") for n in result["notes"])
    rows = {r["variant"]: r for r in result["rows"] if r["batch"] == 1}
    for row in rows.values():
        assert 0 < row["rtf"] < 1 < row["x_real_time"] and "top1" not in row and "_out0_elements" not in row
    table = markdown(result)
    assert "| x real time |" in table and "stay dynamic (" in table



@pytest.fixture(scope="module")
def torch_built(tmp_path_factory):
    """tests/tts_torch.py's TinyTTS (PyTorch: embedding, encoder, durations, repeat_interleave,
    vocoder), its weights as safetensors, built as one graph with --task tts."""
    from safetensors.torch import save_file
    from tts_torch import tiny_tts

    root = tmp_path_factory.mktemp("tts_torch")
    save_file(tiny_tts().state_dict(), root / "tts.safetensors")
    (root / "calib").mkdir()
    np.save(root / "calib" / "tokens.npy", tokens(1, 40))
    source = f"{Path(__file__).parent / 'tts_torch.py'}:tiny_tts"
    run = CliRunner().invoke(main, ["build", source, "--weights", str(root / "tts.safetensors"),
                                    "--input", "tokens:1x8:int64", "--calib",
                                    str(root / "calib"), "--task", f"tts:rate={RATE}",
                                    "-o", str(root / "out")], catch_exceptions=False)
    return root, source, run


def test_a_pytorch_tts_model_builds_from_safetensors_checked_against_pytorch(torch_built):
    root, _, run = torch_built
    assert run.exit_code == 0, run.output
    part = json.loads((root / "out" / "manifest.json").read_text())["parts"][0]
    validation = part["source"]["export"]["validation"]   # the export against PyTorch
    assert validation["cosine_min"] > 0.9999 and validation["calibration"] >= 8
    assert part["source"]["export"]["weights"]["file"] == "tts.safetensors"
    assert part["task"]["kind"] == "tts" and part["accuracy"]["task"]["passed"]
    assert verify(root / "out", runs=5, warmup=1)["passed"]


def test_compare_times_eager_compile_ort_and_the_bundle_as_real_time(torch_built):
    """The seeds' comparison: eager PyTorch, torch.compile, ONNX Runtime and the bundle on the
    same token sequences, warm real-time factors, the cold start apart (a first call's import
    and load is what made an earlier figure 48x)."""
    from packager.compare import compare
    from packager.source.specs import parse_input

    root, source, _ = torch_built
    result = compare(source, weights=root / "tts.safetensors",
                     inputs=[parse_input("tokens:1x8:int64")], calib=root / "calib",
                     batches=(1,), rounds=2,
                     block=3, bundle=root / "out",
                     variants=["PyTorch eager", "torch.compile", "ORT FP32"])
    rows = {r["variant"].split(" (")[0]: r for r in result["rows"]}
    assert {"PyTorch eager", "torch.compile", "ORT FP32", "shipped"} <= set(rows), rows
    for name in ("PyTorch eager", "torch.compile", "ORT FP32", "shipped"):
        assert rows[name]["x_real_time"] > 1 and rows[name]["cosine_min"] > 0.999, rows[name]
    cold = rows["PyTorch eager"]["cold_start"]["total_ms"]
    assert cold > 10 * rows["PyTorch eager"]["p50_ms"]   # cold start is no warm figure


def test_a_tts_model_quantized_already_ships_as_given_and_verifies(tmp_path):
    """Weights already dynamically quantized (as the issue's 82M model's were): the build ships
    it "INT8 (as given)", judged as speech against itself, and verify passes."""
    from onnxruntime.quantization import quantize_dynamic

    tiny_tts(tmp_path / "tts.onnx")
    quantize_dynamic(str(tmp_path / "tts.onnx"), str(tmp_path / "tts.int8.onnx"))
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "tokens.npy", tokens(2, 30))
    run = CliRunner().invoke(main, ["build", str(tmp_path / "tts.int8.onnx"), "--calib",
                                    str(tmp_path / "calib"), "--task", f"tts:rate={RATE}",
                                    "-o", str(tmp_path / "out")], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    assert f"built {tmp_path / 'out'}: INT8 (as given)" in run.output
    report = verify(tmp_path / "out", runs=5, warmup=1)
    assert report["passed"] and any(c["name"] == "task:tts" and c["passed"]
                                    for c in report["checks"])


def test_a_pytorch_tts_model_is_exported_with_its_length_open_and_measured(torch_built, tmp_path):
    """Issue 45: a one-graph TTS from PyTorch took exactly its static length and refused a
    shorter sentence with no hint. Its token axis is now exported open, so the build measures
    what padding does (TinyTTS works token by token: padding keeps the speech, the length
    stays static and says so), and a shorter sentence is refused with the way to speak it."""
    root, _, run = torch_built
    assert run.exit_code == 0, run.output
    part = json.loads((root / "out" / "manifest.json").read_text())["parts"][0]
    assert part["source"]["export"]["dynamic"] == {"tokens": {"1": "length"}}
    assert part["length"]["dynamic"] is False and part["length"]["pad"] == 0
    np.save(tmp_path / "short.npy", np.arange(1, 6)[None])
    r = subprocess.run([sys.executable, str(root / "out" / "run.py"), "infer",
                        str(tmp_path / "short.npy")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and "pad the sentence with 0 to 8 tokens" in r.stderr, r.stderr


def test_a_pytorch_tts_model_without_a_mask_keeps_its_length_open(tmp_path):
    """tests/tts_torch.py's AttentionParts as one graph (its forward(): attention encoder
    without a mask, repeat_interleave, vocoder): padding moves its speech, so the bundle keeps
    the token length open and speaks as forward() at 5, 16 and 30 tokens (the build's INT8
    search also ran over its ragged outputs and sequence-typed tensors: two exits 3 before)."""
    import torch
    from safetensors.torch import load_file, save_file
    from tts_torch import attention_parts

    save_file(attention_parts().state_dict(), tmp_path / "tts.safetensors")
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "tokens.npy",
            np.random.default_rng(1).integers(1, VOCAB, (40, 1, 16)).astype(np.int64))
    source = f"{Path(__file__).parent / 'tts_torch.py'}:attention_parts"
    run = CliRunner().invoke(main, ["build", source, "--weights", str(tmp_path / "tts.safetensors"),
                                    "--input", "tokens:1x16:int64", "--calib",
                                    str(tmp_path / "calib"), "--task", f"tts:rate={RATE}",
                                    "-o", str(tmp_path / "out")], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    part = json.loads((tmp_path / "out" / "manifest.json").read_text())["parts"][0]
    assert part["length"]["dynamic"] is True and part["length"]["padding_mel_db"] > 2.0, \
        part["length"]
    model = attention_parts()
    model.load_state_dict(load_file(tmp_path / "tts.safetensors"))
    for n in (5, 16, 30):
        ids = np.random.default_rng(n).integers(1, VOCAB, (1, n)).astype(np.int64)
        got = spoken(tmp_path / "out", ids, tmp_path, f"s{n}", "output")
        with torch.no_grad():
            want = model(torch.from_numpy(ids)).numpy().reshape(-1)
        assert abs(len(got) / max(len(want), 1) - 1) <= 0.02 and \
            task_tts.mel_distance(want, got, RATE) <= 2.0, (n, len(got), len(want))


def test_serve_reads_accept_as_media_types_with_weights(built, tmp_path):
    """hostile-cases-turn5 #13: `serve` chose WAV or JSON by a case-sensitive substring of
    Accept; now by media type, without case, with q weights."""
    from packager._runtimes.runner.serve_http import wants_json

    for accept, json_wanted in (("APPLICATION/JSON", True), ("application/json;q=0", False),
                                ("audio/wav, application/json;q=0.1", False),
                                ("application/jsonp", False), ("", False), ("*/*", False),
                                ("audio/wav;q=0.2, Application/Json;q=0.5", True)):
        assert wants_json(accept) is json_wanted, accept
    root, _ = built
    proc, url = start_server(root / "out", tmp_path / "serve.log")
    try:
        body = io.BytesIO()
        np.save(body, tokens(5)[0])
        kinds = {}
        for accept in ("APPLICATION/JSON", "application/json;q=0", "application/jsonp"):
            request = urllib.request.Request(url + "/infer", data=body.getvalue(),
                                             headers={"Accept": accept})
            with urllib.request.urlopen(request, timeout=30) as answer:
                kinds[accept] = answer.headers["Content-Type"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert kinds == {"APPLICATION/JSON": "application/json", "application/json;q=0": "audio/wav",
                     "application/jsonp": "audio/wav"}


def test_a_speech_model_that_never_speaks_builds_says_so_and_checks(tmp_path):
    """hostile-cases-turn5 #6: durations all 0 (a Mul by 0 in place of the Relu): the build
    said nothing and `run.py check` crashed (exit 3) on the empty golden speech; now the build
    warns that no sample speaks and check judges empty against empty as alike."""
    t, n = TensorProto, helper.make_node
    nodes = [n("Gather", ["emb", "tokens"], ["e"], axis=0), n("Reshape", ["e", "s88"], ["h"]),
             n("MatMul", ["h", "v"], ["dv"]), n("Mul", ["dv", "zerof"], ["dr"]),
             *regulated_waveform("dr")]
    graph = helper.make_graph(
        nodes, "silent", [helper.make_tensor_value_info("tokens", t.INT64, [1, 8])],
        [helper.make_tensor_value_info("waveform", t.FLOAT, [1, "samples"])],
        tts_constants(np.random.default_rng(0)) + [helper.make_tensor("zerof", t.FLOAT, [],
                                                                      [0.0])])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                 tmp_path / "silent.onnx")
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "tokens.npy", tokens(1, 40))
    run = CliRunner().invoke(main, ["build", str(model), "--calib", str(tmp_path / "calib"),
                                    "--task", f"tts:rate={RATE}", "--openvino", "no",
                                    "-o", str(tmp_path / "out")], catch_exceptions=False)
    assert run.exit_code == 0 and "warning: no held-out sample gives speech" in run.output, \
        run.output
    r = subprocess.run([sys.executable, str(tmp_path / "out" / "run.py"), "check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "check passed" in r.stdout, r.stdout + r.stderr


def test_task_tts_on_an_image_classifier_is_refused(tmp_path, cnn_onnx, image_dir):
    """hostile-cases-turn5 #12: --task tts on an image classifier built, and its bundle
    answered 4 samples of "speech" a photo; a tts part takes integer token ids."""
    from conftest import PREP
    from packager.build.job import build
    from packager.errors import SpecError

    with pytest.raises(SpecError, match=r"--task tts does not fit .*takes integer token ids "
                                        r"of shape \(1, T\), this one takes image float"):
        build(cnn_onnx, tmp_path / "t", target="x86_64-cpu", calib=image_dir,
              preprocess=PREP, tasks={"model": {"kind": "tts", "rate": RATE}})
    assert not (tmp_path / "t").exists()
