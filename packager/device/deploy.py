"""deploy(): copy a bundle to devices over SSH, preflight them, verify there, bring reports home."""

import json
import math
import os
import shlex
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

from ..bundle.manifest import read_manifest
from ..errors import BundleError, PackagerError
from ..progress import OFF, Log, Progress
from .arch import arch_problem
from .device_answers import answer
from .inventory import Host
from .page import write_page
from .release_probe import RECORD
from .remote import Connection, DeviceError, check_destination, end_all, have_local
from .role.edgepack_bundle.files import bundle_needs
from .rollout import HostResult, Rollout
from .rollout import run as run_rollout
from .verify import (
    bundle_digest,
    check_timing_options,
    check_tune,
    check_tune_shipped,
    integrity_problems,
    report_folder,
    run_checks,
    write_reports,
)

# local results, device-built engines and a session tuned for this machine (not the device)
# (and the verdict of the last check there, which status reads)
EXCLUDE = ("reports/", "cache/", "session.tuned.json", RECORD)
# reads exactly the probe's bytes from stdin and runs them, leaving stdin open: `hold` waits
# for it to close (python3 - would read stdin to its end before running anything)
BOOT = "import sys;exec(compile(sys.stdin.buffer.read({n}),'device_probe.py','exec'))"


@dataclass(frozen=True)
class DeployOptions:
    remote_dir: str | None = None          # default: edgepack/<bundle name> in the login's home
    python: str = "python3"
    ssh_config: Path | None = None
    port: int | None = None
    identity: Path | None = None
    transfer: str = "auto"                 # auto (rsync when both ends have it), rsync, scp
    checksum: bool = False                 # compare file contents, not size and time
    bwlimit_kbps: int | None = None        # slow or metered links
    runs: int = 100
    warmup: int = 10
    threads: int | None = None
    latency_budget_ms: float | None = None
    require_provider: str | None = None
    allow_fallback: bool = False           # run even if the target's providers are missing
    timeout: float = 900.0                 # seconds for each remote step, the copy included
    expect_digest: str | None = None       # refuse unless the bundle's digest is this one
    tune: bool = False                     # run.py bench --tune on each device first
    any_arch: bool = False                 # --force: deploy even to a device of another arch

    def __post_init__(self) -> None:
        """Refuse a bad value here, before anything reaches a device (exit 2)."""
        def bad(option: str, value: Any, fix: str) -> None:
            raise PackagerError(f"{option} {value}: {fix.split(';')[0]}", fix.split("; ", 1)[-1])

        check_timing_options(self.runs, self.warmup, self.threads, self.latency_budget_ms)
        if not _positive(self.timeout):
            bad("--timeout", self.timeout, "not a number of seconds; give more than 0")
        if self.bwlimit_kbps is not None and (not isinstance(self.bwlimit_kbps, int)
                                              or self.bwlimit_kbps < 1):
            bad("--bwlimit", self.bwlimit_kbps, "not a bandwidth; give 1 KB/s or more")
        if self.port is not None and not (isinstance(self.port, int)
                                          and 1 <= self.port <= 65535):
            bad("--port", self.port, "not a TCP port; give 1 to 65535")
        if self.transfer not in ("auto", "rsync", "scp"):
            bad("--transfer", self.transfer, "unknown; use auto, rsync or scp")
        if self.remote_dir is not None:
            check_remote_dir(self.remote_dir, "--remote-dir")


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and \
        math.isfinite(value) and value > 0


def check_remote_dir(text: str, where: str) -> None:
    """Refuse a remote folder the device's tools would misread: empty, a leading '-' (an
    option to mkdir, rsync, ssh), a newline or another control character."""
    if not isinstance(text, str) or not text.strip():
        raise PackagerError(f"{where} {text!r}: not a folder", "name a folder on the device")
    if text.startswith("-"):
        raise PackagerError(f"{where} {text!r}: starts with '-', which the device's tools would "
                            "read as an option", f"write it as ./{text}")
    if any(ord(c) < 32 or c == "\x7f" for c in text):
        raise PackagerError(f"{where} {text!r}: holds a newline or another control character",
                            "choose a folder name without them")


