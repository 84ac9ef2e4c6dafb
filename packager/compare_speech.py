"""compare on a speech model, as a TTS user measures it: whole sentences at their own lengths
(no padding where the model takes any), the real-time factor (compute / audio, warm: lower is
better, "x real time" beside it), the cold start (import + load + first sentence in a fresh
process), and each row's log-mel distance and length against the model as given.

Rows, for an .onnx speech model (one float waveform output, an integer (1, n) token input:
Kokoro-82M): "ORT as given" (onnxruntime's CPU provider on the file, as the model's own
package runs it), the bundle's shipped graph with --bundle, and, where a Python with
onnxruntime-openvino exists (ort_builds.py), both under its OpenVINO execution provider (timed
on the median sentence; the provider that really ran said). For a tts pipeline file (its
sentences, its PyTorch model or .onnx parts): the model as it runs (cascade/speech_reference.py:
its forward(), or its parts unpadded), the original parts through the bundle's glue, and the
bundle (--bundle), each stage's share of the time said.

    is_speech(source)                          "graph", "pipeline" or ""
    compare_speech(source, calib, bundle, ...) {"kind": "speech", "rows", ...}
    speech_markdown(result)                    the table
"""

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import PackagerError
from .timing import COLD_ORT
from .timing import session as timing_session

SECONDS = 30.0    # a row's timing stops after this much compute (Kokoro: ~1.5 s a sentence)
AS_GIVEN = "ORT as given"


def is_speech(source: str | Path) -> str:
    """"pipeline" for a tts pipeline file, "graph" for an .onnx whose one output is a waveform
    spoken from integer tokens (build/shape.py recognises it so) of any length, or quantized
    already, else ""."""
    text = str(source)
    if text.lower().endswith(".toml") and Path(text).is_file():
        from .cascade.spec import load_pipeline

        return "pipeline" if load_pipeline(Path(text)).kind == "tts" else ""
    if text.lower().endswith(".onnx") and Path(text).is_file():
        import onnx

        from .build.length import token_axis
        from .build.shape import speech_graph
        from .graph.quantized import quantized_ops

        model = onnx.load(text, load_external_data=False)
        # a speech graph that takes any length, or that is quantized already (no float
        # variants to build): the variants of a static float one are compare's usual rows
        if speech_graph(model) and (token_axis(model) or quantized_ops(model.graph)):
            return "graph"
    return ""


