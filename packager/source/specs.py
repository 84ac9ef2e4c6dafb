"""Tensor specs from the command line: `[PART/]NAME:1x3x224x224[:dtype]` and dynamic axes."""

from dataclasses import dataclass
from typing import Any

from ..errors import SpecError

DTYPES = ("float32", "float16", "int64", "int32", "bool", "uint8", "int8")
# one input of 2**28 elements is 1 GiB of float32: far above any edge model's input, and an
# example tensor of that size is still allocated in a second, not a MemoryError minutes later
MAX_INPUT_ELEMENTS = 2 ** 28
MAX_CONST_BYTES = 256 * 2 ** 20   # a --const .npy: flags, rates and states are far smaller


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
    if not _is_shape(dims):
        raise SpecError(f"--input {value!r}: the shape {dims!r} is not dimensions joined by x",
                        "for example image:1x3x224x224 (a scalar input: NAME:1)")
    if any(len(d.lstrip("0")) > 18 for d in dims.lower().split("x")):
        raise SpecError(f"--input {value!r}: a dimension is over 18 digits, beyond the limit of "
                        f"{MAX_INPUT_ELEMENTS:,} (2**28) elements per input",
                        "give the shape one sample has, e.g. image:1x3x224x224")
    shape = tuple(int(d) for d in dims.lower().split("x"))
    if any(d < 1 for d in shape):
        raise SpecError(f"--input {value!r}: dimensions must be >= 1",
                        "give the static size; mark axes dynamic with --dynamic NAME:0=batch")
    elements = 1
    for d in shape:
        elements *= d
    if elements > MAX_INPUT_ELEMENTS:
        raise SpecError(f"--input {value!r}: {elements:,} elements, over the limit of "
                        f"{MAX_INPUT_ELEMENTS:,} (2**28) elements per input",
                        "give the shape one sample has, e.g. image:1x3x224x224")
    return TensorSpec(name, shape, dtype, part or None)


def _is_shape(text: str) -> bool:
    parts = text.lower().split("x")
    return bool(text) and all(p.isascii() and p.isdigit() for p in parts)


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


    result: dict[str, Any] = {}
    for key, text in parse_assignments(values, "--const").items():
        if text.endswith(".npy"):
            result[key] = _read_npy(key, text)
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


def _read_npy(key: str, text: str) -> Any:
    """A `--const NAME=FILE.npy` array: a regular file (a FIFO would block) in .npy format."""
    import os
    import stat

    import numpy as np

    where = f"--const {key}={text}"
    try:
        info = os.stat(text)
    except OSError as exc:
        raise SpecError(f"{where}: cannot read the file ({exc.strerror})",
                        "give the path of a .npy file saved with numpy.save") from None
    if not stat.S_ISREG(info.st_mode):
        raise SpecError(f"{where}: not a regular file (a FIFO, device or folder)",
                        "give a .npy file saved with numpy.save")
    if info.st_size > MAX_CONST_BYTES:
        raise SpecError(f"{where}: {info.st_size:,} bytes, over the {MAX_CONST_BYTES:,}-byte "
                        "limit for a frozen input", "freeze small values (flags, rates, states)")
    try:
        with open(text, "rb") as f:
            if f.read(6) != b"\x93NUMPY":
                raise SpecError(f"{where}: not a .npy file (no NumPy header)",
                                "save the value with numpy.save(path, array)")
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise SpecError(f"{where}: not a readable .npy file ({exc})",
                        "save it with numpy.save") from None


def shapes_of(specs: list[TensorSpec]) -> dict[str, list[int]]:
    return {s.name: list(s.shape) for s in specs}