def check_bundle_name(manifest: dict[str, Any], bundle: Path) -> str:
    """The manifest's name as the default remote folder's last part: one plain folder name."""
    name = manifest.get("name")
    if not isinstance(name, str) or name in ("", ".", "..") or name.startswith(("-", "~")) or \
            any(c in "/\\" or ord(c) < 32 or c == "\x7f" for c in name):
        raise BundleError(f"{bundle}: manifest.json: name {name!r} cannot be the folder "
                          "~/edgepack/NAME (empty, '.', '..', a '/', a leading '-' or '~', or a "
                          "control character)", "pass --remote-dir DIR, or rebuild the bundle "
                          "with a plain name")
    return name


def check_target(manifest: dict[str, Any], bundle: Path) -> None:
    """The manifest fields preflight reads, so a bundle without them is refused up front."""
    target = manifest.get("target")
    if not isinstance(target, dict):
        raise BundleError(f"{bundle}: manifest.json: no 'target' table (the device it is built "
                          "for)", "build the bundle again with this edgepack")
    if not isinstance(target.get("runtime_package"), str) or not isinstance(
            target.get("min_onnxruntime"), str | None) or not isinstance(
            target.get("install"), str | None):
        raise BundleError(f"{bundle}: manifest.json: target.runtime_package, "
                          "target.min_onnxruntime or target.install is missing or not text",
                          "build the bundle again with this edgepack")
    providers = manifest.get("providers", [])
    if not isinstance(providers, list) or not all(isinstance(p, dict) and isinstance(
            p.get("name"), str) for p in providers):
        raise BundleError(f"{bundle}: manifest.json: providers is not a list of "
                          "{name: ...} tables", "build the bundle again with this edgepack")


@contextmanager
def bundle_folder(path: Path):
    """A bundle directory, or a .tar.gz unpacked into a temporary one (reports go beside it)."""
    path = Path(path)
    if path.is_dir():
        read_manifest(path)
        yield path, path / "reports"
        return
    if not path.is_file() or not path.name.endswith(".tar.gz"):
        raise BundleError(f"{path}: not a bundle directory or .tar.gz",
                          "pass what `edgepack build` wrote (out/NAME or out/NAME.tar.gz)")
    with tempfile.TemporaryDirectory(prefix="edgepack-deploy-") as tmp:
        try:
            with tarfile.open(path) as tar:
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise BundleError(f"{path}: cannot unpack ({exc})", "build the bundle again") from None
        folders = [p for p in Path(tmp).iterdir() if p.is_dir()]
        if len(folders) != 1:
            raise BundleError(f"{path}: expected one bundle folder inside", "build it again")
        read_manifest(folders[0])
        yield folders[0], path.with_name(path.name[:-len(".tar.gz")] + ".reports")


def deploy(bundle: Path, hosts: Sequence[Host], *, options: DeployOptions = DeployOptions(),
           parallel: int = 4, log: Log = lambda _: None, engine: str = "ssh",
           rollout: Rollout | None = None, inventories: Sequence[Path] = (),
           steps: Progress = OFF) -> list[HostResult]:
    """Deploy *bundle* to every host, at most *parallel* at once; one host's failure is its own.
    *steps* shows the hosts done and the time left on a terminal (the ssh engine's).
    *engine*: "ssh" (edgepack's own fan-out) or "ansible" (ansible-playbook with the
    edgepack_bundle role and the user's *inventories*); *rollout*: canary, batches, max-fail.
    Hosts after a stopped rollout come back with `skipped` set, untouched."""
    if not hosts:
        raise PackagerError("no hosts given", "name a host (alias or user@host) or --hosts FILE")
    if engine not in ("ssh", "ansible"):
        raise PackagerError(f"--engine {engine}: unknown", "use ssh or ansible")
    check_tune(options.tune, options.threads)
    for h in hosts:   # before anything reaches a device
        if h.remote_dir is not None:
            check_remote_dir(h.remote_dir, f"{h.name}: edgepack_remote_dir")
        if engine == "ssh":
            check_destination(h)
    with bundle_folder(bundle) as (folder, reports):
        manifest = read_manifest(folder)
        check_target(manifest, Path(bundle))
        check_tune_shipped(options.tune, manifest, Path(bundle))
        if engine == "ssh" and any(h.remote_dir is None for h in hosts) and \
                options.remote_dir is None:
            check_bundle_name(manifest, Path(bundle))
        problems = integrity_problems(folder, manifest, options.expect_digest)
        if problems:   # checked here with this edgepack's code, before anything is copied
            raise BundleError(f"{bundle}: refused: {problems[0]}"
                              + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                              + "; nothing was copied", "build the bundle again")
        for h in hosts:   # a planted link where a host's report goes: refused before any copy
            check_report_folder(reports, report_folder(h.name))
        if engine == "ansible":
            from .ansible_engine import AnsibleEngine

            with AnsibleEngine(Path(bundle), folder, manifest, reports, options, parallel, log,
                               inventories) as ansible:
                return with_page(bundle, _roll(hosts, ansible.deploy, rollout or Rollout(), log))

        steps.start("hosts done", len(hosts))
        lock = threading.Lock()

        def one(h: Host) -> HostResult:
            result = deploy_one(folder, manifest, h, reports, options, log)
            with lock:
                steps.step(f"{h.name}: {'passed' if result.exit_code == 0 else 'failed'}")
            return result

        def ssh_batch(group: list[Host]) -> list[HostResult]:
            try:
                if len(group) == 1:
                    return [one(group[0])]
                pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(group))))
                try:
                    futures = [pool.submit(one, h) for h in group]
                    return [f.result() for f in futures]
                finally:
                    pool.shutdown(wait=False, cancel_futures=True)
            except BaseException:   # Ctrl-C, SIGTERM: end every ssh/rsync/scp still running
                end_all()
                raise

        try:
            return with_page(bundle, _roll(hosts, ssh_batch, rollout or Rollout(), log))
        finally:
            steps.finish()


