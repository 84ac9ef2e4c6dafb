"""Pipeline bundles (issue 25 item 4): the OCR glue on generated arrays, the manifest's pipeline
section and the pipeline file checked naming the key, and the real rapidocr trio (PP-OCRv4
detector, direction classifier, recogniser) built with `edgepack build --pipeline` into one
bundle whose `run.py infer` and `serve` read text lines as the original models do through the
same glue on the host."""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pytest

from packager._runtimes.runner import cascade_ocr as glue
from packager._runtimes.runner import task_detect as db
from packager._runtimes.runner.cascade_spec import STEP_PARAMETERS, pipeline_problem
from packager._runtimes.runner.errors import BundleError as RunnerBundleError
from packager._runtimes.runner.manifest import check_manifest
from packager.errors import SpecError

sys.path.insert(0, str(Path(__file__).resolve().parent))

DETECT = dict(STEP_PARAMETERS["detect"])
BGR = "size=%s,color=bgr,scale=1/255,mean=0.5,std=0.5"


# ---------------------------------------------------------------------------------------------
# The glue on generated arrays


def test_a_probability_map_with_two_text_blobs_gives_two_boxes_grown_by_the_unclip_distance():
    prob = np.zeros((1, 1, 64, 128), np.float32)
    prob[0, 0, 10:20, 10:60] = 0.9        # a line 50 x 10
    prob[0, 0, 40:50, 30:100] = 0.8       # a line 70 x 10
    prob[0, 0, 30, 5] = 0.9               # one pixel: under min_size
    boxes, scores = db.text_boxes(prob, dict(DETECT, dilate=False))
    assert len(boxes) == 2
    # DB's unclip: distance = area * 1.6 / perimeter of the box between pixel centres
    w, h = 49, 9
    d = w * h * 1.6 / (2 * (w + h))
    assert boxes[0] == pytest.approx([10 - d, 10 - d, 59 + d, 19 + d])
    assert scores == pytest.approx([0.9, 0.8], abs=1e-6)


def test_a_tilted_blob_gets_a_tilted_quad_and_its_crop_comes_out_level():
    prob = np.zeros((120, 200), np.float32)
    cv2.line(prob, (20, 90), (180, 30), 0.9, 9)   # a text line rising 20.6 degrees
    quads, scores = db.text_quads(prob, dict(DETECT, dilate=False))
    assert len(quads) == 1 and scores[0] > 0.8
    top = quads[0][1] - quads[0][0]
    assert np.degrees(np.arctan2(-top[1], top[0])) == pytest.approx(20.6, abs=1.5)
    assert db.bounding_boxes(quads)[0] == pytest.approx(db.text_boxes(
        prob, dict(DETECT, dilate=False))[0][0])
    photo = np.full((120, 200, 3), 255, np.uint8)
    cv2.line(photo, (20, 90), (180, 30), (0, 0, 0), 9)
    piece = glue.crop_quad(photo, quads[0])
    assert piece.shape[1] > 4 * piece.shape[0]    # level: long and flat
    rows = piece.mean(axis=(1, 2))
    assert rows[len(rows) // 2] < 60 and rows[0] > 150 and rows[-1] > 150   # ink in the middle
    level = np.zeros((60, 200), np.float32)
    level[20:30, 20:180] = 0.9                      # within 2 degrees: the axis-aligned box
    quad = db.text_quads(level, dict(DETECT, dilate=False))[0][0]
    assert quad[0][1] == quad[1][1] and quad[0][0] == quad[3][0]


def test_box_threshold_drops_a_faint_blob_and_dilation_joins_touching_diagonals():
    prob = np.zeros((32, 32), np.float32)
    prob[4:12, 4:20] = 0.35                # over the pixel line, under the box score
    assert len(db.text_boxes(prob, dict(DETECT, dilate=False))[0]) == 0
    mask = np.zeros((6, 6), bool)
    mask[1, 1] = mask[2, 2] = True         # 8-connected only: two blobs, one once dilated
    assert len(db.components(mask)) == 2
    assert len(db.components(db.dilate(mask))) == 1


def test_components_agree_with_opencv_on_a_random_mask():
    mask = np.random.default_rng(0).random((120, 160)) > 0.55
    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8),
                                                               connectivity=4)
    found = sorted((x1, y1, x2 - x1 + 1, y2 - y1 + 1, n)
                   for x1, y1, x2, y2, n in db.components(mask))
    assert found == sorted(tuple(int(v) for v in row) for row in stats[1:])


