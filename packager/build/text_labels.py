"""The text each sample reads, for a text recogniser's (CTC) labelled budget: a `labels.txt`
beside the calibration images in PaddleOCR's recognition format (`NAME<TAB>TEXT` a line, NAME
the image's path under the folder, or its file name), or the `labels` array of strings of a
single tensor `.npz`. Keyed by each sample's fingerprint, they make the budget the character
error rate's rise against FP32 on the same samples.
"""

from collections.abc import Sequence
from pathlib import Path

from ..errors import CalibrationError
from ..graph.execute import Sample
from ..quantization.calibration import is_image_source, list_sources, picked, source_labels

LABELS_FILE = "labels.txt"


def read_text_labels(path: Path) -> dict[str, str]:
    """{image name: text} of a PaddleOCR-style label file; a CalibrationError naming the line
    that has no tab."""
    found: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise CalibrationError(f"{path}:{n}: '{line[:60]}' has no tab between the image and "
                                   "its text", "write one NAME<TAB>TEXT line per image")
        name, text = line.split("\t", 1)
        found[name.strip()] = text
    return found


def text_truth(samples: Sequence[Sample], source: Path | None
               ) -> tuple[dict[str, str], str] | None:
    """({fingerprint of a sample: the text it reads}, where the texts came from), or None
    where the samples carry no text labels."""
    from ..quantization.budget import fingerprint

    if source is None or not samples or int(next(iter(samples[0].values())).shape[0]) != 1:
        return None
    source = Path(source)
    files = list_sources(source)
    if is_image_source(files):
        table = source / LABELS_FILE if source.is_dir() else None
        if table is None or not table.is_file():
            return None
        labels, files = read_text_labels(table), picked(files, len(samples))
        if files is None:
            return None
        texts = [labels.get(p.relative_to(source).as_posix(), labels.get(p.name))
                 for p in files]
        where = f"{table}"
    else:
        found = source_labels(source, len(samples))
        if not found or not all(isinstance(t, str) for t in found):
            return None
        texts, where = list(found), f"the labels array of {source}"
    truth = {fingerprint(s): t for s, t in zip(samples, texts, strict=True) if t is not None}
    return (truth, where) if truth else None