def with_page(bundle: Path, results: list[HostResult]) -> list[HostResult]:
    """The bundle folder's page refreshed with the hosts' reports (an archive has no page)."""
    if Path(bundle).is_dir():
        write_page(Path(bundle))
    return results


def check_report_folder(reports: Path, host: str) -> None:
    """Refuse (BundleError) a reports/ or reports/HOST that exists as anything but a real
    folder: the report could not be written there, so nothing is deployed."""
    for path in (reports, reports / host):
        if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
            raise BundleError(f"{path}: is a symbolic link or not a folder, so the host's report "
                              "cannot be written there; nothing was copied",
                              "remove it (reports are written only into real folders)")


def _roll(hosts: Sequence[Host], deploy_batch: Callable[[list[Host]], list[HostResult]],
          plan: Rollout, log: Log) -> list[HostResult]:
    results, rest, why = run_rollout(hosts, deploy_batch, plan, lambda r: r.exit_code != 0, log)
    if why:
        log(f"rollout stopped: {why}")
    return results + [HostResult(h.name, 0, skipped=why) for h in rest]


def release_id(digest: str) -> str:
    """The folder a bundle version gets on the device: releases/<first 12 hex digits>."""
    return digest.split(":")[-1][:12]


def deploy_one(folder: Path, manifest: dict[str, Any], host: Host, reports: Path,
               options: DeployOptions, log: Log) -> HostResult:
    """Deploy to one host; whatever goes wrong there is this host's result, not the fleet's."""
    start = time.monotonic()
    result = HostResult(host.name, 2)

    def say(message: str) -> None:
        log(f"[{host.name}] {message}")

    try:
        _deploy(folder, manifest, host, reports, options, say, result)
    except PackagerError as exc:
        result.exit_code, result.error = 2, str(exc)
        say(f"error: {exc}")
    except Exception as exc:   # a bug: this host says so (exit 3), the others keep theirs
        result.exit_code = 3
        result.error = (f"unexpected {type(exc).__name__}: {exc}; this is a bug in edgepack, "
                        "please report it")
        say(f"error: {result.error}")
    result.seconds = time.monotonic() - start
    return result


