"""A bar chart of compare() results, drawn with OpenCV (already a dependency) into a PNG."""

from pathlib import Path
from typing import Any

import numpy as np

COLORS = [(180, 119, 31), (14, 127, 255), (44, 160, 44), (40, 39, 214)]   # BGR


def check_chart_path(path: Path) -> None:
    """The chart is a PNG: refuse another suffix rather than write PNG bytes under it."""
    from .errors import SpecError

    if Path(path).suffix.lower() != ".png":
        raise SpecError(f"--chart {path}: the chart is a PNG image, not "
                        f"{Path(path).suffix or 'a file without a suffix'}",
                        f"name it .png, e.g. --chart {Path(path).with_suffix('.png').name}")


def render(result: dict[str, Any], path: Path) -> Path:
    """Per batch size, a panel of horizontal bars: p50 latency per variant, in ms."""
    import cv2

    from .atomic import atomic_file

    check_chart_path(path)

    rows = [r for r in result["rows"] if "error" not in r]
    batches = sorted({r["batch"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    bar, label_w, width = 24, 210, 1000
    panel_h = 40 + bar * len(variants) + 20
    height = 50 + panel_h * max(1, len(batches))
    img = np.full((height, width, 3), 255, np.uint8)
    font = cv2.FONT_HERSHEY_SIMPLEX
    title = f"p50 latency, {result['machine']['cpu'][:60]}"
    cv2.putText(img, title, (10, 30), font, 0.6, (0, 0, 0), 1, cv2.LINE_AA)
    for i, batch in enumerate(batches):
        top = 50 + i * panel_h
        values = {r["variant"]: r["p50_ms"] for r in rows if r["batch"] == batch}
        longest = max(values.values()) if values else 1.0
        cv2.putText(img, f"batch {batch}", (10, top + 20), font, 0.55, (0, 0, 0), 1, cv2.LINE_AA)
        for j, name in enumerate(variants):
            y = top + 35 + j * bar
            cv2.putText(img, name, (10, y + 16), font, 0.45, (40, 40, 40), 1, cv2.LINE_AA)
            if name not in values:
                cv2.putText(img, "n/a", (label_w, y + 16), font, 0.45, (120, 120, 120), 1)
                continue
            length = int((width - label_w - 110) * values[name] / longest)
            cv2.rectangle(img, (label_w, y + 3), (label_w + max(1, length), y + bar - 3),
                          COLORS[j % len(COLORS)], -1)
            cv2.putText(img, f"{values[name]:.2f} ms", (label_w + length + 6, y + 16), font,
                        0.45, (0, 0, 0), 1, cv2.LINE_AA)
    path = Path(path)
    with atomic_file(path, force=True) as tmp:
        ok, data = cv2.imencode(".png", img)
        tmp.write_bytes(data.tobytes())
    return path
