"""Calibration samples from a folder of images (decoded by OpenCV) or .npy / .npz tensors."""

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CalibrationError
from ..graph.execute import Sample

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
TENSOR_SUFFIXES = (".npy", ".npz")


def list_sources(source: Path) -> list[Path]:
    """Image and tensor files under *source* (a folder, searched recursively, or one file)."""
    source = Path(source)
    if not source.exists():
        raise CalibrationError(f"{source}: no such calibration file or folder", "check --calib")
    if source.is_file():
        files = [source]
    else:
        files = sorted(p for p in source.rglob("*") if p.is_file() and not p.name.startswith("."))
    usable = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES + TENSOR_SUFFIXES]
    if not usable:
        raise CalibrationError(f"{source}: no calibration data (no {'/'.join(IMAGE_SUFFIXES)} "
                               "images or .npy/.npz tensors)",
                               "point --calib at a folder of representative inputs")
    kinds = {p.suffix.lower() in IMAGE_SUFFIXES for p in usable}
    if len(kinds) > 1:
        raise CalibrationError(f"{source}: mixes images and tensor files",
                               "keep images and .npy/.npz files in separate folders")
    return usable


def is_image_source(files: Sequence[Path]) -> bool:
    return files[0].suffix.lower() in IMAGE_SUFFIXES


def peek_shapes(source: Path) -> dict[str, list[int]]:
    """Shapes of the first tensor sample (to fix dynamic dims); {} for image folders."""
    files = list_sources(source)
    if is_image_source(files):
        return {}
    first = files[0]
    if first.suffix.lower() == ".npz":
        with np.load(first) as f:
            return {k: list(f[k].shape) for k in f.files}
    return {"": list(np.load(first, mmap_mode="r").shape)}


def _split_samples(name: str, arr: np.ndarray, shape: list[int], path: Path) -> list[np.ndarray]:
    if list(arr.shape) == list(shape):
        return [arr]
    if arr.ndim == len(shape) + 1 and list(arr.shape[1:]) == list(shape):
        return [np.asarray(a) for a in arr]   # a 1-D array of scalars yields numpy scalars
    if shape and shape[0] == 1 and arr.ndim == len(shape) and list(arr.shape[1:]) == shape[1:]:
        return [a[None] for a in arr]
    raise CalibrationError(f"{path}: '{name}' has shape {list(arr.shape)}, the model input is "
                           f"{shape}", f"save samples shaped {shape} or N x {shape}")


def _cast(arr: np.ndarray, dtype: str, name: str, path: Path) -> np.ndarray:
    target = np.dtype(dtype)
    if arr.dtype == target:
        return arr
    if target.kind in "iu" and arr.dtype.kind == "f":
        raise CalibrationError(f"{path}: '{name}' holds {arr.dtype} values, the model input is "
                               f"{dtype}", f"save it as {dtype} (token ids, indices)")
    if target.kind == "b" and arr.dtype.kind not in "biu":
        raise CalibrationError(f"{path}: '{name}' is {arr.dtype}, the input is bool",
                               "save it as bool")
    if arr.dtype.kind not in "biufc":
        raise CalibrationError(f"{path}: '{name}' holds {arr.dtype} values, not numbers",
                               f"save it as a numeric array ({dtype})")
    return arr.astype(target)


def _tensor_samples(files: Sequence[Path], inputs: Sequence[dict[str, Any]]) -> list[Sample]:
    names = [i["name"] for i in inputs]
    per_input: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for path in files:
        try:
            if path.suffix.lower() == ".npz":
                with np.load(path) as f:
                    arrays = {k: f[k] for k in f.files}
            else:
                if len(inputs) != 1:
                    raise CalibrationError(f"{path}: a .npy file holds one tensor, the model has "
                                           f"{len(inputs)} inputs ({', '.join(names)})",
                                           "save .npz files keyed by input name")
                arrays = {names[0]: np.load(path)}
        except (OSError, ValueError) as exc:
            raise CalibrationError(f"{path}: not a readable .npy/.npz file ({exc})",
                                   "re-save it with numpy.save / numpy.savez") from None
        missing = [n for n in names if n not in arrays]
        if missing:
            raise CalibrationError(f"{path}: no array for input '{missing[0]}' "
                                   f"(has: {', '.join(arrays) or 'nothing'})",
                                   "key the .npz arrays by the model's input names")
        for spec in inputs:
            arr = _cast(arrays[spec["name"]], spec["dtype"], spec["name"], path)
            if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                bad = int(arr.size - np.isfinite(arr).sum())
                raise CalibrationError(f"{path}: '{spec['name']}' holds NaN or Inf ({bad} of "
                                       f"{arr.size} values)", "calibration samples must be "
                                       "finite: fix or drop the samples that hold them")
            per_input[spec["name"]].extend(_split_samples(spec["name"], arr, spec["shape"], path))
    counts = {n: len(v) for n, v in per_input.items()}
    if len(set(counts.values())) != 1:
        raise CalibrationError(f"calibration tensors disagree on the sample count: {counts}",
                               "give every input the same number of samples")
    return [{n: per_input[n][i] for n in names} for i in range(counts[names[0]])]