def test_a_crop_is_fitted_to_the_input_height_its_ratio_kept_and_zeros_pad_the_width():
    crop = np.full((20, 50, 3), 255, np.uint8)
    spec = {"size": [160, 40], "color": "bgr", "scale": 1 / 255, "mean": 0.5, "std": 0.5}
    x = glue.fit_crop(crop, spec)
    assert x.shape == (1, 3, 40, 160) and x.dtype == np.float32
    assert np.allclose(x[..., :100], 1.0)  # 50 x 20 at height 40: 100 wide, white is +1
    assert np.all(x[..., 100:] == 0)
    wide = glue.fit_crop(np.zeros((10, 500, 3), np.uint8), spec)   # squeezed to the width
    assert np.allclose(wide, -1.0)


def test_the_180_degree_turn_and_a_tall_crop_turned_a_quarter():
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    turned = glue.rotate180(image)
    assert np.array_equal(turned[0, 0], image[-1, -1]) and np.array_equal(
        glue.rotate180(turned), image)
    photo = np.zeros((100, 100, 3), np.uint8)
    assert glue.crop(photo, [10, 10, 20, 60]).shape == (10, 50, 3)   # vertical text: turned
    assert glue.crop(photo, [10.4, 10, 60.2, 20]).shape == (10, 51, 3)
    assert glue.crop(photo, [10, 10, 11, 60]) is None


def test_resize_without_opencv_matches_opencv_within_one_level(monkeypatch):
    image = (np.random.default_rng(1).random((37, 53, 3)) * 255).astype(np.uint8)
    want = cv2.resize(image, (120, 48), interpolation=cv2.INTER_LINEAR)
    monkeypatch.setitem(sys.modules, "cv2", None)   # `import cv2` raises ImportError
    got = glue.resize(image, 120, 48)
    assert got.shape == want.shape and np.abs(got.astype(int) - want).max() <= 1


def test_a_long_line_is_cut_between_words_into_pieces_the_input_takes():
    line = np.full((20, 400, 3), 255, np.uint8)
    for x in range(5, 395, 60):             # "words" 48 wide, 12-pixel gaps
        line[4:16, x:x + 48] = 0
    pieces = glue.split_line(line, 40, 160)   # at height 20, one input holds 80 columns
    widths = [p.shape[1] for p, _ in pieces]
    assert sum(widths) == 400 and all(40 <= w <= 80 for w in widths[:-1]), widths
    cuts = np.cumsum(widths)[:-1]
    assert all(line[:, c].min() == 255 for c in cuts), cuts   # every cut in a gap
    assert pieces[0][1] == 0 and all(gap == 12 for _, gap in pieces[1:])
    assert [(p.shape, g) for p, g in glue.split_line(line[:, :70], 40, 160)] == [
        ((20, 70, 3), 0)]   # a short line stays whole


def test_end_to_end_lines_match_by_box_overlap_and_text():
    from packager.cascade.judge import match_lines

    want = [{"box": [0, 0, 100, 20], "text": "a"}, {"box": [0, 40, 100, 60], "text": "b"},
            {"box": [0, 80, 100, 100], "text": "c"}]
    got = [{"box": [2, 41, 100, 61], "text": "b"}, {"box": [1, 0, 99, 21], "text": "x"},
           {"box": [0, 0, 100, 20], "text": "a"}, {"box": [300, 80, 400, 100], "text": "c"}]
    # a: the exact box wins over the near one that misreads; b matches; c's box is elsewhere
    assert match_lines(want, got) == 2
    assert match_lines(want, []) == 0


