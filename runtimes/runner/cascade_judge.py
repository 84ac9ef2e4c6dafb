"""A pipeline judged end to end: its answers on photos against the original models' answers
through the same glue, per kind. The build judges a staged bundle with it on held-out photos
(packager/cascade/judge.py); `run.py check` judges the device's run of the golden photos a
pipeline bundle keeps (golden/pipeline/) against the answers the original models gave there.

    agreement_of(kind)     agreement(want, got) -> (n_want, n_same, n_got) on one photo's
                           answers: {"lines": [...]} for ocr (cascade.py's Cascade.read),
                           {"faces": [...]} for face (cascade_face.agreement)
    tally(kind, pairs)     {"lines"|"faces": n_want, "same", "extra", "photos"} over
                           (want, got) pairs
    verdict(kind, counts, keep, where, floor=None)
                           the counts with value, keep, shown, passed and a one-line text
    golden_problem(accuracy)   what is wrong with the manifest's pipeline.accuracy (and its
                           golden entry), or ''
    pipeline_verdict(bundle, manifest, run_part)
                           `run.py check`'s figure for a pipeline bundle's golden photos
"""

import json
import math
import os

from .cascade import Cascade
from .cascade_tts import Speech, alike, speech_figure
from .errors import BundleError, one_line
from .images import MAX_PIXELS
from .manifest import read_npz
from .task_detect import matched_pairs

KEEP = 0.99   # the original's answers the bundle must give alike, unless the manifest says
GOLDEN_DIR = "golden/pipeline"
# The golden files of a pipeline kind (pipeline.accuracy.golden's keys, each file's suffix):
# photos and the original's answers; a tts pipeline's sentences (token ids) and its speech.
GOLDEN_FILES = {"tts": (("tokens", ".npz"), ("audio", ".npz"))}
PHOTO_FILES = (("photos", ".npz"), ("answers", ".json"))
# Per kind: the answer's list, its items as a figure names them, and what "alike" means.
WORDS = {"ocr": ("lines", "text lines", "read alike (box IoU >= 0.5, same text)"),
         "face": ("faces", "faces", "found alike (box IoU >= 0.5)")}


def match_lines(want, got):
    """How many of *want*'s lines a line of *got* matches: box IoU >= 0.5 and the same text
    (each line of *got* matched once, the best overlap first)."""
    pairs = matched_pairs([w["box"] for w in want], [g["box"] for g in got])
    return sum(want[i]["text"] == got[j]["text"] for i, j in pairs)


def ocr_agreement(want, got):
    """(the original's lines, the bundle's lines that read alike, the bundle's lines)."""
    return len(want["lines"]), match_lines(want["lines"], got["lines"]), len(got["lines"])


def agreement_of(kind):
    """The agreement function of a pipeline *kind*, or None when this runner has none."""
    if kind == "ocr":
        return ocr_agreement
    if kind == "face":
        try:   # the face cascade's own module, in runners that ship it
            from .cascade_face import agreement
        except ImportError:
            return None
        return agreement
    return None


def words(kind):
    return WORDS.get(kind, ("answers", "answers", "alike"))


def tally(kind, pairs):
    """The counts of (want, got) answer pairs, one pair a photo."""
    agreement = agreement_of(kind)
    wanted = same = found = photos = 0
    for want, got in pairs:
        n_want, n_same, n_got = agreement(want, got)
        wanted, same, found, photos = wanted + n_want, same + n_same, found + n_got, photos + 1
    return {words(kind)[0]: wanted, "same": same, "extra": found - same, "photos": photos}


def needed(keep):
    """How many answers a set must hold for *keep* to be shown (one miss in fewer is more than
    1 - keep); None for a keep of 100 %, which no finite set shows."""
    if keep >= 1.0:
        return None
    return int(math.ceil(round(1.0 / (1.0 - keep), 6)))


