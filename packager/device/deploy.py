"""deploy(): copy a bundle to devices over SSH, preflight them, verify there, bring reports home."""

import shlex
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bundle.manifest import read_manifest
from ..errors import BundleError, PackagerError, VerifyError
from .inventory import Host
from .remote import Connection, DeviceError, have_local
from .rollout import HostResult, Rollout
from .rollout import run as run_rollout
from .verify import bundle_digest, check_tune, integrity_problems, run_checks, write_reports

Log = Callable[[str], None]
# local results, device-built engines and a session tuned for this machine (not the device)
EXCLUDE = ("reports/", "cache/", "session.tuned.json")


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
    timeout: float = 900.0
    expect_digest: str | None = None       # refuse unless the bundle's digest is this one
    tune: bool = False                     # run.py bench --tune on each device first


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
           rollout: Rollout | None = None, inventories: Sequence[Path] = ()) -> list[HostResult]:
    """Deploy *bundle* to every host, at most *parallel* at once; one host's failure is its own.
    *engine*: "ssh" (edgepack's own fan-out) or "ansible" (ansible-playbook with the
    edgepack_bundle role and the user's *inventories*); *rollout*: canary, batches, max-fail.
    Hosts after a stopped rollout come back with `skipped` set, untouched."""
    if not hosts:
        raise PackagerError("no hosts given", "name a host (alias or user@host) or --hosts FILE")
    if engine not in ("ssh", "ansible"):
        raise PackagerError(f"--engine {engine}: unknown", "use ssh or ansible")
    check_tune(options.tune, options.threads)
    with bundle_folder(bundle) as (folder, reports):
        manifest = read_manifest(folder)
        problems = integrity_problems(folder, manifest, options.expect_digest)
        if problems:   # checked here with this edgepack's code, before anything is copied
            raise BundleError(f"{bundle}: refused: {problems[0]}"
                              + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                              + "; nothing was copied", "build the bundle again")
        if engine == "ansible":
            from .ansible_engine import AnsibleEngine

            with AnsibleEngine(Path(bundle), folder, manifest, reports, options, parallel, log,
                               inventories) as ansible:
                return _roll(hosts, ansible.deploy, rollout or Rollout(), log)

        def ssh_batch(group: list[Host]) -> list[HostResult]:
            if len(group) == 1:
                return [deploy_one(folder, manifest, group[0], reports, options, log)]
            with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(group)))) as pool:
                futures = [pool.submit(deploy_one, folder, manifest, h, reports, options, log)
                           for h in group]
                return [f.result() for f in futures]

        return _roll(hosts, ssh_batch, rollout or Rollout(), log)


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
    start = time.monotonic()
    result = HostResult(host.name, 2)

    def say(message: str) -> None:
        log(f"[{host.name}] {message}")

    try:
        _deploy(folder, manifest, host, reports, options, say, result)
    except (DeviceError, VerifyError, BundleError) as exc:
        result.exit_code, result.error = 2, str(exc)
        say(f"error: {exc}")
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
    quoted = shlex.quote(remote)
    python = shlex.quote(python)

    say("preflight: python, numpy, onnxruntime, providers, disk")
    proc = conn.run(f"command -v rsync >/dev/null 2>&1 && echo RSYNC; "
                    f"{python} - preflight {quoted}", stdin=probe, timeout=options.timeout)
    info = _probe_json(proc, host, python)
    info["rsync"] = proc.stdout.startswith("RSYNC")
    result.device = info
    problems = preflight_problems(info, manifest, _size(folder), options)
    if problems:
        raise DeviceError(f"{host.name}: preflight failed: " + "; ".join(problems),
                          "install what is missing on the device, then deploy again")
    say(f"preflight ok: {info['arch']}, Python {info['python']}, onnxruntime "
        f"{info['onnxruntime']}, {info['free_mb']:.0f} MB free")

    method = options.transfer
    if method == "auto":
        method = "rsync" if info["rsync"] and have_local("rsync") else "scp"
    elif method == "rsync" and not (info["rsync"] and have_local("rsync")):
        raise DeviceError(f"{host.name}: --transfer rsync, but rsync is missing "
                          f"{'on the device' if not info['rsync'] else 'here'}",
                          "install rsync, or use --transfer scp")
    digest = bundle_digest(folder)
    release = f"{remote}/releases/{release_id(digest)}"
    result.release = {"dir": remote, "release": release_id(digest)}
    quoted_release = shlex.quote(release)
    proc = conn.run(f"test -d {quoted_release} && echo THERE; mkdir -p {quoted_release}",
                    timeout=options.timeout)
    fresh = "THERE" not in proc.stdout
    say(f"copying with {method} to {release}/")
    # A new release takes what it shares with the one in use from the device (rsync
    # --copy-dest), matched by content: two versions' files can share size and time. Into a
    # release already there (a re-deploy, a cut-off copy) only what changed is sent.
    copied = conn.copy(folder, release, method=method, checksum=options.checksum or fresh,
                       exclude=EXCLUDE, bwlimit_kbps=options.bwlimit_kbps,
                       copy_dest="../../current/" if fresh else None)
    result.copied = copied.__dict__
    say(f"copied {copied.files} file(s), {copied.bytes_sent / 1e6:.2f} MB sent")

    proc = conn.run(f"{python} - integrity {quoted_release}", stdin=probe,
                    timeout=options.timeout)
    probed = _probe_json(proc, host, python)
    found = probed["problems"]
    if probed.get("manifest_sha256") and "sha256:" + probed["manifest_sha256"] != digest:
        found.insert(0, f"manifest.json differs from the one deployed ({digest})")
    if found:
        raise DeviceError(f"{host.name}: refused: {found[0]} on the device"
                          + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
                          + "; nothing was run", "deploy again with --checksum to replace "
                          "changed files (rsync skips files whose size and time still match)")
    say(f"integrity: all {len(manifest['files'])} files match the manifest")

    def execute(args: list[str]) -> tuple[int, str, str]:
        proc = conn.run(f"cd {quoted_release} && {python} run.py {shlex.join(args)}",
                        timeout=options.timeout)
        return proc.returncode, proc.stdout, proc.stderr

    require = options.require_provider
    report = run_checks(manifest, execute, f"{host.name}:{release}", runs=options.runs,
                        warmup=options.warmup, threads=options.threads,
                        latency_budget_ms=options.latency_budget_ms,
                        require_provider=require, progress=say, tune=options.tune)
    report["host"] = host.name
    report["digest"] = digest
    out = reports / host.label
    write_reports(out, report)
    result.report, result.reports_dir = report, str(out)
    result.exit_code = 0 if report["passed"] else 1
    if report["passed"]:   # only a release that passed its check on the device is put in use
        proc = conn.run(f"{python} - switch {quoted} {release_id(digest)}", stdin=probe,
                        timeout=options.timeout)
        result.release.update(_probe_json(proc, host, python))
        say(f"passed; {remote}/current -> releases/{release_id(digest)}"
            + ("" if result.release["switched"] else " (already)") + f"; report in {out}/")
    else:
        proc = conn.run(f"readlink {quoted}/current || true", timeout=options.timeout)
        kept = proc.stdout.strip().rsplit("/", 1)[-1]
        result.release.update(current=kept, previous=kept, switched=False)
        say(f"FAILED; {'current still points at ' + kept if kept else 'nothing was in use'}"
            f"; report in {out}/")


