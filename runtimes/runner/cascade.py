"""A pipeline bundle's parts run as one cascade on a photo (`infer`, `serve`): OCR's detector,
direction classifier and recogniser, with crops between them (runner/cascade_ocr.py), or
MTCNN's P-Net, R-Net and O-Net (runner/cascade_face.py: {"faces": [...]}).

    Cascade(manifest, run_part)       run_part(part, feed) -> the part's outputs (a list, in
                                      the order of the manifest's part["outputs"])
    Cascade.read(image)               {"lines": [{"box", "polygon", "text", "confidence",
                                                  "rotated", "box_score"}],
                                       "image_size": [w, h]}
    load_photo(data, spec, path)      (H, W, C) uint8 pixels of an image file's bytes
                                      (OpenCV) or an .npy array's (no OpenCV needed)
    cmd_infer_pipeline(bundle, manifest, args, keys)
    ServedCascade(manifest, sessions)   serve's entry: .serve(body, max_pixels)

The host runs the same class with sessions on the original models to judge the bundle.
"""

import collections
import io
import time

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .cascade_face import find_faces
from .cascade_face import summary as face_summary
from .cascade_ocr import crop_quad, fit_crop, fit_image, reading_order, rotate180, split_line
from .cascade_spec import stage_settings
from .cascade_tts import Speech, read_tokens, write_speech
from .cascade_tts import answer as speech_answer
from .errors import BundleError, one_line
from .images import MAX_PIXELS, decode_image
from .manifest import read_npz, require_intact
from .sessions import open_session
from .task_ctc import ctc_decode, ctc_text
from .task_detect import bounding_boxes, input_to_image, text_quads
from .tasks import as_probabilities, pick, settings, task_kind


