"""The bundle's page (issue 36): build writes reports/index.html and its JSON twin, verify
refreshes it with its report, `edgepack report` writes it again; it parses, holds nothing from
outside, shows the manifest's and the reports' figures as they are, and a real headless
browser draws its charts. Golden data is bounded by default and the page says its cost."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from page_check import check_figures, check_rendered
from test_label_check import CLASSES, colour_model, photos

from conftest import save
from packager.cli import main
from packager.device.verify import verify


def edgepack(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """An INT8 classifier built from class folders, then verified here."""
    root = tmp_path_factory.mktemp("page")
    model = colour_model(root / "colours.onnx")
    calib = photos(root / "calib", per_class=12)
    (root / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    out = root / "colours"
    run = edgepack("build", str(model), "--calib", str(calib), "--preprocess",
                   "size=16x16,color=rgb,scale=1/255", "--task", "classify", "--precision",
                   "int8", "--labels", str(root / "labels.txt"), "-o", str(out))
    assert run.exit_code == 0, run.output
    return out, run.output


def test_build_writes_the_page_and_says_where(labelled):
    bundle, output = labelled
    assert f"page: {bundle / 'reports' / 'index.html'}" in output
    data, text = check_figures(bundle)
    assert data["devices"] == []                      # nothing has run it yet
    assert "No device report yet" in text
    part = data["parts"][0]
    assert part["shipped"].startswith("INT8") and part["task"] == "classify"
    # where the time goes: the profiler's figures for both graphs, the nodes left float
    assert set(part["profile"]) >= {"fp32", "shipped"}
    assert any(op.startswith("QLinear") or op == "QuantizeLinear"
               for op in part["profile"]["shipped"]["by_op"])
    assert isinstance(part["float_nodes"], list)
    assert all(n["why"] for n in part["float_nodes"])
    # the summary first: what shipped, not yet verified, not measured on the target, one
    # headline speed figure saying what it compares, the labelled top-1, the size
    top = data["summary"]
    assert top["shipped"] == part["shipped"] and top["verdict"] is None
    assert top["target_p50_ms"] is None and top["peak_rss_mb"] is None
    assert top["headline"]["against"] == part["speed"][0]["against"]
    assert top["labelled"][0]["shipped"] == part["labelled"]["shipped"]["top1"]
    assert text.index("Summary") < text.index("Why")
    assert "not measured on the target" in text and "speed (headline)" in text


def test_the_page_holds_labelled_top1_with_confusion_matrices(labelled):
    bundle, _ = labelled
    data, text = check_figures(bundle)
    found = data["parts"][0]["labelled"]
    shipped = found["shipped"]
    assert found["n"] == shipped["n"] == 36
    for result in (found, shipped):
        matrix = result["confusion"]["matrix"]
        assert sum(map(sum, matrix)) == result["n"]
        assert sum(matrix[i][i] for i in range(len(matrix))) == result["hits"]
    assert (f"labelled top-1 FP32 {100 * found['top1']:.1f} %, shipped "
            f"{100 * shipped['top1']:.1f} %") in text
    assert "Confusion, FP32" in text and "Confusion, shipped" in text


def test_verify_refreshes_the_page_with_its_report(labelled, tmp_path):
    bundle, _ = labelled
    report = verify(bundle, runs=20, warmup=2)
    data, text = check_figures(bundle)
    [device] = data["devices"]
    assert device["device"] == "this machine (edgepack verify)" and device["this_version"]
    assert device["verdict"] == report["verdict"]
    top = data["summary"]   # the summary says what verify said, in the same words
    assert top["verdict"] == report["verdict"] and top["verdict"].startswith("passed")
    assert top["target_p50_ms"] == {"model": device["parts"]["model"]["p50_ms"]}
    assert top["peak_rss_mb"] == device["peak_rss_mb"] and f"{report['verdict']} (" in text
    assert device["parts"]["model"]["p50_ms"] == \
        report["bench"]["parts"]["model"]["latency_ms"]["p50"]
    check_rendered(bundle, tmp_path, data)


def test_report_writes_the_page_again_and_refuses_a_folder_that_is_no_bundle(labelled, tmp_path):
    bundle, _ = labelled
    page = bundle / "reports" / "index.html"
    page.unlink()
    run = edgepack("report", str(bundle))
    assert run.exit_code == 0 and run.output.strip() == f"page: {page}"
    assert page.is_file()
    twin = json.loads(edgepack("report", str(bundle), "--json").output)
    assert twin["bundle"] == "colours"
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = edgepack("report", str(empty))
    assert bad.exit_code == 2 and bad.output.count("\n") == 1, bad.output
    assert bad.output.startswith("error: ") and "manifest.json" in bad.output
    assert not (empty / "reports").exists()


def big_output_model(path: Path, side: int) -> Path:
    """A 1x1 conv over a 1x3xSIDExSIDE image: each golden sample is several MB of tensors."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, side, side])],
        [helper.make_tensor("w", TensorProto.FLOAT, [3, 3, 1, 1],
                            np.eye(3, dtype=np.float32).ravel().tolist())])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_golden_data_is_bounded_by_default_and_as_asked_with_golden(tmp_path):
    model = big_output_model(tmp_path / "wide.onnx", 320)   # 1.2 MB in, 1.2 MB out a sample
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    np.save(calib / "x.npy", rng.random((30, 3, 320, 320), dtype=np.float32))
    run = edgepack("build", str(model), "--calib", str(calib), "--precision", "fp32",
                   "-o", str(tmp_path / "bounded"))
    assert run.exit_code == 0, run.output
    golden = json.loads((tmp_path / "bounded" / "manifest.json").read_text()
                        )["parts"][0]["golden"]
    assert 1 <= golden["samples"] < 8 and "--golden N keeps N" in golden["capped"]
    assert f"golden data: {golden['capped']}" in run.output
    stored = sum((tmp_path / "bounded" / golden[k]).stat().st_size
                 for k in ("inputs", "outputs", "shipped") if k in golden)
    assert stored < 8_000_000                     # 8 samples would be about 40 MB
    data, text = check_figures(tmp_path / "bounded")
    assert golden["capped"] in text and "MB each" in text
    assert "The shipped graph is FP32: no node runs in INT8" in text
    asked = edgepack("build", str(model), "--calib", str(calib), "--precision", "fp32",
                     "--golden", "3", "-o", str(tmp_path / "asked"))
    assert asked.exit_code == 0, asked.output
    golden = json.loads((tmp_path / "asked" / "manifest.json").read_text())["parts"][0]["golden"]
    assert golden["samples"] == 3 and "capped" not in golden


