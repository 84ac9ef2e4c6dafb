"""One latency answer, measured (issue 26): the same bundle's p50 as the build's decision timed
it, as `edgepack verify` times it and as the bundle's own `run.py bench` does, each with its
p10-p90 and the machine's load, in one table. Run: .venv/bin/python tests/latency_agreement.py
[WORK] (the demo's CNN: trained once into WORK, default build/latency)."""

import json
import subprocess
import sys
from pathlib import Path

from packager.demo import CLASSES, PREPROCESS, SIZE, load_labelled, make_dataset, trained_weights
from packager.device.verify import verify
from packager.pipeline import ExportOptions, build
from packager.source.specs import TensorSpec
from packager.timing import machine, machine_line


def main() -> None:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "build/latency")
    data = work / "data"
    if not (data / "test").is_dir():
        make_dataset(data, per_class={"train": 150, "calib": 40, "test": 60})
    weights, _ = trained_weights(work, data, print)
    load_labelled(data / "test")
    out = work / "bundle"
    build("packager.demo:make_net", out, target="x86_64-cpu", calib=data / "calib",
          preprocess=dict(PREPROCESS), inputs=[TensorSpec("image", (1, 3, SIZE, SIZE))],
          export_options=ExportOptions(weights=weights, output_names=["scores"]),
          labels=CLASSES, force=True, log=lambda _: None)
    decision = json.loads((out / "manifest.json").read_text())["parts"][0]["precision"]
    chosen = next(c for c in decision["decision"]["candidates"]
                  if c["label"] == decision["decision"]["label"])
    rows = [("build (decision timing)", chosen["p50_ms"], None, chosen.get("p90_ms"), None)]
    report = verify(out, runs=200)
    lat = report["bench"]["parts"]["model"]["latency_ms"]
    load = report["bench"]["parts"]["model"].get("load", {})
    rows.append(("verify", lat["p50"], lat["p10"], lat["p90"], load.get("other_share")))
    bench = subprocess.run([sys.executable, "run.py", "bench", "--runs", "200", "--json"],
                           cwd=out, capture_output=True, text=True, check=True)
    part = json.loads(bench.stdout)["parts"]["model"]
    rows.append(("run.py bench", part["latency_ms"]["p50"], part["latency_ms"]["p10"],
                 part["latency_ms"]["p90"], part["load"].get("other_share")))
    print(f"Machine: {machine_line(machine())}; bundle: {decision['description']}")
    print("| measured by | p50 ms | p10 ms | p90 ms | others' CPU |\n| --- | --- | --- | --- | --- |")
    for name, p50, p10, p90, share in rows:
        print(f"| {name} | {p50:.3f} | {'-' if p10 is None else f'{p10:.3f}'} | "
              f"{'-' if p90 is None else f'{p90:.3f}'} | "
              f"{'-' if share is None else f'{100 * share:.0f}%'} |")


if __name__ == "__main__":
    main()