def verdict(kind, counts, keep, where, floor=None):
    """*counts* (tally's) judged against *keep*: passed when the share alike reaches it, or
    when *floor* (a count: what the host's run of the same photos reached) is given and
    reached; `shown` is False when the set is too small to show *keep*. *where* names the
    photos ("held-out photo(s)", "golden photo(s)")."""
    key, unit, alike = words(kind)
    wanted, same, photos = counts[key], counts["same"], counts["photos"]
    value = float(same) / wanted if wanted else None
    passed = value is None or value >= keep - 1e-12 or (floor is not None and same >= floor)
    need = needed(keep)
    shown = bool(wanted) and need is not None and wanted >= need
    if not wanted:
        text = "the original models gave no %s on the %d %s: nothing to judge" % (
            unit, photos, where)
    else:
        notes = ["needs %s" % percent(keep)]
        if floor is not None and floor < wanted:
            notes.append("or %d alike as on the host" % floor)
        if not shown:
            notes.append("%d %s cannot show %s: %s" % (
                wanted, unit, percent(keep), "%d needed" % need if need else "no set can"))
        text = "%d of the original's %d %s %s on %d %s, %d other %s (%s)" % (
            same, wanted, unit, alike, photos, where, counts["extra"], key[:-1] + "(s)",
            "; ".join(notes))
    out = dict(counts, value=value, keep=keep, shown=shown, passed=passed,
               text=text + ("" if passed else ": FAILED"))
    if floor is not None:
        out["floor"] = floor
    return out


def percent(share):
    return "%.0f%%" % (100 * share) if round(100 * share, 6) == int(round(100 * share)) else \
        "%.1f%%" % (100 * share)


def is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10 ** 9


def golden_problem(accuracy, kind=None):
    """'' when the manifest's pipeline.accuracy can be read as the build left it: its `keep`
    a share in (0, 1], its `golden` entry (when it has one) {"photos": an .npz file, "answers":
    a .json file (a tts pipeline's: "tokens" and "audio", .npz files), "count", "wanted",
    "same": counts}; else one line naming the key."""
    if not isinstance(accuracy, dict):
        return ""   # cascade_spec.pipeline_problem names it
    keep = accuracy.get("keep", KEEP)
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0.0 < keep <= 1.0:
        return "pipeline.accuracy.keep must be a share in (0, 1], got %r" % (str(keep)[:40],)
    if "golden" not in accuracy:
        return ""
    golden = accuracy["golden"]
    files = GOLDEN_FILES.get(kind, PHOTO_FILES)
    if not isinstance(golden, dict):
        return "pipeline.accuracy.golden must be an object {%s, count, wanted, same}" % (
            ", ".join(key for key, _ in files))
    for key, suffix in files:
        value = golden.get(key)
        if not isinstance(value, str) or not value.startswith(GOLDEN_DIR + "/") or \
                not value.endswith(suffix) or ".." in value.replace("\\", "/").split("/"):
            return "pipeline.accuracy.golden.%s must name a %s file in %s/, got %r" % (
                key, suffix, GOLDEN_DIR, str(value)[:60])
    for key in ("count", "wanted", "same"):
        if not is_count(golden.get(key)):
            return "pipeline.accuracy.golden.%s must be a count, got %r" % (
                key, str(golden.get(key))[:40])
    if golden["same"] > golden["wanted"] or golden["count"] < 1:
        return "pipeline.accuracy.golden holds %d photo(s), %d of %d alike: not counts a " \
               "build writes" % (golden["count"], golden["same"], golden["wanted"])
    return ""


def answer_problem(kind, answer):
    """'' when *answer* (one photo's, from the golden answers) has the kind's list of items,
    each with a box (4 numbers) and, for ocr, a text; else what is wrong."""
    key = words(kind)[0]
    items = answer.get(key) if isinstance(answer, dict) else None
    if not isinstance(items, list):
        return "has no %s list" % key
    for i, item in enumerate(items):
        box = item.get("box") if isinstance(item, dict) else None
        if not isinstance(box, list) or len(box) != 4 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and
                math.isfinite(v) for v in box):
            return "%s[%d] has no box of 4 numbers" % (key, i)
        if kind == "ocr" and not isinstance(item.get("text"), str):
            return "%s[%d] has no text" % (key, i)
    return ""