def test_reading_order_is_top_to_bottom_then_left_to_right_on_one_line():
    boxes = [[200, 12, 300, 30], [10, 10, 100, 30], [10, 50, 100, 70]]
    assert glue.reading_order(boxes) == [1, 0, 2]


# ---------------------------------------------------------------------------------------------
# The manifest's pipeline section


def parts():
    image = {"inputs": [{"name": "x", "shape": [1, 3, 48, 320], "dtype": "float32"}],
             "preprocess": {"size": [320, 48], "color": "bgr", "scale": 1 / 255, "mean": 0.5,
                            "std": 0.5}}
    return [dict(image, name="det", outputs=[{"name": "map"}]),
            dict(image, name="cls", outputs=[{"name": "p"}]),
            dict(image, name="rec", outputs=[{"name": "t"}],
                 task={"kind": "ctc", "alphabet": ["blank", "a"]})]


PIPELINE = {"kind": "ocr", "stages": [{"part": "det", "step": "detect", "threshold": 0.3},
                                      {"part": "cls", "step": "direction"},
                                      {"part": "rec", "step": "recognize"}]}


@pytest.mark.parametrize("change, key", [
    (lambda p, s: p.update(kind="pose"), "pipeline.kind"),
    (lambda p, s: p.update(stages=[]), "pipeline.stages"),
    (lambda p, s: p.update(extra=1), "pipeline.extra"),
    (lambda p, s: s[0].update(threshold=2), "pipeline.stages[0].threshold"),
    (lambda p, s: s[0].update(box_threshold="x"), "pipeline.stages[0].box_threshold"),
    (lambda p, s: s[0].update(max_boxes=0), "pipeline.stages[0].max_boxes"),
    (lambda p, s: s[1].update(rotated=True), "pipeline.stages[1].rotated"),
    (lambda p, s: s[1].update(unclip=1.6), "pipeline.stages[1].unclip"),
    (lambda p, s: s[2].update(part="nope"), "pipeline.stages[2].part"),
    (lambda p, s: s[2].update(step="read"), "pipeline.stages[2].step"),
    (lambda p, s: s.reverse(), "pipeline.stages has steps"),
    (lambda p, s: s.__setitem__(1, 7), "pipeline.stages[1]"),
    (lambda p, s: s[1].update(part="det"), "pipeline.stages name a part twice"),
])
def test_a_damaged_pipeline_section_is_refused_naming_its_key(change, key):
    pipeline = copy.deepcopy(PIPELINE)
    change(pipeline, pipeline["stages"])
    problem = pipeline_problem(pipeline, parts())
    assert problem.startswith(key), problem


def test_the_stage_parts_must_take_an_image_and_the_recogniser_must_spell():
    assert pipeline_problem(PIPELINE, parts()) == ""
    no_alphabet = parts()
    del no_alphabet[2]["task"]
    assert "no ctc task with an alphabet" in pipeline_problem(PIPELINE, no_alphabet)
    flat = parts()
    flat[0]["inputs"][0]["shape"] = [1, 100]
    assert pipeline_problem(PIPELINE, flat).startswith("pipeline.stages[0].part det takes")
    bad_std = parts()
    bad_std[1]["preprocess"]["std"] = 0
    assert "preprocess.std" in pipeline_problem(PIPELINE, bad_std)
    without_cls = dict(PIPELINE, stages=[PIPELINE["stages"][0], PIPELINE["stages"][2]])
    assert pipeline_problem(without_cls, parts()) == ""   # the direction step is optional


# ---------------------------------------------------------------------------------------------
# The pipeline file


def write_toml(folder: Path, stages: list[str], kind: str = "ocr") -> Path:
    path = folder / "ocr.toml"
    path.write_text(f'kind = "{kind}"\n' + "".join(f"\n[[stage]]\n{s}\n" for s in stages))
    return path


