"""The bundle's page (reports/index.html) from its data (page_data.py): one self-contained HTML
file, inline CSS and SVG, no script, font or link to anything outside it."""

import re
from collections.abc import Sequence
from html import escape
from typing import Any

from ..quantization.profile import family
from .page_svg import bars, scatter, stacked

CSS = """body{font-family:system-ui,sans-serif;max-width:980px;margin:24px auto;padding:0 16px;
color:#222}h1{font-size:1.5em}h2{margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;font-size:.9em}th{background:#f3f3f3}.pass{color:#1a7f37}.fail{color:#c62828}
.warn{color:#b26a00}.note{color:#555;font-size:.9em}svg.chart{display:block;margin:8px 0}
code{background:#f5f5f5;padding:0 3px}table.devices,table.speed{display:block;overflow-x:auto;
max-width:100%}"""


def ms(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def spread(pair: Any) -> str:
    return f"{pair[0]:.3f}-{pair[1]:.3f}" if isinstance(pair, (list, tuple)) and \
        len(pair) == 2 and None not in pair else "-"


def pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def prose(text: Any) -> str:
    """Escaped text, its `code` spans (a reason's `make openvino`) set as code, not backticks."""
    return re.sub(r"`([^`<>]{1,200})`", r"<code>\1</code>", escape(str(text)))


def table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    out = [f'<table{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}><tr>'
           + "".join(f"<th>{escape(str(h))}</th>" for h in head) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>")
    return "".join(out) + "</table>"


def header(data: dict[str, Any]) -> str:
    providers = ", ".join(p.get("name", "?") if isinstance(p, dict) else str(p)
                          for p in data.get("providers") or [])
    return (f"<h1>{escape(str(data['bundle']))}: what shipped, how fast, how close</h1>"
            f"<p>target <b>{escape(str(data['target']))}</b>; built {escape(str(data['created']))}"
            f"; providers in order: {escape(providers)}; digest <code>"
            f"{escape(str(data['digest']))}</code> (verify and deploy take it as "
            f"--expect-digest). Page written {escape(data['written'])} from the manifest and "
            f"the reports beside it.</p>")


def summary(data: dict[str, Any]) -> str:
    """The page's first lines: one story, the same words as the terminal's."""
    found = data.get("summary") or {}
    if not found:
        return ""
    p50 = found.get("target_p50_ms")
    rows = [["shipped", found.get("shipped") or "-"],
            ["verdict", f"{found['verdict']} ({found['verdict_on']})" if found.get("verdict")
             else "not verified yet: edgepack verify here, or deploy to a device"],
            ["p50 on the target", (" / ".join(f"{k} {ms(v)} ms" for k, v in p50.items())
                                   + f" ({found['target_device']})") if p50 else
             "not measured on the target: deploy to one (the build's timings below are its "
             "host's)"]]
    head = found.get("headline")
    if head:
        rows.append(["speed (headline)",
                     f"{ratio_text(head.get('speedup'), head.get('speedup_range'))} the speed of "
                     f"{head['against']}: {ms(head.get('bundle_p50_ms'))} vs "
                     f"{ms(head.get('other_p50_ms'))} ms p50, interleaved in one run on the "
                     "build's host"
                     + (f"; NOISY ({head['noisy']}): a range, build again on a quiet machine "
                        "for one figure" if head.get("noisy") else "")
                     + " (the other figures below each say what they compare)"])
    for entry in found.get("labelled") or []:
        rows.append([f"against your labels ({entry['part']})",
                     f"top-1 shipped {pct(entry['shipped'])}, FP32 {pct(entry['fp32'])} on "
                     f"{entry['n']} labelled images"])
    rows.append(["peak memory", "-" if found.get("peak_rss_mb") is None else
                 f"{found['peak_rss_mb']:.0f} MB on the target (run.py bench)"])
    if found.get("size_mb") is not None:
        rows.append(["size", f"{found['size_mb']:.2f} MB copied to each device"])
    return "<h2>Summary</h2>" + table(["", ""], rows, "summary")


def decision(part: dict[str, Any]) -> str:
    out = [f"<p><b>Shipped:</b> {escape(str(part['shipped']))}.</p>",
           f"<p><b>Why</b> (the search's own timing of its candidates, on the build's host)"
           f": {prose(part['reason'] or 'no decision recorded')}</p>"]
    if part.get("evidence"):
        out.append(f"<p><b>Evidence:</b> {prose(part['evidence'])} (whether the samples "
                   "judged could show the accuracy budget: one confident miss would break "
                   "it)</p>")
    choice = part.get("provider_choice")
    if choice and choice.get("reason"):
        out.append(f"<p><b>Faster provider:</b> {prose(choice['reason'])}</p>")
    return "".join(out)


def speed(part: dict[str, Any]) -> str:
    rows = [[r["against"], ms(r["bundle_p50_ms"]), spread(r["bundle_p10_p90_ms"]),
             ms(r["other_p50_ms"]), spread(r["other_p10_p90_ms"]),
             ratio_text(r.get("speedup"), r.get("speedup_range")),
             load_text(r.get("load"))] for r in part["speed"]]
    if not rows:
        return "<h3>Speed</h3><p class=\"note\">The build did not time this part here.</p>"
    return ("<h3>Speed, as the build measured it on its host</h3>" + table(
        ["against", "bundle p50 ms", "bundle p10-p90", "other p50 ms", "other p10-p90",
         "bundle's speed", "machine load"], rows, "speed"))


def ratio_text(speedup: Any, between: Any) -> str:
    """One ratio, or for a timing noisy twice the range its spreads allow (never one figure)."""
    if isinstance(speedup, (int, float)) and speedup > 0:
        return f"{speedup:.2f}x"
    if isinstance(between, list) and len(between) == 2 and \
            all(isinstance(v, (int, float)) for v in between):
        return f"{between[0]:.2f}-{between[1]:.2f}x (noisy: a range)"
    return "-"


def load_text(load: Any) -> str:
    if not isinstance(load, dict) or load.get("other_share") is None:
        return "-"
    return f"others used {100 * load['other_share']:.0f} % of {load.get('cores', '?')} cores"


def candidates(part: dict[str, Any]) -> str:
    rows = [[c["label"] + (" (shipped)" if c["shipped"] else "")
             + (f" (shipped under {c['shipped_under']})" if c.get("shipped_under") else ""),
             c["precision"] or "-",
             ms(c["p50_ms"]), ms(c["p90_ms"]),
             "-" if c["cosine_min"] is None else f"{c['cosine_min']:.4f}",
             ", ".join(f"{k} {v:.3f}" for k, v in c["task"].items()) or "-",
             "yes" if c["meets_budget"] else ("error: " + c["error"] if c["error"] else "no")]
            for c in part["candidates"]]
    budget = part["budget"]
    chart = scatter(part["candidates"], budget.get("min_cosine"),
                    f"{part['name']}: candidates, speed against accuracy")
    return (f"<h3>The candidates (budget: {escape(str(budget.get('spec')))})</h3>" + chart
            + table(["candidate", "precision", "p50 ms", "p90 ms", "cosine min", "task",
                     "within budget"], rows, "candidates"))


def accuracy(part: dict[str, Any], pipeline: bool = False) -> str:
    acc = part["accuracy"]
    out = ["<h3>Accuracy</h3><p>"
           + escape(f"{acc['task'] or 'no task figure'}; cosine min "
                    f"{'-' if acc['cosine_min'] is None else format(acc['cosine_min'], '.4f')} "
                    f"on {acc['samples'] or '?'} held-out samples")
           + f" <b class=\"{'pass' if acc['passed'] else 'fail'}\">"
           + ("within budget" if acc["passed"] else "outside budget") + "</b></p>"]
    if part.get("labelled") or part.get("task") in (None, "classify") and not pipeline:
        out.append(labelled(part.get("labelled")))   # class folders mean something to these
    return "".join(out)


def labelled(found: dict[str, Any] | None) -> str:
    if not found:
        return ("<p class=\"note\">No labelled top-1: put the calibration images in class "
                "folders (calib/cat/1.jpg) to see it against your labels.</p>")
    if "skipped" in found:
        return f"<p class=\"note\">Labelled top-1 not measured: {escape(found['skipped'])}.</p>"
    shipped = found.get("shipped") or found
    where = (f"of your --eval folder {found['folder']}, never calibrated on"
             if found.get("folder") else "of the calibration set")
    out = [f"<p><b>Against your labels</b> ({escape(str(found['n']))} images in class folders "
           f"{escape(where)}, {escape(found['mapping'])}): labelled top-1 FP32 "
           f"{pct(found['top1'])}, shipped {pct(shipped['top1'])}.</p>"]
    tried = found.get("preprocessing") or {}
    if tried.get("warning"):
        out.append(f"<p class=\"warn\"><b>Warning:</b> {escape(str(tried['warning']))}</p>")
    elif tried.get("alternatives"):
        out.append("<p class=\"note\">No usual alternative to your preprocessing scores "
                   "markedly higher on these images ("
                   + escape(", ".join(f"{k}: {pct(v)}" for k, v in tried["alternatives"].items()))
                   + ").</p>")
    for name, result in (("FP32", found), ("shipped", shipped)):
        conf = result.get("confusion")
        if conf:
            out.append(f"<p class=\"note\">Confusion, {name} (rows: your folder; columns: the "
                       f"answer)</p>" + table(["folder", *conf["columns"]],
                                              [[c, *row] for c, row in
                                               zip(conf["classes"], conf["matrix"], strict=True)],
                                              "confusion"))
    return "".join(out)


def profile(part: dict[str, Any]) -> str:
    prof = part.get("profile")
    if not prof:
        return "<h3>Where the time goes</h3><p class=\"note\">No profile recorded by the build.</p>"
    shipped = prof.get("shipped") or {}
    fp32 = prof.get("fp32") if isinstance(prof.get("fp32"), dict) else None
    if "skipped" in shipped:
        return f"<h3>Where the time goes</h3><p class=\"note\">{escape(shipped['skipped'])}</p>"
    fams = families(shipped, fp32)
    series = ["FP32", "shipped"] if fp32 else ["shipped"]
    chart = bars([(f, [fp32_ms, ms_] if fp32 else [ms_]) for f, fp32_ms, ms_ in fams],
                 series, "ms", f"{part['name']}: time per op type")
    nodes = [[n["node"], n["op"], ms(n["ms"])] for n in shipped.get("top_nodes", [])]
    return ("<h3>Where the time goes</h3><p class=\"note\">onnxruntime's profiler on "
            f"{escape(str(prof.get('measured_on')))}, {escape(str(prof.get('runs')))} calls, ms "
            "per call "
            f"(kernel time: shipped {ms(shipped.get('kernel_ms'))}"
            + (f", FP32 {ms(fp32.get('kernel_ms'))}" if fp32 else "")
            + "; another provider's own graph is not profiled here; a run of its own with "
            "the profiler on, not the headline)</p>" + _contradicts(part, shipped, fp32) + chart
            + "<p>The shipped graph's slowest nodes</p>"
            + table(["node", "op", "ms"], nodes, "nodes") + float_table(part))


def _contradicts(part: dict[str, Any], shipped: dict[str, Any], fp32: dict[str, Any] | None
                 ) -> str:
    """A note where the profile puts the shipped graph behind FP32 while the timed runs chose it
    (the demo's page: 1.27x in Why, the profile's INT8 twice as slow, nothing reconciling)."""
    mine, theirs = shipped.get("kernel_ms"), (fp32 or {}).get("kernel_ms")
    if not isinstance(mine, (int, float)) or not isinstance(theirs, (int, float)) or \
            mine <= theirs or str(part.get("label") or "FP32").startswith("FP32"):
        return ""
    return ("<p class=\"note\">The profiler puts the shipped graph behind FP32 "
            f"({ms(mine)} vs {ms(theirs)} ms of kernel time) while the timed runs chose it: the "
            "profiler adds a cost per node, which a graph of many small Q/DQ nodes pays more "
            "of. The timed runs (the headline) decide; the profile shows where the time "
            "goes.</p>")


def families(shipped: dict[str, Any], fp32: dict[str, Any] | None) -> list[tuple]:
    """(op family, FP32 ms, shipped ms), the costliest first."""
    def fam(prof: dict[str, Any] | None) -> dict[str, float]:
        out: dict[str, float] = {}
        for op, value in ((prof or {}).get("by_op") or {}).items():
            out[family(op)] = out.get(family(op), 0.0) + value
        return out
    a, b = fam(fp32), fam(shipped)
    return sorted(((f, a.get(f), b.get(f)) for f in set(a) | set(b)),
                  key=lambda r: -max(r[1] or 0.0, r[2] or 0.0))[:12]


def float_table(part: dict[str, Any]) -> str:
    nodes = part.get("float_nodes")
    if str(part.get("shipped") or "").startswith("FP32"):
        return "<p>The shipped graph is FP32: no node runs in INT8 (why: the decision above).</p>"
    if nodes is None:
        return ""
    if not nodes:
        return "<p>Every node that the quantizer handles runs in INT8.</p>"
    return (f"<p>{len(nodes)} node{'s' if len(nodes) != 1 else ''} stayed float</p>"
            + table(["node", "op", "why"], [[n["node"], n["op"], n["why"]] for n in nodes],
                    "float"))


def size(data: dict[str, Any]) -> str:
    by_kind = data["size"]["by_kind"]
    chart = stacked(list(by_kind.items()), "the bundle's bytes by file kind")
    notes = []
    for part in data["parts"]:
        golden = part.get("golden")
        if golden and golden.get("per_sample"):
            notes.append(f"{part['name']}: {golden['samples']} golden samples, "
                         f"{golden['bytes'] / 1e6:.2f} MB ({golden['per_sample'] / 1e6:.2f} MB "
                         f"each: every sample more that --golden asks costs that on every "
                         f"device)" + (f"; {golden['capped']}" if golden.get("capped") else ""))
    return (f"<h2>Size: {data['size']['total'] / 1e6:.2f} MB copied to each device</h2>" + chart
            + "".join(f"<p class=\"note\">{escape(n)}</p>" for n in notes))


def speech(data: dict[str, Any]) -> str:
    """A speech bundle's section: how it was judged end to end, and each device's real-time
    factor, first audio and per-sentence latency."""
    found = data.get("speech")
    if not found:
        return ""
    out = ["<h2>Speech</h2><p>" + escape(str(found.get("text") or "not judged end to end"))
           + (f" (against {escape(str(found['reference']))})" if found.get("reference") else "")
           + "</p>"]
    rows = []
    for d in data["devices"]:
        s = d.get("speech")
        if not s:
            continue
        first = s.get("first_audio_ms") or {}
        for r in s.get("sentences") or []:
            lat = r.get("latency_ms") or {}
            rows.append([d["device"], r.get("file"), "-" if r.get("seconds") is None else
                         f"{r['seconds']:.2f}", ms(lat.get("p50")), ms(lat.get("p90")),
                         "-" if r.get("real_time_factor") is None else
                         f"{r['real_time_factor']:.3f}", ms(r.get("first_audio_ms"))])
        rtf = s.get("real_time_factor")
        rows.append([d["device"], "all sentences", "-" if s.get("audio_s") is None else
                     f"{s['audio_s']:.2f}", "-", "-", "-" if not rtf else
                     f"{rtf:.3f} ({1 / rtf:.1f}x real time)", ms(first.get("p50"))])
    if rows:
        out.append(table(["device", "sentence", "audio s", "p50 ms", "p90 ms",
                          "real-time factor", "first audio ms"], rows, "speech"))
        out.append("<p class=\"note\">Real-time factor: compute over audio (lower is better). "
                   "First audio: until the vocoder's first piece, what a listener waits for "
                   "where <code>serve</code> streams (<code>?stream=1</code>).</p>")
    else:
        out.append("<p class=\"note\">No device has timed its sentences yet: "
                   "<code>edgepack verify</code> here or <code>edgepack deploy</code>.</p>")
    return "".join(out)


def devices(data: dict[str, Any]) -> str:
    rows = []
    for d in data["devices"]:
        if not d["parts"]:   # refused or failed before bench: what failed, nothing timed
            rows.append([d["device"], d["when"], d["verdict"],
                         "this version" if d["this_version"] else f"other ({d['digest']})",
                         "-", "-", "-", "-", "-", "-", "; ".join(d["failed"]) or "-", "-"])
        for name, p in d["parts"].items():
            rows.append([d["device"], d["when"], d["verdict"],
                         "this version" if d["this_version"] else f"other ({d['digest']})",
                         name, ", ".join(p["providers"] or []), ms(p["p50_ms"]),
                         f"{ms(p['p10_ms'])}-{ms(p['p90_ms'])}",
                         "-" if p["throughput_per_s"] is None else f"{p['throughput_per_s']:.1f}",
                         "-" if d["peak_rss_mb"] is None else f"{d['peak_rss_mb']:.0f}",
                         f"{d['cpu'] or '?'} ({d['arch'] or '?'}), onnxruntime "
                         f"{d['onnxruntime'] or '?'}", p["noisy"] or "no"])
    if not rows:
        return ("<h2>Devices</h2><p class=\"note\">No device report yet: <code>edgepack verify"
                "</code> here or <code>edgepack deploy</code> to a device adds one.</p>")
    return "<h2>Devices: each one's latest report</h2>" + table(
        ["device", "when", "verdict", "bundle", "part", "providers", "p50 ms", "p10-p90 ms",
         "per s", "peak MB", "machine", "noisy"], rows, "devices")


def render(data: dict[str, Any]) -> str:
    body = [header(data), summary(data), speech(data)]
    for part in data["parts"]:
        title = f"Part {part['name']}" + (f" ({part['task']})" if part.get("task") else "")
        body += [f"<h2>{escape(title)}</h2>", decision(part), speed(part), candidates(part),
                 accuracy(part, data.get("pipeline")), profile(part)]
    body += [size(data), devices(data)]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"{escape(str(data['bundle']))}: edgepack bundle</title><style>{CSS}</style></head>"
            "<body>" + "\n".join(body) + "</body></html>\n")