def read_sentences(folder: Path, names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """Each sentence's feed from *folder* (or one file): an .npz a sentence with the model's
    inputs by name (tokens (1, n) or (n,)), or an .npy of its token ids (*names*[0]); an .npz
    or .npy that stacks several sentences of one length is taken a row each."""
    files = sorted(p for p in Path(folder).rglob("*") if p.suffix in (".npz", ".npy")) \
        if Path(folder).is_dir() else [Path(folder)]
    out = []
    for path in files:
        if path.suffix == ".npy":   # (n,), (1, n), or sentences stacked: (N, n), (N, 1, n)
            ids = np.load(path)
            ids = ids.reshape(1, -1) if ids.ndim == 1 else ids.reshape(len(ids), -1)
            out += [{names[0]: row[None]} for row in ids]
            continue
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
        rows = len(arrays.get(names[0], np.zeros((1, 1))))
        for i in range(rows):
            out.append({k: v[i:i + 1] if len(v) == rows and v.ndim > 1 else v
                        for k, v in arrays.items()})
    if not out:
        raise PackagerError(f"--calib {folder}: no sentences (.npz or .npy files)",
                            "save each sentence's inputs with numpy.savez, or its token ids "
                            "with numpy.save")
    for feed in out:
        if names[0] in feed:
            feed[names[0]] = np.asarray(feed[names[0]]).reshape(1, -1)
    return out


def timed(speak: Callable[[dict], np.ndarray], feeds: Sequence[dict], rounds: int,
          seconds: float = SECONDS) -> tuple[list[float], list[np.ndarray]]:
    """(each sentence's median warm milliseconds, its samples): one untimed call a sentence,
    then up to *rounds* timed, stopping after *seconds* of compute."""
    spent, times, audio = 0.0, [], []
    for feed in feeds:
        audio.append(np.asarray(speak(feed), np.float64).reshape(-1))
        calls = []
        for _ in range(rounds):
            start = time.perf_counter()
            speak(feed)
            calls.append((time.perf_counter() - start) * 1000.0)
            spent += calls[-1] / 1000.0
            if spent > seconds:
                break
        times.append(float(np.median(calls)))
    return times, audio


def row(variant: str, times: list[float], audio: list[np.ndarray], want: list[np.ndarray],
        rate: int, provider: str = "CPUExecutionProvider") -> dict[str, Any]:
    """A row's figures: per-sentence p50/p90 ms, real-time factor over every sentence, and
    its speech against *want* (worst log-mel distance, sentences of the same length)."""
    from ._runtimes.runner.task_tts import mel_distance

    seconds = sum(len(a) for a in audio) / float(rate)
    compute = sum(times) / 1000.0
    mels = [mel_distance(w, a, rate) if len(w) and len(a) else 0.0
            for w, a in zip(want, audio, strict=True)]
    same = sum(abs(len(a) - len(w)) <= 0.02 * max(1, len(w))
               for w, a in zip(want, audio, strict=True))
    return {"variant": variant, "provider": provider, "sentences": len(times),
            "p50_ms": float(np.percentile(times, 50)), "p90_ms": float(np.percentile(times, 90)),
            "audio_s": seconds, "rtf": compute / seconds if seconds else None,
            "x_real_time": seconds / compute if compute else None,
            "worst_mel_db": max(mels or [0.0]), "same_length": int(same)}


def compare_speech(source: str | Path, kind: str, *, calib: Path | None, bundle: Path | None,
                   threads: int, rounds: int, cold: bool, log: Callable[[str], None]
                   ) -> dict[str, Any]:
    """The speech comparison of *source* (module doc); *kind* is_speech()'s."""
    from .timing import machine

    rows, notes = (_pipeline_rows if kind == "pipeline" else _graph_rows)(
        Path(source), calib, bundle, threads, rounds, cold, log)
    return {"kind": "speech", "source": str(source), "machine": machine(), "threads": threads,
            "rounds": rounds, "rows": rows, "notes": notes,
            "reference": rows[0]["variant"] if rows else None}


def _graph_rows(source: Path, calib: Path | None, bundle: Path | None, threads: int,
                rounds: int, cold: bool, log: Callable[[str], None]
                ) -> tuple[list[dict[str, Any]], list[str]]:
    """The .onnx speech model's rows (module doc)."""
    if calib is None:
        raise PackagerError(f"{source}: a speech model is compared on sentences",
                            "pass --calib DIR: an .npz a sentence with the model's inputs "
                            "(its token ids at their own length)")
    original = timing_session(source, threads)
    names = [i.name for i in original.get_inputs()]
    feeds = read_sentences(calib, names)
    rate, graphs = 24000, [(AS_GIVEN, source)]
    if bundle is not None:
        from .compare_bundle import shipped_graph

        shipped = shipped_graph(bundle)
        rate = shipped["audio_rate"] or rate
        graphs.append((shipped["label"], shipped["path"]))
    rows, want = [], None
    for variant, path in graphs:
        log(f"compare: {variant}: {len(feeds)} sentence(s), whole")
        session = original if path == source else timing_session(path, threads)
        try:
            times, audio = timed(lambda f, s=session: s.run(None, f)[0], feeds, rounds)
        except Exception as exc:   # onnxruntime's refusal: a sentence it cannot speak
            from .build.length import cause

            if want is None:
                raise PackagerError(f"--calib {calib}: onnxruntime cannot speak its sentences "
                                    f"with {source} ({cause(exc)})",
                                    "save each sentence with the model's inputs by name") \
                    from None
            rows.append({"variant": variant, "error": f"a sentence at its own length: "
                         f"{cause(exc)} (the bundle takes the length it was built at)"})
            continue
        want = want or audio
        rows.append(row(variant, times, audio, want, rate))
        rows[-1]["_path"] = str(path)
    notes = _openvino_rows(graphs, feeds, want or [], rate, threads, rounds, rows, log)
    if cold:
        _cold(rows, feeds[0], threads)
    for r in rows:
        r.pop("_path", None)
    return rows, notes


def _openvino_rows(graphs: list[tuple[str, Path]], feeds: Sequence[dict], want: list,
                   rate: int, threads: int, rounds: int, rows: list[dict[str, Any]],
                   log: Callable[[str], None]) -> list[str]:
    """Each graph under onnxruntime-openvino's OpenVINO provider, in its own Python (timed on
    the median-length sentence, its speech on every sentence): rows added, notes returned."""
    from . import ort_builds

    python = ort_builds.openvino_python()
    if python is None:
        return [f"OpenVINO rows skipped: {ort_builds.why_no_openvino()}."]
    middle = sorted(range(len(feeds)), key=lambda i: feeds[i][next(iter(feeds[i]))].size)
    pick = middle[len(middle) // 2]
    plan = [(f"{variant} under OpenVINO", path, ort_builds.openvino_chain())
            for variant, path in graphs]
    log(f"compare: {len(plan)} graph(s) under OpenVINO ({python})")
    try:
        medians, providers, _ = ort_builds.time_plan(python, plan, feeds[pick], threads,
                                                     rounds, 1, every=True)
        outputs, _ = ort_builds.outputs_plan(python, plan, list(feeds), threads)
    except ort_builds.OrtBuildError as exc:
        return [f"OpenVINO rows failed: {exc.message}."]
    for key, _, _ in plan:
        out = outputs.get(key) or {}
        audio = [np.asarray(a, np.float64).reshape(-1) for a in next(iter(out.values()), [])]
        if len(audio) != len(feeds):
            ran = providers.get(key) or "none"
            rows.append({"variant": key, "error": "the OpenVINO provider did not start for "
                         f"this graph (the session ran {ran.replace('ExecutionProvider', '')})"
                         if ran != ort_builds.OPENVINO else "it gave no speech"})
            continue
        p50 = medians[key]["p50"]
        scale = p50 / max(1, len(audio[pick]))   # ms per sample on the sentence timed
        found = row(key, [scale * len(a) for a in audio], audio, want, rate,
                    providers.get(key, "?"))
        found.update(p50_ms=p50, p90_ms=medians[key]["p90"], timed_on=f"sentence {pick + 1}")
        rows.append(found)
    return ["OpenVINO rows: timed on the median-length sentence (its real-time factor scaled "
            "to every sentence by samples), their speech on every sentence; provider: the "
            "one that really ran."]


def _cold(rows: list[dict[str, Any]], feed: dict, threads: int) -> None:
    """Each CPU row's import + load + first sentence in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="edgepack-compare-") as tmp:
        np.savez(Path(tmp) / "feed.npz", **feed)
        for r in rows:
            if not r.get("_path"):
                continue
            proc = subprocess.run([sys.executable, "-c", COLD_ORT, r["_path"],
                                   str(Path(tmp) / "feed.npz"), str(threads)],
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode == 0 and proc.stdout.strip():
                r["cold_start_ms"] = json.loads(proc.stdout.strip().splitlines()[-1])["total_ms"]


def _pipeline_rows(source: Path, calib: Path | None, bundle: Path | None, threads: int,
                   rounds: int, cold: bool, log: Callable[[str], None]
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """A tts pipeline's rows: the model as it runs, its parts through the glue, the bundle."""
    from ._runtimes.runner.cascade import Cascade, pipeline_sessions, session_runner
    from ._runtimes.runner.cascade_tts import Speech
    from ._runtimes.runner.manifest import load_manifest
    from .cascade.spec import load_pipeline
    from .cascade.speech import (
        load_root,
        original_parts,
        original_speech,
        read_sentence,
        sentence_files,
        stage_of,
    )
    from .cascade.speech_reference import reference_speech

    spec = load_pipeline(source)
    folder = calib or stage_of(spec, "encode").calib
    sentences = [read_sentence(p) for p in sentence_files(folder)] if folder else []
    if not sentences:
        raise PackagerError(f"--calib {folder}: no sentences (.npy files of token ids)",
                            "save each sentence's token ids with numpy.save")
    root = load_root(spec)
    runs = original_parts(spec, root)
    padded = original_speech(spec, root, runs=runs)
    reference = reference_speech(spec, root, runs, padded)
    rate = padded.voc_conf["rate"]
    speakers: list[tuple[str, Callable[[Any], np.ndarray]]] = [
        (f"the model as it runs ({reference.what})", reference.speak),
        ("the original parts through the glue", lambda t: padded.speak(t, {}))]
    stages: dict[str, float] = {}
    if bundle is not None:
        manifest = load_manifest(str(bundle))
        if (manifest.get("pipeline") or {}).get("kind") != "tts":
            raise PackagerError(f"--bundle {bundle}: not a tts pipeline's bundle",
                                "pass the bundle built from this pipeline file")
        shipped = Speech(Cascade(manifest, session_runner(pipeline_sessions(
            str(bundle), manifest, None))))
        speakers.append((f"shipped ({manifest['name']})",
                         lambda t: shipped.speak(t, stages)))
    rows, want = [], None
    for k, (variant, speak) in enumerate(speakers):
        log(f"compare: {variant}: {len(sentences)} sentence(s)")
        stages.clear()
        times, audio = timed(speak, sentences, rounds)
        want = want or audio
        rows.append(row(variant, times, audio, want, rate, "PyTorch eager" if root is not None
                        and k < 2 else "CPUExecutionProvider"))
        if stages:
            total = sum(stages.values()) or 1.0
            rows[-1]["stages"] = {k: round(v / total, 3) for k, v in stages.items()}
    return rows, ["cold start: not measured for a pipeline (its parts load in one process: "
                  "`run.py infer` says the first sentence's time)"] if cold else []


def speech_markdown(result: dict[str, Any]) -> str:
    """The speech comparison as a Markdown table."""
    from .timing import machine_line

    lines = [f"Machine: {machine_line(result['machine'])}; {result['threads'] or 'default'} "
             f"intra-op threads; up to {result['rounds']} timed calls a sentence after one "
             "untimed, warm.", "",
             "| variant | provider | sentences | p50 ms | p90 ms | real-time factor | "
             "x real time | cold start ms | log-mel dB (worst) | same length |",
             "|" + " --- |" * 10]

    def num(value: Any, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, int | float) else "-"

    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | - | failed: {r['error']} |" + " |" * 7)
            continue
        lines.append(f"| {r['variant']} | {r['provider'].replace('ExecutionProvider', '')} | "
                     f"{r['sentences']} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} | "
                     f"{num(r['rtf'], '.3f')} | {num(r['x_real_time'], '.1f')} | "
                     f"{num(r.get('cold_start_ms'), '.0f')} | {r['worst_mel_db']:.2f} | "
                     f"{r['same_length']}/{r['sentences']} |")
    lines += ["", f"Real-time factor: compute over audio, every sentence (lower is better; "
              f"x real time: its inverse). p50/p90: per sentence. Log-mel distance and length "
              f"against {result['reference']}, sentence by sentence (the tts budget: 2 dB, "
              "2 %). Cold start: import + load + the first sentence, in a fresh process."]
    stages = [r for r in result["rows"] if r.get("stages")]
    for r in stages:
        lines.append(f"\n{r['variant']}: " + ", ".join(
            f"{k} {100 * v:.0f} %" for k, v in r["stages"].items()) + " of the time.")
    lines += [f"\n{note}" for note in result.get("notes", ())]
    return "\n".join(lines) + "\n"