@pytest.fixture
def pipeline_folder(tmp_path, cnn_onnx, image_dir):
    shutil.copy(cnn_onnx, tmp_path / "m.onnx")
    (tmp_path / "chars.txt").write_text("blank\na\nb\n")
    shutil.copytree(image_dir, tmp_path / "photos")
    return tmp_path


def stages(**changes) -> list[str]:
    det = {"part": '"det"', "step": '"detect"', "model": '"m.onnx"', "calib": '"photos"',
           "preprocess": f'"{BGR % "48x40"}"'}
    rec = {"part": '"rec"', "step": '"recognize"', "model": '"m.onnx"',
           "preprocess": f'"{BGR % "48x40"}"', "task": '"ctc:alphabet=@chars.txt"'}
    for key, value in changes.items():
        which, _, name = key.partition("__")
        target = det if which == "det" else rec
        if value is None:
            target.pop(name)
        else:
            target[name] = value
    return ["\n".join(f"{k} = {v}" for k, v in s.items()) for s in (det, rec)]


@pytest.mark.parametrize("changes, said", [
    ({"det__step": '"find"'}, "stage[0].step = 'find' is not a step"),
    ({"det__model": '"missing.onnx"'}, "stage[0].model = 'missing.onnx': no such file"),
    ({"det__calib": None}, "stage[0] has no calib"),
    ({"det__preprocess": '"size=banana"'}, "stage[0].preprocess"),
    ({"det__threshold": "3"}, "stage[0].threshold must be a number from 0 to 1"),
    ({"det__rotated": "1"}, "stage[0].rotated is not a parameter of a detect stage"),
    ({"rec__task": '"ctc"'}, "stage[1].task must be a ctc task with its alphabet"),
    ({"rec__task": '"ctc:alphabet=@nope.txt"'}, "stage[1].task"),
    ({"rec__task": '"ctc:alphabet=@/dev/zero"'}, "/dev/zero: not a regular file"),   # N-PIPE-10
    ({"rec__precision": '"int4"'}, "stage[1].precision = 'int4' is not a precision"),
    ({"rec__part": '"det"'}, "names a part twice"),
])
def test_a_bad_pipeline_file_is_one_line_naming_the_file_and_key(pipeline_folder, changes, said):
    from packager.cascade.spec import load_pipeline

    path = write_toml(pipeline_folder, stages(**changes))
    with pytest.raises(SpecError) as info:
        load_pipeline(path)
    assert str(path) in str(info.value) and said in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_the_cli_refuses_a_pipeline_with_per_part_options_and_a_missing_file(pipeline_folder):
    from click.testing import CliRunner

    from packager.cli import main

    out = pipeline_folder / "out"
    toml = write_toml(pipeline_folder, stages())
    r = CliRunner().invoke(main, ["build", "--pipeline", str(toml), "--calib", "x", "-o",
                                  str(out)])
    assert r.exit_code == 2 and "--calib with --pipeline" in r.output, r.output
    r = CliRunner().invoke(main, ["build", "--pipeline", str(pipeline_folder / "no.toml"),
                                  "-o", str(out)])
    assert r.exit_code == 2 and "no such file" in r.output and not out.exists(), r.output
    r = CliRunner().invoke(main, ["build", "-o", str(out)])
    assert r.exit_code == 2 and "give MODEL or --pipeline" in r.output, r.output


# ---------------------------------------------------------------------------------------------
# The real rapidocr trio, end to end


RAPIDOCR = "rapidocr_onnxruntime/models/"
WORDS = [("HELLO WORLD", 2.0, 4), ("edge bundle 2026", 1.5, 3), ("ONNX Runtime", 1.4, 3)]


