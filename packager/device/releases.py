"""status() and rollback(): what each device runs, and putting the previous release back in use.

Both read the release layout deploy keeps on a device (DIR/releases/ID, DIR/current and
DIR/previous; runtimes/device_probe.py has the contract) with release_probe.py, over either
engine (fleet_steps.py). A rollback needs no archive: the previous release is still on the
device. It is checked there first (integrity, `run.py check`, `run.py bench`, the bundle's
budgets, as deploy does) and put in use only when it passes, with device_probe.py's `switch`:
`current` -> it, `previous` -> the release it replaces, so a second rollback undoes the first.
"""

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import PackagerError
from ..progress import Log
from . import fleet_steps
from .deploy import DeployOptions, check_record, check_remote_dir
from .fleet_steps import Step, python_of
from .inventory import Host
from .rollout import HostResult
from .verify import report_folder, run_checks, write_reports

DEFAULTS = DeployOptions()


@dataclass
class HostState:
    host: str
    error: str = ""
    bundles: list[dict[str, Any]] = field(default_factory=list)   # release_probe's state
    searched: str = ""          # ~/edgepack when no folder was named

    @property
    def exit_code(self) -> int:
        return 2 if self.error else 0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "status": "error" if self.error else "ok"}


def probe_source(name: str) -> str:
    if name == "device_probe":
        from .._runtimes import device_probe

        return Path(device_probe.__file__).read_text()
    return (Path(__file__).parent / f"{name}.py").read_text()


def base_of(host: Host, options: DeployOptions, name: str | None) -> str:
    """The folder to look at on *host*: the inventory's, --remote-dir, ~/edgepack/NAME, or ''
    (every bundle under ~/edgepack)."""
    return host.remote_dir or options.remote_dir or (f"~/edgepack/{name}" if name else "")


def _check(hosts: Sequence[Host], engine: str, name: str | None) -> None:
    if not hosts:
        raise PackagerError("no hosts given", "name a host (alias or user@host) or --hosts FILE")
    if engine not in ("ssh", "ansible"):
        raise PackagerError(f"--engine {engine}: unknown", "use ssh or ansible")
    if name is not None and (not name or "/" in name or name in (".", "..")
                             or name.startswith(("-", "~"))):
        raise PackagerError(f"--name {name!r}: not a bundle name", "give the name build printed "
                            "(the folder ~/edgepack/NAME on the device)")
    for h in hosts:
        if h.remote_dir is not None:
            check_remote_dir(h.remote_dir, f"{h.name}: edgepack_remote_dir")
        if engine == "ssh":
            from .remote import check_destination

            check_destination(h)


def _json(answer: tuple[int, str, str], host: str, step: str) -> dict[str, Any]:
    code, out, err = answer
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str) and len(data) == 1:
        raise PackagerError(f"{host}: {step}: {' '.join(data['error'].split())[:300]}")
    if not isinstance(data, dict):
        last = " ".join((err.strip().splitlines() or ["no output"])[-1].split())[:200]
        raise PackagerError(f"{host}: {step}: the device gave no answer edgepack can read "
                            f"(exit {code}: {last})", "check that its python3 is Python 3.8+, "
                            "or pass --python PATH")
    return data


def _states(hosts: Sequence[Host], options: DeployOptions, name: str | None, engine: str,
            parallel: int, inventories: Sequence[Path], log: Log) -> list[HostState]:
    source = probe_source("release_probe")
    plan = {h: [Step("state", (python_of(h, options), "-", "state", base_of(h, options, name)),
                     stdin=source)] for h in hosts}
    answers = fleet_steps.run(plan, engine=engine, options=options, parallel=parallel,
                              inventories=inventories, log=log)
    states = []
    for h in hosts:
        got, state = answers[h.name], HostState(h.name)
        try:
            if isinstance(got, str):
                raise PackagerError(got)
            data = _json(got[0], h.name, "state")
            bundles = data.get("bundles")
            if not isinstance(bundles, list) or not all(isinstance(b, dict) and isinstance(
                    b.get("dir"), str) for b in bundles):
                raise PackagerError(f"{h.name}: state: the device's answer is not "
                                    "release_probe.py's", "check its python3")
            state.bundles, state.searched = bundles, str(data.get("searched") or "")
        except PackagerError as exc:
            state.error = str(exc)
        states.append(state)
    return states