def _image_samples(files: Sequence[Path], inputs: Sequence[dict[str, Any]], spec: dict[str, Any],
                   progress: Callable[[int, int], None] | None) -> list[Sample]:
    from .._runtimes.runner.errors import BundleError
    from .._runtimes.runner.images import preprocess, read_image

    if len(inputs) != 1:
        raise CalibrationError(f"image calibration feeds one input, the model has {len(inputs)}",
                               "pass .npz tensors keyed by input name")
    name, shape, dtype = inputs[0]["name"], inputs[0]["shape"], inputs[0]["dtype"]
    batch = shape[0]
    tensors = []
    for i, path in enumerate(files):
        try:
            tensors.append(preprocess(read_image(path, spec), spec))
        except BundleError as exc:
            raise CalibrationError(str(exc)) from None
        if progress:
            progress(i + 1, len(files))
    if len(tensors) < batch:
        raise CalibrationError(f"{len(tensors)} image(s) cannot fill one batch of {batch}",
                               "add images or use a smaller batch")
    usable = len(tensors) - len(tensors) % batch
    return [{name: np.concatenate(tensors[i:i + batch]).astype(dtype)}
            for i in range(0, usable, batch)]


def load_samples(source: Path, *, inputs: Sequence[dict[str, Any]],
                 preprocess: dict[str, Any] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> list[Sample]:
    """Load every calibration sample under *source* as {input name: array of the input's shape}."""
    files = list_sources(source)
    if is_image_source(files):
        if preprocess is None:
            raise CalibrationError(f"{source}: images need a preprocessing spec",
                                   "pass --preprocess size=WxH,color=rgb,... or a .toml file")
        return _image_samples(files, inputs, preprocess, progress)
    return _tensor_samples(files, inputs)


def samples_for_model(model: Path, source: Path, *, preprocess: dict[str, Any] | None,
                      command: str, progress: Callable[[int, int], None] | None = None
                      ) -> list[Sample]:
    """load_samples for *model*'s inputs, refusing first (as build does) a model with dynamic
    inputs, or a preprocessing spec that makes tensors the model's input does not take."""
    from ..graph.modelio import load_model
    from ..graph.shapes import static_inputs
    from .preprocessing import check_fits

    inputs = static_inputs(load_model(model), model, command)
    if preprocess is not None and len(inputs) == 1 and is_image_source(list_sources(source)):
        check_fits(preprocess, inputs[0]["name"], inputs[0]["shape"], inputs[0]["dtype"])
    return load_samples(source, inputs=inputs, preprocess=preprocess, progress=progress)


def check_holdout(fraction: float) -> None:
    """Raise unless *fraction* (--holdout) is a fraction strictly between 0 and 1."""
    if fraction >= 1:
        raise CalibrationError(f"--holdout {fraction:g} holds out every sample and leaves none "
                               "to calibrate on", "use a fraction below 1, e.g. --holdout 0.2")
    if not 0 < fraction < 1:   # also refuses NaN
        raise CalibrationError(f"--holdout {fraction:g} is not a fraction between 0 and 1",
                               "for example --holdout 0.2 keeps a fifth of the samples out of "
                               "calibration to measure accuracy")


def check_golden(count: int) -> None:
    """Raise unless *count* (--golden) is at least 1."""
    if count < 1:
        raise CalibrationError(f"--golden {count}: the bundle needs at least 1 golden sample",
                               "the device checks itself against them; for example --golden 8")


def holdout_indices(count: int, fraction: float) -> set[int]:
    """Every k-th index, spread over the set: the samples kept out of calibration."""
    check_holdout(fraction)
    if count < 2:
        raise CalibrationError(f"{count} calibration sample(s): need at least 2 (one to "
                               "calibrate, one held out to measure accuracy)", "add samples")
    held = max(1, round(count * fraction))
    if held >= count:
        raise CalibrationError(f"--holdout {fraction:g} holds out all {count} samples and leaves "
                               "none to calibrate on", "use a smaller fraction, e.g. --holdout "
                               "0.2, or add samples")
    step = count / held
    return {int(i * step + step / 2) for i in range(held)}


def split_holdout(samples: Sequence[Sample], *, fraction: float) -> tuple[list[Sample], list[Sample]]:
    """Every k-th sample held out for accuracy (never used to calibrate); the rest calibrate."""
    picks = holdout_indices(len(samples), fraction)
    calib = [s for i, s in enumerate(samples) if i not in picks]
    holdout = [s for i, s in enumerate(samples) if i in picks]
    return calib, holdout


def sample_labels(source: Path, count: int, fraction: float) -> list[str] | None:
    """Labels of the held-out samples, for a user's metric: the class folder of each image
    (calib/cat/1.jpg -> "cat"), or the "labels" array of a single .npz; else None."""
    files = list_sources(source)
    if is_image_source(files):
        root = Path(source)
        labels = [p.parent.name if p.parent != root else None for p in files]
        if None in labels or len(labels) != count:
            return None
    elif len(files) == 1 and files[0].suffix.lower() == ".npz":
        with np.load(files[0]) as f:
            if "labels" not in f.files or len(f["labels"]) != count:
                return None
            labels = [x.item() if hasattr(x, "item") else x for x in f["labels"]]
    else:
        return None
    picks = holdout_indices(count, fraction)
    return [label for i, label in enumerate(labels) if i in picks]
