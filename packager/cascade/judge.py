"""The pipeline's end-to-end figure: the answers a built bundle gives on held-out photos against
the answers the original models give through the same glue (the runner's Cascade), judged by
the runner's own cascade_judge (as `run.py check` judges the device); a few of the photos and
the original's answers kept in the bundle (golden/pipeline/) for that check."""

import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._runtimes.runner.cascade import Cascade, pipeline_sessions, session_runner
from .._runtimes.runner.cascade_judge import (
    GOLDEN_DIR,
    KEEP,
    match_lines,  # noqa: F401  (this module's API too)
    tally,
    verdict,
    words,
)
from .._runtimes.runner.images import read_image
from .._runtimes.runner.manifest import load_manifest
from .host import original_cascade
from .spec import PipelineSpec

KEEP_LINES = KEEP    # the original's lines the bundle must read alike (box IoU >= 0.5, same text)
GOLDEN_SIDE = 640    # a golden photo's long side at most (the detector's input is 640 here)
GOLDEN_BYTES = 2_000_000   # the golden photos' pixels, compressed, a bundle keeps at most
GOLDEN_OFFERED = 48        # held-out photos considered for it (each runs both cascades again)


def end_to_end(spec: PipelineSpec, bundle: Path, photos: Sequence[Path]) -> dict[str, Any]:
    """{"lines": the original's lines, "same": read alike, "extra": the bundle's lines no
    original line matches, "photos", "value", "keep", "shown", "passed", "text", "golden"} on
    *photos*, the bundle's parts run by its own runner code on this machine's providers.

    Photos (up to GOLDEN_BYTES compressed, each shrunk to GOLDEN_SIDE; pick_golden) are written
    into *bundle*'s golden/pipeline/ with the original's answers on them (photos.npz,
    answers.json); `golden` names them with how many answers the bundle gave alike there."""
    original = original_cascade(spec)
    manifest = load_manifest(str(bundle))
    shipped = Cascade(manifest, session_runner(pipeline_sessions(str(bundle), manifest, None)))
    pairs, offered = [], []
    for path in photos:
        image = read_image(path, spec.stages[0].preprocess)
        pairs.append((original.read(image), shipped.read(image)))
        if len(offered) < GOLDEN_OFFERED:
            small = shrink(image)
            entry = (path.name, small, *(pairs[-1] if small is image else
                                         (original.read(small), shipped.read(small))))
            # what the original finds only at full size (small faces) is kept at full size
            offered.append(entry if found(spec.kind, entry) or not found(
                spec.kind, (path.name, image, *pairs[-1])) else (path.name, image, *pairs[-1]))
    golden = pick_golden(spec.kind, offered)
    figure = verdict(spec.kind, tally(spec.kind, pairs), KEEP, "held-out photo(s)")
    figure["text"] = "end to end: " + figure["text"]
    if golden:
        figure["golden"] = write_golden(bundle, spec.kind, golden)
    return figure


def pick_golden(kind: str, offered: list[tuple[str, np.ndarray, dict, dict]]
                ) -> list[tuple[str, np.ndarray, dict, dict]]:
    """The photos the device's check keeps, up to GOLDEN_BYTES compressed: those on which the
    original gives an answer (faces, text lines) first, in their order, then the others; a
    photo with nothing to find judges nothing on the device."""
    ranked = sorted(offered, key=lambda g: not found(kind, g))
    golden, room = [], GOLDEN_BYTES
    for entry in ranked:
        size = len(zlib.compress(entry[1].tobytes(), 1))
        if size <= room:
            room -= size
            golden.append(entry)
    return golden


def found(kind: str, entry: tuple[str, np.ndarray, dict, dict]) -> int:
    """How many things (faces, text lines) the original finds in a golden candidate."""
    return tally(kind, [(entry[2], entry[3])])[words(kind)[0]]


def shrink(image: np.ndarray) -> np.ndarray:
    """*image* with its long side at most GOLDEN_SIDE (itself when it already is)."""
    import cv2

    height, width = image.shape[:2]
    scale = GOLDEN_SIDE / max(height, width)
    if scale >= 1:
        return image
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return np.ascontiguousarray(cv2.resize(image, size, interpolation=cv2.INTER_AREA))


def write_golden(bundle: Path, kind: str, golden: list[tuple[str, np.ndarray, dict, dict]]
                 ) -> dict[str, Any]:
    """golden/pipeline/photos.npz (photo0, photo1...: (H, W, 3) uint8 in the detector's colour
    order) and answers.json (the original's answer on each) in *bundle*; the manifest's entry
    for them, with the host bundle's count alike (the device's floor besides the budget)."""
    folder = Path(bundle) / GOLDEN_DIR
    folder.mkdir(parents=True, exist_ok=True)
    keys = [f"photo{k}" for k in range(len(golden))]
    np.savez_compressed(folder / "photos.npz", **dict(zip(keys, (g[1] for g in golden),
                                                          strict=True)))
    answers = {"kind": kind, "photos": [{"photo": key, "name": name, "answer": want}
                                        for key, (name, _, want, _) in zip(keys, golden,
                                                                           strict=True)]}
    (folder / "answers.json").write_text(json.dumps(answers, ensure_ascii=False, indent=1) + "\n",
                                         encoding="utf-8")
    counts = tally(kind, [(want, got) for _, _, want, got in golden])
    return {"photos": f"{GOLDEN_DIR}/photos.npz", "answers": f"{GOLDEN_DIR}/answers.json",
            "count": len(golden), "wanted": counts[words(kind)[0]], "same": counts["same"]}