def status(hosts: Sequence[Host], *, options: DeployOptions = DEFAULTS,
           name: str | None = None, engine: str = "ssh", parallel: int = 4,
           inventories: Sequence[Path] = (), log: Log = lambda _: None) -> list[HostState]:
    """What each host runs: for its folder (or every ~/edgepack/NAME), the release in use, the
    previous one and the last check recorded there. Changes nothing on the devices."""
    _check(hosts, engine, name)
    return _states(hosts, options, name, engine, parallel, inventories, log)


def _age(stamp: Any, now: datetime) -> str:
    try:
        when = datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "at an unknown time"
    seconds = max(0, (now - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _verdict(check: dict[str, Any]) -> str:
    """The check's verdict as verify said it ('passed on 8 samples; 100 show 99%'), or from
    a record kept before verdicts were: passed or FAILED."""
    said = check.get("verdict")
    if check["passed"] is True:
        return said if isinstance(said, str) and said.startswith("passed") else "passed"
    return "FAILED"


def describe(release: dict[str, Any] | None, now: datetime) -> str:
    """A release in a few words: id, name, precision, target, its last check."""
    if not release:
        return "none"
    if not release.get("present"):
        return f"{release['id']} (missing on the device)"
    what = ", ".join(str(release[k]) for k in ("precision", "target", "arch") if release.get(k))
    text = f"{release['id']} {release.get('name') or '?'}" + (f" ({what})" if what else "")
    check = release.get("check")
    if isinstance(check, dict) and "passed" in check:
        p50 = check.get("p50_ms") or []
        text += (f", checked {_age(check.get('checked_at'), now)} by {check.get('by', '?')}: "
                 + _verdict(check)
                 + (f" p50 {' / '.join(f'{x:.2f}' for x in p50 if isinstance(x, int | float))} ms"
                    if p50 else ""))
    else:
        text += ", no check recorded"
    return text


def _own(host: str, text: str) -> str:
    """An error line without its leading 'HOST: ' (the line already starts with the host)."""
    return text[len(host) + 2:] if text.startswith(f"{host}: ") else text


def status_lines(states: Sequence[HostState]) -> list[str]:
    """One line per host and bundle folder."""
    now = datetime.now(UTC)
    lines = []
    for s in states:
        if s.error:
            lines.append(f"{s.host}: error: {_own(s.host, s.error)}")
            continue
        if not s.bundles:
            lines.append(f"{s.host}: nothing deployed"
                         + (f" under {s.searched} (a bundle deployed elsewhere: pass "
                            "--remote-dir DIR, or --hosts FILE with its edgepack_remote_dir)"
                            if s.searched else ""))
        for b in s.bundles:
            if not b.get("exists", True):
                lines.append(f"{s.host}: {b['dir']}: no such folder (nothing deployed there)")
                continue
            lines.append(f"{s.host}: {b['dir']}: current {describe(b.get('current'), now)}; "
                         f"previous {describe(b.get('previous'), now)}")
    return lines


def _pick(state: HostState) -> dict[str, Any]:
    """The one bundle folder to roll back on this host."""
    found = [b for b in state.bundles if b.get("exists", True)]
    if not found:
        raise PackagerError(f"{state.host}: nothing deployed"
                            + (f" under {state.searched}" if state.searched else
                               f" in {state.bundles[0]['dir']}" if state.bundles else ""),
                            "check the host, --name or --remote-dir")
    if len(found) > 1:
        names = ", ".join(b["dir"].rstrip("/").rsplit("/", 1)[-1] for b in found)
        raise PackagerError(f"{state.host}: several bundles are deployed under "
                            f"{state.searched} ({names})", "pass --name NAME or --remote-dir DIR")
    return found[0]


def rollback(hosts: Sequence[Host], *, options: DeployOptions = DEFAULTS,
             name: str | None = None, engine: str = "ssh", parallel: int = 4,
             inventories: Sequence[Path] = (), reports: Path | None = None,
             log: Log = lambda _: None) -> list[HostResult]:
    """Put each host's previous release back in use, once it passed its check there again.
    A host without a previous release, or whose previous release fails its check, keeps the
    one it runs (exit 2 / 1); the others are rolled back."""
    _check(hosts, engine, name)
    states = _states(hosts, options, name, engine, parallel, inventories, log)
    results = {h.name: HostResult(h.name, 2, engine=engine) for h in hosts}
    todo: dict[Host, dict[str, Any]] = {}
    for h, s in zip(hosts, states, strict=True):
        try:
            if s.error:
                raise PackagerError(s.error)
            b = _pick(s)
            cur, prev = b.get("current") or {}, b.get("previous") or {}
            results[h.name].release = {"dir": b["dir"], "current": cur.get("id", ""),
                                       "previous": prev.get("id", ""), "switched": False}
            if not prev.get("id"):
                raise PackagerError(f"{h.name}: {b['dir']} has no previous release to roll back "
                                    f"to (current: {cur.get('id') or 'none'})",
                                    "deploy the bundle you want instead")
            if not prev.get("present"):
                raise PackagerError(f"{h.name}: {b['dir']}/releases/{prev['id']} (previous) is "
                                    "gone from the device", "deploy that bundle again instead")
            todo[h] = b
        except PackagerError as exc:
            _fail(results[h.name], exc, log)
    _read_previous(todo, results, options, engine, parallel, inventories, log)
    _check_and_switch(todo, results, options, engine, parallel, inventories, reports, log)
    return [results[h.name] for h in hosts]


def _fail(result: HostResult, exc: Exception, log: Log, code: int = 2) -> None:
    result.exit_code, result.error = code, str(exc)
    log(f"[{result.host}] error: {exc}")


def _read_previous(todo: dict[Host, dict[str, Any]], results: dict[str, HostResult],
                   options: DeployOptions, engine: str, parallel: int,
                   inventories: Sequence[Path], log: Log) -> None:
    """The previous release's manifest and every file's hash, before anything of it runs."""
    probe = probe_source("device_probe")
    plan = {}
    for h, b in todo.items():
        release = f"{b['dir']}/releases/{b['previous']['id']}"
        plan[h] = [Step("read manifest.json", ("cat", "--", f"{release}/manifest.json")),
                   Step("integrity", (python_of(h, options), "-", "integrity", release),
                        stdin=probe)]
    answers = fleet_steps.run(plan, engine=engine, options=options, parallel=parallel,
                              inventories=inventories, log=log)
    for h in list(todo):
        b, got = todo[h], answers[h.name]
        rid = b["previous"]["id"]
        try:
            if isinstance(got, str):
                raise PackagerError(got)
            (code, text, err), integrity = got
            digest = hashlib.sha256(text.encode()).hexdigest()
            if code != 0 or digest[:12] != rid:
                raise PackagerError(f"{h.name}: {b['dir']}/releases/{rid}/manifest.json does not "
                                    "match its release name; nothing was run",
                                    "deploy that bundle again instead")
            found = _json(integrity, h.name, "integrity")
            problems = list(found.get("problems") or [])
            if found.get("manifest_sha256") not in (None, digest):
                problems.insert(0, "manifest.json changed while it was read")
            if problems:
                raise PackagerError(f"{h.name}: refused: {problems[0]} in releases/{rid} on the "
                                    "device; nothing was run", "deploy that bundle again instead")
            b["manifest"], b["digest"] = json.loads(text), "sha256:" + digest
        except (PackagerError, ValueError) as exc:
            _fail(results[h.name], exc, log)
            del todo[h]


def _check_and_switch(todo: dict[Host, dict[str, Any]], results: dict[str, HostResult],
                      options: DeployOptions, engine: str, parallel: int,
                      inventories: Sequence[Path], reports: Path | None, log: Log) -> None:
    common = ([] if options.threads is None else ["--threads", str(options.threads)]) + (
        ["--require-provider", options.require_provider] if options.require_provider else [])
    plan = {}
    for h, b in todo.items():
        release = f"{b['dir']}/releases/{b['previous']['id']}"
        roofline = ["--roofline"] if b["manifest"].get("roofline") else []
        b["release"] = release
        b["args"] = {"check": ["check", *common, "--json"],
                     "bench": ["bench", "--runs", str(options.runs), "--warmup",
                               str(options.warmup), *roofline, *common, "--json"]}
        plan[h] = [Step(f"run.py {k}", (python_of(h, options), "run.py", *a), chdir=release)
                   for k, a in b["args"].items()]
        log(f"[{h.name}] checking releases/{b['previous']['id']} before putting it back in use")
    answers = fleet_steps.run(plan, engine=engine, options=options, parallel=parallel,
                              inventories=inventories, log=log)
    source, probe = probe_source("release_probe"), probe_source("device_probe")
    after = {}
    for h in list(todo):
        b, got, result = todo[h], answers[h.name], results[h.name]
        try:
            if isinstance(got, str):
                raise PackagerError(got)
            ran = dict(zip(b["args"], got, strict=True))
            report = run_checks(b["manifest"], lambda args, ran=ran: ran[args[0]],
                                f"{h.name}:{b['release']}", runs=options.runs,
                                warmup=options.warmup, threads=options.threads,
                                latency_budget_ms=options.latency_budget_ms,
                                require_provider=options.require_provider)
        except PackagerError as exc:
            _fail(result, exc, log)
            del todo[h]
            continue
        report["host"], report["digest"] = h.name, b["digest"]
        result.report = report
        if reports is not None:
            result.reports_dir = str(write_reports(reports, report, host=report_folder(h.name)))
        result.exit_code = 0 if report["passed"] else 1
        record = json.dumps(check_record(report, "rollback"))
        steps = [Step("record the check", (python_of(h, options), "-", "record", b["release"],
                                           record), stdin=source)]
        if report["passed"]:
            steps.append(Step("switch", (python_of(h, options), "-", "switch", b["dir"],
                                         b["previous"]["id"],
                                         f"{max(1.0, min(60.0, options.timeout * 0.8)):g}"),
                              stdin=probe))
        after[h] = steps
    answers = fleet_steps.run(after, engine=engine, options=options, parallel=parallel,
                              inventories=inventories, log=log)
    for h in after:
        b, got, result = todo[h], answers[h.name], results[h.name]
        was, to = b["current"]["id"] if b.get("current") else "", b["previous"]["id"]
        if not result.report["passed"]:
            result.error = (f"{h.name}: releases/{to} (previous) failed its check on the device; "
                            f"current still points at {was or 'nothing'}")
            log(f"[{h.name}] {result.error}")
            continue
        try:
            if isinstance(got, str):
                raise PackagerError(got)
            switched = _json(got[-1], h.name, "switch")
            if switched.get("current") != to:
                raise PackagerError(f"{h.name}: switch: the device did not put {to} in use")
        except PackagerError as exc:
            _fail(result, exc, log)
            continue
        result.release.update(current=to, previous=str(switched.get("previous", "")),
                              switched=bool(switched.get("switched")), rolled_back=True,
                              release=to)
        log(f"[{h.name}] rolled back to {to} (was {was or 'nothing'}) in {b['dir']}")


def rollback_lines(results: Sequence[HostResult]) -> list[str]:
    """One line per host."""
    lines = []
    for r in results:
        rel = r.release
        if r.exit_code == 0:
            lines.append(f"{r.host}: rolled back to {rel.get('current')} (was "
                         f"{rel.get('previous') or 'nothing'}) in {rel.get('dir')}")
        else:
            lines.append(f"{r.host}: {'FAIL' if r.exit_code == 1 else 'error'}: "
                         f"{_own(r.host, r.error)}")
    return lines
