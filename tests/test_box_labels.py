"""Issue 44 item 1: detection images with YOLO-format labels (`labels/NAME.txt` beside
`images/NAME.jpg`) make a detector's budget the labelled box mAP@0.5's drop against FP32 on the
same samples; agreement with FP32's boxes is reported, not gated."""

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_decoder_fit import yolo_like

from conftest import PREP
from packager.build.box_labels import box_truth, image_to_input, label_file, read_labels
from packager.errors import CalibrationError
from packager.quantization.box_map import average_precision, map50
from runtimes.runner.task_detect import input_to_image


def test_map50_counts_hits_in_score_order_per_class():
    truth = [np.array([[0, 0, 0, 10, 10], [1, 20, 20, 30, 30]], float)]
    perfect = [(np.array([[0, 0, 10, 10], [20, 20, 30, 30]], float), np.array([0.9, 0.8]),
                np.array([0, 1]))]
    assert map50(truth, perfect) == pytest.approx(1.0)
    # class 1's box found as class 0: class 0 keeps AP 1 (its hit ranks first), class 1 has 0
    swapped = [(perfect[0][0], perfect[0][1], np.array([0, 0]))]
    assert map50(truth, swapped) == pytest.approx(0.5)
    # a false box ranked above the hit halves the precision at full recall
    assert average_precision(np.array([0.0, 1.0]), 1) == pytest.approx(0.5)
    assert average_precision(np.array([1.0, 0.0]), 1) == pytest.approx(1.0)
    assert average_precision(np.array([1.0]), 2) == pytest.approx(0.5)   # half the boxes found


def test_labels_map_into_the_models_input_pixels_as_the_resize_placed_them():
    for resize in ("stretch", "letterbox", "center-crop"):
        spec = {"size": [320, 320], "resize": resize}
        to_input, back = image_to_input(spec, (640, 480)), input_to_image(spec, (640, 480))
        x, y = to_input(np.array([100.0, 600.0]), np.array([50.0, 400.0]))
        bx, by = back(x, y)
        np.testing.assert_allclose(bx, [100, 600], atol=1e-6)
        np.testing.assert_allclose(by, [50, 400], atol=1e-6)


