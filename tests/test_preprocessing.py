import numpy as np
import pytest

from packager._runtimes.runner.images import preprocess
from packager.errors import PreprocessError
from packager.quantization.preprocessing import check_fits, parse_preprocess


def test_inline_spec_parses_fractions_and_per_channel_values():
    spec = parse_preprocess("size=224x160,resize=letterbox,color=rgb,layout=nchw,scale=1/255,"
                            "mean=0.485/0.456/0.406,std=0.229/0.224/0.225")
    assert spec["size"] == [224, 160]
    assert spec["scale"] == pytest.approx(1 / 255)
    assert spec["mean"] == [0.485, 0.456, 0.406]
    assert spec["resize"] == "letterbox" and spec["dtype"] == "float32"


def test_toml_file_spec(tmp_path):
    path = tmp_path / "prep.toml"
    path.write_text('[preprocess]\nsize = [64, 48]\ncolor = "gray"\nlayout = "nhwc"\n'
                    'scale = 0.5\nmean = 0.5\n')
    spec = parse_preprocess(str(path))
    assert spec["size"] == [64, 48] and spec["color"] == "gray" and spec["mean"] == [0.5]


@pytest.mark.parametrize("text, match", [
    ("size=224", None), ("color=rgb", "no size"), ("size=2x2,resize=squash", "resize"),
    ("size=2x2,scale=1/0", "scale"), ("size=2x2,mean=1/2", "2 values for 3"),
    ("size=2x2,speed=fast", "unknown preprocess key 'speed'"), ("size=axb", "WIDTHxHEIGHT"),
])
def test_bad_specs(text, match):
    if match is None:
        assert parse_preprocess(text)["size"] == [224, 224]
        return
    with pytest.raises(PreprocessError, match=match):
        parse_preprocess(text)


def test_spec_must_fit_the_input():
    spec = parse_preprocess("size=224x224")
    check_fits(spec, "image", [1, 3, 224, 224], "float32")
    with pytest.raises(PreprocessError, match="use size=96x64"):
        check_fits(spec, "image", [1, 3, 64, 96], "float32")
    with pytest.raises(PreprocessError, match="color=gray"):
        check_fits(spec, "image", [1, 1, 224, 224], "float32")
    with pytest.raises(PreprocessError, match="layout nhwc"):
        check_fits(spec, "image", [1, 224, 224, 3], "float32")


def test_resize_modes_and_color_order():
    img = np.zeros((20, 40, 3), np.uint8)
    img[:, :, 0] = 255  # blue in OpenCV's BGR order
    base = {"size": [10, 10], "color": "rgb", "layout": "nhwc", "scale": 1.0, "mean": None,
            "std": None, "dtype": "float32", "pad": 7}
    box = preprocess(img[:, :, ::-1].copy(), {**base, "resize": "letterbox"})
    assert box.shape == (1, 10, 10, 3)
    assert (box[0, 0, 0] == 7).all()             # padding rows above the 2:1 image
    assert box[0, 5, 5].tolist() == [0, 0, 255]  # rgb: blue is last
    crop = preprocess(img, {**base, "resize": "center-crop", "layout": "nchw"})
    assert crop.shape == (1, 3, 10, 10) and (crop[0, 0] == 255).all()
    u8 = preprocess(img, {**base, "resize": "stretch", "dtype": "uint8"})
    assert u8.dtype == np.uint8


def test_the_device_converts_a_photo_to_the_model_s_colours():
    """The runner's decoder (host and device share it): a colour JPEG for a grey model comes
    out as its luma, a grey PNG for a colour model as three equal channels."""
    import cv2

    from packager._runtimes.runner.images import decode_image

    bgr = np.zeros((8, 8, 3), np.uint8)
    bgr[:, :, 2] = 200   # red
    png = np.frombuffer(cv2.imencode(".png", bgr)[1].tobytes(), np.uint8)
    grey = decode_image(png, {"color": "gray"}, "red.png")
    assert grey.shape == (8, 8, 1)
    assert int(grey[0, 0, 0]) == int(cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)[0, 0])
    flat = np.frombuffer(cv2.imencode(".png", np.full((8, 8), 77, np.uint8))[1].tobytes(),
                         np.uint8)
    for color in ("rgb", "bgr"):
        assert (decode_image(flat, {"color": color}, "grey.png") == 77).all()
        assert decode_image(flat, {"color": color}, "grey.png").shape == (8, 8, 3)


def test_a_list_in_another_separator_is_told_the_per_channel_form():
    """mean=0.485|0.456|0.406 (rapid-layout's ImageNet values, '|' as --task lists take them)
    was told "use e.g. scale=1/255": the hint now shows mean's own per-channel form."""
    with pytest.raises(PreprocessError) as info:
        parse_preprocess("size=8x8,mean=0.485|0.456|0.406")
    assert "mean='0.485|0.456|0.406' is not a number" in str(info.value)
    assert "mean=0.485/0.456/0.406" in info.value.hint and "scale" not in info.value.hint
    with pytest.raises(PreprocessError) as info:
        parse_preprocess("size=8x8,scale=x")
    assert "scale=1/255" in info.value.hint
