"""Tensor specs from the command line: `[PART/]NAME:1x3x224x224[:dtype]` and dynamic axes."""

from dataclasses import dataclass
from typing import Any

from ..errors import SpecError

DTYPES = ("float32", "float16", "int64", "int32", "bool", "uint8", "int8")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    part: str | None = None   # which part of a multi-part model the input belongs to

    def describe(self) -> str:
        return f"{self.name}:{'x'.join(map(str, self.shape))}:{self.dtype}"


def parse_input(value: str) -> TensorSpec:
    """`image:1x3x224x224`, `ids:1x128:int64`, `encoder/tokens:1x32:int64`."""
    fields = value.rsplit(":", 2)
    dtype = "float32"
    if len(fields) == 3 and not _is_shape(fields[2]):
        name, dims, dtype = fields
    elif len(fields) >= 2 and _is_shape(fields[-1]):
        name, dims = value.rsplit(":", 1)
    else:
        raise SpecError(f"--input {value!r} is not NAME:1x3x224x224[:dtype]",
                        f"for example image:1x3x224x224 or input_ids:1x128:int64 "
                        f"(dtypes: {', '.join(DTYPES)})")
    if dtype not in DTYPES:
        raise SpecError(f"--input {value!r}: unknown dtype '{dtype}'", f"use one of {', '.join(DTYPES)}")
    part, _, name = name.rpartition("/") if "/" in name else (None, "", name)
    if not name:
        raise SpecError(f"--input {value!r} has no input name", "write NAME:1x3x224x224")
    shape = tuple(int(d) for d in dims.lower().split("x"))
    if any(d < 1 for d in shape):
        raise SpecError(f"--input {value!r}: dimensions must be >= 1",
                        "give the static size; mark axes dynamic with --dynamic NAME:0=batch")
    return TensorSpec(name, shape, dtype, part or None)


def _is_shape(text: str) -> bool:
    parts = text.lower().split("x")
    return bool(text) and all(p.isdigit() for p in parts)


def parse_dynamic(values: tuple[str, ...] | list[str]) -> dict[str, dict[int, str]]:
    """`--dynamic ids:0=batch,1=seq` -> {"ids": {0: "batch", 1: "seq"}}."""
    result: dict[str, dict[int, str]] = {}
    for value in values:
        name, sep, axes = value.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            parsed = {}
            for item in axes.split(","):
                axis, eq, label = item.partition("=")
                parsed[int(axis)] = label.strip() or f"{name}_dim{axis}"
                if eq and not label.strip():
                    raise ValueError
        except ValueError:
            raise SpecError(f"--dynamic {value!r} is not NAME:AXIS=label[,AXIS=label]",
                            "for example --dynamic input_ids:0=batch,1=sequence") from None
        result.setdefault(name, {}).update(parsed)
    return result


def parse_assignments(values: tuple[str, ...] | list[str], option: str) -> dict[str, str]:
    """`KEY=VALUE` pairs (--part, --factory-arg, --calib PART=DIR) in the order given."""
    result: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key.strip() or not rest.strip():
            raise SpecError(f"{option} {value!r} is not KEY=VALUE", f"for example {option} name=value")
        if key.strip() in result:
            raise SpecError(f"{option} {key.strip()!r} is given twice", "give each key once")
        result[key.strip()] = rest.strip()
    return result


def parse_consts(values: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """`--const sr=16000`, `--const flags=[1,0]`, `--const state=zeros.npy` -> {name: value}."""
    import ast

    import numpy as np

    result: dict[str, Any] = {}
    for key, text in parse_assignments(values, "--const").items():
        if text.endswith(".npy"):
            try:
                result[key] = np.load(text, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise SpecError(f"--const {key}={text}: not a readable .npy file ({exc})",
                                "save it with numpy.save") from None
            continue
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise SpecError(f"--const {key}={text!r} is not a number, list or .npy file",
                            "for example --const sr=16000 or --const flags=[1,0]") from None
        if not isinstance(value, int | float | bool | list | tuple):
            raise SpecError(f"--const {key}={text!r} is not a number, list or .npy file",
                            "for example --const sr=16000 or --const flags=[1,0]")
        result[key] = value
    return result


def shapes_of(specs: list[TensorSpec]) -> dict[str, list[int]]:
    return {s.name: list(s.shape) for s in specs}
