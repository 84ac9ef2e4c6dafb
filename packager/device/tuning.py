"""Session tuning at build time: the staged bundle's own run.py (`bench --tune --no-save`) times
thread counts, optimisation levels and the execution mode on this machine or on a device over
SSH, and the settings it keeps become the manifest's session options, with the table of what it
tried. Per-device tuning after deployment is `run.py bench --tune` (or `deploy --tune`), which
keeps its result on the device in session.tuned.json."""

import json
import math
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._runtimes.runner.sessions import OPT_LEVELS
from ..bundle.assemble import Tuner
from ..bundle.manifest import MANIFEST
from ..errors import VerifyError
from ..progress import Log
from .verify import TUNE_RUNS, TUNE_WARMUP, Execute, local_runner, run_runner, tune_args

MAX_THREADS = 256     # no edge device has more cores; a larger count is a lie or a typo
MAX_CORES = 4096
MODES = ("sequential", "parallel")

def local_tuner(*, python: str = sys.executable, runs: int = TUNE_RUNS, warmup: int = TUNE_WARMUP,
                timeout: float = 1800.0, log: Log = lambda _: None) -> Tuner:
    """Tune on this machine, with its Python and onnxruntime."""
    def tune(folder: Path) -> dict[str, Any]:
        log(f"tune: timing session options on this machine, {runs} runs each")
        execute = local_runner(folder, python=python, timeout=timeout)
        return record(execute, runs, warmup, "this machine", _own_session(folder))
    return tune


def remote_tuner(host: Any, *, ssh_config: Path | None = None, python: str = "python3",
                 runs: int = TUNE_RUNS, warmup: int = TUNE_WARMUP, timeout: float = 1800.0,
                 log: Log = lambda _: None) -> Tuner:
    """Tune on a device over SSH: the staged bundle is copied to a scratch folder there (checked
    by its own run.py before anything runs) and removed after. Every remote step has a
    deadline (the copy and the clean-up at most 900 s and 120 s, the tuning *timeout*) and a
    name in its error."""
    from .remote import Connection, device_scratch

    def tune(folder: Path) -> dict[str, Any]:
        conn = Connection(host, ssh_config=ssh_config)
        with device_scratch(conn, folder, "tune", "tune", timeout=timeout,
                            copy_timeout=min(timeout, 900.0)) as remote:
            log(f"tune: timing session options on {host.name}, {runs} runs each")

            def execute(args: list[str]) -> tuple[int, str, str]:
                proc = conn.run(f"cd -- {shlex.quote(remote)} && {shlex.quote(python)} run.py "
                                f"{shlex.join(args)}", timeout=timeout,
                                step="tune: run.py bench --tune")
                return proc.returncode, proc.stdout, proc.stderr
            return record(execute, runs, warmup, host.name, _own_session(folder))
    return tune


def record(execute: Execute, runs: int, warmup: int, where: str,
           own: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """run.py bench --tune's result as the manifest keeps it, checked first: the answer comes
    from a device (*where*), and its chosen session becomes every copy's default. *own*: the
    staged manifest's session options (kept settings may use more threads than the device has
    cores: the target asked for them)."""
    code, report, stderr = run_runner(execute, tune_args(runs, warmup, save=False), where)
    tuning = report.get("tuning")
    if code != 0 or not tuning:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise VerifyError(f"tuning in {where} failed (exit {code}): {last}",
                          "run `run.py bench --tune` in the bundle there to see why, or build "
                          "without --tune")
    problem = answer_problem(report, own or {})
    if problem:
        raise VerifyError(f"tuning in {where}: the answer of its run.py bench --tune has "
                          f"{problem}; nothing was written",
                          "check that device's bundle runner and onnxruntime, or build without "
                          "--tune")
    return {"measured_on": where, "device": report.get("device", {}),
            "onnxruntime": report.get("onnxruntime"), "providers": report.get("providers"),
            **{k: tuning[k] for k in ("runs", "warmup", "cores", "tried", "current", "chosen",
                                      "reason", "margin") if k in tuning},
            "speedup": tuning.get("speedup", 1.0)}


def _own_session(folder: Path) -> dict[str, Any]:
    """The staged bundle's session options (written by bundle(), so trusted)."""
    return json.loads((Path(folder) / MANIFEST).read_text()).get("session", {})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def session_problem(field: str, session: Any, cores: int, own: Mapping[str, Any]) -> str | None:
    """What is wrong with a session the device named at *field*, or None: only the four known
    options, thread counts 0 (auto) to the device's cores (or the manifest's own count) and at
    most MAX_THREADS, the optimisation levels and modes the runner knows."""
    if not isinstance(session, dict):
        return f"{field} that is not an object"
    for key, value in session.items():
        if key in ("intra_op_threads", "inter_op_threads"):
            if not _is_int(value) or not 0 <= value <= MAX_THREADS or (
                    value > cores and value != own.get(key)):
                return (f"{field}.{key} = {json.dumps(value)[:40]}, not a thread count from 0 "
                        f"(auto) to the device's {cores} cores")
        elif key == "graph_optimization_level":
            if value not in OPT_LEVELS:
                return (f"{field}.{key} = {json.dumps(value)[:40]}, not one of "
                        f"{', '.join(OPT_LEVELS)}")
        elif key == "execution_mode":
            if value not in MODES:
                return f"{field}.{key} = {json.dumps(value)[:40]}, not sequential or parallel"
        else:
            return f"{field}.{str(key)[:40]!r}, not a session option"
    return None


def answer_problem(report: dict[str, Any], own: Mapping[str, Any]) -> str | None:
    """The first field of a device's `bench --tune` answer the manifest cannot keep, or None."""
    tuning = report["tuning"]
    if not isinstance(tuning, dict):
        return "tuning that is not an object"
    cores = tuning.get("cores")
    if not _is_int(cores) or not 1 <= cores <= MAX_CORES:
        return f"tuning.cores = {json.dumps(cores)[:40]}, not a core count"
    for key in ("chosen", "current"):
        if key == "chosen" or key in tuning:
            problem = session_problem(f"tuning.{key}", tuning.get(key), cores, own)
            if problem:
                return problem
    tried = tuning.get("tried", [])
    if not isinstance(tried, list) or len(tried) > 1000:
        return "tuning.tried that is not a list of at most 1000 trials"
    for i, trial in enumerate(tried):
        if not isinstance(trial, dict) or not isinstance(trial.get("stage"), str) \
                or not _is_number(trial.get("p50_ms")):
            return f"tuning.tried[{i}] that is not a trial (stage, session, p50_ms)"
        problem = session_problem(f"tuning.tried[{i}].session", trial.get("session"), cores,
                                  own)
        if problem:
            return problem
    for key, ok, what in (("reason", lambda v: isinstance(v, str) and len(v) <= 1000, "a text"),
                          ("runs", _is_int, "a count"), ("warmup", _is_int, "a count"),
                          ("margin", _is_number, "a number"), ("speedup", _is_number,
                                                               "a number")):
        if key in tuning and not ok(tuning[key]):
            return f"tuning.{key} = {json.dumps(tuning[key])[:40]}, not {what}"
    if not isinstance(tuning.get("reason"), str):
        return "no tuning.reason"
    for key, kind in (("device", dict), ("onnxruntime", str), ("providers", list)):
        if report.get(key) is not None and not isinstance(report[key], kind):
            return f"{key} that is not {'an object' if kind is dict else 'a ' + kind.__name__}"
    return None
