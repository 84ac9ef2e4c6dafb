"""The pipeline's end-to-end figure: the text lines a built bundle reads on held-out photos
against the lines the original models read through the same glue (the runner's Cascade)."""

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._runtimes.runner.cascade import Cascade, pipeline_sessions, session_runner
from .._runtimes.runner.images import read_image
from .._runtimes.runner.manifest import load_manifest
from .._runtimes.runner.tasks import iou_matrix
from .host import original_cascade
from .spec import PipelineSpec

KEEP_LINES = 0.99   # the original's lines the bundle must read alike (box IoU >= 0.5, same text)


def match_lines(want: Sequence[dict[str, Any]], got: Sequence[dict[str, Any]]) -> int:
    """How many of *want*'s lines a line of *got* matches: box IoU >= 0.5 and the same text
    (each line of *got* matched once, the best overlap first)."""
    if not want or not got:
        return 0
    iou = iou_matrix([w["box"] for w in want], [g["box"] for g in got])
    used: set[int] = set()
    same = 0
    for i in np.argsort(-iou.max(axis=1), kind="stable"):
        for j in np.argsort(-iou[i], kind="stable"):
            if iou[i, j] < 0.5:
                break
            if int(j) not in used:
                used.add(int(j))
                same += want[i]["text"] == got[j]["text"]
                break
    return same


def end_to_end(spec: PipelineSpec, bundle: Path, photos: Sequence[Path]) -> dict[str, Any]:
    """{"lines": the original's lines, "same": read alike, "extra": the bundle's lines no
    original line matches, "photos", "value", "shown", "passed", "text"} on *photos*, the
    bundle's parts run by its own runner code on this machine's providers."""
    original = original_cascade(spec)
    manifest = load_manifest(str(bundle))
    shipped = Cascade(manifest, session_runner(pipeline_sessions(str(bundle), manifest, None)))
    lines = same = found = 0
    for path in photos:
        image = read_image(path, spec.stages[0].preprocess)
        want, got = original.read(image)["lines"], shipped.read(image)["lines"]
        lines, found = lines + len(want), found + len(got)
        same += match_lines(want, got)
    value = same / lines if lines else None
    need = int(math.ceil(round(1.0 / (1.0 - KEEP_LINES), 6)))
    passed = value is None or value >= KEEP_LINES - 1e-12
    shown = lines >= need
    text = (f"end to end: {same} of the original's {lines} text lines read alike (box IoU >= 0.5, "
            f"same text) on {len(photos)} held-out photo(s), {found - same} other line(s) "
            f"(needs {KEEP_LINES:.0%}" + ("" if shown else f"; {lines} lines cannot show "
                                               f"{KEEP_LINES:.0%}: {need} needed") + ")"
            if lines else f"end to end: the original models read no text in the "
            f"{len(photos)} held-out photo(s): nothing to judge")
    return {"lines": lines, "same": same, "extra": found - same, "photos": len(photos),
            "value": value, "shown": shown, "passed": passed,
            "text": text + ("" if passed else ": FAILED")}