def _deploy(folder: Path, manifest: dict[str, Any], host: Host, reports: Path,
            options: DeployOptions, say: Log, result: HostResult) -> None:
    from .._runtimes import device_probe

    host = Host(host.name, host.destination, host.port or options.port,
                host.identity or options.identity, host.python, host.remote_dir,
                host.ssh_options)
    conn = Connection(host, ssh_config=options.ssh_config)
    python = host.python or options.python
    remote = host.remote_dir or options.remote_dir or f"edgepack/{manifest['name']}"
    probe = Path(device_probe.__file__).read_text()
    python = shlex.quote(python)
    timeout = options.timeout

    def probe_step(step: str, *args: str) -> dict[str, Any]:
        proc = conn.run(f"{python} - {shlex.join(args)}", stdin=probe, timeout=timeout,
                        step=step)
        return answer(proc, host.name, python, step, args[0])

    say("preflight: python, numpy, onnxruntime, providers, disk")
    proc = conn.run(f"command -v rsync >/dev/null 2>&1 && echo RSYNC; "
                    f"{python} - preflight {shlex.quote(remote)}", stdin=probe, timeout=timeout,
                    step="preflight")
    info = answer(proc, host.name, python, "preflight", "preflight")
    info["rsync"] = proc.stdout.startswith("RSYNC")
    result.device = info
    problems = preflight_problems(info, manifest, _size(folder), options)
    arch = None if options.any_arch else arch_problem(manifest, info.get("arch"))
    if problems:   # a bundle for another arch: no install on the device mends that
        raise DeviceError(f"{host.name}: preflight failed: " + "; ".join(problems),
                          f"build the bundle for this device's target ({info.get('arch')}: "
                          "edgepack targets lists them), or deploy this one to its own"
                          if arch and len(problems) == 1 else
                          "install what is missing on the device (or pass --python with the "
                          "Python that has it, e.g. a venv's: --python ~/ort/bin/python), "
                          "then deploy again")
    say(f"preflight ok: {info['arch']}, Python {info['python']}, onnxruntime "
        f"{info['onnxruntime']}, {info['free_mb']:.0f} MB free")
    result.notes = optional_providers_missing(info, manifest)
    for note in result.notes:
        say(f"note: {note}")

    method = options.transfer
    if method == "auto":
        method = "rsync" if info["rsync"] and have_local("rsync") else "scp"
    elif method == "rsync" and not (info["rsync"] and have_local("rsync")):
        raise DeviceError(f"{host.name}: --transfer rsync, but rsync is missing "
                          f"{'on the device' if not info['rsync'] else 'here'}",
                          "install rsync, or use --transfer scp")
    digest = bundle_digest(folder)
    rid = release_id(digest)
    result.release = {"dir": remote, "release": rid}
    made = probe_step("prepare", "prepare", remote, rid)   # refuses what edgepack did not make
    if made["release"] != made["base"].rstrip("/") + "/releases/" + rid:
        raise DeviceError(f"{host.name}: prepare: the device named {made['release']!r} as the "
                          f"release folder, not {made['base']}/releases/{rid}",
                          f"check that {python} on the device is a plain Python 3.8+")
    # The release is busy from before the copy until after the switch: another deploy's
    # clean-up leaves it alone (device_probe's docstring has the whole contract).
    boot = BOOT.format(n=len(probe.encode()))
    seconds = 8 * timeout + 600
    held = conn.hold(f"{python} -c {shlex.quote(boot)} hold {shlex.quote(made['base'])} {rid} "
                     f"{seconds:.0f}", probe, timeout=timeout, step="hold")
    try:
        answer(held.as_completed(), host.name, python, "hold", "hold")
        _release(conn, folder, manifest, host, reports, options, say, result, probe_step,
                 python, made, method, digest)
    finally:
        held.close()


