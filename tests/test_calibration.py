import numpy as np
import pytest

from conftest import PREP, write_images
from packager.errors import CalibrationError
from packager.quantization.calibration import load_samples, split_holdout

IMAGE_INPUT = [{"name": "image", "shape": [1, 3, 32, 32], "dtype": "float32"}]


def test_images_are_decoded_and_preprocessed(image_dir):
    samples = load_samples(image_dir, inputs=IMAGE_INPUT, preprocess=PREP)
    assert len(samples) == 20
    assert samples[0]["image"].shape == (1, 3, 32, 32)
    assert samples[0]["image"].dtype == np.float32
    assert len({s["image"].tobytes() for s in samples}) == 20


def test_batch_of_four_stacks_images(image_dir):
    inputs = [{"name": "image", "shape": [4, 3, 32, 32], "dtype": "float32"}]
    assert [s["image"].shape for s in load_samples(image_dir, inputs=inputs, preprocess=PREP)] \
        == [(4, 3, 32, 32)] * 5


def test_int64_and_float_tensors_from_npz(embed_npz):
    inputs = [{"name": "ids", "shape": [1, 12], "dtype": "int64"},
              {"name": "mask", "shape": [1, 12], "dtype": "float32"}]
    samples = load_samples(embed_npz, inputs=inputs)
    assert len(samples) == 24
    assert samples[0]["ids"].dtype == np.int64 and samples[0]["ids"].shape == (1, 12)


def test_folder_of_npy_files(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"s{i}.npy", np.full((1, 4), i, np.float32))
    samples = load_samples(tmp_path, inputs=[{"name": "x", "shape": [1, 4], "dtype": "float32"}])
    assert [float(s["x"][0, 0]) for s in samples] == [0, 1, 2]


def test_holdout_is_disjoint_from_calibration():
    samples = [{"x": np.array([i])} for i in range(10)]
    calib, held = split_holdout(samples, fraction=0.2)
    assert len(held) == 2 and len(calib) == 8
    assert not {int(s["x"][0]) for s in calib} & {int(s["x"][0]) for s in held}


def test_empty_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(CalibrationError, match="no calibration data"):
        load_samples(tmp_path, inputs=IMAGE_INPUT, preprocess=PREP)


def test_every_unreadable_image_is_named_at_once(tmp_path):
    write_images(tmp_path, 3)
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated jpeg")
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(CalibrationError) as caught:
        load_samples(tmp_path, inputs=IMAGE_INPUT, preprocess=PREP)
    message = caught.value.message
    assert message.startswith(f"2 of the 5 calibration images in {tmp_path} cannot be used: ")
    assert "cannot be used: broken.jpg: not a readable image" in message
    assert "; empty.png: " in message
    assert "\n" not in str(caught.value) and "remove or re-save them" in caught.value.hint
    for i in range(8):
        (tmp_path / f"bad_{i}.png").write_bytes(b"not a png")
    with pytest.raises(CalibrationError) as caught:
        load_samples(tmp_path, inputs=IMAGE_INPUT, preprocess=PREP)
    assert caught.value.message.startswith("10 of the 13 ")
    assert caught.value.message.endswith("; and 5 more")


