"""Issue 37, item 3: a TTS model from PyTorch in parts. tests/tts_torch.py's TTSParts (an
encoder with its duration predictor, a vocoder; weights as safetensors) is built with
`build --pipeline` as two parts, each exported separately, the length regulation between them
shipped in the runner (runner/cascade_tts.py); its speech matches the PyTorch model's own
forward() end to end, `run.py check` judges the golden sentences as speech, `infer` writes a
WAV file a sentence with each stage's time, and `serve` answers audio/wav."""

import io
import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from packager.cli import main

RATE = 16000
TOKENS, CHUNK = 12, 16


def write_pipeline(root: Path, extra: str = "", factory: str = "tts_parts") -> Path:
    import tts_torch
    from safetensors.torch import save_file

    save_file(getattr(tts_torch, factory)().state_dict(), root / "tts.safetensors")
    sentences = root / "sentences"
    sentences.mkdir()
    rng = np.random.RandomState(3)
    for i in range(15):   # 15 sentences of 3 to 20 tokens: every 5th judges end to end
        np.save(sentences / f"s{i:02d}.npy", rng.randint(1, 32, size=rng.randint(3, 21)))
    path = root / "tts.toml"
    path.write_text(f"""kind = "tts"
model = "{Path(__file__).parent / 'tts_torch.py'}:{factory}"
weights = "tts.safetensors"

[[stage]]
part = "enc"
step = "encode"
module = "encoder"
input = "tokens:1x{TOKENS}:int64"
calib = "sentences"
{extra}
[[stage]]
part = "voc"
step = "vocode"
module = "vocoder"
input = "frames:1x{CHUNK}x16"
rate = {RATE}
""")
    return path


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    root = tmp_path_factory.mktemp("tts_pipeline")
    path = write_pipeline(root)
    run = CliRunner().invoke(main, ["build", "--pipeline", str(path), "-o", str(root / "out")],
                             catch_exceptions=False)
    return root, run


def run_py(bundle: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(bundle / "run.py"), *argv],
                          capture_output=True, text=True, timeout=300)


def test_the_parts_build_as_one_bundle_judged_end_to_end_as_speech(speech):
    root, run = speech
    assert run.exit_code == 0, run.output
    manifest = json.loads((root / "out" / "manifest.json").read_text())
    assert [p["name"] for p in manifest["parts"]] == ["enc", "voc"]
    for part in manifest["parts"]:   # each exported on its own, from the safetensors weights
        assert part["source"]["export"]["weights"]["file"] == "tts.safetensors"
        assert part["source"]["export"]["validation"]["cosine_min"] > 0.9999
    accuracy = manifest["pipeline"]["accuracy"]
    assert accuracy["passed"] and accuracy["sentences"] == 3 and accuracy["same"] == 3
    assert "runner/cascade_tts.py" in manifest["files"]
    # judged against the model as it runs (its forward()), the glue's padding measured first
    assert "end to end: against the PyTorch model's forward(): 3 of 3 held-out sentence(s) " \
        "sound alike" in run.output
    assert "padding to 12 tokens (longer sentences in pieces of 12) keeps the speech within " \
        "the budget" in run.output
    assert accuracy["reference"] == "the PyTorch model's forward()"
    r = run_py(root / "out", "check")
    assert r.returncode == 0 and "golden sentence(s) sound alike" in r.stdout, \
        r.stdout[-2000:] + r.stderr[-2000:]


