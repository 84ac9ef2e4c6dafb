"""Checks of a bundle's page (reports/index.html and index.json) shared by the tests: the HTML
parses and holds nothing from outside it, every figure equals the manifest's and the reports',
and a real headless browser (Debian's chromium) renders its charts.

In CI (EDGEPACK_REQUIRE_BROWSER=1, set by .ci/run, which installs chromium) a missing browser
fails; elsewhere the browser step skips with the reason."""

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import cv2
import numpy as np
import pytest

VOID = {"meta", "br", "img", "hr", "input", "link", "col", "area", "base", "wbr", "source"}
SVG_LEAVES = {"line", "circle", "rect", "path", "polyline"}
BLUE, ORANGE, RED = (180, 119, 31), (14, 127, 255), (40, 39, 214)   # BGR, page_svg.COLORS


class Strict(HTMLParser):
    """Tags balanced, no script, no link, no URL outside the page."""

    def __init__(self):
        super().__init__()
        self.stack, self.problems, self.text = [], [], []
        self.counts: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        for key, value in attrs:
            if key in ("src", "href") or (value or "").startswith(("http:", "https:", "//")):
                self.problems.append(f"<{tag} {key}={value}> reaches outside the page")
        if tag in ("script", "link", "iframe", "img"):
            self.problems.append(f"<{tag}> in a self-contained page")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(page: Path) -> Strict:
    parser = Strict()
    parser.feed(page.read_text())
    parser.close()
    assert not parser.problems, parser.problems
    assert not parser.stack, f"unclosed: {parser.stack}"
    return parser


def check_figures(bundle: Path) -> tuple[dict, str]:
    """The twin's figures are the manifest's and the reports', and the page prints them."""
    data = json.loads((bundle / "reports" / "index.json").read_text())
    manifest = json.loads((bundle / "manifest.json").read_text())
    text = " ".join(parse(bundle / "reports" / "index.html").text)
    assert data["target"] == manifest["target"]["name"] and data["bundle"] == manifest["name"]
    files = [*manifest["files"], "manifest.json"]
    assert data["size"]["total"] == sum((bundle / f).stat().st_size for f in files)
    assert f"{data['size']['total'] / 1e6:.2f} MB copied to each device" in text
    for part, entry in zip(data["parts"], manifest["parts"], strict=True):
        precision = entry["precision"]
        decision = precision["decision"]
        flat = " ".join(text.split())   # (a reason's `command` is set as code on the page)
        assert part["reason"] == decision["reason"] and \
            " ".join(part["reason"].replace("`", "").split()) in flat
        for c, d in zip(part["candidates"], decision["candidates"], strict=True):
            assert (c["label"], c["p50_ms"], c["cosine_min"]) == \
                (d["label"], d["p50_ms"], d["cosine_min"])
            if c["p50_ms"] is not None:
                assert f"{c['p50_ms']:.3f}" in text
        shipped = [c for c in part["candidates"] if c["shipped"]]
        assert len(shipped) == (1 if decision["candidates"] else 0)
        vs = precision.get("vs_original") or {}
        if vs.get("bundle_p50_ms") and vs.get("original_p50_ms"):
            assert f"{vs['bundle_p50_ms']:.3f}" in text and f"{vs['original_p50_ms']:.3f}" in text
        if part["profile"] and "by_op" in (part["profile"].get("shipped") or {}):
            assert part["profile"] == precision["profile"]
            for node in part["profile"]["shipped"]["top_nodes"]:
                assert node["node"] in text
        golden = entry["golden"]
        assert part["golden"]["samples"] == golden["samples"]
    for device in data["devices"]:
        where = "report.json" if device["device"].startswith("this machine") else \
            f"{device['device']}/report.json"
        report = json.loads((bundle / "reports" / where).read_text())
        for name, p in device["parts"].items():
            given = report["bench"]["parts"][name]["latency_ms"]["p50"]
            if not isinstance(given, int | float) or isinstance(given, bool):
                assert p["p50_ms"] is None   # a figure that is no number is shown as none
                continue
            assert p["p50_ms"] == given
            assert f"{p['p50_ms']:.3f}" in text
    return data, text


def browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        reason = "no headless browser here (apt-get install chromium)"
        if os.environ.get("EDGEPACK_REQUIRE_BROWSER") == "1":
            pytest.fail(f"the page's browser test is required here: {reason}")
        pytest.skip(reason)
    return found


def render(page: Path, out: Path) -> tuple[str, np.ndarray]:
    """The DOM chromium builds and a screenshot of it, offline (every host name unresolvable)."""
    common = [browser(), "--headless", "--no-sandbox", "--disable-gpu",
              "--disable-dev-shm-usage",   # a container's /dev/shm is 64 MB: use /tmp
              "--host-resolver-rules=MAP * ~NOTFOUND", "--user-data-dir=" + str(out / "profile")]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = out / "page.png"
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=1000,4000", page.as_uri()],
                   capture_output=True, text=True, timeout=120, check=True)
    image = cv2.imread(str(shot))
    assert image is not None, "chromium wrote no screenshot"
    return dom.stdout, image


def has_colour(image: np.ndarray, bgr: tuple[int, int, int]) -> bool:
    return bool((np.abs(image.astype(int) - np.array(bgr)).sum(axis=2) < 30).sum() > 20)


def check_rendered(bundle: Path, out: Path, data: dict) -> str:
    """Chromium lays the page out with its charts drawn: the candidates' points, the shipped
    ring and the profile's bars are in its DOM, and their colours in its pixels."""
    dom, image = render(bundle / "reports" / "index.html", out)
    timed = sum(1 for p in data["parts"] for c in p["candidates"]
                if c["p50_ms"] and c["cosine_min"] is not None)
    assert dom.count('class="candidate"') == timed, dom[:3000]
    if timed:
        assert 'class="shipped"' in dom and 'class="budget"' in dom
        assert has_colour(image, RED)   # the budget line
    if any((p["profile"] or {}).get("shipped", {}).get("by_op") for p in data["parts"]):
        assert 'class="bar"' in dom and has_colour(image, ORANGE)   # the shipped graph's bars
    assert has_colour(image, BLUE)   # the size bar's first kind
    return dom
