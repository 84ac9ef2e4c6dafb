"""Image preprocessing specs: parse `key=value,...` strings or TOML files, check them against inputs.

The spec is plain data stored in the manifest; the runner's `preprocess()` applies it, on the host
for calibration and on the device for inference, so both preprocess alike.
"""

import tomllib
from pathlib import Path
from typing import Any

from .errors import PreprocessError

RESIZE = ("stretch", "letterbox", "center-crop")
COLORS = ("rgb", "bgr", "gray")
LAYOUTS = ("nchw", "nhwc")
DTYPES = ("float32", "float16", "uint8")
KEYS = ("size", "resize", "color", "layout", "scale", "mean", "std", "dtype", "pad")
EXAMPLE = "size=224x224,resize=letterbox,color=rgb,layout=nchw,scale=1/255,mean=0.485/0.456/0.406"


def _number(text: str, key: str) -> float:
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        raise PreprocessError(f"preprocess {key}={text!r} is not a number",
                              "use e.g. scale=1/255 or scale=0.00392") from None


def _numbers(value: Any, key: str) -> list[float]:
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    if isinstance(value, (int, float)):
        return [float(value)]
    return [_number(v, key) for v in str(value).split("/")]


def parse_preprocess(text: str) -> dict[str, Any]:
    """Parse an inline spec (`size=224x224,color=rgb,...`) or a path to a TOML file."""
    path = Path(text)
    if text.endswith(".toml"):
        if not path.is_file():
            raise PreprocessError(f"{path}: no such preprocessing file", "check the path")
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise PreprocessError(f"{path}: not valid TOML ({exc})", "fix the syntax") from None
        raw = raw.get("preprocess", raw)
    else:
        raw = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise PreprocessError(f"preprocess item {item!r} is not key=value",
                                      f"write it like {EXAMPLE}")
            raw[key.strip()] = value.strip()
    return normalize_preprocess(raw)


def normalize_preprocess(raw: dict[str, Any]) -> dict[str, Any]:
    """Validate a spec and return it with every key present and typed."""
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise PreprocessError(f"unknown preprocess key '{unknown[0]}'", f"keys: {', '.join(KEYS)}")
    if "size" not in raw:
        raise PreprocessError("the preprocess spec has no size", "add size=WIDTHxHEIGHT")
    size = raw["size"]
    try:
        if isinstance(size, str):
            size = [int(s) for s in size.lower().split("x")]
        size = [int(s) for s in size]
        if len(size) == 1:
            size = size * 2
        if len(size) != 2 or min(size) < 1:
            raise ValueError
    except (TypeError, ValueError):
        raise PreprocessError(f"preprocess size={raw['size']!r} is not WIDTHxHEIGHT",
                              "use e.g. size=224x224") from None
    spec: dict[str, Any] = {"size": size}
    for key, choices, default in (("resize", RESIZE, "stretch"), ("color", COLORS, "rgb"),
                                  ("layout", LAYOUTS, "nchw"), ("dtype", DTYPES, "float32")):
        value = str(raw.get(key, default)).lower()
        if value not in choices:
            raise PreprocessError(f"preprocess {key}={value!r} is not valid",
                                  f"use one of: {', '.join(choices)}")
        spec[key] = value
    scale = raw.get("scale", 1.0)
    spec["scale"] = _number(scale, "scale") if isinstance(scale, str) else float(scale)
    channels = 1 if spec["color"] == "gray" else 3
    for key in ("mean", "std"):
        if raw.get(key) is None:
            spec[key] = None
            continue
        values = _numbers(raw[key], key)
        if len(values) == 1:
            values = values * channels
        if len(values) != channels:
            raise PreprocessError(f"preprocess {key} has {len(values)} values for {channels} "
                                  f"channel(s) (color={spec['color']})", "give one per channel")
        if key == "std" and min(values) == 0:
            raise PreprocessError("preprocess std contains 0", "std values must be non-zero")
        spec[key] = values
    pad = raw.get("pad", 114)
    spec["pad"] = int(_number(pad, "pad") if isinstance(pad, str) else pad)
    return spec


def spec_shape(spec: dict[str, Any], batch: int) -> list[int]:
    """The input shape a spec produces for *batch* images."""
    width, height = spec["size"]
    channels = 1 if spec["color"] == "gray" else 3
    if spec["layout"] == "nchw":
        return [batch, channels, height, width]
    return [batch, height, width, channels]


def check_fits(spec: dict[str, Any], name: str, shape: list, dtype: str) -> None:
    """Raise PreprocessError unless the spec produces tensors that fit input *name*."""
    want = spec_shape(spec, shape[0] if shape and isinstance(shape[0], int) else 1)
    layout = spec["layout"]
    if len(shape) != 4:
        raise PreprocessError(f"input '{name}' has shape {shape}, image preprocessing makes "
                              f"rank-4 {layout.upper()} tensors",
                              "pass .npy/.npz calibration tensors for this input")
    for i, (w, h) in enumerate(zip(want, shape, strict=True)):
        if i and isinstance(h, int) and h > 0 and w != h:
            hint = _fit_hint(shape, layout)
            raise PreprocessError(f"the preprocess spec makes {'x'.join(map(str, want))} "
                                  f"({layout}, size={spec['size'][0]}x{spec['size'][1]}, "
                                  f"color={spec['color']}) but input '{name}' is "
                                  f"{'x'.join(map(str, shape))}", hint)
    if spec["dtype"] != dtype:
        raise PreprocessError(f"the preprocess spec makes {spec['dtype']} tensors but input "
                              f"'{name}' is {dtype}", f"use dtype={dtype}")


def _fit_hint(shape: list, layout: str) -> str:
    if layout == "nchw":
        c, h, w = shape[1], shape[2], shape[3]
    else:
        h, w, c = shape[1], shape[2], shape[3]
    color = "color=gray" if c == 1 else "color=rgb (or bgr)"
    if not (isinstance(c, int) and c in (1, 3)):
        other = "nhwc" if layout == "nchw" else "nchw"
        return f"is the layout {other}? the channel dim is {c}"
    return f"use size={w}x{h}, {color}, layout={layout}"