def _release(conn: Connection, folder: Path, manifest: dict[str, Any], host: Host,
             reports: Path, options: DeployOptions, say: Log, result: HostResult,
             probe_step: Callable[..., dict[str, Any]], python: str, made: dict[str, Any],
             method: str, digest: str) -> None:
    rid = release_id(digest)
    base, release = made["base"], made["release"]   # absolute: `~` and relative paths resolved
    result.release["dir"] = base
    say(f"copying with {method} to {release}/")
    # A new release takes what it shares with the one in use from the device (rsync
    # --copy-dest), matched by content: two versions' files can share size and time. Into a
    # release already there (a re-deploy, a cut-off copy) only what changed is sent.
    fresh = not made["there"]
    copied = conn.copy(folder, release, method=method, checksum=options.checksum or fresh,
                       exclude=EXCLUDE, bwlimit_kbps=options.bwlimit_kbps,
                       copy_dest="../../current/" if fresh and made["current"] else None,
                       timeout=options.timeout)
    result.copied = copied.__dict__
    say(f"copied {copied.files} file(s), {copied.bytes_sent / 1e6:.2f} MB sent")

    probed = probe_step("integrity", "integrity", release)
    found = list(probed["problems"])
    if probed.get("manifest_sha256") and "sha256:" + probed["manifest_sha256"] != digest:
        found.insert(0, f"manifest.json differs from the one deployed ({digest})")
    if found:
        raise DeviceError(f"{host.name}: refused: {found[0]} on the device"
                          + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
                          + "; nothing was run", "deploy again with --checksum to replace "
                          "changed files (rsync skips files whose size and time still match)")
    say(f"integrity: all {len(manifest['files'])} files match the manifest")

    def execute(args: list[str]) -> tuple[int, str, str]:
        proc = conn.run(f"cd -- {shlex.quote(release)} && {python} run.py {shlex.join(args)}",
                        timeout=options.timeout, step=f"run.py {args[0] if args else ''}".strip())
        return proc.returncode, proc.stdout, proc.stderr

    try:
        report = run_checks(manifest, execute, f"{host.name}:{release}", runs=options.runs,
                            warmup=options.warmup, threads=options.threads,
                            latency_budget_ms=options.latency_budget_ms,
                            require_provider=options.require_provider, progress=say,
                            tune=options.tune)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # run.py's answers are the device's: one that is not what run.py prints is this host's
        # failure, not edgepack's crash
        raise DeviceError(f"{host.name}: run.py on the device answered with something edgepack "
                          f"cannot read ({type(exc).__name__}: {str(exc)[:120]})",
                          "check the device's Python, numpy and onnxruntime") from None
    report["host"] = host.name
    report["digest"] = digest
    out = write_reports(reports, report, host=report_folder(host.name))
    result.report, result.reports_dir = report, str(out)
    result.exit_code = 0 if report["passed"] else 1
    before = record_check(conn, python, release, report, "deploy", options.timeout)
    if report["passed"]:   # only a release that passed its check on the device is put in use
        # waits for another deploy's switch, well within this step's own deadline
        wait = f"{max(1.0, min(60.0, options.timeout * 0.8)):g}"
        result.release.update(probe_step("switch", "switch", base, rid, wait))
        # the release that was `previous` put back in use: a rollback, not a new release
        result.release["rolled_back"] = bool(result.release["switched"]
                                             and before.get("previous") == rid)
        say(f"passed; {base}/current -> releases/{rid}"
            + (" (rolled back)" if result.release["rolled_back"] else "")
            + ("" if result.release["switched"] else " (already)") + f"; report in {out}/")
    else:
        proc = conn.run(f"readlink -- {shlex.quote(base + '/current')} || true",
                        timeout=options.timeout, step="readlink current")
        kept = proc.stdout.strip().rsplit("/", 1)[-1][:64]
        result.release.update(current=kept, previous=kept, switched=False)
        say(f"FAILED; {'current still points at ' + kept if kept else 'nothing was in use'}"
            f"; report in {out}/")


def check_record(report: dict[str, Any], by: str) -> dict[str, Any]:
    """What a device keeps of a check (RELEASE/.edgepack-check.json, read by `status`)."""
    from datetime import datetime

    bench = report.get("bench", {}).get("parts", {})
    p50 = [e["latency_ms"]["p50"] for e in bench.values() if isinstance(e, dict)
           and isinstance(e.get("latency_ms"), dict) and "p50" in e["latency_ms"]]
    failed = [c.get("name", "?") for c in report.get("checks", []) if isinstance(c, dict)
              and c.get("passed") is False]
    return {"checked_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "by": by, "passed": bool(report.get("passed")), "p50_ms": p50,
            "verdict": str(report.get("verdict") or "")[:120],
            "provider": (report.get("providers") or [None])[0], "failed": failed[:5]}


def record_check(conn: Connection, python: str, release: str, report: dict[str, Any], by: str,
                 timeout: float) -> dict[str, Any]:
    """Keep the check's verdict in the release on the device; answer `current` and `previous`
    as they are before any switch ({} when the device could not record it: the deploy's
    verdict stands, status then shows no check)."""
    from . import release_probe

    record = json.dumps(check_record(report, by))
    proc = conn.run(f"{python} - record {shlex.quote(release)} {shlex.quote(record)}",
                    stdin=Path(release_probe.__file__).read_text(), timeout=timeout,
                    step="record the check")
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return data if isinstance(data, dict) and "recorded" in data else {}


