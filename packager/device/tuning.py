"""Session tuning at build time: the staged bundle's own run.py (`bench --tune --no-save`) times
thread counts, optimisation levels and the execution mode on this machine or on a device over
SSH, and the settings it keeps become the manifest's session options, with the table of what it
tried. Per-device tuning after deployment is `run.py bench --tune` (or `deploy --tune`), which
keeps its result on the device in session.tuned.json."""

import shlex
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..bundle.assemble import Tuner
from ..errors import VerifyError
from .verify import TUNE_RUNS, TUNE_WARMUP, Execute, local_runner, run_runner, tune_args

Log = Callable[[str], None]

def local_tuner(*, python: str = sys.executable, runs: int = TUNE_RUNS, warmup: int = TUNE_WARMUP,
                timeout: float = 1800.0, log: Log = lambda _: None) -> Tuner:
    """Tune on this machine, with its Python and onnxruntime."""
    def tune(folder: Path) -> dict[str, Any]:
        log(f"tune: timing session options on this machine, {runs} runs each")
        execute = local_runner(folder, python=python, timeout=timeout)
        return record(execute, runs, warmup, "this machine")
    return tune


def remote_tuner(host: Any, *, ssh_config: Path | None = None, python: str = "python3",
                 runs: int = TUNE_RUNS, warmup: int = TUNE_WARMUP, timeout: float = 1800.0,
                 log: Log = lambda _: None) -> Tuner:
    """Tune on a device over SSH: the staged bundle is copied to a scratch folder there (checked
    by its own run.py before anything runs) and removed after."""
    from .remote import Connection, have_local

    def tune(folder: Path) -> dict[str, Any]:
        conn = Connection(host, ssh_config=ssh_config)
        remote = shlex.quote(f"edgepack/.tune-{uuid.uuid4().hex[:8]}")
        conn.run(f"mkdir -p {remote}")
        try:
            probe = conn.run("command -v rsync >/dev/null 2>&1 && echo RSYNC")
            rsync = probe.stdout.startswith("RSYNC") and have_local("rsync")
            conn.copy(folder, remote, method="rsync" if rsync else "scp")
            log(f"tune: timing session options on {host.name}, {runs} runs each")

            def execute(args: list[str]) -> tuple[int, str, str]:
                proc = conn.run(f"cd {remote} && {shlex.quote(python)} run.py "
                                f"{shlex.join(args)}", timeout=timeout)
                return proc.returncode, proc.stdout, proc.stderr
            return record(execute, runs, warmup, host.name)
        finally:
            conn.run(f"rm -rf {remote}")
    return tune


def record(execute: Execute, runs: int, warmup: int, where: str) -> dict[str, Any]:
    """run.py bench --tune's result as the manifest keeps it."""
    code, report, stderr = run_runner(execute, tune_args(runs, warmup, save=False), where)
    tuning = report.get("tuning")
    if code != 0 or not tuning:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise VerifyError(f"tuning in {where} failed (exit {code}): {last}",
                          "run `run.py bench --tune` in the bundle there to see why, or build "
                          "without --tune")
    return {"measured_on": where, "device": report.get("device", {}),
            "onnxruntime": report.get("onnxruntime"), "providers": report.get("providers"),
            **{k: tuning[k] for k in ("runs", "warmup", "cores", "tried", "current", "chosen",
                                      "reason", "margin") if k in tuning},
            "speedup": tuning.get("speedup", 1.0)}