def test_the_bundle_speaks_as_the_pytorch_model_does(speech, tmp_path):
    """The whole PyTorch model (its forward(): encoder, repeat_interleave, vocoder) against the
    bundle's infer on sentences shorter and longer than the encoder's 12 tokens: the same
    length, within the speech budget; a WAV file a sentence; each stage timed."""
    import torch
    from safetensors.torch import load_file
    from tts_torch import tts_parts

    from packager._runtimes.runner.task_tts import mel_distance

    root, _ = speech
    model = tts_parts()
    model.load_state_dict(load_file(root / "tts.safetensors"))
    files = []
    for n in (5, 12, 30):   # 30 tokens: three pieces of the encoder's 12
        path = tmp_path / f"say{n}.npy"
        np.save(path, np.random.RandomState(n).randint(1, 32, size=n))
        files.append(path)
    r = run_py(root / "out", "infer", *map(str, files), "--json", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    audio = np.load(tmp_path / "o.npz")
    for path, result in zip(files, report["results"], strict=True):
        with torch.no_grad():
            want = model(torch.from_numpy(np.load(path))[None]).numpy().reshape(-1)
        got = audio[f"{result['key']}/audio"]
        assert len(got) == len(want) == result["samples"] > 0
        assert mel_distance(want, got, RATE) < 0.5 and np.abs(got - want).max() < 0.05
        assert set(result["latency_ms"]) == {"enc", "glue", "voc"}, result
        # RTF as the field reads it: compute over audio (lower is better), x real time beside
        assert 0 < result["real_time_factor"] < 1 and result["x_real_time"] > 1
        assert abs(result["real_time_factor"] * result["x_real_time"] - 1) < 0.05
        with wave.open(str(tmp_path / f"o.{result['key']}.wav")) as f:
            assert f.getframerate() == RATE and f.getnframes() == len(want)


def test_serve_answers_audio_wav(speech, tmp_path):
    import urllib.request

    from conftest import start_server

    root, _ = speech
    body = io.BytesIO()
    np.save(body, np.arange(1, 9))
    proc, url = start_server(root / "out", tmp_path / "serve.log")
    try:
        with urllib.request.urlopen(urllib.request.Request(
                url + "/infer", data=body.getvalue(),
                headers={"Content-Type": "application/octet-stream"}), timeout=60) as answer:
            assert answer.headers["Content-Type"] == "audio/wav"
            stages = json.loads(answer.headers["X-Edgepack-Stages-Ms"])
            data = answer.read()
        with urllib.request.urlopen(urllib.request.Request(
                url + "/infer", data=body.getvalue(),
                headers={"Accept": "application/json"}), timeout=60) as answer:
            as_json = json.loads(answer.read())
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert set(stages) == {"enc", "glue", "voc"}
    with wave.open(io.BytesIO(data)) as f:
        assert f.getframerate() == RATE and f.getnframes() == as_json["samples"] > 0


def test_a_tts_pipeline_file_names_what_is_wrong(tmp_path):
    """A stage with both a module and a model, an unknown key, and a vocode stage with calib
    are each one line naming the key (exit 2), nothing written."""
    path = write_pipeline(tmp_path, extra='max_repeat = "x"\n')
    run = CliRunner().invoke(main, ["build", "--pipeline", str(path), "-o",
                                    str(tmp_path / "out")])
    assert run.exit_code == 2 and "stage[0].max_repeat must be a whole number" in run.output, \
        run.output
    assert not (tmp_path / "out").exists() and "Traceback" not in run.output


def test_a_damaged_speech_bundle_or_input_is_one_line(speech, tmp_path):
    """Golden speech named outside golden/pipeline/, a golden sentence that is not one, and
    an infer input of floats: each one line, exit 2 or a failed check, no traceback."""
    import shutil

    from test_runner import resign

    root, _ = speech
    floats = tmp_path / "floats.npy"
    np.save(floats, np.zeros((1, 4), np.float32))
    r = run_py(root / "out", "infer", str(floats))
    assert r.returncode == 2 and "not one sentence's token ids" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    bundle = tmp_path / "b"
    shutil.copytree(root / "out", bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["pipeline"]["accuracy"]["golden"]["audio"] = "golden/x/../../audio.npz"
    resign(bundle, manifest)
    r = run_py(bundle, "check")
    assert r.returncode == 2 and "pipeline.accuracy.golden.audio must name a .npz file in " \
        "golden/pipeline/" in r.stderr, r.stderr[-2000:]
    manifest["pipeline"]["accuracy"]["golden"]["audio"] = "golden/pipeline/audio.npz"
    np.savez(bundle / "golden" / "pipeline" / "tokens.npz", sentence0=np.zeros(3, np.float32))
    resign(bundle, manifest)
    r = run_py(bundle, "check")
    assert r.returncode == 2 and "holds no sentence sentence0" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_a_tts_pipeline_of_onnx_parts_builds_and_speaks(tmp_path):
    """The same parts exported first (edgepack export --submodule), each stage its own .onnx
    with its outputs named: the build takes them as they are; the encoder's durations output
    is named in the pipeline file."""
    root = tmp_path
    write_pipeline(root)
    source = f"{Path(__file__).parent / 'tts_torch.py'}:tts_parts"
    for module, spec, names in (("encoder", f"tokens:1x{TOKENS}:int64", ["hidden", "dur"]),
                                ("vocoder", f"frames:1x{CHUNK}x16", ["audio"])):
        run = CliRunner().invoke(main, ["export", source, "--weights", str(root / "tts.safetensors"),
                                        "--submodule", module, "--input", spec,
                                        *sum((["--output-name", n] for n in names), []),
                                        "-o", str(root / f"{module}.onnx")],
                                 catch_exceptions=False)
        assert run.exit_code == 0, run.output
    (root / "onnx.toml").write_text(f"""kind = "tts"

[[stage]]
part = "enc"
step = "encode"
model = "encoder.onnx"
input = "tokens:1x{TOKENS}:int64"
calib = "sentences"
durations = "dur"

[[stage]]
part = "voc"
step = "vocode"
model = "vocoder.onnx"
input = "frames:1x{CHUNK}x16"
rate = {RATE}
""")
    run = CliRunner().invoke(main, ["--debug", "build", "--pipeline", str(root / "onnx.toml"), "-o",
                                    str(root / "out")], catch_exceptions=False)
    assert run.exit_code == 0 and "3 of 3 held-out sentence(s) sound alike" in run.output, \
        run.output
    r = run_py(root / "out", "check")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_an_attention_encoder_keeps_its_length_open_and_speaks_as_forward(tmp_path):
    """Issue 45 item 5: an encoder whose tokens all see each other without a mask (the docs'
    recipe with attention) changes its speech when padded. The build measures that against
    the model's own forward() before it builds, keeps the encoder's token axis open (exported
    so), and the bundle then speaks as forward() at 5 to 149 tokens (the padded glue
    spoke 9 tokens 14 % too long); the end-to-end judge compares with forward() too."""
    import torch
    from safetensors.torch import load_file
    from tts_torch import attention_parts

    from packager._runtimes.runner.task_tts import mel_distance

    path = write_pipeline(tmp_path, factory="attention_parts")
    run = CliRunner().invoke(main, ["build", "--pipeline", str(path), "-o",
                                    str(tmp_path / "out")], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    assert "moves the speech" in run.output and "over the budget; the encoder has no mask" \
        in run.output and "the encoder keeps tokens's length open" in run.output, run.output
    assert "end to end: against the PyTorch model's forward(): 3 of 3" in run.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    enc = next(p for p in manifest["parts"] if p["name"] == "enc")
    assert enc["length"]["dynamic"] and enc["length"]["input"] == "tokens", enc.get("length")
    assert enc["source"]["export"]["dynamic"] == {"tokens": {"1": "length"}}
    model = attention_parts()
    model.load_state_dict(load_file(tmp_path / "tts.safetensors"))
    files = []
    for n in (5, 9, 10, 12, 30, 54, 149):   # the 10, 54, 149 among them
        files.append(tmp_path / f"say{n}.npy")
        np.save(files[-1], np.random.RandomState(n).randint(1, 32, size=n))
    r = run_py(tmp_path / "out", "infer", *map(str, files), "--json", "--out",
               str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr[-2000:]
    audio = np.load(tmp_path / "o.npz")
    for path, result in zip(files, json.loads(r.stdout)["results"], strict=True):
        with torch.no_grad():
            want = model(torch.from_numpy(np.load(path))[None]).numpy().reshape(-1)
        got = audio[f"{result['key']}/audio"]
        assert abs(len(got) / len(want) - 1) <= 0.02, (path.name, len(got), len(want))
        assert mel_distance(want, got, RATE) <= 2.0, path.name
    r = run_py(tmp_path / "out", "check")
    assert r.returncode == 0 and "golden sentence(s) sound alike" in r.stdout, \
        r.stdout[-2000:] + r.stderr[-2000:]


def test_blame_names_the_part_whose_graph_breaks_the_speech(speech):
    """The end-to-end judge's attribution: with the vocoder's samples spoiled, putting the
    original vocoder in its place restores the speech and the original encoder does not: the
    vocoder is blamed, and the encoder where its durations are spoiled instead."""
    from packager._runtimes.runner.cascade import pipeline_sessions, session_runner
    from packager._runtimes.runner.manifest import load_manifest
    from packager.cascade.spec import load_pipeline
    from packager.cascade.speech import (
        load_root,
        original_parts,
        original_speech,
        read_sentence,
        sentence_files,
    )
    from packager.cascade.speech_reference import blame, reference_speech

    root, _ = speech
    spec = load_pipeline(root / "tts.toml")
    model = load_root(spec)
    runs = original_parts(spec, model)
    reference = reference_speech(spec, model, runs, original_speech(spec, model, runs=runs))
    manifest = load_manifest(str(root / "out"))
    run_part = session_runner(pipeline_sessions(str(root / "out"), manifest, None))
    sentences = [read_sentence(p) for p in sentence_files(root / "sentences")[:4]]
    wants = [reference.speak(t) for t in sentences]

    def spoiled(part, change):
        def run(entry, feed):
            out = run_part(entry, feed)
            return [change(o) for o in out] if entry["name"] == part else out
        return run
    noisy = spoiled("voc", lambda o: o + 0.3 * np.sign(np.sin(np.arange(o.size))).reshape(
        o.shape).astype(o.dtype))
    assert blame(wants, manifest, noisy, runs, sentences, ["enc", "voc"]) == ["voc"]
    longer = spoiled("enc", lambda o: o + 1 if o.ndim == 2 else o)
    assert blame(wants, manifest, longer, runs, sentences, ["enc", "voc"]) == ["enc"]
    assert blame(wants, manifest, longer, runs, sentences, ["enc"]) == ["enc"]


def test_a_miss_rebuilds_the_blamed_part_alone_and_says_why(tmp_path, monkeypatch):
    """Issue 45 item 5: where the end-to-end judge blames one part (the vocoder here, its
    first judgement made to miss), only that part goes back to FP32, its precision saying
    why (not "asked for"); the encoder keeps its INT8."""
    import packager.cascade.build as pipeline_build
    from packager.cascade.speech import speech_end_to_end

    calls = []

    def first_misses(spec, bundle, held):
        figure = speech_end_to_end(spec, bundle, held)
        calls.append([s.precision for s in spec.stages])
        if len(calls) == 1:
            figure = dict(figure, passed=False, worst_mel_db=2.5, below=["enc", "voc"],
                          blame=["voc"], text=figure["text"] + ": FAILED")
        return figure
    monkeypatch.setattr(pipeline_build, "speech_end_to_end", first_misses)
    path = write_pipeline(tmp_path, extra='precision = "int8"\n')
    text = path.read_text().replace('rate = ', 'precision = "int8"\nrate = ')
    path.write_text(text)
    run = CliRunner().invoke(main, ["build", "--pipeline", str(path), "-o",
                                    str(tmp_path / "out")], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    assert calls == [["int8", "int8"], ["int8", "fp32"]]
    assert "voc breaks it (the original in its place keeps it): building voc again at FP32, " \
        "enc kept" in run.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    precision = {p["name"]: p["precision"] for p in manifest["parts"]}
    assert precision["enc"]["precision"] == "int8" and precision["voc"]["precision"] == "fp32"
    reason = precision["voc"]["decision"]["reason"]
    assert "asked for" not in reason and "end to end, the held-out speech missed its budget " \
        "with voc below FP32 (worst 2.50 dB)" in reason, reason


def test_compare_on_a_pipeline_times_whole_sentences_against_the_model(speech):
    """Issue 45 item 6: compare takes the pipeline file and its own sentence folder (any
    length): the model as it runs, its parts through the glue and the bundle, each in
    real-time factors with a log-mel column against the first; the bundle's stages said. A
    pipeline's bundle beside the PyTorch model is refused in one line (it was exit 3)."""
    from packager.compare import compare, markdown

    root, _ = speech
    result = compare(root / "tts.toml", bundle=root / "out", rounds=2)
    names = [r["variant"] for r in result["rows"]]
    assert names[0] == "the model as it runs (the PyTorch model's forward())", names
    assert names[1] == "the original parts through the glue" and names[2].startswith("shipped")
    for r in result["rows"]:
        assert r["sentences"] == 15 and r["same_length"] == 15 and r["worst_mel_db"] < 0.5, r
        assert 0 < r["rtf"] < 1, r
    assert set(result["rows"][2]["stages"]) == {"enc", "glue", "voc"}
    assert "| real-time factor |" in markdown(result)
    run = CliRunner().invoke(main, ["compare", str(Path(__file__).parent / "tts_torch.py") +
                                    ":tts_parts", "--input", f"tokens:1x{TOKENS}:int64",
                                    "--bundle", str(root / "out"), "--no-cold"])
    assert run.exit_code == 2 and "a pipeline's bundle" in run.output, run.output


def test_serve_streams_speech_as_the_vocoder_makes_it(speech, tmp_path):
    """Issue 45 item 5: POST /infer?stream=1 answers a streamed audio/wav (the header with
    lengths unknown, then 16-bit PCM piece by piece, the connection closed at its end) whose
    samples are the whole answer's; the first audio's latency is in infer's JSON; a body that
    is no sentence is still a JSON error."""
    import struct
    import urllib.error
    import urllib.request

    from conftest import start_server

    root, _ = speech
    body = io.BytesIO()
    np.save(body, np.arange(90) % 31 + 1)   # 90 tokens: several vocoder windows
    proc, url = start_server(root / "out", tmp_path / "serve.log")
    try:
        with urllib.request.urlopen(urllib.request.Request(
                url + "/infer?stream=1", data=body.getvalue()), timeout=60) as answer:
            assert answer.headers["Content-Type"] == "audio/wav"
            assert answer.headers["X-Edgepack-Stream"] == "1"
            assert answer.headers["Content-Length"] is None
            streamed = answer.read()
        with urllib.request.urlopen(urllib.request.Request(
                url + "/infer", data=body.getvalue()), timeout=60) as answer:
            whole = answer.read()
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(urllib.request.Request(
                url + "/infer?stream=1", data=b"not a sentence"), timeout=60)
        assert bad.value.code == 400 and "error" in json.loads(bad.value.read())
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert streamed[:4] == b"RIFF" and struct.unpack("<I", streamed[40:44])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", streamed[24:28])[0] == RATE
    with wave.open(io.BytesIO(whole)) as f:
        pcm = f.readframes(f.getnframes())
    assert streamed[44:] == pcm and len(pcm) > 2 * CHUNK * 256   # over one window's bytes
    np.save(tmp_path / "x.npy", np.arange(90) % 31 + 1)
    r = run_py(root / "out", "infer", str(tmp_path / "x.npy"), "--json")
    result = json.loads(r.stdout)["results"][0]
    assert 0 < result["first_audio_ms"] <= sum(result["latency_ms"].values()) + 1.0, result


def test_bench_times_whole_sentences_of_a_pipeline(speech, tmp_path):
    """Issue 45 item 6: `run.py bench FILE...` on a tts pipeline speaks each sentence whole
    (it asked for --part before): per-sentence p50/p90, the first audio's latency and the
    real-time factor (compute over audio), and the same over all; each part's own bench
    beside."""
    root, _ = speech
    files = []
    for n in (6, 40):
        files.append(tmp_path / f"b{n}.npy")
        np.save(files[-1], np.arange(n) % 31 + 1)
    r = run_py(root / "out", "bench", *map(str, files), "--runs", "5", "--warmup", "1",
               "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    speech_report = json.loads(r.stdout)["speech"]
    assert [s["tokens"] for s in speech_report["sentences"]] == [6, 40]
    for s in speech_report["sentences"]:
        assert s["runs"] == 5 and 0 < s["first_audio_ms"] <= s["latency_ms"]["p90"] + 1.0
        assert abs(s["real_time_factor"] - s["latency_ms"]["p50"] / 1000 / s["seconds"]) < 1e-9
    assert 0 < speech_report["real_time_factor"] < 1
    human = run_py(root / "out", "bench", *map(str, files), "--runs", "3", "--warmup", "1")
    assert human.returncode == 0 and "first audio p50" in human.stdout and \
        "real-time factor" in human.stdout, human.stdout + human.stderr


def test_bench_without_files_speaks_the_golden_sentences(speech):
    """`run.py bench` on a tts pipeline (as verify and deploy run it) also speaks its golden
    sentences whole: the real-time factor and the first audio reach every device's report."""
    root, _ = speech
    r = run_py(root / "out", "bench", "--runs", "3", "--warmup", "1", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert [s["file"] for s in report["speech"]["sentences"]] == \
        ["golden sentence0", "golden sentence1", "golden sentence2"]
    assert set(report["parts"]) == {"enc", "voc"}   # each part's own bench beside


def test_the_page_has_a_speech_section_with_each_device_s_figures(speech):
    """Issue 45 item 6: the page of a tts pipeline says how it was judged end to end (against
    the model as it runs) and, once verify has run, each golden sentence's p50/p90, real-time
    factor and first audio; the encoder's section no longer asks for class folders."""
    from page_check import check_figures, parse

    from packager.device.verify import verify

    root, _ = speech
    report = verify(root / "out", runs=3, warmup=1)
    data, _ = check_figures(root / "out")
    assert data["speech"]["reference"] == "the PyTorch model's forward()"
    assert data["speech"]["passed"] and data["speech"]["sentences"] == 3
    [device] = data["devices"]
    measured = report["bench"]["speech"]
    assert device["speech"]["real_time_factor"] == measured["real_time_factor"]
    assert [r["latency_ms"]["p50"] for r in device["speech"]["sentences"]] == \
        [r["latency_ms"]["p50"] for r in measured["sentences"]] and len(measured["sentences"]) == 3
    page = root / "out" / "reports" / "index.html"
    text = " ".join(parse(page).text)
    assert "Speech" in text and "real-time factor" in text and "first audio ms" in text
    assert "against the PyTorch model's forward()" in text
    assert "class folders" not in text


@pytest.mark.parametrize("extra, where, problem", [
    ("pad = 99999\n", "stage[0].pad = 99999", "the original enc refuses it"),
    ("", "stage[1].context", "leaves nothing of a 16-frame chunk"),
])
def test_a_pad_past_the_vocabulary_or_a_context_past_the_chunk_is_one_line(
        tmp_path, extra, where, problem):
    """hostile-cases-turn5 #7, #8: a pad id past the encoder's vocabulary and a vocode context
    of half the chunk or more were exit 3 (an onnxruntime refusal, range() of step 0); each is
    now exit 2 naming the key."""
    path = write_pipeline(tmp_path, extra=extra)
    if not extra:
        path.write_text(path.read_text().replace("rate = ", "context = 8\nrate = "))
    run = CliRunner().invoke(main, ["build", "--pipeline", str(path), "-o",
                                    str(tmp_path / "out")])
    assert run.exit_code == 2 and where in run.output and problem in run.output, run.output
    assert not (tmp_path / "out").exists()