def test_a_manifest_with_records_edgepack_did_not_write_gets_a_page_saying_so(labelled,
                                                                             tmp_path):
    """The manifest's shape is checked, not every figure in its records: a hand-edited profile
    gives a page that says it cannot show them, never a crash (exit 3) of verify or report."""
    import shutil

    bundle = tmp_path / "edited"
    shutil.copytree(labelled[0], bundle)
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["parts"][0]["precision"]["profile"]["shipped"]["by_op"] = {"Conv": "slow"}
    path.write_text(json.dumps(manifest))
    run = edgepack("report", str(bundle))
    assert run.exit_code == 0, run.output
    page = (bundle / "reports" / "index.html").read_text()
    assert "This bundle's records cannot be shown" in page and "TypeError" in page
    twin = json.loads((bundle / "reports" / "index.json").read_text())
    assert twin["unreadable"].startswith("TypeError")


def test_text_from_the_manifest_is_escaped_on_the_page(labelled, tmp_path):
    """Whatever a manifest's records hold is text on the page, never markup: a hand-edited
    profile and labelled count that carry a script stay escaped."""
    import shutil

    from page_check import parse

    bundle = tmp_path / "edited"
    shutil.copytree(labelled[0], bundle)
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    precision = manifest["parts"][0]["precision"]
    precision["profile"]["runs"] = "<script>alert(1)</script>"
    precision["labelled_top1"]["n"] = "<img src=x>"
    path.write_text(json.dumps(manifest))
    assert edgepack("report", str(bundle)).exit_code == 0
    page = parse(bundle / "reports" / "index.html")   # no script, no img: refused by the parser
    assert "<script>alert(1)</script>" in " ".join(page.text)


def test_a_device_report_that_is_no_report_leaves_the_other_rows(labelled, tmp_path):
    import shutil

    bundle = tmp_path / "fleet"
    shutil.copytree(labelled[0], bundle)
    verify(bundle, runs=5, warmup=1)
    (bundle / "reports" / "pi").mkdir()
    (bundle / "reports" / "pi" / "report.json").write_text(json.dumps(
        {"bench": {"parts": ["not", "a", "table"]}, "passed": True}))
    assert edgepack("report", str(bundle)).exit_code == 0
    data, text = check_figures(bundle)
    rows = {d["device"]: d for d in data["devices"]}
    assert rows["pi"]["verdict"] == "unreadable report" and rows["pi"]["parts"] == {}
    assert rows["this machine (edgepack verify)"]["parts"]["model"]["p50_ms"] > 0