def test_a_bad_label_line_is_one_error_naming_the_file_and_line(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    image = tmp_path / "images" / "a.jpg"
    image.touch()
    (tmp_path / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n1 0.5 1.5 0.2 0.2\n")
    assert label_file(image) == tmp_path / "labels" / "a.txt"
    with pytest.raises(CalibrationError, match=r"a.txt:2: '1 0.5 1.5 0.2 0.2' is not a YOLO box"):
        read_labels(label_file(image))
    (tmp_path / "labels" / "a.txt").write_text("3 0.5 0.5 0.2 0.2\n")
    with pytest.raises(CalibrationError, match="class below 2"):
        read_labels(label_file(image), classes=2)
    (tmp_path / "labels" / "a.txt").write_text("")
    assert read_labels(label_file(image)).shape == (0, 5)   # nothing to find there


def _labelled_images(folder: Path, count: int = 30) -> Path:
    """32x32 images with a bright square at a known place, each labelled with it (class 0)
    or, every third, class 1."""
    rng = np.random.default_rng(0)
    (folder / "images").mkdir(parents=True)
    (folder / "labels").mkdir()
    for i in range(count):
        image = (rng.random((48, 64, 3)) * 60).astype(np.uint8)
        x, y = int(rng.integers(4, 40)), int(rng.integers(4, 24))
        image[y:y + 16, x:x + 20] = 230
        cv2.imwrite(str(folder / "images" / f"{i:03d}.png"), image)
        (folder / "labels" / f"{i:03d}.txt").write_text(
            f"{i % 3 == 2:d} {(x + 10) / 64:.4f} {(y + 8) / 48:.4f} {20 / 64:.4f} {16 / 48:.4f}\n")
    return folder


def _int8_build(model: Path, out: Path, lines: list[str], **kwargs) -> tuple[dict, dict]:
    """Build *model* at INT8 (forced: it ships whatever the timing) without OpenVINO: (the
    manifest's decision, the shipped candidate's record)."""
    from packager.build.job import build

    build(model, out, target="x86_64-cpu", openvino="no", quant={"precision": "int8"},
          log=lines.append, **kwargs)
    decision = json.loads((out / "manifest.json").read_text())["parts"][0]["precision"][
        "decision"]
    return decision, next(c for c in decision["candidates"] if c["label"] == decision["label"])


def test_labelled_boxes_make_the_budget_the_box_map_drop(tmp_path):

    data = _labelled_images(tmp_path / "data")
    lines: list[str] = []
    decision, shipped = _int8_build(yolo_like(tmp_path / "yolo.onnx"), tmp_path / "b", lines,
                                    calib=data, preprocess=PREP)
    assert any(line.startswith("budget: 30 of the 30 images carry YOLO box labels "
                               "(labels/NAME.txt, 30 boxes)") for line in lines), lines
    assert "labelled box mAP@0.5 drop <= 1 point" in decision["budget"]
    assert "recall" not in decision["budget"]   # agreement with FP32's boxes: reported
    figures = shipped["labelled_map50"]
    assert 0.0 <= figures["candidate"] <= 1.0 and 0.0 <= figures["fp32"] <= 1.0
    assert figures["n"] == 30   # every image's boxes: 6 held out are rotated over all 30
    assert shipped["task"]["recall"] is not None   # ... reported beside it
    # 30 boxes cannot show a 1-point drop: said in the boxes' own unit
    assert decision["evidence"]["verdict"] == ("not proven: 30 labelled boxes judged, 100 "
                                               "would show a 1-point drop")


def test_box_truth_is_keyed_by_sample_and_skips_unlabelled_images(tmp_path):
    from packager.quantization.budget import fingerprint
    from packager.quantization.calibration import load_samples

    data = _labelled_images(tmp_path / "data", count=4)
    (data / "labels" / "001.txt").unlink()
    samples = load_samples(data, inputs=[{"name": "image", "shape": [1, 3, 32, 32],
                                          "dtype": "float32"}], preprocess=PREP)
    truth, count = box_truth(samples, data, PREP)
    assert count == 3 and fingerprint(samples[1]) not in truth
    boxes = truth[fingerprint(samples[0])]
    assert boxes.shape == (1, 5) and boxes[0, 0] == 0
    # letterbox of 64x48 into 32x32: half the size, 4 rows of padding above
    assert 0 <= boxes[0, 1] < boxes[0, 3] <= 32 and 4 <= boxes[0, 2] < boxes[0, 4] <= 28


def test_texts_make_a_recogniser_s_budget_the_cer_rise(tmp_path):
    """A CTC recogniser's samples that carry the text they read (a labels array of strings;
    or a PaddleOCR labels.txt beside images) make its budget the labelled CER's rise against
    FP32 (1 point); agreement with FP32's strings is reported."""
    from onnx import TensorProto, helper, numpy_helper

    from conftest import save

    rng = np.random.default_rng(0)
    alphabet, steps = ["<blank>", *"abcdefghij"], 24
    texts, xs = [], []
    for _ in range(40):
        ids = rng.integers(1, len(alphabet), int(rng.integers(3, 8)))
        logits = rng.normal(0, 0.3, (steps, len(alphabet)))
        logits[:, 0] += 2.0
        for k, c in enumerate(ids):
            logits[2 + 3 * k, c] += 4.0
        texts.append("".join(alphabet[c] for c in ids))
        xs.append(logits)
    w = np.eye(len(alphabet)) + rng.normal(0, 0.02, (len(alphabet), len(alphabet)))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"])], "ctc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, steps, len(alphabet)])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, steps, len(alphabet)])],
        [numpy_helper.from_array(w.astype(np.float32), "w")])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                 tmp_path / "ctc.onnx")
    np.savez(tmp_path / "calib.npz", x=np.asarray(xs, np.float32)[:, None], labels=np.array(texts))
    lines: list[str] = []
    decision, shipped = _int8_build(model, tmp_path / "b", lines, calib=tmp_path / "calib.npz",
                                    tasks={"model": {"kind": "ctc", "alphabet": alphabet}})
    assert any(line.startswith("budget: 40 of the 40 samples carry the text they read (the "
                               "labels array of ") for line in lines), lines
    assert "labelled CER rise <= 1 point" in decision["budget"]
    assert "exact" not in decision["budget"]   # agreement with FP32's strings: reported
    figures = shipped["labelled_cer"]
    # FP32 reads every text; 8 held out are too few: rotated, every sample's characters judge
    assert figures["fp32"] == pytest.approx(0.0) and figures["n"] == sum(map(len, texts))
    # 204 characters can show a 1-point rise (100 needed)
    assert decision["evidence"]["verdict"] == "shown"


def test_a_paddleocr_labels_file_gives_each_image_its_text(tmp_path):
    from packager.build.text_labels import text_truth
    from packager.quantization.budget import fingerprint
    from packager.quantization.calibration import load_samples

    rng = np.random.default_rng(1)
    for i in range(3):
        cv2.imwrite(str(tmp_path / f"line{i}.png"), (rng.random((16, 48, 3)) * 255).astype(np.uint8))
    (tmp_path / "labels.txt").write_text("line0.png\tabc\nline2.png\t\u7b80\u5355\n")
    samples = load_samples(tmp_path, inputs=[{"name": "x", "shape": [1, 3, 16, 48],
                                              "dtype": "float32"}], preprocess=PREP)
    truth, where = text_truth(samples, tmp_path)
    assert where.endswith("labels.txt") and len(truth) == 2   # line1 has no text: not judged
    assert truth[fingerprint(samples[0])] == "abc" and truth[fingerprint(samples[2])] == "\u7b80\u5355"
    (tmp_path / "labels.txt").write_text("line0.png abc\n")
    with pytest.raises(CalibrationError, match=r"labels.txt:1: 'line0.png abc' has no tab"):
        text_truth(samples, tmp_path)
