"""Image preprocessing specs: parse `key=value,...` strings or TOML files, check them against inputs.

The spec is plain data stored in the manifest; the runner's `preprocess()` applies it, on the host
for calibration and on the device for inference, so both preprocess alike.
"""

import math
import tomllib
from pathlib import Path
from typing import Any

from .._runtimes.runner.images import COLORS, DTYPES, LAYOUTS, MAX_SIDE, RESIZE
from ..errors import PreprocessError

KEYS = ("size", "resize", "color", "layout", "scale", "mean", "std", "dtype", "pad")
EXAMPLE = "size=224x224,resize=letterbox,color=rgb,layout=nchw,scale=1/255,mean=0.485/0.456/0.406"
# MAX_SIDE: OpenCV decodes and resizes in memory; a 16384x16384 RGB float tensor is 3 GiB


def _number(text: Any, key: str) -> float:
    """A finite number from `0.5`, `1/255` or a TOML number."""
    try:
        if isinstance(text, bool) or not isinstance(text, str | int | float):
            raise TypeError
        if isinstance(text, str) and "/" in text:
            num, den = text.split("/", 1)
            value = float(num) / float(den)
        else:
            value = float(text)
    except (ValueError, TypeError, ZeroDivisionError, OverflowError):
        raise PreprocessError(f"preprocess {key}={text!r} is not a number",
                              "use e.g. scale=1/255 or scale=0.00392" if key == "scale" else
                              f"use e.g. {key}=0.5, or one per channel split by '/': "
                              f"{key}=0.485/0.456/0.406") from None
    if not math.isfinite(value):
        raise PreprocessError(f"preprocess {key}={text!r} is not a finite number",
                              "scale, mean and std must be finite (std non-zero), e.g. "
                              "scale=1/255,mean=0.5,std=0.25")
    return value


def _numbers(value: Any, key: str) -> list[float]:
    if isinstance(value, list | tuple):
        return [_number(v, key) for v in value]
    if isinstance(value, str):
        return [_number(v, key) for v in value.split("/")]
    return [_number(value, key)]


def parse_preprocess(text: str) -> dict[str, Any]:
    """Parse an inline spec (`size=224x224,color=rgb,...`) or a path to a TOML file."""
    path = Path(text)
    if text.endswith(".toml"):
        if not path.is_file():
            raise PreprocessError(f"{path}: no such preprocessing file", "check the path")
        try:
            raw = tomllib.loads(path.read_text())
        except UnicodeDecodeError as exc:
            raise PreprocessError(f"{path}: not a text file (byte {exc.start} is not UTF-8)",
                                  "--preprocess takes a TOML file or key=value,...") from None
        except tomllib.TOMLDecodeError as exc:
            raise PreprocessError(f"{path}: not valid TOML ({exc})", "fix the syntax") from None
        raw = raw.get("preprocess", raw)
        if not isinstance(raw, dict):
            raise PreprocessError(f"{path}: 'preprocess' is not a table",
                                  "write [preprocess] then size = \"224x224\" ... under it")
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
    if max(size) > MAX_SIDE:
        raise PreprocessError(f"preprocess size={size[0]}x{size[1]} is larger than "
                              f"{MAX_SIDE}x{MAX_SIDE}", "image models take inputs of at most a "
                              "few thousand pixels a side; check the size (and --input)")
    spec: dict[str, Any] = {"size": size}
    for key, choices, default in (("resize", RESIZE, "stretch"), ("color", COLORS, "rgb"),
                                  ("layout", LAYOUTS, "nchw"), ("dtype", DTYPES, "float32")):
        value = str(raw.get(key, default)).lower()
        if value not in choices:
            raise PreprocessError(f"preprocess {key}={value!r} is not valid",
                                  f"use one of: {', '.join(choices)}")
        spec[key] = value
    spec["scale"] = _number(raw.get("scale", 1.0), "scale")
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
    pad = _number(raw.get("pad", 114), "pad")
    if pad != int(pad) or not 0 <= pad <= 255:
        raise PreprocessError(f"preprocess pad={raw['pad']!r} is not a pixel value",
                              "pad is the letterbox border's 8-bit value, an integer 0..255 "
                              "(default 114)")
    spec["pad"] = int(pad)
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