def test_a_device_report_with_wrong_typed_figures_blanks_no_row(labelled, tmp_path):
    """hostile-cases-turn5 #9: a device whose bench answered providers [1, 2], peak_rss_mb
    "big" or p50 "fast" blanked the whole page ("This bundle's records cannot be shown"). Its
    row now shows what it can read, as numbers or "-", and the other rows stay."""
    import shutil

    bundle = tmp_path / "typed"
    shutil.copytree(labelled[0], bundle)
    verify(bundle, runs=5, warmup=1)
    (bundle / "reports" / "d3").mkdir()
    (bundle / "reports" / "d3" / "report.json").write_text(json.dumps(
        {"bench": {"parts": {"model": {"providers": [1, 2], "latency_ms": {"p50": "fast"},
                                       "throughput_per_s": True}},
                   "peak_rss_mb": "big", "speech": {"real_time_factor": "slow"}},
         "passed": True}))
    assert edgepack("report", str(bundle)).exit_code == 0
    data, text = check_figures(bundle)
    rows = {d["device"]: d for d in data["devices"]}
    assert rows["d3"]["parts"]["model"]["p50_ms"] is None and rows["d3"]["peak_rss_mb"] is None
    assert rows["d3"]["parts"]["model"]["providers"] == []
    assert rows["this machine (edgepack verify)"]["parts"]["model"]["p50_ms"] > 0
    assert "cannot be shown" not in text


def test_non_finite_figures_are_left_out_of_the_charts_and_no_cosine_axis_passes_1():
    """hostile-cases-turn5 #18: an edited manifest's `cosine_min: NaN` or `p50_ms: Infinity`
    drew `cx="nan"`; first-week-turn5: the cosine axis was labelled above 1."""
    import re

    from packager.device.page_svg import bars, scatter

    points = [{"label": "FP32", "p50_ms": 1.0, "cosine_min": 1.0, "meets_budget": True},
              {"label": "INT8 a", "p50_ms": 0.5, "cosine_min": 0.995, "meets_budget": True,
               "shipped": True},
              {"label": "INT8 nan", "p50_ms": 0.4, "cosine_min": float("nan")},
              {"label": "INT8 inf", "p50_ms": float("inf"), "cosine_min": 0.99}]
    svg = scatter(points, 0.99, "candidates")
    assert "nan" not in svg.lower() and "inf" not in svg.lower().replace("info", "")
    assert svg.count('class="candidate"') == 2
    ticks = [float(t) for t in re.findall(r'text-anchor="end">(\d\.\d{4})<', svg)]
    assert ticks and max(ticks) <= 1.0, ticks
    assert scatter(points, float("nan"), "x").count('class="budget"') == 0
    svg = bars([("Conv", [1.0, float("nan")]), ("Relu", [float("inf"), 0.5])], ["FP32", "INT8"],
               "ms", "ops")
    assert "nan" not in svg.lower() and "inf" not in svg.lower()


def test_labels_of_points_close_together_do_not_overlap_and_backticks_are_code():
    """first-week-turn5: "shipped (CPU provider): INT8 preset" was drawn over "INT8 NNCF";
    "`make openvino`" showed its backticks."""
    import re

    from packager.device.page_html import prose
    from packager.device.page_svg import scatter

    points = [{"label": "INT8 preset", "p50_ms": 0.50, "cosine_min": 0.9950, "meets_budget": True,
               "shipped": True},
              {"label": "INT8 NNCF", "p50_ms": 0.51, "cosine_min": 0.9951, "meets_budget": True},
              {"label": "INT8 heavy ops only", "p50_ms": 0.52, "cosine_min": 0.9949,
               "meets_budget": True},
              {"label": "FP32", "p50_ms": 1.0, "cosine_min": 1.0, "meets_budget": True}]
    svg = scatter(points, 0.98, "candidates")
    boxes = []
    for m in re.finditer(r'<text x="([\d.]+)" y="([\d.]+)" font-size="(\d+)" '
                         r'text-anchor="(\w+)"[^>]*>([^<]*)</text>', svg):
        x, y, size, anchor, text = float(m[1]), float(m[2]), int(m[3]), m[4], m[5]
        if text not in [p["label"] for p in points] and not text.startswith("shipped ("):
            continue
        width = 0.6 * size * len(text)
        left = x if anchor == "start" else x - width
        boxes.append((left, y - size, left + width, y + 3))
    assert len(boxes) == 4
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (a, b)
    assert prose("install it (`make openvino`) <b>") == \
        "install it (<code>make openvino</code>) &lt;b&gt;"


def test_a_noisy_headline_is_a_range_never_one_figure():
    """issue 46 item 5: a ratio timed noisily is never the page's headline figure."""
    from packager.device.page_data import _noisy_range

    steady = {"bundle_p10_p90_ms": [1.0, 1.2], "other_p10_p90_ms": [2.0, 2.2], "load": None}
    assert _noisy_range(steady) == {}
    spread = {**steady, "bundle_p10_p90_ms": [1.0, 3.0]}
    found = _noisy_range(spread)
    assert found["speedup"] is None and found["speedup_range"] == [0.667, 2.2]
    assert "p90 is 3.0x p10" in found["noisy"]
    busy = {**steady, "load": {"other_share": 0.9, "cores": 2}}
    assert _noisy_range(busy)["speedup_range"] == [1.667, 2.2]