def load_photo(data, spec, path, max_pixels=MAX_PIXELS):
    """(H, W, C) uint8 pixels of a photo: an image file's bytes (*data*, a uint8 array,
    decoded in *spec*'s colour order) or an .npy array of them (H, W, C uint8, that order)."""
    if bytes(data[:6]) == b"\x93NUMPY":
        try:
            image = np.load(io.BytesIO(data.tobytes()), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise BundleError("%s: cannot read it (%s); save it again with numpy.save"
                              % (path, one_line(exc))) from None
        if image.ndim == 2:
            image = image[:, :, None]
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (1, 3) or \
                min(image.shape[:2]) < 1:
            raise BundleError("%s: an array of %s %s, not a photo's (H, W, 3) uint8 pixels; "
                              "save the image's pixels, or pass the image file"
                              % (path, image.dtype, list(image.shape)))
        if image.shape[0] * image.shape[1] > max_pixels:
            raise BundleError("%s: %dx%d pixels, over the %.0f MP limit; resize it, or raise "
                              "--max-megapixels" % (path, image.shape[1], image.shape[0],
                                                    max_pixels / 1e6))
        return image if image.shape[2] == 3 else np.repeat(image, 3, axis=2)
    return decode_image(data, spec, path, max_pixels)


class PipelineMisfit(BundleError):
    """The bundle's pipeline does not fit its parts (exit 2; in `serve`, 500: the bundle's
    fault, not the request's)."""

    status = 500


class Cascade(object):
    """The pipeline of *manifest*, each stage's part run by *run_part(part, feed)* (its outputs
    in the session's order)."""

    def __init__(self, manifest, run_part):
        parts = dict((p["name"], p) for p in manifest["parts"])
        self.kind = manifest["pipeline"]["kind"]
        self.stages = [(parts[s["part"]], stage_settings(s))
                       for s in manifest["pipeline"]["stages"]]
        self.run_part = run_part

    def parts(self):
        return [part for part, _ in self.stages]

    def stage(self, step):
        for part, conf in self.stages:
            if conf["step"] == step:
                return part, conf
        return None, None

    def run(self, part, tensor, timing):
        """{output name: array} of *part* on its one input *tensor*; its milliseconds added to
        *timing*."""
        start = time.perf_counter()
        try:
            outputs = self.run_part(part, {part["inputs"][0]["name"]: tensor})
        except BundleError:
            raise
        except Exception as exc:
            raise BundleError("part %s: onnxruntime refused its input (%s)"
                              % (part["name"], one_line(exc))) from None
        timing[part["name"]] = timing.get(part["name"], 0.0) + \
            (time.perf_counter() - start) * 1000.0
        return collections.OrderedDict(zip([o["name"] for o in part["outputs"]], outputs))

    def detect(self, image, timing):
        """Text quads in the photo's pixels (N, 4, 2: corners x, y), reading order, and their
        scores."""
        part, conf = self.stage("detect")
        spec = part["preprocess"]
        prob = list(self.run(part, fit_image(image, spec), timing).values())[0]
        quads, scores = text_quads(prob, conf)
        if not len(quads):
            return quads, scores
        # the map's pixels are the input's (DB's map has the input's size), or a stride of it
        width, height = spec["size"]
        sx, sy = float(width) / prob.shape[-1], float(height) / prob.shape[-2]
        convert = input_to_image(spec, (image.shape[1], image.shape[0]))
        xs, ys = convert(quads[:, :, 0] * sx, quads[:, :, 1] * sy)
        quads = np.stack([xs, ys], axis=2)
        order = reading_order(bounding_boxes(quads))
        return quads[order], scores[order]

    def upright(self, piece, timing):
        """(the crop turned 180 degrees when the classifier says so, whether it was, score)."""
        part, conf = self.stage("direction")
        if part is None:
            return piece, False, None
        task = settings(part.get("task") if task_kind(part.get("task")) == "classify"
                        else {"kind": "classify"})
        outputs = self.run(part, fit_crop(piece, part["preprocess"]), timing)
        probs = as_probabilities(pick(outputs, task["output"]).reshape(-1), task["softmax"])
        best = int(probs.argmax())
        turn = best == conf["rotated"] and probs[best] > conf["threshold"]
        return (rotate180(piece) if turn else piece), bool(turn), float(probs[best])

    def recognize(self, piece, timing):
        """(text, confidence) of one upright crop; a line longer than the recogniser's input
        holds is read in pieces cut at pale columns (a space where the cut is a word gap)."""
        part, stage = self.stage("recognize")
        conf = settings(part["task"])
        width, height = part["preprocess"]["size"]
        pieces = split_line(piece, height, width) if stage["split"] else [(piece, 0)]
        texts, scores = [], []
        for k, (cut, gap) in enumerate(pieces):
            ids, confidence = ctc_decode(conf, self.run(part, fit_crop(cut, part["preprocess"]),
                                                        timing))
            text = ctc_text(conf, ids) or ""
            if k and gap >= 0.15 * piece.shape[0] and texts and not texts[-1].endswith(" ") \
                    and not text.startswith(" "):
                text = " " + text
            texts.append(text)
            scores += [confidence] * max(1, len(text.strip()))
        return "".join(texts).strip(), float(np.mean(scores)) if scores else 0.0

    def read(self, image, timing=None):
        """The text lines of a photo (H, W, C pixels in the detector's colour order); each
        part's milliseconds are added to *timing* (a dict) when given. A pipeline that cannot
        read its parts' outputs (a manifest that does not fit the models) is a BundleError."""
        try:
            timing = {} if timing is None else timing
            if self.kind == "face":   # MTCNN: runner/cascade_face.py
                return find_faces(self, image, timing)
            return self.lines(image, timing)
        except BundleError:
            raise
        except Exception as exc:
            raise PipelineMisfit("the %s pipeline cannot run its parts on this photo (%s); "
                                 "pass --part NAME for one part, or rebuild the bundle"
                                 % (self.kind, one_line(exc))) from None

    def lines(self, image, timing):
        quads, scores = self.detect(image, timing)
        _, conf = self.stage("recognize")
        lines = []
        for quad, score in zip(quads, scores):
            piece = crop_quad(image, quad)
            if piece is None:
                continue
            piece, turned, _ = self.upright(piece, timing)
            text, confidence = self.recognize(piece, timing)
            if confidence < conf["min_confidence"] or not text:
                continue
            lines.append({"box": [round(float(v), 1) for v in bounding_boxes(quad)[0]],
                          "polygon": [[round(float(x), 1), round(float(y), 1)] for x, y in quad],
                          "text": text,
                          "confidence": round(confidence, 5), "rotated": turned,
                          "box_score": round(float(score), 5)})
        return {"lines": lines, "image_size": [int(image.shape[1]), int(image.shape[0])]}


def summary(result):
    """The lines read, one a line: 'text (0.98)' (or the faces found)."""
    if "faces" in result:
        return face_summary(result)
    if not result["lines"]:
        return "no text found"
    return "%d line(s): %s" % (len(result["lines"]), "; ".join(
        "%r %.2f" % (line["text"], line["confidence"]) for line in result["lines"]))


def pipeline_sessions(bundle, manifest, args):
    """{part name: session} for every part a stage runs."""
    opened = {}
    for stage in manifest["pipeline"]["stages"]:
        part = [p for p in manifest["parts"] if p["name"] == stage["part"]][0]
        session, _ = open_session(bundle, manifest, part, args)
        opened[part["name"]] = session
    return opened


def session_runner(opened):
    """run_part for Cascade over sessions from pipeline_sessions."""
    def run_part(part, feed):
        return opened[part["name"]].run([o["name"] for o in part["outputs"]], feed)
    return run_part


def printable(path):
    """*path* as text that encodes (a non-UTF-8 file name's bytes become U+FFFD)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def cmd_infer_pipeline(bundle, manifest, args, keys):
    """`infer` of a pipeline bundle: each file (a photo, or an .npy of its pixels; a tts
    pipeline's: an .npy of a sentence's token ids) read whole; *keys*: infer's result key for
    each file."""
    if manifest["pipeline"].get("kind") == "tts":
        return infer_speech(bundle, manifest, args, keys)
    if getattr(args, "out", None):
        raise BundleError("--out writes output tensors; a pipeline bundle answers in %s "
                          "(--json prints them), or pass --part NAME --out %s for one part's"
                          % ("faces" if manifest["pipeline"].get("kind") == "face"
                             else "text lines", printable(args.out)))
    require_intact(bundle, manifest)
    opened = pipeline_sessions(bundle, manifest, args)
    cascade = Cascade(manifest, session_runner(opened))
    spec = cascade.stages[0][0]["preprocess"]
    results = []
    for path, key in zip(args.files, keys):
        timing = {}
        result = cascade.read(load_photo(read_file(path), spec, printable(path),
                                         args.max_megapixels * 1e6), timing)
        results.append(dict(result, file=printable(path), key=key, summary=summary(result),
                            latency_ms=dict((k, round(v, 3)) for k, v in timing.items())))
    providers = dict((name, s.get_providers()) for name, s in opened.items())
    return {"results": results, "pipeline": manifest["pipeline"]["kind"],
            "providers": providers, "passed": True}


def read_file(path):
    try:
        return np.fromfile(path, dtype=np.uint8)
    except (OSError, ValueError) as exc:
        raise BundleError("%s: cannot read it (%s)" % (printable(path), one_line(exc))) from None


def infer_speech(bundle, manifest, args, keys):
    """`infer` of a tts pipeline: each .npy of token ids spoken, with each stage's time (the
    encoder, the glue, the vocoder) and the real-time factor; --out writes OUT.npz and a WAV
    file a sentence."""
    require_intact(bundle, manifest)
    opened = pipeline_sessions(bundle, manifest, args)
    speech = Speech(Cascade(manifest, session_runner(opened)))
    results, audios = [], []
    for path, key in zip(args.files, keys):
        tokens = read_tokens(read_file(path), printable(path))
        timing, start = {}, time.perf_counter()
        result, audio = speech_answer(speech, tokens, timing)
        took = time.perf_counter() - start
        results.append(dict(result, file=printable(path), key=key,
                            # the field's RTF (Piper, Coqui, ESPnet): compute over audio,
                            # lower is better; "x real time" (audio over compute) beside it
                            real_time_factor=round(took / max(result["seconds"], 1e-9), 4),
                            x_real_time=round(result["seconds"] / max(took, 1e-9), 2),
                            latency_ms=dict((k, round(v, 3)) for k, v in timing.items())))
        audios.append((key, audio))
    report = {"results": results, "pipeline": "tts", "passed": True,
              "providers": dict((name, s.get_providers()) for name, s in opened.items())}
    if getattr(args, "out", None):
        report["out"], report["wav"] = write_speech(args.out, audios, speech.voc_conf["rate"])
    return report


BENCH_SECONDS = 30.0   # bench's sentences stop after this much compute (one run each at least)
WARMUP_SECONDS = 1.0   # a sentence's warm-up stops after this much (one call at least)


def bench_sentences(bundle, manifest, args):
    """[(name, token ids)]: bench's files, else the bundle's golden sentences (None: none)."""
    if getattr(args, "files", None):
        return [(printable(p), read_tokens(read_file(p), printable(p))) for p in args.files]
    golden = ((manifest.get("pipeline") or {}).get("accuracy") or {}).get("golden")
    if not isinstance(golden, dict) or not isinstance(golden.get("tokens"), str):
        return None
    tokens = read_npz(bundle, golden["tokens"])
    return [("golden %s" % key, read_tokens(_npy_bytes(tokens[key]), golden["tokens"]))
            for key in sorted(tokens)]


def _npy_bytes(array):
    out = io.BytesIO()
    np.save(out, np.asarray(array))
    return np.frombuffer(out.getvalue(), dtype=np.uint8)


def bench_speech(bundle, manifest, args):
    """`bench` of a tts pipeline: each sentence (bench's .npy files, else the golden ones)
    spoken whole, warmed up (bounded in seconds) then timed --runs times, all of them stopping
    after BENCH_SECONDS of compute (one run each at least): per sentence p50/p90, the first
    audio's latency (what a listener waits for where `serve` streams) and the real-time factor
    (compute over audio, lower is better); over all, the same at p50 summed. None: no
    sentences."""
    from .metrics import latency_stats

    named = bench_sentences(bundle, manifest, args)
    if not named:
        return None
    opened = pipeline_sessions(bundle, manifest, args)
    speech = Speech(Cascade(manifest, session_runner(opened)))
    rows, spent = [], 0.0
    for name, tokens in named:
        start = time.perf_counter()
        for _ in range(max(1, args.warmup)):
            speech.speak(tokens, {})
            if time.perf_counter() - start > WARMUP_SECONDS:
                break
        times, firsts = [], []
        while len(times) < args.runs and (not times or spent < BENCH_SECONDS):
            start = time.perf_counter()
            result, _ = speech_answer(speech, tokens, {})
            times.append((time.perf_counter() - start) * 1000.0)
            firsts.append(result["first_audio_ms"])
            spent += times[-1] / 1000.0
        latency = latency_stats(times)
        rows.append({"file": name, "tokens": result["tokens"],
                     "seconds": result["seconds"], "runs": len(times), "latency_ms": latency,
                     "first_audio_ms": float(np.median(firsts)),
                     "real_time_factor": latency["p50"] / 1000.0 / max(result["seconds"], 1e-9)})
    audio = sum(r["seconds"] for r in rows)
    return {"sentences": rows, "audio_s": audio,
            "real_time_factor": sum(r["latency_ms"]["p50"] for r in rows) / 1000.0 /
            max(audio, 1e-9),
            "first_audio_ms": {"p50": float(np.percentile([r["first_audio_ms"] for r in rows],
                                                          50)),
                               "max": max(r["first_audio_ms"] for r in rows)}}


def print_speech_bench(report):
    """bench_speech()'s report as lines a person reads."""
    for r in report["sentences"]:
        lat = r["latency_ms"]
        print("%s: %d token(s), %.2f s of speech: p50 %.1f ms (p90 %.1f, %d runs), first audio "
              "%.1f ms, real-time factor %.3f" % (r["file"], r["tokens"], r["seconds"],
                                                  lat["p50"], lat["p90"], r["runs"],
                                                  r["first_audio_ms"], r["real_time_factor"]))
    print("sentences: %d, %.2f s of speech: real-time factor %.3f (%.1fx real time), first "
          "audio p50 %.1f ms (max %.1f)" % (
              len(report["sentences"]), report["audio_s"], report["real_time_factor"],
              1.0 / max(report["real_time_factor"], 1e-9), report["first_audio_ms"]["p50"],
              report["first_audio_ms"]["max"]))


class ServedCascade(object):
    """The pipeline as `serve` runs it: a (part, session, names) triple of its own, whose
    "session" answers a request's body (a photo, or an .npy of its pixels)."""

    def __init__(self, manifest, sessions):
        def run_part(part, feed):
            return sessions[part["name"]][1].run([o["name"] for o in part["outputs"]], feed)
        self.cascade = Cascade(manifest, run_part)
        self.speech = Speech(self.cascade) if self.cascade.kind == "tts" else None
        self.spec = self.cascade.stages[0][0].get("preprocess")
        self.part = {"name": "pipeline", "inputs": [], "outputs": []}

    def __getitem__(self, index):   # serve's (part, session, names): names None marks it
        return (self.part, self, None)[index]

    def serve(self, body, max_pixels):
        """(HTTP status, answer) for one request's body."""
        if not body:
            return 400, {"error": "empty request body; POST %s" % (
                "an .npy of a sentence's token ids" if self.speech else
                "a photo (an image file, or an .npy of its (H, W, 3) uint8 pixels)")}
        if self.speech:
            return self.speak(body)
        try:
            start, timing = time.perf_counter(), {}
            result = self.cascade.read(load_photo(np.frombuffer(body, dtype=np.uint8),
                                                  self.spec, "request body", max_pixels), timing)
        except BundleError as exc:
            return exc.status, {"error": str(exc)}
        return 200, dict(result, summary=summary(result), pipeline=self.cascade.kind,
                         latency_ms=round((time.perf_counter() - start) * 1000.0, 3),
                         stages_ms=dict((k, round(v, 3)) for k, v in timing.items()))

    def speak(self, body):
        """(HTTP status, answer) of a tts pipeline for one request's .npy of token ids: the
        answer's samples ride along as "_audio" (serve answers audio/wav unless JSON is asked)."""
        try:
            start, timing = time.perf_counter(), {}
            result, audio = speech_answer(self.speech, read_tokens(np.frombuffer(
                body, dtype=np.uint8), "request body"), timing)
        except BundleError as exc:
            return exc.status, {"error": str(exc)}
        return 200, dict(result, pipeline="tts", _audio=audio,
                         latency_ms=round((time.perf_counter() - start) * 1000.0, 3),
                         stages_ms=dict((k, round(v, 3)) for k, v in timing.items()))


    def stream(self, body):
        """(the sentence's pieces of float32 samples, a generator, its rate) for `serve`'s
        streamed answer (BundleError: a body that is no sentence)."""
        tokens = read_tokens(np.frombuffer(body, dtype=np.uint8), "request body")
        return self.speech.stream(tokens, {}), self.speech.voc_conf["rate"]


def served_cascade(manifest, sessions):
    """serve's entry for the pipeline, over its {part name: (part, session, names)}."""
    return ServedCascade(manifest, sessions)
