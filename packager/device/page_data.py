"""The bundle's page as data (reports/index.json, the page's twin): every figure the page shows,
taken from the manifest and the device reports as they are, never measured again here."""

import json
import time
from pathlib import Path
from typing import Any

from ..bundle.manifest import read_manifest

SCHEMA = 1
GOLDEN_KEYS = ("inputs", "outputs", "shipped")


def file_kind(name: str) -> str:
    """model, golden data, runner, roofline or other: what a bundle's file is for."""
    if name.startswith("golden/"):
        return "golden data"
    if name.startswith("runner/") or name == "run.py":
        return "runner"
    if name.startswith("roofline/"):
        return "roofline graphs"
    if name.endswith((".onnx", ".ort", ".onnx.data", ".data")) or "/" in name and \
            name.split("/")[0] in ("openvino", "graphs"):
        return "model"
    return "other"


def sizes(bundle: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Bytes per file kind, over the manifest's file table (what is copied to a device)."""
    kinds: dict[str, int] = {}
    for name in [*manifest.get("files", {}), "manifest.json"]:
        path = bundle / name
        size = path.stat().st_size if path.is_file() else 0
        kinds[file_kind(name)] = kinds.get(file_kind(name), 0) + size
    return {"by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "total": sum(kinds.values())}


def golden_cost(bundle: Path, part: dict[str, Any]) -> dict[str, Any] | None:
    """The part's golden files: samples, bytes, bytes per sample (what `--golden N` costs)."""
    golden = part.get("golden") or {}
    files = [golden[k] for k in GOLDEN_KEYS if isinstance(golden.get(k), str)]
    if not files:
        return None
    total = sum((bundle / f).stat().st_size for f in files if (bundle / f).is_file())
    samples = int(golden.get("samples") or 0)
    return {"samples": samples, "bytes": total,
            "per_sample": round(total / samples) if samples else None,
            "capped": golden.get("capped")}


def candidates(decision: dict[str, Any]) -> list[dict[str, Any]]:
    """The decision's candidates, the one that shipped marked (the CPU provider's), and the
    one a faster provider runs where the build chose one (shipped_under: its name)."""
    rows = []
    choice = decision.get("provider_choice") or {}
    faster = choice.get("graph") if choice.get("chosen") else None
    for c in decision.get("candidates") or []:
        rows.append({"label": c.get("label"), "precision": c.get("precision"),
                     "p50_ms": c.get("p50_ms"), "p90_ms": c.get("p90_ms"),
                     "cosine_min": c.get("cosine_min"), "task": c.get("task") or {},
                     "meets_budget": bool(c.get("meets_budget")), "error": c.get("error"),
                     "shipped": c.get("label") == decision.get("label"),
                     "shipped_under": str(choice.get("provider", "")).replace(
                         "ExecutionProvider", "") if c.get("label") == faster else None})
    return rows


def speed_rows(precision: dict[str, Any]) -> list[dict[str, Any]]:
    """The bundle against the original, eager PyTorch and the faster provider, as recorded."""
    rows = []
    vs = precision.get("vs_original") or {}
    if vs.get("measured") is not False and vs.get("original_p50_ms") and vs.get("bundle_p50_ms"):
        rows.append({"against": "the original ONNX graph (CPU provider)",
                     "bundle_p50_ms": vs["bundle_p50_ms"], "other_p50_ms": vs["original_p50_ms"],
                     "bundle_p10_p90_ms": vs.get("bundle_p10_p90_ms"),
                     "other_p10_p90_ms": vs.get("original_p10_p90_ms"),
                     "speedup": vs.get("speedup"), "load": vs.get("load")})
    eager = precision.get("vs_eager") or {}
    if eager.get("measured") and eager.get("eager_p50_ms"):
        rows.append({"against": f"eager PyTorch ({eager.get('threads', '?')} threads)",
                     "bundle_p50_ms": eager["bundle_p50_ms"],
                     "other_p50_ms": eager["eager_p50_ms"],
                     "bundle_p10_p90_ms": eager.get("bundle_p10_p90_ms"),
                     "other_p10_p90_ms": eager.get("eager_p10_p90_ms"),
                     "speedup": eager.get("speedup"), "load": eager.get("load"),
                     "speedup_range": eager.get("speedup_range")})
    choice = (precision.get("decision") or {}).get("provider_choice") or {}
    if choice.get("p50_ms") and choice.get("cpu_p50_ms"):
        name = str(choice.get("provider", "")).replace("ExecutionProvider", "")
        rows.append({"against": f"the CPU provider's graph, bundle under {name}"
                                + ("" if choice.get("chosen") else " (not chosen)"),
                     "bundle_p50_ms": choice["p50_ms"], "other_p50_ms": choice["cpu_p50_ms"],
                     "bundle_p10_p90_ms": None, "other_p10_p90_ms": None,
                     "speedup": choice.get("gain"), "load": None})
    return rows


def part_data(bundle: Path, part: dict[str, Any]) -> dict[str, Any]:
    precision = part.get("precision") or {}
    decision = precision.get("decision") or {}
    accuracy = part.get("accuracy") or {}
    return {"name": part.get("name"), "task": (part.get("task") or {}).get("kind"),
            "shipped": precision.get("description"), "label": decision.get("label"),
            "reason": decision.get("reason"),
            "evidence": (decision.get("evidence") or {}).get("verdict")
            if isinstance(decision.get("evidence"), dict) else None,
            "provider_choice": {k: decision.get("provider_choice", {}).get(k)
                                for k in ("provider", "chosen", "reason", "graph")}
            if decision.get("provider_choice") else None,
            "budget": {"spec": decision.get("budget"),
                       "min_cosine": decision.get("budget_min_cosine")},
            "candidates": candidates(decision), "speed": speed_rows(precision),
            "accuracy": {"cosine_min": accuracy.get("cosine_min"),
                         "samples": accuracy.get("samples"),
                         "task": (accuracy.get("task") or {}).get("text"),
                         "passed": (accuracy.get("budget") or {}).get("passed")},
            "labelled": precision.get("labelled_top1"), "profile": precision.get("profile"),
            "float_nodes": precision.get("float_nodes"), "golden": golden_cost(bundle, part),
            "model_bytes": (part.get("model") or {}).get("bytes"),
            "graphs": [g.get("file") for g in part.get("graphs") or [] if isinstance(g, dict)]}


def device_rows(bundle: Path, digest: str) -> list[dict[str, Any]]:
    """The latest report of each device: reports/report.json (verify here) and
    reports/HOST/report.json (deploy), newest first."""
    found = []
    reports = bundle / "reports"
    places = [("this machine (edgepack verify)", reports / "report.json")]
    if reports.is_dir() and not reports.is_symlink():
        places += [(d.name, d / "report.json") for d in sorted(reports.iterdir())
                   if d.is_dir() and not d.is_symlink()]
    for device, path in places:
        if not path.is_file() or path.is_symlink():
            continue
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        when = path.stat().st_mtime
        try:   # a device's answer is its own: one that is no report spoils no other row
            found.append(device_row(device, report, when, digest))
        except (TypeError, AttributeError, ValueError, KeyError):
            found.append(device_row(device, {"verdict": "unreadable report"}, when, digest))
    return sorted(found, key=lambda r: r["when"], reverse=True)


def _num(value: Any) -> float | None:
    """A figure as a number the page can format, or None (a device's report is its own: a
    string, a bool or NaN there blanked the whole page)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or \
            value in (float("inf"), float("-inf")):
        return None
    return float(value)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _names(value: Any) -> list[str] | None:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else None


def _speech(bench: dict[str, Any]) -> dict[str, Any] | None:
    """The device's speech figures (bench's `speech`, or a one-graph tts part's), numbers
    only."""
    found = bench.get("speech")
    if isinstance(found, dict):
        first = found.get("first_audio_ms")
        rows = [r for r in found.get("sentences") or [] if isinstance(r, dict)]
        return {"sentences": [{"file": _text(r.get("file")), "seconds": _num(r.get("seconds")),
                               "latency_ms": _latency(r.get("latency_ms")),
                               "real_time_factor": _num(r.get("real_time_factor")),
                               "first_audio_ms": _num(r.get("first_audio_ms"))} for r in rows],
                "audio_s": _num(found.get("audio_s")),
                "real_time_factor": _num(found.get("real_time_factor")),
                "first_audio_ms": {"p50": _num(first.get("p50"))} if isinstance(first, dict)
                else None}
    for name, part in (bench.get("parts") or {}).items():   # a one-graph tts part's figures
        if isinstance(part, dict) and _num(part.get("real_time_factor")) is not None:
            return {"sentences": [{"file": f"{name} (golden sample)",
                                   "seconds": _num(part.get("audio_s")),
                                   "latency_ms": _latency(part.get("latency_ms")),
                                   "real_time_factor": _num(part["real_time_factor"]),
                                   "first_audio_ms": None}],
                    "audio_s": _num(part.get("audio_s")),
                    "real_time_factor": _num(part["real_time_factor"]), "first_audio_ms": None}
    return None


def _latency(value: Any) -> dict[str, float | None]:
    lat = value if isinstance(value, dict) else {}
    return {k: _num(lat.get(k)) for k in ("p50", "p10", "p90")}


def device_row(device: str, report: dict[str, Any], when: float, digest: str) -> dict[str, Any]:
    bench = report.get("bench") if isinstance(report.get("bench"), dict) else {}
    facts = bench.get("device") if isinstance(bench.get("device"), dict) else {}
    parts = {}
    for name, part in (bench.get("parts") or {}).items():
        part = part if isinstance(part, dict) else {}
        lat = _latency(part.get("latency_ms"))
        parts[str(name)] = {"p50_ms": lat["p50"], "p10_ms": lat["p10"], "p90_ms": lat["p90"],
                            "throughput_per_s": _num(part.get("throughput_per_s")),
                            "providers": _names(part.get("providers")),
                            "loaded": _text(part.get("loaded")),
                            "noisy": _text(part.get("noisy")) or "",
                            "roofline_share": _num(part.get("roofline_share"))}
    failed = [c for c in report.get("checks") or [] if isinstance(c, dict) and not c.get("passed")]
    return {"device": device, "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when)),
            "failed": [f"{c.get('name')}: {c.get('detail')}" for c in failed],
            "verdict": _text(report.get("verdict")) or ("passed" if report.get("passed") is True
                                                        else "failed"),
            "this_version": report.get("digest") == digest, "digest": _text(report.get("digest")),
            "on_target": report.get("on_target") is not False,
            "cpu": _text(facts.get("cpu")), "arch": _text(facts.get("arch")),
            "onnxruntime": _text(bench.get("onnxruntime")),
            "peak_rss_mb": _num(bench.get("peak_rss_mb")), "parts": parts,
            "speech": _speech(bench)}


def page_data(bundle: Path, digest: str) -> dict[str, Any]:
    """Everything the page shows, from the manifest, the files' sizes and the reports."""
    bundle = Path(bundle)
    manifest = read_manifest(bundle)   # its shape checked: target is an object with a name
    data = {"schema": SCHEMA, "bundle": manifest.get("name"),
            "target": manifest["target"]["name"],
            "created": manifest.get("created"), "digest": digest,
            "providers": manifest.get("providers"), "budget": manifest.get("budget"),
            "written": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "size": sizes(bundle, manifest),
            "parts": [part_data(bundle, p) for p in manifest.get("parts") or []],
            "devices": device_rows(bundle, digest),
            "pipeline": bool(manifest.get("pipeline")), "speech": speech_data(manifest)}
    data["summary"] = summary(data)
    return data


def _noisy_range(row: dict[str, Any]) -> dict[str, Any]:
    """A headline timed noisily (a busy machine, or calls spread past 2x) is given as the range
    its spreads allow, never one figure: {} where it was steady."""
    from .._runtimes.runner.load import noise

    mine, theirs = row.get("bundle_p10_p90_ms"), row.get("other_p10_p90_ms")
    if not (isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs) == 2
            and all(isinstance(v, (int, float)) and v > 0 for v in mine + theirs)):
        return {}
    why = noise(row.get("load") if isinstance(row.get("load"), dict) else None,
                {"p10": mine[0], "p90": mine[1]})
    if not why:
        return {}
    return {"speedup": None, "noisy": why,
            "speedup_range": [round(theirs[0] / mine[1], 3), round(theirs[1] / mine[0], 3)]}


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """The page's first lines: what shipped, the verdict and p50 on the target (or that it was
    not measured there), one headline speed figure and what it compares, accuracy against the
    user's labels where there are any, peak memory and size."""
    parts = data["parts"]
    several = len(parts) > 1
    mine = [d for d in data["devices"] if d["this_version"]]
    there = next((d for d in mine if d["on_target"] and d["parts"]), None)
    headline = None
    for part in parts[:1] if not several else ():
        row = (part.get("speed") or [None])[0]
        if row:
            headline = {"against": row["against"], "speedup": row.get("speedup"),
                        "speedup_range": row.get("speedup_range"),
                        "bundle_p50_ms": row.get("bundle_p50_ms"),
                        "other_p50_ms": row.get("other_p50_ms"), **_noisy_range(row)}
    labelled = [(p["name"], p["labelled"]) for p in parts
                if isinstance(p.get("labelled"), dict) and "top1" in p["labelled"]]
    return {"shipped": "; ".join((f"{p['name']}: " if several else "") + str(p["shipped"])
                                 for p in parts),
            "verdict": mine[0]["verdict"] if mine else None,
            "verdict_on": mine[0]["device"] if mine else None,
            "target_p50_ms": {n: v["p50_ms"] for n, v in there["parts"].items()} if there
            else None, "target_device": there["device"] if there else None,
            "headline": headline,
            "labelled": [{"part": n, "fp32": found["top1"],
                          "shipped": (found.get("shipped") or found)["top1"], "n": found["n"]}
                         for n, found in labelled],
            "peak_rss_mb": there["peak_rss_mb"] if there else None,
            "size_mb": round(data["size"]["total"] / 1e6, 2) if data.get("size") else None}


def speech_data(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """A speech bundle's judgement as the page shows it: a tts pipeline's end-to-end figure
    (held-out sentences against the model as it runs), or a tts part's own; else None."""
    pipeline = manifest.get("pipeline") or {}
    if pipeline.get("kind") == "tts":
        acc = pipeline.get("accuracy") or {}
        return {"text": acc.get("text"), "passed": acc.get("passed"),
                "reference": acc.get("reference"), "worst_mel_db": acc.get("worst_mel_db"),
                "sentences": acc.get("sentences")}
    for part in manifest.get("parts") or []:
        if (part.get("task") or {}).get("kind") == "tts":
            task = (part.get("accuracy") or {}).get("task") or {}
            return {"text": task.get("text"), "passed": task.get("passed"),
                    "reference": "the FP32 graph", "worst_mel_db": None,
                    "sentences": task.get("samples")}
    return None
