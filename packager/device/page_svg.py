"""The page's charts as inline SVG (no script, no font, no network): the candidates' speed
against accuracy with the budget line, paired bars (time per op type, FP32 and shipped) and
one stacked bar (the bundle's bytes by file kind)."""

import math
from collections.abc import Sequence
from html import escape
from typing import Any

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#7f7f7f")
W, H, PAD = 560, 300, 48


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" '
            f'class="chart">' + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "start", size: int = 11,
          cls: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"'
            f'{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}>{escape(text)}</text>')


def _span(values: Sequence[float], floor: float | None = None) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if floor is not None:
        lo, hi = min(lo, floor), max(hi, floor)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5 * (abs(lo) or 1) * 0.01, hi + 0.5 * (abs(hi) or 1) * 0.01
    pad = (hi - lo) * 0.08
    return lo - pad, hi + pad


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def scatter(points: Sequence[dict[str, Any]], budget: float | None, label: str) -> str:
    """Candidates: p50 ms (x) against cosine min (y); the budget a dashed line, the shipped
    ones ringed and named. Points need "label", "p50_ms", "cosine_min", "meets_budget",
    "shipped" ("shipped_under": a faster provider's name); those without a time are left to
    the table under the chart."""
    drawn = [p for p in points if _finite(p.get("p50_ms")) and p["p50_ms"] > 0
             and _finite(p.get("cosine_min"))]   # NaN or infinity in an edited manifest: not drawn
    budget = budget if _finite(budget) else None
    if not drawn:
        return ""
    x0, x1 = _span([0.0] + [p["p50_ms"] for p in drawn])
    y0, y1 = _span([p["cosine_min"] for p in drawn], budget)
    x0, y1 = 0.0, (min(y1, 1.0) if max([p["cosine_min"] for p in drawn] + [budget or 0]) <= 1
                   else y1)   # a cosine axis never runs past 1

    def px(x: float) -> float:
        return PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD)

    def py(y: float) -> float:
        return H - PAD - (y - y0) / (y1 - y0) * (H - 2 * PAD)

    body = [f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#333"/>',
            f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#333"/>',
            _text(W / 2, H - 10, "p50 latency, ms (lower is faster)", "middle"),
            _text(12, PAD - 14, "cosine min vs FP32 (higher is closer)")]
    for frac in (0.0, 0.5, 1.0):
        xv, yv = x0 + frac * (x1 - x0), y0 + frac * (y1 - y0)
        body += [_text(px(xv), H - PAD + 14, f"{xv:.3g}", "middle", 10),
                 _text(PAD - 4, py(yv) + 3, f"{yv:.4f}", "end", 10)]
    if budget is not None:
        body += [f'<line x1="{PAD}" y1="{py(budget):.1f}" x2="{W - PAD}" y2="{py(budget):.1f}" '
                 f'stroke="#d62728" stroke-dasharray="5,4" class="budget"/>',
                 _text(W - PAD, py(budget) - 4, f"budget: cosine >= {budget}", "end", 10)]
    labels = Labels()
    for p in sorted(drawn, key=lambda p: not (p.get("shipped") or p.get("shipped_under"))):
        x, y = px(p["p50_ms"]), py(p["cosine_min"])
        color = "#2ca02c" if p.get("meets_budget") else "#d62728"
        title = (f"{p['label']}: {p['p50_ms']:.3f} ms p50, cosine {p['cosine_min']:.4f}, "
                 f"{'within' if p.get('meets_budget') else 'outside'} the budget")
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{color}" '
                    f'class="candidate" data-label="{escape(p["label"])}">'
                    f'<title>{escape(title)}</title></circle>')
        if p.get("shipped") or p.get("shipped_under"):
            where = " and ".join(([] if not p.get("shipped") else ["CPU provider"])
                                 + ([p["shipped_under"]] if p.get("shipped_under") else []))
            body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="10" fill="none" stroke="#000" '
                     f'stroke-width="2" class="shipped"/>',
                     labels.place(x, y + 4, f"shipped ({where}): {p['label']}", 13, 11)]
        else:
            body.append(labels.place(x, y - 7, str(p["label"]), 8, 10))
    return _svg(W, H, body, label)