def preflight_needs(manifest: dict[str, Any], bundle_bytes: int, *,
                    allow_fallback: bool = False) -> dict[str, Any]:
    """What the device needs for this bundle, as device_probe.problems reads it: the role's
    rule (bundle_needs.py), so both engines refuse and pass the same devices."""
    return bundle_needs.needs(manifest, bundle_bytes, allow_fallback)


def optional_providers_missing(info: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    """The providers the build listed for speed (OpenVINO) that the device lacks: it runs the
    next provider's graph, which is no failure; one note each, naming that provider, its graph
    and how to get the measured speed (the same notes for both engines)."""
    return bundle_needs.fallback_notes(manifest, info.get("providers") or [])


def preflight_problems(info: dict[str, Any], manifest: dict[str, Any], bundle_bytes: int,
                       options: DeployOptions) -> list[str]:
    """One line per thing the device lacks for this bundle, saying what to install."""
    from .._runtimes import device_probe

    arch = None if options.any_arch else arch_problem(manifest, info.get("arch"))
    return ([arch] if arch else []) + device_probe.problems(
        info, preflight_needs(manifest, bundle_bytes, allow_fallback=options.allow_fallback))


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()
               and p.relative_to(folder).parts[0] not in ("reports", "cache"))


def summary_table(results: Sequence[HostResult]) -> str:
    """One row per host: arch, Python, onnxruntime, provider, threads, latency as run.py bench
    measures it (p50, p10-p90, p99, other processes' share of the cores, NOISY when that or the
    spread is high), accuracy, the release in use after the deploy, result; the hosts' notes
    (a provider listed for speed that a device lacks) under it."""
    lines = ["| host | arch | python | onnxruntime | provider | threads | p50 ms | p10-p90 ms | "
             "p99 ms | others' CPU | accuracy (cosine min) | in use | result |",
             "|" + " --- |" * 13]
    notes: list[str] = []
    for r in results:
        dev, rep = r.device, r.report
        bench = rep.get("bench", {})
        parts = [e for e in bench.get("parts", {}).values() if isinstance(e, dict)]
        lat = [e["latency_ms"] for e in parts]
        shares = [e["load"]["other_share"] for e in parts
                  if isinstance(e.get("load"), dict) and e["load"].get("other_share") is not None]
        noisy = [e["noisy"] for e in parts if e.get("noisy")]
        notes += [f"{r.host}: {n}" for n in dict.fromkeys(noisy)]
        cos = [o["cosine_min"] for p in rep.get("check", {}).get("parts", {}).values()
               for o in p["outputs"].values()]
        threads = (bench.get("session") or {}).get("intra_op_threads") if bench else None
        cells = [r.host, dev.get("arch", "?"), dev.get("python", "?"),
                 dev.get("onnxruntime") or ("missing" if dev else "?"),
                 (rep.get("providers") or ["?"])[0].replace("ExecutionProvider", ""),
                 "-" if not bench else str(threads or "auto"),
                 " / ".join(f"{x['p50']:.2f}" for x in lat) or "-",
                 " / ".join(f"{x.get('p10', x.get('min', 0)):.2f}-{x['p90']:.2f}"
                            for x in lat) or "-",
                 " / ".join(f"{x['p99']:.2f}" for x in lat) or "-",
                 (f"{100 * max(shares):.0f}%" if shares else "-")
                 + (" NOISY" if noisy else ""),
                 f"{min(cos):.4f}" if cos else "-", _in_use(r.release),
                 r.verdict + (f": {r.error or r.skipped}" if r.error or r.skipped else "")]
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "NOISY latency (measure again on a quieter device): " + "; ".join(notes)]
    said = [f"note: {r.host}: {n}" for r in results for n in r.notes]
    return "\n".join(lines + ([""] + said if said else []))


def _in_use(release: dict[str, Any]) -> str:
    """The release current points at after the deploy: new, already in use, or kept."""
    current = release.get("current")
    if "current" not in release:
        return "-"
    if not current:
        return "none"
    if current != release.get("release"):
        return f"{current} (kept)"
    if release.get("rolled_back"):
        return f"{current} (rolled back)"
    return f"{current} ({'new' if release.get('switched') else 'already'})"