def write_png(path, pixels: np.ndarray, color_type: int) -> None:
    """An 8-bit PNG of *color_type* (4: grey + alpha, which OpenCV cannot write)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    h, w = pixels.shape[:2]
    rows = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8,
                                                                          color_type, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_grey_and_rgba_images_are_converted_to_the_model_s_colours(tmp_path):
    """color= converts, never refuses: a grey PNG (and grey+alpha, RGBA) feeds an RGB model as
    the grey repeated in three channels; a colour photo feeds a grey model as its luma."""
    import cv2

    grey = np.arange(32 * 32, dtype=np.uint8).reshape(32, 32)
    cv2.imwrite(str(tmp_path / "grey.png"), grey)
    write_png(tmp_path / "grey_alpha.png", np.dstack([grey, np.full_like(grey, 200)]), 4)
    rgba = np.dstack([np.full_like(grey, 10), np.full_like(grey, 20), grey,
                      np.full_like(grey, 255)])   # BGRA as OpenCV writes it
    cv2.imwrite(str(tmp_path / "rgba.png"), rgba)
    spec = {**PREP, "size": [32, 32], "resize": "stretch", "color": "rgb", "layout": "nchw",
            "scale": 1.0, "mean": None, "std": None, "dtype": "float32"}
    samples = load_samples(tmp_path, inputs=IMAGE_INPUT, preprocess=spec)
    by_name = dict(zip(["grey", "grey_alpha", "rgba"], samples, strict=True))
    for name in ("grey", "grey_alpha"):
        image = by_name[name]["image"][0]
        assert all((image[c] == grey).all() for c in range(3))
    assert (by_name["rgba"]["image"][0][0] == grey).all()      # R (last in BGRA) comes first
    assert (by_name["rgba"]["image"][0][2] == 10).all()
    cv2.imwrite(str(tmp_path / "colour.png"), rgba[:, :, :3])
    luma = cv2.cvtColor(rgba[:, :, :3], cv2.COLOR_BGR2GRAY)
    grey_input = [{"name": "image", "shape": [1, 1, 32, 32], "dtype": "float32"}]
    samples = load_samples(tmp_path / "colour.png", inputs=grey_input,
                           preprocess={**spec, "color": "gray"})
    assert samples[0]["image"].shape == (1, 1, 32, 32)
    assert (samples[0]["image"][0, 0] == luma).all()


def test_npz_with_wrong_shape_or_dtype(tmp_path):
    inputs = [{"name": "ids", "shape": [1, 12], "dtype": "int64"}]
    np.savez(tmp_path / "a.npz", ids=np.zeros((1, 11), np.int64))
    with pytest.raises(CalibrationError, match="shape \\[1, 11\\].*\\[1, 12\\]"):
        load_samples(tmp_path / "a.npz", inputs=inputs)
    np.savez(tmp_path / "b.npz", ids=np.zeros((1, 12), np.float32))
    with pytest.raises(CalibrationError, match="float32 values.*int64"):
        load_samples(tmp_path / "b.npz", inputs=inputs)


def test_e72_labels_of_a_capped_image_folder_follow_the_same_picks(tmp_path):
    """600 images (class folder a: white, b: black) are thinned to MAX_SAMPLES; the metric's
    labels for the held-out samples must be those of the very images held out."""
    import cv2

    from packager.quantization.calibration import MAX_SAMPLES, sample_labels
    from packager.quantization.preprocessing import parse_preprocess

    for i in range(600):
        folder = tmp_path / ("a" if i % 2 else "b")
        folder.mkdir(exist_ok=True)
        cv2.imwrite(str(folder / f"{i:04d}.png"), np.full((8, 8, 3), 255 if i % 2 else 0,
                                                          np.uint8))
    samples = load_samples(tmp_path, inputs=[{"name": "image", "shape": [1, 3, 8, 8],
                                              "dtype": "float32"}],
                           preprocess=parse_preprocess("size=8x8,scale=1/255"))
    assert len(samples) == MAX_SAMPLES
    _, held = split_holdout(samples, fraction=0.2)
    labels = sample_labels(tmp_path, len(samples), 0.2)
    assert labels is not None and len(labels) == len(held)
    assert [("a" if float(h["image"].mean()) > 0.5 else "b") for h in held] == labels


def test_calibration_sets_too_big_for_the_quantizer_are_thinned_evenly(cnn_onnx):
    from packager.graph.modelio import load_model
    from packager.graph.shapes import fix_shapes_proto
    from packager.quantization.calibration import activation_bytes, fit_memory

    model = fix_shapes_proto(load_model(cnn_onnx), {}, batch=1, strict=False)
    per = activation_bytes(model)
    out = model.graph.output[0].type.tensor_type.shape.dim
    assert per > 4 * int(np.prod([d.dim_value for d in out]))   # more than the output alone
    samples = [{"x": np.full((1,), i, np.float32)} for i in range(40)]
    assert fit_memory(samples, per, budget=40 * per) == samples      # fits: all of them
    kept = fit_memory(samples, per, budget=20 * per, floor=4)
    assert len(kept) == 20 and kept == fit_memory(samples, per, budget=20 * per, floor=4)
    picked = [int(s["x"][0]) for s in kept]
    assert picked[0] <= 1 and picked[-1] >= 38                      # spread over the whole set
    assert len(fit_memory(samples, per, budget=per, floor=8)) == 8  # never below the floor


def test_hygiene_notes_a_small_set_and_held_out_samples_unlike_it():
    from packager.quantization.budget import SMALL_CALIBRATION, hygiene

    rng = np.random.default_rng(0)

    def batch(n, loc=0.0, scale=1.0):
        return [{"x": (rng.standard_normal((1, 3, 8, 8)) * scale + loc).astype(np.float32),
                 "ids": np.zeros((1, 4), np.int64)} for _ in range(n)]

    calib = batch(SMALL_CALIBRATION)
    assert hygiene(calib, batch(8)) == []
    assert "only 4 calibration samples" in hygiene(batch(4), batch(4))[0]
    shifted = hygiene(calib, batch(8, loc=2.0))
    assert len(shifted) == 1 and shifted[0].startswith("input x: held-out samples differ")
    wider = hygiene(calib, batch(8, scale=3.0))
    assert len(wider) == 1 and "std 2.9" in wider[0] or "std 3" in wider[0]