class Labels:
    """Where each point's label goes: beside it, moved a line up or down (or to its left,
    anchored at its end) until it overlaps no label placed before it (the demo's "shipped
    (CPU provider): INT8 preset" was drawn over "INT8 NNCF")."""

    def __init__(self) -> None:
        self.boxes: list[tuple[float, float, float, float]] = []

    def place(self, x: float, y: float, text: str, dx: float, size: int) -> str:
        width, height = 0.6 * size * len(text), size + 3
        tries = [(x + dx, y + k * height, "start") for k in (0, -1, 1, -2, 2, -3, 3)]
        tries += [(x - dx, y + k * height, "end") for k in (0, -1, 1)]
        for tx, ty, anchor in tries:
            left = tx if anchor == "start" else tx - width
            box = (left, ty - size, left + width, ty + 3)
            if left >= 0 and box[2] <= W and 0 <= box[1] and box[3] <= H - PAD + 12 and \
                    not any(_overlaps(box, other) for other in self.boxes):
                self.boxes.append(box)
                return _text(tx, ty, text, anchor, size)
        self.boxes.append((x + dx, y - size, x + dx + width, y + 3))
        return _text(x + dx, y, text, size=size)


def _overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def bars(rows: Sequence[tuple[str, Sequence[float | None]]], series: Sequence[str],
         unit: str, label: str) -> str:
    """Horizontal bars, one group per row (e.g. an op type), one bar per series (FP32,
    shipped), each with its value written beside it."""
    rows = [(name, [v if _finite(v) else None for v in vals]) for name, vals in rows]
    if not rows:
        return ""
    top = max((v for _, vals in rows for v in vals if v), default=0.0) or 1.0
    bar, gap = 12, 8
    height = PAD + len(rows) * (bar * len(series) + gap) + 10
    body, y = [], PAD - 20
    for i, name in enumerate(series):
        body += [f'<rect x="{160 + i * 110}" y="{y - 9}" width="10" height="10" '
                 f'fill="{COLORS[i % len(COLORS)]}"/>', _text(175 + i * 110, y, name)]
    y = PAD
    for name, values in rows:
        body.append(_text(150, y + bar * len(series) / 2 + 4, name, "end"))
        for i, value in enumerate(values):
            width = 0 if not value else max(1.0, value / top * (W - 240))
            body.append(f'<rect x="155" y="{y}" width="{width:.1f}" height="{bar - 2}" '
                        f'fill="{COLORS[i % len(COLORS)]}" class="bar">'
                        f'<title>{escape(f"{name}, {series[i]}: {value or 0:.4f} {unit}")}'
                        f'</title></rect>')
            body.append(_text(160 + width, y + bar - 3,
                              "-" if value is None else f"{value:.3f} {unit}", size=10))
            y += bar
        y += gap
    return _svg(W, height, body, label)


def stacked(parts: Sequence[tuple[str, int]], label: str) -> str:
    """One bar split by kind (bytes), a legend with each kind's MB and share."""
    total = sum(v for _, v in parts) or 1
    body, x = [], PAD
    for i, (name, value) in enumerate(parts):
        width = value / total * (W - 2 * PAD)
        body.append(f'<rect x="{x:.1f}" y="20" width="{width:.1f}" height="24" '
                    f'fill="{COLORS[i % len(COLORS)]}" class="bar"><title>'
                    f'{escape(f"{name}: {value / 1e6:.2f} MB")}</title></rect>')
        x += width
    for i, (name, value) in enumerate(parts):
        y = 66 + i * 16
        body += [f'<rect x="{PAD}" y="{y - 9}" width="10" height="10" '
                 f'fill="{COLORS[i % len(COLORS)]}"/>',
                 _text(PAD + 16, y, f"{name}: {value / 1e6:.2f} MB "
                                    f"({100 * value / total:.0f} %)")]
    return _svg(W, 70 + len(parts) * 16, body, label)
