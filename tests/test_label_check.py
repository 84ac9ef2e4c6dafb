"""Preprocessing sanity: with class folders, build measures the FP32 model's own top-1 on the
labelled images first, and stops (exit 1, one line) when it is no better than guessing."""

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from conftest import save
from packager.build.label_check import MIN_CHECKED, chance_p_value
from packager.cli import main

CLASSES = {"0_red": 2, "1_green": 1, "2_blue": 0}   # folder -> its strong channel in BGR


def colour_model(path: Path, batch: int = 1) -> Path:
    """Scores = the mean of each input channel: a photo's strongest colour wins (R, G, B)."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "w"], ["c"]),
         helper.make_node("GlobalAveragePool", ["c"], ["g"]),
         helper.make_node("Flatten", ["g"], ["scores"])], "colours",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor("w", TensorProto.FLOAT, [3, 3, 1, 1],
                            np.eye(3, dtype=np.float32).ravel().tolist())])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def photos(folder: Path, per_class: int) -> Path:
    rng = np.random.default_rng(0)
    for name, channel in CLASSES.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            image = rng.integers(0, 90, (20, 24, 3), dtype=np.uint8)
            image[:, :, channel] += 120
            cv2.imwrite(str(folder / name / f"{i:02d}.png"), image)
    return folder


def build(model: Path, calib: Path, out: Path, color: str, *extra: str):
    return CliRunner().invoke(main, ["build", str(model), "--calib", str(calib), "--preprocess",
                                     f"size=16x16,color={color},scale=1/255", "-o", str(out),
                                     "--precision", "fp32", *extra], catch_exceptions=False)


def test_chance_is_a_binomial_tail():
    assert chance_p_value(0, 30, 1 / 3) == pytest.approx(1.0)
    assert chance_p_value(10, 30, 1 / 3) > 0.5            # a third right among three: guessing
    assert chance_p_value(30, 30, 1 / 3) < 1e-12
    assert chance_p_value(8, 20, 0.1) < 0.001             # 40 % among ten classes is not chance


def test_a_model_fed_the_wrong_colour_order_stops_the_build(tmp_path):
    model = colour_model(tmp_path / "colours.onnx")
    calib = photos(tmp_path / "calib", per_class=10)
    good = build(model, calib, tmp_path / "good", "rgb")
    assert good.exit_code == 0, good.output
    assert "labels: the FP32 model itself scores 100.0 % top-1 on your 30 labelled images " \
           "(3 classes, chance 33.3 %; class folders in sorted order as outputs 0..2)" in good.output
    part = json.loads((tmp_path / "good" / "manifest.json").read_text())["parts"][0]
    assert part["precision"]["labelled_top1"]["hits"] == 30
    bad = build(model, calib, tmp_path / "bad", "bgr")   # red and blue swapped: a third right
    errors = [line for line in bad.output.splitlines() if line.startswith("error: ")]
    assert bad.exit_code == 1 and len(errors) == 1, bad.output
    assert "the FP32 model itself scores 33.3 % top-1 on your 30 labelled images" in errors[0]
    assert "no better than guessing; check --preprocess (color rgb/bgr, mean/std" in errors[0]
    assert "Traceback" not in bad.output and not (tmp_path / "bad").exists()
    # --labels matches outputs to folders by name: a file in another order is followed
    labels = tmp_path / "labels.txt"
    labels.write_text("0_red\n1_green\n2_blue\n")
    named = build(model, calib, tmp_path / "named", "rgb", "--labels", str(labels))
    assert named.exit_code == 0 and "folder names matched to --labels" in named.output
    # folders named by class number: 0, 1, 2 are the outputs whatever their sorted order
    numbered = tmp_path / "numbered"
    numbered.mkdir()
    for folder, number in (("0_red", "0"), ("1_green", "1"), ("2_blue", "2")):
        (calib / folder).rename(numbered / number)
    result = build(model, numbered, tmp_path / "numbers", "rgb")
    assert result.exit_code == 0 and "folder names as output numbers" in result.output


def test_a_batch_of_four_images_a_sample_is_checked_image_by_image(tmp_path):
    """At batch 4 each calibration sample holds 4 consecutive images: their folders are their
    labels, so the check still runs (it was skipped: no output had one score a sample)."""
    model = colour_model(tmp_path / "colours4.onnx", batch=4)
    calib = photos(tmp_path / "calib", per_class=10)   # 30 images: 7 samples of 4
    good = build(model, calib, tmp_path / "good", "rgb")
    assert good.exit_code == 0, good.output
    assert "the FP32 model itself scores 100.0 % top-1 on your 28 labelled images" in good.output
    bad = build(model, calib, tmp_path / "bad", "bgr")   # only the 10 green images right
    assert bad.exit_code == 1, bad.output
    assert "scores 35.7 % top-1 on your 28 labelled images" in bad.output
    assert "no better than guessing" in bad.output and not (tmp_path / "bad").exists()


def test_too_few_or_unmatched_labelled_images_are_said_not_judged(tmp_path):
    model = colour_model(tmp_path / "colours.onnx")
    few = photos(tmp_path / "few", per_class=MIN_CHECKED // 3 - 1)
    result = build(model, few, tmp_path / "b1", "bgr")
    assert result.exit_code == 0, result.output
    assert f"(under {MIN_CHECKED} images: not judged)" in result.output
    labels = tmp_path / "labels.txt"
    labels.write_text("red\ngreen\nblue\n")
    result = build(model, few, tmp_path / "b2", "bgr", "--labels", str(labels))
    assert result.exit_code == 0, result.output
    assert "preprocessing not checked on the class folders: class folder '0_red' is not among " \
           "--labels" in result.output


def test_the_metric_shows_in_the_accuracy_line():
    from packager.quantization.budget import accuracy_line

    acc = {"cosine_min": 0.99, "cosine_mean": 0.995, "max_abs": 0.1, "samples": 8,
           "metric": "f1", "metric_fp32": 0.91, "metric_quantized": 0.905}
    assert ", f1 0.905 against FP32's 0.91 (8 samples)" in accuracy_line(acc)


def _with_metadata(model, path, **props):
    import onnx

    proto = onnx.load(str(model))
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))
    return path


def test_class_names_come_from_the_models_metadata_when_labels_are_not_given(cnn_onnx, image_dir,
                                                                          tmp_path):
    """Issue 36: a model that names its classes in its metadata (Ultralytics `names`, Hugging
    Face `id2label`, PaddlePaddle `character`, `labels`) gets them as the bundle's labels
    without --labels; names that do not fit its class scores are not used, and say why."""
    import json

    import onnx

    from conftest import PREP
    from packager.build.job import build
    from packager.graph.metadata import class_names

    names = {i: f"kind{i}" for i in range(10)}
    model = _with_metadata(cnn_onnx, tmp_path / "named.onnx", names=repr(names))
    assert class_names(onnx.load(str(model))) == ([f"kind{i}" for i in range(10)], "names")
    hf = _with_metadata(cnn_onnx, tmp_path / "hf.onnx",
                        id2label=json.dumps({str(i): f"c{i}" for i in range(10)}))
    assert class_names(onnx.load(str(hf)))[0][9] == "c9"
    lines = []
    out = build(model, tmp_path / "b", target="x86_64-cpu", calib=image_dir, preprocess=PREP,
                quant={"precision": "fp32"}, log=lines.append)
    assert out.bundle.manifest["parts"][0]["labels"] == [f"kind{i}" for i in range(10)]
    assert any("10 class names from the model's metadata 'names'" in line for line in lines)
    # the classes named without doubt: a classify task, applied by default and said
    assert out.bundle.manifest["parts"][0]["task"]["kind"] == "classify"
    assert any(line.startswith("task: classify, applied by default: the model's metadata "
                               "'names' names its 10 classes") for line in lines), lines
    raw = build(model, tmp_path / "r", target="x86_64-cpu", calib=image_dir, preprocess=PREP,
                quant={"precision": "fp32"}, tasks={"model": {"kind": "raw"}})
    assert not raw.bundle.manifest["parts"][0].get("task")   # --task raw opts out
    wrong = _with_metadata(cnn_onnx, tmp_path / "wrong.onnx", labels="a,b,c")
    lines = []
    out = build(wrong, tmp_path / "w", target="x86_64-cpu", calib=image_dir, preprocess=PREP,
                quant={"precision": "fp32"}, log=lines.append)
    assert "labels" not in out.bundle.manifest["parts"][0] or \
        out.bundle.manifest["parts"][0]["labels"] is None
    assert any("names 3 classes, not used" in line for line in lines), lines