def zoo_files():
    """(det, cls, rec .onnx, the recogniser's alphabet) from the rapidocr wheel, else skip (or
    fail under EDGEPACK_REQUIRE_ZOO=1, as CI runs)."""
    import zoo
    import zoo_tasks

    try:
        models = [zoo.package_file("rapidocr-onnxruntime", RAPIDOCR + name) for name in (
            "ch_PP-OCRv4_det_infer.onnx", "ch_ppocr_mobile_v2.0_cls_infer.onnx",
            "ch_PP-OCRv4_rec_infer.onnx")]
        chars = zoo_tasks.rec_chars()
    except (zoo.FetchError, OSError) as exc:
        if os.environ.get("EDGEPACK_REQUIRE_ZOO") == "1":
            pytest.fail(f"zoo packages unavailable and EDGEPACK_REQUIRE_ZOO=1: {exc}")
        pytest.skip(f"the rapidocr models are not in the zoo cache (no PyPI?): {exc}")
    return models, chars


LEXICON = ["invoice", "TOTAL", "42.50", "Station", "exit 3", "Monday", "OPEN", "receipt",
           "Platform 9", "coffee", "tea", "2026-11-24", "north", "SALE", "bundle", "device"]
FONTS = [cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX,
         cv2.FONT_HERSHEY_TRIPLEX]


def text_photos(folder: Path, count: int = 10) -> Path:
    """*count* 640x480 photos of printed words, drawn by OpenCV: a few lines each in one of
    four fonts, scales and inks on a tinted page with some noise (seeded)."""
    rng = np.random.default_rng(25)
    folder.mkdir()
    for n in range(count):
        page = np.full((480, 640, 3), rng.integers(200, 256, 3), np.uint8)
        for k in range(int(rng.integers(3, 6))):
            words = " ".join(rng.choice(LEXICON, int(rng.integers(1, 4))))
            cv2.putText(page, words, (int(rng.integers(10, 120)), 70 + 90 * k),
                        FONTS[int(rng.integers(0, 4))], float(rng.uniform(0.9, 1.6)),
                        tuple(int(v) for v in rng.integers(0, 90, 3)), int(rng.integers(2, 4)))
        noise = rng.normal(0, 6, page.shape)
        cv2.imwrite(str(folder / f"{n:02d}.png"), np.clip(page + noise, 0, 255).astype(np.uint8))
    return folder


def rendered_text() -> np.ndarray:
    """A 640x480 BGR photo: three printed lines and one turned upside down."""
    image = np.full((480, 640, 3), 255, np.uint8)
    for k, (text, scale, weight) in enumerate(WORDS):
        cv2.putText(image, text, (40, 90 + 110 * k), cv2.FONT_HERSHEY_SIMPLEX, scale,
                    (10, 10, 10), weight)
    flipped = np.full((90, 520, 3), 255, np.uint8)
    cv2.putText(flipped, "upside down", (20, 62), cv2.FONT_HERSHEY_SIMPLEX, 1.6, (0, 0, 0), 3)
    image[375:465, 40:560] = flipped[::-1, ::-1]
    return image


@pytest.fixture(scope="module")
def ocr_bundle(tmp_path_factory):
    """The rapidocr trio built with `edgepack build --pipeline` (FP32 stages: about 40 s here,
    most of it the candidates' timing), with its pipeline file and a rendered photo."""
    from click.testing import CliRunner

    from packager.cli import main

    (det, cls, rec), chars = zoo_files()
    folder = tmp_path_factory.mktemp("ocr")
    text_photos(folder / "photos")
    (folder / "chars.txt").write_text("\n".join(chars) + "\n", encoding="utf-8")
    toml = write_toml(folder, [
        f'part = "det"\nstep = "detect"\nmodel = "{det}"\ncalib = "photos"\nprecision = "fp32"\n'
        f'preprocess = "size=640x640,resize=letterbox,pad=0,color=bgr,scale=1/255,mean=0.5,'
        f'std=0.5"',
        f'part = "cls"\nstep = "direction"\nmodel = "{cls}"\ntask = "classify"\n'
        f'precision = "fp32"\nthreshold = 0.9\npreprocess = "{BGR % "192x48"}"',
        f'part = "rec"\nstep = "recognize"\nmodel = "{rec}"\nprecision = "fp32"\n'
        f'task = "ctc:alphabet=@chars.txt"\npreprocess = "{BGR % "320x48"}"'])
    cv2.imwrite(str(folder / "text.png"), rendered_text())
    r = CliRunner().invoke(main, ["build", "--pipeline", str(toml), "-o", str(folder / "out"),
                                  "--openvino", "no"])
    assert r.exit_code == 0, r.output
    assert "[cls] calibration: the crops the original detector finds in" in r.output
    # two of the ten photos held out judge the FP32 stages end to end: every line alike
    found = re.search(r"end to end: (\d+) of the original's (\d+) text lines read alike", r.output)
    assert found and found.group(1) == found.group(2) != "0", r.output
    return folder


