"""Calibration samples from a folder of images (decoded by OpenCV) or .npy / .npz tensors."""

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CalibrationError
from ..graph.execute import Sample

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
TENSOR_SUFFIXES = (".npy", ".npz")
# Calibration ranges settle after a few hundred samples (minmax, entropy and percentile alike:
# their histograms gain nothing from thousands), while each sample is held in memory: more
# than this are thinned to this many, evenly spread over the set, the same ones every run.
MAX_SAMPLES = 512
# onnxruntime's calibrators run every calibration sample through a graph that outputs every
# tensor, and hold all of those outputs at once before they reduce them to ranges: 334 MB a
# sample for CenterFace at 640x480, so its 53 photos held 17.7 GB (the build was killed for
# memory on a 23 GB machine, and page faults made its system time equal its user time). A set
# that would hold more than this is thinned, evenly spread, to what fits (never below
# MIN_FIT samples: ranges from fewer are noticeably worse).
CALIB_BYTES = 6 * 2 ** 30
HOLDOUT = 0.2   # the share of the samples held out to judge (build's --holdout default)
MIN_FIT = 16
# What one .npy/.npz file may unpack to (its headers are read first): a 12 MB .npz declaring
# 12 GB of zeros is refused before anything is inflated.
MAX_FILE_BYTES = 2 ** 30


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
    return {name: list(shape) for name, (shape, _) in _headers(files[0]).items()}


def spread(count: int, cap: int = MAX_SAMPLES) -> list[int]:
    """*cap* indices of *count*, evenly spread from first to last (all of them if fewer)."""
    if count <= cap:
        return list(range(count))
    return [int((i + 0.5) * count / cap) for i in range(cap)]


def activation_bytes(model: Any) -> int:
    """Bytes of every tensor a graph computes for one sample (static shapes from inference)."""
    import onnx

    total = 0
    for value in list(model.graph.value_info) + list(model.graph.output):
        kind = value.type.tensor_type
        dims = [d.dim_value for d in kind.shape.dim]
        if kind.elem_type and dims and all(d > 0 for d in dims):
            size = onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type).itemsize
            total += int(np.prod(dims)) * size
    return total