def pipeline_verdict(bundle, manifest, run_part):
    """The pipeline run as one cascade on the bundle's golden photos (this device's sessions,
    *run_part*), its answers judged against the original models' answers there: the share
    alike must reach the bundle's budget (pipeline.accuracy.keep) or the count the host's run
    of the same photos reached. A bundle without golden photos says so (nothing judged)."""
    kind = manifest["pipeline"]["kind"]
    accuracy = manifest["pipeline"].get("accuracy") or {}
    golden = accuracy.get("golden")
    if kind == "tts" and golden:
        return speech_verdict(bundle, manifest, run_part, golden)
    if not golden or agreement_of(kind) is None:
        return {"kind": kind, "checked": False, "passed": True,
                "text": "not checked: the bundle keeps no golden photos (%s)" % (
                    "this runner cannot judge a %s pipeline" % kind if golden else
                    "its build had too few photos to hold some out, or is older")}
    photos = read_npz(bundle, golden["photos"])
    cascade = Cascade(manifest, run_part)
    pairs = [(want, cascade.read(photos[key])) for key, want in
             golden_answers(bundle, golden, kind, photos)]
    figure = verdict(kind, tally(kind, pairs), accuracy.get("keep", KEEP), "golden photo(s)",
                     floor=golden["same"])
    return dict(figure, kind=kind, checked=True)


def speech_verdict(bundle, manifest, run_part, golden):
    """`run.py check` of a tts pipeline: the golden sentences spoken on this device, each
    judged against the original's speech there by the vocode stage's budget (length and
    log-mel distance): every one must sound alike."""
    tokens, audio = read_npz(bundle, golden["tokens"]), read_npz(bundle, golden["audio"])
    speech = Speech(Cascade(manifest, run_part))
    results = []
    for i in range(golden["count"]):
        key = "sentence%d" % i
        if key not in tokens or key not in audio or tokens[key].dtype.kind not in "iu" or \
                audio[key].ndim != 1 or tokens[key].ndim != 1:
            raise BundleError("%s: holds no sentence %s with its speech in %s; rebuild the "
                              "bundle with edgepack" % (golden["tokens"], key, golden["audio"]))
        results.append(alike(speech.voc_conf, audio[key], speech.speak(tokens[key], {})))
    figure = speech_figure(speech.voc_conf, results, "golden sentence(s)")
    return dict(figure, kind="tts", checked=True)


def golden_answers(bundle, golden, kind, photos):
    """[(photo key, the original's answer)] of the golden answers file, each photo an (H, W,
    3) uint8 array of *photos*; a file that is not so is a BundleError naming it."""
    rel = golden["answers"]

    def fail(what):
        raise BundleError("%s: %s; rebuild the bundle with edgepack" % (rel, what))

    answers, problem = None, None
    try:
        with open(os.path.join(bundle, rel), encoding="utf-8") as f:
            answers = json.load(f)
    except (OSError, ValueError) as exc:
        problem = "not golden answers (%s)" % one_line(exc)
    if problem:
        fail(problem)
    if not isinstance(answers, dict) or answers.get("kind") != kind or \
            not isinstance(answers.get("photos"), list):
        fail("not the golden answers of a %s pipeline {kind, photos}" % kind)
    if len(answers["photos"]) != golden["count"]:
        fail("holds %d answer(s), the manifest says %d" % (len(answers["photos"]),
                                                           golden["count"]))
    out = []
    for i, entry in enumerate(answers["photos"]):
        key = entry.get("photo") if isinstance(entry, dict) else None
        image = photos.get(key) if isinstance(key, str) else None
        if image is None or image.dtype.name != "uint8" or image.ndim != 3 or \
                image.shape[2] != 3 or min(image.shape[:2]) < 1 or \
                image.shape[0] * image.shape[1] > MAX_PIXELS:
            fail("photos[%d] names no (H, W, 3) uint8 photo of %s" % (i, golden["photos"]))
        problem = answer_problem(kind, entry.get("answer"))
        if problem:
            fail("photos[%d].answer %s" % (i, problem))
        out.append((key, entry["answer"]))
    return out


def pipeline_line(entry):
    """'pipeline: 19 of the original's 19 text lines read alike ... on 4 golden photo(s) ...:
    ok' (the verdict's text says FAILED itself)."""
    return "pipeline: %s: %s%s" % (entry["kind"], entry["text"], (
        "" if not entry["passed"] or not entry.get("checked") else ": ok" if entry["shown"]
        else ": NOT PROVEN (too few golden answers to show it)"))