@pytest.mark.zoo
@pytest.mark.slow
def test_the_ocr_pipeline_bundle_reads_text_lines_as_the_original_models_do(ocr_bundle):
    from conftest import run_py
    from packager.cascade.host import original_cascade
    from packager.cascade.spec import load_pipeline

    bundle = ocr_bundle / "out"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [p["name"] for p in manifest["parts"]] == ["det", "cls", "rec"]
    assert all(p["precision"]["decision"] for p in manifest["parts"])   # one decision a part
    # the cascade's modules ship in a pipeline bundle (and only there: test_runner)
    assert {"runner/cascade.py", "runner/cascade_ocr.py", "runner/cascade_judge.py"} <= \
        set(manifest["files"])
    assert manifest["pipeline"]["stages"][1] == {"part": "cls", "step": "direction",
                                                 "threshold": 0.9}
    accuracy = manifest["pipeline"]["accuracy"]   # the end-to-end figure, in the manifest
    assert accuracy["passed"] and accuracy["same"] == accuracy["lines"] > 0, accuracy
    assert accuracy["photos"] == 2 and not accuracy["shown"]   # too few lines to show 99%
    photos = [ocr_bundle / "text.png"] + sorted((ocr_bundle / "photos").glob("*.png"))[:3]
    r = run_py(bundle, "infer", *map(str, photos), "--json")
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)["results"]
    texts = [line["text"] for line in results[0]["lines"]]
    assert texts == [w for w, _, _ in WORDS] + ["upside down"], texts
    assert [line["rotated"] for line in results[0]["lines"]] == [False] * 3 + [True]
    # the same glue on the host over the three original models: the same lines
    host = original_cascade(load_pipeline(ocr_bundle / "ocr.toml"))
    for path, result in zip(photos, results, strict=True):
        want = host.read(cv2.imread(str(path)))
        assert [w["text"] for w in want["lines"]] == [g["text"] for g in result["lines"]], path
        for w, g in zip(want["lines"], result["lines"], strict=True):
            assert np.allclose(w["box"], g["box"], atol=0.2)
            assert np.allclose(w["polygon"], g["polygon"], atol=0.2)
            assert abs(w["confidence"] - g["confidence"]) < 1e-3
    human = run_py(bundle, "infer", str(photos[0]))
    assert human.returncode == 0 and "4 line(s): 'HELLO WORLD'" in human.stdout, human.stdout


