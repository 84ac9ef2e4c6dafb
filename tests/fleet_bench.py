"""Rollout time to 1, 8 and 32 loopback devices with both engines (a benchmark, not a test).

    .venv/bin/python tests/fleet_bench.py [--hosts 1,8,32] [--parallel 8]

Each device is its own sshd on 127.0.0.1 (tests/fleet.py) running the test venv's Python, so the
figures are the engines' own overhead plus run.py check and a 3-run bench per device, all on this
machine's cores: compare the engines within a row, not with a real fleet.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

import fleet  # noqa: E402
from fleet import Device, Fleet  # noqa: E402

from packager.demo import run_demo  # noqa: E402
from packager.device.ansible_engine import inventory_hosts  # noqa: E402
from packager.device.deploy import DeployOptions, deploy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", default="1,8,32")
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args()
    reason = fleet.problem()
    if reason:
        sys.exit(reason)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bundle = demo_bundle(root)
        print(f"bundle: {bundle.name}, --parallel {args.parallel}, run.py bench 3 runs\n")
        print("| hosts | engine | first rollout s | again (nothing to copy) s | per host s | "
              "passed |")
        print("| --- | --- | --- | --- | --- | --- |")
        for count in map(int, args.hosts.split(",")):
            for engine in ("ssh", "ansible"):
                names = [f"pi-{i:02d}" for i in range(count)]
                with Fleet(root / f"{engine}-{count}", [Device(n) for n in names]) as f:
                    hosts = inventory_hosts([f.write_inventory(root / f"{engine}-{count}.ini")])
                    times, passed = [], 0
                    for _ in range(2):
                        start = time.monotonic()
                        results = deploy(bundle, hosts, engine=engine, parallel=args.parallel,
                                         options=DeployOptions(runs=3, warmup=1))
                        times.append(time.monotonic() - start)
                        passed = sum(r.exit_code == 0 for r in results)
                print(f"| {count} | {engine} | {times[0]:.1f} | {times[1]:.1f} | "
                      f"{times[0] / count:.2f} | {passed}/{count} |", flush=True)


def demo_bundle(root: Path) -> Path:
    """The built-in demo's bundle (generated, no download)."""
    out = root / "demo"
    run_demo(out)
    return out / "bundle.tar.gz"


if __name__ == "__main__":
    main()