def available_bytes() -> int | None:
    """The memory this machine can still give (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def calibration_budget() -> int:
    """Bytes of activations the quantizer's calibration may hold: CALIB_BYTES, or half the
    memory available now where that is less (a build the kernel would kill says so instead)."""
    free = available_bytes()
    return CALIB_BYTES if free is None else max(1, min(CALIB_BYTES, free // 2))


def fit_memory(samples: Sequence[Sample], per_sample: int, *, budget: int | None = None,
               floor: int = MIN_FIT) -> list[Sample]:
    """*samples*, thinned (evenly spread, the same ones every run) so that the quantizer's
    calibration holds at most *budget* bytes of activations (*per_sample* each; default
    calibration_budget())."""
    budget = calibration_budget() if budget is None else budget
    if per_sample <= 0 or len(samples) * per_sample <= budget:
        return list(samples)
    keep = max(floor, budget // per_sample)
    return [samples[i] for i in spread(len(samples), keep)]


def _note_cap(used: int, total: int, what: str) -> None:
    if used < total:
        from ..progress import echo

        echo(f"calibration: using {used} of {total:,} {what} (at most {MAX_SAMPLES}, evenly "
             f"spread: every {total / used:.1f}th, the same ones every run)")


def _unreadable(path: Path, exc: BaseException) -> CalibrationError:
    why = str(exc)[:200] or type(exc).__name__
    return CalibrationError(f"{path}: not a readable .npy/.npz file ({why})",
                            "re-save it with numpy.save / numpy.savez")


def _npy_header(f: Any, path: Path) -> tuple[tuple[int, ...], np.dtype]:
    fmt = np.lib.format
    version = fmt.read_magic(f)
    shape, _, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                       else fmt.read_array_header_2_0(f))
    return tuple(shape), dtype


def _headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{array name: (shape, dtype)} of a .npy ("") or .npz file from its headers alone; refuse
    a file that declares more than MAX_FILE_BYTES before anything is unpacked."""
    import zipfile
    import zlib

    result = {}
    try:
        if path.suffix.lower() == ".npz":
            with zipfile.ZipFile(path) as archive:
                for member in archive.infolist():
                    if member.file_size > MAX_FILE_BYTES:
                        raise _too_big(path, member.file_size)
                    with archive.open(member) as f:
                        result[member.filename.removesuffix(".npy")] = _npy_header(f, path)
        else:
            with open(path, "rb") as f:
                result[""] = _npy_header(f, path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise _unreadable(path, exc) from None
    declared = sum(int(np.prod(shape, dtype=object)) * dtype.itemsize
                   for shape, dtype in result.values())
    if declared > MAX_FILE_BYTES:
        raise _too_big(path, declared)
    return result


def _too_big(path: Path, size: int) -> CalibrationError:
    return CalibrationError(f"{path}: declares {size / 2 ** 30:.1f} GiB of arrays, over the "
                            f"{MAX_FILE_BYTES / 2 ** 30:.0f} GiB limit per calibration file",
                            f"split it into smaller files; at most {MAX_SAMPLES} samples are "
                            "used anyway")


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a .npy ("") or .npz file, its headers checked first."""
    import zipfile
    import zlib

    _headers(path)
    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as f:
                return {k: f[k] for k in f.files}
        return {"": np.load(path, allow_pickle=False)}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise _unreadable(path, exc) from None


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
    if arr.dtype.kind == "c":
        raise CalibrationError(f"{path}: '{name}' holds complex ({arr.dtype}) values, the model "
                               f"input is {dtype}", "save the real values only (casting would "
                               "drop the imaginary part)")
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
    """The samples of every file, counted from the headers first so that at most MAX_SAMPLES,
    evenly spread, are ever held; one file is unpacked at a time."""
    names = [i["name"] for i in inputs]
    counts = []
    for path in files:
        headers = _headers(path)
        if path.suffix.lower() == ".npy":
            if len(inputs) != 1:
                raise CalibrationError(f"{path}: a .npy file holds one tensor, the model has "
                                       f"{len(inputs)} inputs ({', '.join(names)})",
                                       "save .npz files keyed by input name")
            headers = {names[0]: headers[""]}
        missing = [n for n in names if n not in headers]
        if missing:
            raise CalibrationError(f"{path}: no array for input '{missing[0]}' "
                                   f"(has: {', '.join(headers) or 'nothing'})",
                                   "key the .npz arrays by the model's input names")
        for spec in inputs:   # the dtype rules first, on an empty array of the file's dtype
            _cast(np.empty(0, headers[spec["name"]][1]), spec["dtype"], spec["name"], path)
        per_file = {spec["name"]: _count(spec["name"], headers[spec["name"]][0], spec["shape"],
                                         path) for spec in inputs}
        if len(set(per_file.values())) != 1:
            raise CalibrationError(f"calibration tensors disagree on the sample count: "
                                   f"{per_file} in {path}",
                                   "give every input the same number of samples")
        counts.append(per_file[names[0]])
    total = sum(counts)
    keep = set(spread(total))
    _note_cap(len(keep), total, "samples")
    samples: list[Sample] = []
    start = 0
    for path, count in zip(files, counts, strict=True):
        wanted = [i - start for i in range(start, start + count) if i in keep]
        start += count
        if not wanted:
            continue
        arrays = _read_arrays(path)
        if path.suffix.lower() == ".npy":
            arrays = {names[0]: arrays[""]}
        split = {}
        for spec in inputs:
            arr = _cast(arrays[spec["name"]], spec["dtype"], spec["name"], path)
            if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                bad = int(arr.size - np.isfinite(arr).sum())
                raise CalibrationError(f"{path}: '{spec['name']}' holds NaN or Inf ({bad} of "
                                       f"{arr.size} values)", "calibration samples must be "
                                       "finite: fix or drop the samples that hold them")
            parts = _split_samples(spec["name"], arr, spec["shape"], path)
            split[spec["name"]] = [np.array(parts[i]) for i in wanted]   # copies: the file goes
        del arrays
        samples.extend({n: split[n][j] for n in names} for j in range(len(wanted)))
    return samples


def _count(name: str, shape: tuple[int, ...], want: list[int], path: Path) -> int:
    """How many samples an array of *shape* holds for an input of shape *want*
    (the rules of _split_samples)."""
    shape_l = list(shape)
    if shape_l == list(want):
        return 1
    if len(shape_l) == len(want) + 1 and shape_l[1:] == list(want):
        return shape_l[0]
    if want and want[0] == 1 and len(shape_l) == len(want) and shape_l[1:] == list(want[1:]):
        return shape_l[0]
    raise CalibrationError(f"{path}: '{name}' has shape {shape_l}, the model input is "
                           f"{list(want)}", f"save samples shaped {list(want)} or N x {list(want)}")


MAX_LISTED = 5   # bad calibration files named in the one-line error (the count says the rest)


def _image_samples(files: Sequence[Path], inputs: Sequence[dict[str, Any]], spec: dict[str, Any],
                   progress: Callable[[int, int], None] | None) -> list[Sample]:
    from .._runtimes.runner.errors import BundleError
    from .._runtimes.runner.images import preprocess, read_image

    if len(inputs) != 1:
        raise CalibrationError(f"image calibration feeds one input, the model has {len(inputs)}",
                               "pass .npz tensors keyed by input name")
    name, shape, dtype = inputs[0]["name"], inputs[0]["shape"], inputs[0]["dtype"]
    batch = shape[0]
    if len(files) < batch:
        raise CalibrationError(f"{len(files)} image(s) cannot fill one batch of {batch}",
                               "add images or use a smaller batch")
    total = len(files) // batch
    picks = spread(total)
    _note_cap(len(picks), total, "samples" if batch > 1 else "images")
    samples, bad, read = [], [], 0
    for n, pick in enumerate(picks):
        tensors = []
        for path in files[pick * batch:(pick + 1) * batch]:
            read += 1
            try:
                tensors.append(preprocess(read_image(path, spec), spec))
            except BundleError as exc:   # every bad file is listed at once, not one per run
                bad.append((path, str(exc).split("; ")[0]))
        if len(tensors) == batch:
            samples.append({name: np.concatenate(tensors).astype(dtype)})
        if progress:
            progress(n + 1, len(picks))
    if bad:
        import os

        root = Path(os.path.commonpath([str(p) for p in files]))
        root = root if root.is_dir() else root.parent
        named = [reason.replace(str(path), str(path.relative_to(root)), 1)
                 for path, reason in bad[:MAX_LISTED]]
        raise CalibrationError(
            f"{len(bad)} of the {read} calibration images in {root} cannot be used: "
            + "; ".join(named) + (f"; and {len(bad) - MAX_LISTED} more"
                                  if len(bad) > MAX_LISTED else ""),
            "remove or re-save them (PNG/JPEG), then build again")
    return samples


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


def check_golden(count: int | None) -> None:
    """Raise unless *count* (--golden) is at least 1 (None: the build's bounded default)."""
    if count is not None and count < 1:
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


def source_labels(source: Path, count: int) -> list[Any] | None:
    """The label of each of the *count* samples loaded from *source*: the class folder of each
    image (calib/cat/1.jpg -> "cat"), or the "labels" array of a single .npz; else None."""
    files = list_sources(source)
    if is_image_source(files):
        labels = class_folders(source, files)
        if None in labels:
            return None
    elif len(files) == 1 and files[0].suffix.lower() == ".npz":
        if "labels" not in _headers(files[0]):
            return None
        found = _read_arrays(files[0])["labels"]
        labels = [x.item() if hasattr(x, "item") else x for x in found]
    else:
        return None
    return picked(labels, count)


def class_folders(source: Path, files: Sequence[Path]) -> list[str | None]:
    """The class folder of each image file under *source* (None for an image at the top):
    the label a classifier's image carries. A folder whose name is not printable UTF-8 text
    (b'0\\xff\\xfe') is refused in one line: the name is the label the bundle ships, its page
    shows and its checks compare."""
    root = Path(source)
    labels = [p.parent.name if p.parent != root else None for p in files]
    for label, path in zip(labels, files, strict=True):
        if label is not None and (not label.isprintable() or
                                  label != label.encode("utf-8", "replace").decode()):
            shown = label.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise CalibrationError(
                f"{path.parent.parent}: the class folder {shown!r} has a name that is not "
                "printable UTF-8 text (its name is the class label the bundle ships)",
                "rename the folder to the label you mean and run again")
    return labels


def picked(items: Sequence[Any], count: int) -> list[Any] | None:
    """*items* (one per file or array entry under --calib, in the loader's order) as the
    loader picked its *count* samples from them (thinned to MAX_SAMPLES, evenly spread), or
    None where they cannot be matched to the samples."""
    if len(items) != count:
        items = [items[i] for i in spread(len(items))]
    return list(items) if len(items) == count else None


def sample_labels(source: Path, count: int, fraction: float) -> list[str] | None:
    """Labels of the held-out samples, for a user's metric (source_labels' of those)."""
    labels = source_labels(source, count)
    if labels is None:
        return None
    picks = holdout_indices(count, fraction)
    return [label for i, label in enumerate(labels) if i in picks]