def _probe_json(proc, host: Host, python: str) -> dict[str, Any]:
    import json

    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        if proc.returncode == 127 or "not found" in proc.stderr:
            raise DeviceError(f"{host.name}: preflight failed: '{python}' is not on the device",
                              "install Python 3.8+ there, or pass --python PATH")
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise DeviceError(f"{host.name}: the device probe failed ({last})",
                          "check that python3 runs on the device")
    return json.loads(lines[-1])


def preflight_needs(manifest: dict[str, Any], bundle_bytes: int, *,
                    allow_fallback: bool = False) -> dict[str, Any]:
    """What the device needs for this bundle, as device_probe.problems reads it."""
    target = manifest["target"]
    return {"runtime_package": target["runtime_package"],
            "min_onnxruntime": target["min_onnxruntime"], "install": target.get("install"),
            "providers": [p["name"] for p in manifest.get("providers", [])],
            "allow_fallback": allow_fallback, "need_mb": 2 * bundle_bytes / 1e6 + 50}


def preflight_problems(info: dict[str, Any], manifest: dict[str, Any], bundle_bytes: int,
                       options: DeployOptions) -> list[str]:
    """One line per thing the device lacks for this bundle, saying what to install."""
    from .._runtimes import device_probe

    return device_probe.problems(info, preflight_needs(manifest, bundle_bytes,
                                                       allow_fallback=options.allow_fallback))


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()
               and p.relative_to(folder).parts[0] not in ("reports", "cache"))


def summary_table(results: Sequence[HostResult]) -> str:
    """One row per host: arch, Python, onnxruntime, provider, latency, accuracy, the release in
    use after the deploy, result."""
    lines = ["| host | arch | python | onnxruntime | provider | p50 ms | p90 ms | p99 ms | "
             "accuracy (cosine min) | in use | result |", "|" + " --- |" * 11]
    for r in results:
        dev, rep = r.device, r.report
        bench = rep.get("bench", {}).get("parts", {})
        lat = [e["latency_ms"] for e in bench.values()]
        cos = [o["cosine_min"] for p in rep.get("check", {}).get("parts", {}).values()
               for o in p["outputs"].values()]
        cells = [r.host, dev.get("arch", "?"), dev.get("python", "?"),
                 dev.get("onnxruntime") or ("missing" if dev else "?"),
                 (rep.get("providers") or ["?"])[0].replace("ExecutionProvider", ""),
                 *(" / ".join(f"{x[k]:.2f}" for x in lat) or "-" for k in ("p50", "p90", "p99")),
                 f"{min(cos):.4f}" if cos else "-", _in_use(r.release),
                 r.status + (f": {r.error or r.skipped}" if r.error or r.skipped else "")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _in_use(release: dict[str, Any]) -> str:
    """The release current points at after the deploy: new, already in use, or kept."""
    current = release.get("current")
    if "current" not in release:
        return "-"
    if not current:
        return "none"
    if current != release.get("release"):
        return f"{current} (kept)"
    return f"{current} ({'new' if release.get('switched') else 'already'})"