@pytest.mark.zoo
@pytest.mark.slow
def test_one_part_of_a_pipeline_bundle_still_answers_alone_and_serve_runs_the_pipeline(
        ocr_bundle, tmp_path):
    from conftest import run_py, start_server

    bundle = ocr_bundle / "out"
    crop = np.full((48, 320, 3), 255, np.uint8)
    cv2.putText(crop, "HELLO", (10, 36), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (0, 0, 0), 3)
    cv2.imwrite(str(tmp_path / "crop.png"), crop)
    r = run_py(bundle, "infer", "--part", "rec", str(tmp_path / "crop.png"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["task"]["text"] == "HELLO"
    proc, url = start_server(bundle, tmp_path / "serve.log", "--quiet")
    try:
        body = (ocr_bundle / "text.png").read_bytes()
        req = urllib.request.Request(url + "/infer", data=body, method="POST",
                                     headers={"Content-Type": "image/png"})
        with urllib.request.urlopen(req, timeout=120) as reply:
            answer = json.loads(reply.read())
        assert [line["text"] for line in answer["lines"]][:3] == [w for w, _, _ in WORDS]
        assert answer["pipeline"] == "ocr" and set(answer["stages_ms"]) == {"det", "cls", "rec"}
        req = urllib.request.Request(url + "/infer/rec", data=(tmp_path / "crop.png").read_bytes(),
                                     method="POST", headers={"Content-Type": "image/png"})
        with urllib.request.urlopen(req, timeout=120) as reply:
            assert json.loads(reply.read())["task"]["text"] == "HELLO"
        with urllib.request.urlopen(url + "/metadata", timeout=30) as reply:
            assert json.loads(reply.read())["pipeline"]["kind"] == "ocr"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.zoo
@pytest.mark.slow
def test_a_photo_as_npy_pixels_needs_no_opencv_and_a_damaged_pipeline_never_crashes(
        ocr_bundle, tmp_path):
    from conftest import run_py
    from packager._runtimes.runner.cascade import Cascade, pipeline_sessions, session_runner

    bundle = ocr_bundle / "out"
    np.save(tmp_path / "text.npy", rendered_text())

    def without_opencv(photo):   # a device without OpenCV: `import cv2` fails in the runner
        blocked = ("import runpy, sys; sys.modules['cv2'] = None; sys.argv = ['run.py', "
                   f"'infer', {str(photo)!r}, '--json']; runpy.run_path('run.py', "
                   "run_name='__main__')")
        return subprocess.run([sys.executable, "-I", "-c", blocked], cwd=bundle,
                              capture_output=True, text=True, timeout=300)

    r = without_opencv(tmp_path / "text.npy")
    assert r.returncode == 0, r.stderr
    assert [line["text"] for line in json.loads(r.stdout)["results"][0]["lines"]] == [
        w for w, _, _ in WORDS] + ["upside down"]
    r = without_opencv(ocr_bundle / "text.png")
    assert r.returncode == 2 and "image input needs OpenCV" in r.stderr, r.stderr
    np.save(tmp_path / "flat.npy", np.zeros((4, 4), np.float32))
    r = run_py(bundle, "infer", str(tmp_path / "flat.npy"))
    assert r.returncode == 2 and "not a photo's (H, W, 3) uint8 pixels" in r.stderr, r.stderr
    r = run_py(bundle, "infer", str(tmp_path / "text.npy"), "--out", str(tmp_path / "o.npz"))
    assert r.returncode == 2 and "--part NAME --out" in r.stderr and not list(
        tmp_path.glob("o.npz*")), r.stderr
    # every key of the pipeline section and of its parts' preprocessing damaged: the
    # manifest is refused in one line, or the cascade reads (or refuses) the photo
    manifest = json.loads((bundle / "manifest.json").read_text())
    run_part = session_runner(pipeline_sessions(str(bundle), manifest, None))
    image = cv2.resize(rendered_text(), (320, 240))
    odd = [None, True, -1, 0, 2, 1e308, float("nan"), "", "x", [], {}, [1, "a"], 10 ** 30]
    spots = [("pipeline", k) for k in ("kind", "stages")] + [
        ("pipeline", "stages", i, k) for i in range(3) for k in ("part", "step", "threshold")] + [
        ("parts", i, "preprocess", k) for i in range(3) for k in ("size", "scale", "mean",
                                                                  "layout", "resize")]
    ran = 0
    for spot in spots:
        for value in odd:
            damaged = copy.deepcopy(manifest)
            parent = damaged
            for key in spot[:-1]:
                parent = parent[key]
            parent[spot[-1]] = value
            try:
                check_manifest(damaged)
                ran += 1
                Cascade(damaged, run_part).read(image)
            except RunnerBundleError as exc:
                assert "\n" not in str(exc), (spot, value)
    assert ran   # some damage is harmless (a threshold of 0): the cascade still runs
