"""One latency answer, measured (issue 26): the same bundle's p50 as the build's decision timed
it, as `edgepack verify` times it and as the bundle's own `run.py bench` does, each with its
p10-p90 and the machine's load, in one table. Run: .venv/bin/python tests/latency_agreement.py
[WORK] (the demo's CNN: trained once into WORK, default build/latency); tests/bench.py writes
the table into BENCHMARKS.md and tests/test_latency_agreement.py holds the three to agree."""

import json
import subprocess
import sys
from pathlib import Path

from packager.device.verify import verify
from packager.timing import machine, machine_line

SPREAD = 1.5   # p90 over p10 above this, or others' CPU over BUSY: the figure is noisy
MARGIN = 0.15  # separate processes differ (memory layout, clock): not a disagreement. CI saw
               # the build's p50 0.324 ms against the others' p10 0.325 ms; with the demo's INT8
               # at 0.27 ms (AMD EPYC, issue 44) verify and bench alone differed by 23 % in one run
               # (p50 0.294 against 0.362 ms) and the build's 0.267 fell under verify's p10 0.282


def measure(bundle: Path, runs: int = 200) -> list[dict]:
    """The bundle's latency three ways: the build's decision timing of the candidate it shipped
    (p50, p90), `verify` and `run.py bench` (p10, p50, p90, other processes' share of the cores)."""
    precision = json.loads((bundle / "manifest.json").read_text())["parts"][0]["precision"]
    decision = precision["decision"]
    chosen = next(c for c in decision["candidates"] if c["label"] == decision["label"])
    # the build says whether the machine was busy while it timed its candidates (CI saw its p50
    # 0.304 ms under the others' 0.324 ms floor in a build that had warned so)
    rows = [{"by": "build (decision timing)", "p50": chosen["p50_ms"], "p10": None,
             "p90": chosen.get("p90_ms"), "share": None,
             "noisy": (decision.get("timing") or {}).get("noisy") or ""}]
    rows.append(_build_method_now(bundle, runs))
    part = next(iter(verify(bundle, runs=runs)["bench"]["parts"].values()))
    rows.append(_row("verify", part))
    bench = subprocess.run([sys.executable, "-I", "run.py", "bench", "--runs", str(runs),
                            "--json"], cwd=bundle, capture_output=True, text=True, check=True)
    rows.append(_row("run.py bench", next(iter(json.loads(bench.stdout)["parts"].values()))))
    return rows


def _build_method_now(bundle: Path, runs: int) -> dict:
    """The bundle's model timed as the build times its candidates (packager.timing's session
    and blocks, the golden input, the target's threads), now: beside verify and bench in the
    same minute. The build's stored figure was taken minutes before, and this VM's speed moves
    between minutes (CI: verify and bench 0.35-0.36 ms in three rounds against the build's
    0.267; the same bundle afterwards 0.267 both ways in one process, and bench 0.265)."""
    import numpy as np

    from packager.timing import session, time_blocks

    manifest = json.loads((bundle / "manifest.json").read_text())
    threads = int((manifest.get("session") or {}).get("intra_op_threads", 0))
    with np.load(bundle / "golden" / "model.inputs.npz") as golden:
        feed = {k: np.asarray(golden[k][0]) for k in golden.files}
    run = session(bundle / manifest["parts"][0]["model"]["file"], threads)
    stats = time_blocks({"now": lambda: run.run(None, feed)}, rounds=5, block=max(3, runs // 5))
    return {"by": "build's timing, now", "p50": stats["now"]["p50"], "p10": stats["now"]["p10"],
            "p90": stats["now"]["p90"], "share": None, "noisy": ""}


def _row(by: str, part: dict) -> dict:
    lat = part["latency_ms"]
    return {"by": by, "p50": lat["p50"], "p10": lat["p10"], "p90": lat["p90"],
            "share": (part.get("load") or {}).get("other_share"), "noisy": part.get("noisy") or ""}


def disagreements(rows: list[dict]) -> list[str]:
    """Each p50 must lie inside the spread the measures state: from the lowest p10 to the
    highest p90 of those that give one, widened by MARGIN either side."""
    lo = min(r["p10"] for r in rows if r["p10"] is not None) * (1 - MARGIN)
    hi = max(r["p90"] for r in rows if r["p90"] is not None) * (1 + MARGIN)
    return [f"{r['by']} p50 {r['p50']:.3f} ms outside {lo:.3f}-{hi:.3f} ms"
            for r in rows if not lo <= r["p50"] <= hi]


def table(rows: list[dict]) -> str:
    lines = ["| measured by | p50 ms | p10 ms | p90 ms | others' CPU | noisy |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cells = [r["by"], f"{r['p50']:.3f}"] + [
            "-" if r[k] is None else f"{r[k]:.3f}" for k in ("p10", "p90")] + [
            "-" if r["share"] is None else f"{100 * r['share']:.0f}%", r["noisy"] or "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def demo_bundle(work: Path) -> Path:
    """The demo's CNN (51 M multiply-adds at 64 px), trained once into WORK, built for x86_64-cpu."""
    from packager.build.job import ExportOptions, build
    from packager.demo import CLASSES, PREPROCESS, SIZE, load_labelled, make_dataset, trained_weights
    from packager.source.specs import TensorSpec

    data = work / "data"
    if not (data / "test").is_dir():
        make_dataset(data, per_class={"train": 150, "calib": 125, "test": 60})
    weights, _ = trained_weights(work, data, lambda _: None)
    load_labelled(data / "test")
    out = work / "bundle"
    build("packager.demo:make_net", out, target="x86_64-cpu", calib=data / "calib",
          preprocess=dict(PREPROCESS), inputs=[TensorSpec("image", (1, 3, SIZE, SIZE))],
          export_options=ExportOptions(weights=weights, output_names=["scores"]),
          labels=CLASSES, force=True, log=lambda _: None)
    return out


def main() -> None:
    out = demo_bundle(Path(sys.argv[1] if len(sys.argv) > 1 else "build/latency"))
    rows = measure(out)
    description = json.loads((out / "manifest.json").read_text())["parts"][0]["precision"]
    print(f"Machine: {machine_line(machine())}; bundle: {description['description']}")
    print(table(rows))
    print("agree" if not disagreements(rows) else "; ".join(disagreements(rows)))


if __name__ == "__main__":
    main()
