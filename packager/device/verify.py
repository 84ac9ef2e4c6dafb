"""Verify a bundle by running its own runner in a separate process, as the device would."""

import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._runtimes.runner.sessions import describe_session
from ..bundle.manifest import read_manifest
from ..errors import BundleError, PackagerError, VerifyError
from .page import write_page
from .reports import REPORTS, bundle_digest, write_files

TUNE_RUNS = 50   # runs per session setting tried by --tune (each after its warm-up runs)
TUNE_WARMUP = 5


def tune_args(runs: int, warmup: int, *, save: bool = True) -> list[str]:
    """`run.py bench --tune`'s arguments (with --no-save: report only)."""
    return ["bench", "--tune", *([] if save else ["--no-save"]), "--runs", str(runs),
            "--warmup", str(warmup)]


# Runs `run.py ARGS --json` where the bundle is: (exit code, stdout, stderr).
Execute = Callable[[list[str]], tuple[int, str, str]]


def local_runner(bundle: Path, *, python: str, timeout: float) -> Execute:
    """Run the bundle's run.py in a separate local process, in the bundle's folder."""
    def execute(args: list[str]) -> tuple[int, str, str]:
        try:
            proc = subprocess.run([python, "run.py", *args], cwd=bundle, capture_output=True,
                                  text=True, timeout=timeout)
        except FileNotFoundError:
            raise VerifyError(f"python interpreter '{python}' not found", "fix --python") from None
        except subprocess.TimeoutExpired:
            raise VerifyError(f"run.py {args[0]} did not finish in {timeout:.0f} s",
                              "raise --timeout or lower --runs") from None
        return proc.returncode, proc.stdout, proc.stderr
    return execute


def run_runner(execute: Execute, args: list[str], where: str) -> tuple[int, dict, str]:
    """`run.py ARGS --json` through *execute*: (exit code, parsed JSON, stderr)."""
    code, stdout, stderr = execute([*args, "--json"])
    last = (stderr.strip().splitlines() or [""])[-1]
    if code == 2 and re.search(r"\b(onnxruntime|numpy) is not installed for ", last):
        # the bundle is fine; the device's Python lacks a package, and the line says the fix
        raise VerifyError(f"run.py {args[0]} cannot run in {where}: {last}",
                          "then verify again (or point --python at a Python that has it)")
    if code == 2 or (code != 0 and not stdout.strip()):
        raise VerifyError(f"run.py {args[0]} failed in {where} (exit {code}): {last}",
                          "rebuild or copy the bundle again")
    try:
        report = json.loads(stdout)
    except (ValueError, RecursionError):
        raise VerifyError(f"run.py {args[0]} printed no JSON (exit {code}): {last}",
                          "the runner is damaged; rebuild the bundle") from None
    if not isinstance(report, dict):
        raise VerifyError(f"run.py {args[0]} in {where} printed JSON that is not an object "
                          f"(exit {code})", "the runner is damaged; rebuild the bundle")
    return code, report, stderr


DIGEST = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


def parse_digest(text: str) -> str:
    """--expect-digest as `sha256:` + 64 lower-case hex digits. Accepts the prefix in any case,
    upper-case hex and surrounding spaces; anything else is VerifyError saying the form."""
    match = DIGEST.fullmatch(str(text).strip().lower())
    if not match:
        shown = str(text) if len(str(text)) <= 80 else str(text)[:77] + "..."
        raise VerifyError(f"--expect-digest {shown!r}: not a bundle digest",
                          "give sha256: and the 64 hex digits `edgepack build` printed (e.g. "
                          "sha256:1d12...; the prefix may be left out)")
    return "sha256:" + match.group(1)


def integrity_problems(bundle: Path, manifest: dict[str, Any],
                       expect_digest: str | None = None, digest: str | None = None) -> list[str]:
    """The host's check of *bundle* (with the host's own runner code, not the bundle's), done
    before anything from the bundle runs. *digest*: the bundle's, when already computed."""
    from .._runtimes.runner.errors import BundleError
    from .._runtimes.runner.manifest import check_manifest, integrity_problems

    problems = []
    if expect_digest is not None:
        wanted = parse_digest(expect_digest)
        digest = digest or bundle_digest(bundle)
        if digest != wanted:
            problems.append(f"manifest.json: digest {digest} is not the expected {wanted}")
    try:
        check_manifest(manifest)
    except BundleError as exc:   # a damaged manifest: its shape is the problem
        return problems + [str(exc)]
    return problems + integrity_problems(str(bundle), manifest)


def refused(manifest: dict[str, Any], problems: list[str], digest: str) -> dict[str, Any]:
    """The report of a bundle that failed the host's integrity check: nothing was run."""
    return {"bundle": manifest.get("name"), "target": manifest.get("target", {}).get("name"),
            "precision": "; ".join(p.get("precision", {}).get("description", "?")
                                   for p in manifest.get("parts", [])),
            "passed": False, "digest": digest, "providers": [], "check": {}, "bench": {},
            "checks": [{"name": "integrity", "passed": False,
                        "detail": "; ".join(problems) + "; nothing from the bundle was run"}]}


def check_timing_options(runs: Any, warmup: Any, threads: Any, latency_budget_ms: Any) -> None:
    """PackagerError (exit 2) naming the option when a count or the latency budget is not one:
    verify and deploy refuse it here, before anything runs."""
    def whole(value: Any, least: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= least

    for option, value, least, what in (("--runs", runs, 1, "runs"),
                                       ("--warmup", warmup, 0, "warm-up runs"),
                                       ("--threads", 1 if threads is None else threads, 1,
                                        "threads")):
        if not whole(value, least):
            raise PackagerError(f"{option} {value}: not a number of {what}",
                                f"give {least} or more")
    if latency_budget_ms is not None and (isinstance(latency_budget_ms, bool) or not isinstance(
            latency_budget_ms, int | float) or not 0 < latency_budget_ms < float("inf")):
        raise PackagerError(f"--latency-budget-ms {latency_budget_ms}: not a latency",
                            "give a number of milliseconds above 0")


def verify(bundle: Path, *, python: str = sys.executable, runs: int = 100, warmup: int = 10,
           threads: int | None = None, latency_budget_ms: float | None = None,
           require_provider: str | None = None, timeout: float = 900.0,
           expect_digest: str | None = None, tune: bool = False) -> dict[str, Any]:
    """Check integrity (here, before anything from the bundle runs), then run the bundle's own
    run.py: accuracy, benchmark, budgets; write reports/ in *bundle*. *tune*: first time
    session options with `run.py bench --tune`, which keeps the fastest in the bundle's
    session.tuned.json for this machine."""
    check_timing_options(runs, warmup, threads, latency_budget_ms)
    check_tune(tune, threads)
    bundle = Path(bundle)
    wanted = parse_digest(expect_digest) if expect_digest is not None else None
    manifest = read_manifest(bundle)
    check_tune_shipped(tune, manifest, bundle)
    digest = bundle_digest(bundle)
    prepare_reports(bundle / REPORTS)
    problems = integrity_problems(bundle, manifest, wanted, digest)
    if problems:
        report = refused(manifest, problems, digest)
    else:
        report = run_checks(manifest, local_runner(bundle, python=python, timeout=timeout),
                            str(bundle), runs=runs, warmup=warmup, threads=threads,
                            latency_budget_ms=latency_budget_ms,
                            require_provider=require_provider, tune=tune)
        report["digest"] = digest
    # written for a refused bundle too (the user wants to know why), never through a link
    write_files(bundle, [REPORTS], report_files(report))
    write_page(bundle)   # the bundle's page shows this machine's latest report
    return report


def run_checks(manifest: dict[str, Any], execute: Execute, where: str, *, runs: int = 100,
               warmup: int = 10, threads: int | None = None,
               latency_budget_ms: float | None = None, require_provider: str | None = None,
               progress: Callable[[str], None] = lambda _: None,
               tune: bool = False) -> dict[str, Any]:
    """run.py check then bench through *execute*, judged against the bundle's budgets; with
    *tune*, `bench --tune` first (its choice is kept on the device and used by both). What
    run.py answers comes from the device: JSON without the fields read here is VerifyError."""
    try:
        report = _run_checks(manifest, execute, where, runs=runs, warmup=warmup,
                             threads=threads, latency_budget_ms=latency_budget_ms,
                             require_provider=require_provider, progress=progress, tune=tune)
        render_markdown(report)   # every field the report shows can be read
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise VerifyError(f"run.py in {where} answered JSON without the fields this edgepack "
                          f"reads ({type(exc).__name__}: {str(exc)[:100]})",
                          "the runner there is damaged or from another edgepack; copy the "
                          "bundle again, or rebuild it") from None
    return report


def _run_checks(manifest: dict[str, Any], execute: Execute, where: str, *, runs: int,
                warmup: int, threads: int | None, latency_budget_ms: float | None,
                require_provider: str | None, progress: Callable[[str], None],
                tune: bool) -> dict[str, Any]:
    common = [] if threads is None else ["--threads", str(threads)]
    if require_provider:
        common += ["--require-provider", require_provider]
    tuning = None
    if tune:
        progress(f"tune: timing session options, {min(runs, TUNE_RUNS)} runs each")
        _, tuned, _ = run_runner(execute, [*tune_args(min(runs, TUNE_RUNS),
                                                      min(warmup, TUNE_WARMUP)), *common], where)
        tuning = tuned.get("tuning")
    progress("check: integrity and accuracy against the golden outputs")
    _, check, check_log = run_runner(execute, ["check", *common], where)
    checks = [{"name": "integrity", "passed": not check.get("integrity"),
               "detail": "; ".join(check.get("integrity", [])) or "all file hashes match"}]
    bench: dict[str, Any] = {}
    several = len(manifest["parts"]) > 1
    if checks[0]["passed"]:
        for part, entry in check.get("parts", {}).items():
            for name, stats in entry["outputs"].items():
                checks += _accuracy_checks(_label(part, name, several), entry, stats)
            task = entry.get("task")
            if task:   # the part's task figures against the reference (docs/tasks.md)
                checks.append({"name": f"task:{part if several else task['kind']}",
                               "passed": task["passed"], "detail": task["text"],
                               **({} if task["shown"] or not task["passed"] else
                                  {"proven": False})})
        pipeline = check.get("pipeline")
        if pipeline:   # the whole cascade on the golden photos (docs/pipelines.md)
            checks.append({"name": f"pipeline:{pipeline['kind']}", "passed": pipeline["passed"],
                           "detail": pipeline["text"], **({} if pipeline.get("checked") else
                                                          {"skipped": True}),
                           **({"proven": False} if pipeline.get("checked") and
                              pipeline["passed"] and not pipeline.get("shown", True) else {})})
        progress(f"bench: {runs} runs after {warmup} warm-up")
        roofline = ["--roofline"] if manifest.get("roofline") else []   # (newer bundles)
        _, bench, _ = run_runner(execute, ["bench", "--runs", str(runs), "--warmup", str(warmup),
                                           *roofline, *common], where)
        checks += _latency_checks(bench, latency_budget_ms, manifest, several)
    elsewhere = not_the_target(manifest, check, bench)
    if elsewhere:
        checks.append({"name": "target", "passed": True, "skipped": True,
                       "detail": f"not checked on the target: {elsewhere}"})
    report = {
        "bundle": manifest.get("name"), "target": manifest["target"]["name"],
        "on_target": not elsewhere, "target_note": elsewhere,
        "graphs": {name: entry["graph"] for name, entry in check.get("parts", {}).items()
                   if "graph" in entry},
        # the file the session really loads: the graph optimised offline (model.ort) where
        # this onnxruntime takes it
        "loaded": {name: entry["loaded"] for name, entry in check.get("parts", {}).items()
                   if entry.get("loaded") and entry["loaded"] != entry.get("graph")},
        "precision": "; ".join((f"{p['name']}: " if several else "")
                               + p["precision"].get("description", "?")
                               for p in manifest["parts"]),
        "accuracy_at_build": {p["name"]: p.get("accuracy", {}) for p in manifest["parts"]},
        "passed": all(c["passed"] for c in checks), "checks": checks,
        "verdict": verdict(checks),
        "providers": check.get("providers", []),
        "provider_line": next((ln for ln in check_log.splitlines() if "running on" in ln), ""),
        "check": check, "bench": bench, "tuning": tuning,
        "precision_choice": {p["name"]: p["precision"]["decision"] for p in manifest["parts"]
                             if "decision" in p.get("precision", {})},
    }
    return report


def _latency_checks(bench: dict[str, Any], asked: float | None, manifest: dict[str, Any],
                    several: bool) -> list[dict[str, Any]]:
    """Each part's p90 against --latency-budget-ms (*asked*), else the target's ceiling for
    one answer, else, for speech, real time: Kokoro-82M took 1.82 s at p90 for its golden
    sentence, 5.00 s of audio, and failed the target's 1000 ms, a ceiling made for one
    answer, not for a sentence."""
    budget = asked or manifest.get("budget", {}).get("latency_p90_ms")
    checks = []
    for part, entry in bench["parts"].items():
        p90, name = entry["latency_ms"]["p90"], "latency" + (f":{part}" if several else "")
        if entry.get("audio_s") and not asked:
            limit = 1000.0 * entry["audio_s"]
            checks.append({"name": name, "passed": p90 <= limit, "detail": (
                f"p90 {p90:.3f} ms {'<=' if p90 <= limit else '>'} the {entry['audio_s']:.2f}"
                f" s of audio it speaks (real-time factor {p90 / limit:.2f} at p90; "
                "--latency-budget-ms sets a ceiling instead)")})
        elif budget:
            checks.append({"name": name, "passed": p90 <= budget,
                           "detail": f"p90 {p90:.3f} ms {'<=' if p90 <= budget else '>'} "
                                     f"budget {budget:g} ms"})
    return checks


def check_tune(tune: bool, threads: int | None) -> None:
    if tune and threads is not None:
        raise VerifyError("--tune and --threads: tuning tries the thread counts itself",
                          "drop one of them")


def check_tune_shipped(tune: bool, manifest: dict[str, Any], bundle: Path) -> None:
    """--tune of a bundle built without the `tune` extra: refused here, before any device is
    contacted (deploy copied it first, then the device's run.py said so)."""
    from .._runtimes.runner.contents import EXTRAS, RUNNER_EXTRAS, shipped

    if tune and not all(shipped(manifest, rel) for rel in RUNNER_EXTRAS["tune"]):
        raise VerifyError(f"{bundle}: --tune, but this bundle was built without `tune` "
                          "(edgepack build --runner-extras)",
                          f"drop --tune, or build it again with --runner-extras "
                          f"{','.join(EXTRAS)} (the default)")


def not_the_target(manifest: dict[str, Any], check: dict[str, Any],
                   bench: dict[str, Any]) -> str:
    """'' when the check ran on the target's arch and first provider, else what differed (a
    pass there says nothing of the target's kernels or speed): the runner's own note, or for a
    runner from before it, the same judgement from its report."""
    from .._runtimes.runner.check import target_note

    if "target_note" in check:
        return check["target_note"]
    arch = (bench.get("device") or check.get("device") or {}).get("arch") or ""
    return target_note(manifest, (check.get("providers") or [""])[0], arch)


def report_folder(name: str) -> str:
    """A host as one safe folder name below reports/ (never '', '.', '..' or a path): both
    deploy engines write reports/HOST with it."""
    label = re.sub(r"[^A-Za-z0-9_.@-]", "_", name)[:100]
    return label if label.strip(".") else "_" * max(1, len(label))


def write_reports(out: Path, report: dict[str, Any], *, host: str | None = None) -> Path:
    """report.json and report.md into the folder *out* (with *host*: into out/host), written
    without following links (reports.write_files): `reports/` (or `ARCHIVE.reports/`) and a
    host's folder in it must be real folders (or absent) and one plain name each; only the
    folder above them, the bundle's or the archive's, may be reached through a link. Returns
    the folder written to."""
    base, folders = report_folders(Path(out), host)
    return write_files(base, folders, report_files(report))


def prepare_reports(reports: Path) -> Path:
    """Create (or check) BUNDLE/reports (or ARCHIVE.reports) before any work is done, so a
    planted link or file there is refused (BundleError) before anything runs or is copied."""
    reports = Path(reports)
    return write_files(reports.parent, [reports.name], {})


def report_files(report: dict[str, Any]) -> dict[str, str]:
    return {"report.json": json.dumps(report, indent=2, sort_keys=True) + "\n",
            "report.md": render_markdown(report)}


def report_folders(out: Path, host: str | None = None) -> tuple[Path, list[str]]:
    """(the folder the user named, the folders below it) for *out*: BUNDLE/reports,
    BUNDLE/reports/HOST or ARCHIVE.reports/HOST. Without *host*, a host's folder is told by its
    parent's name (`reports`, `*.reports`): `reports/..` is refused by write_files, and a host
    label holding a '/' (reports/a/b) here."""
    def reports_folder(path: Path) -> bool:
        return path.name == REPORTS or path.name.endswith("." + REPORTS)

    if host is not None:
        return out.parent, [out.name, host]
    if reports_folder(out.parent):
        return out.parent.parent, [out.parent.name, out.name]
    if not reports_folder(out):
        for above in out.parents:
            if reports_folder(above):
                raise BundleError(f"reports in {above}: {str(out.relative_to(above))!r} is not "
                                  "a single folder name",
                                  "name the host with letters, digits, '.', '_' or '-'")
    return out.parent, [out.name]


def verdict(checks: Sequence[dict[str, Any]]) -> str:
    """The one verdict verify, deploy, status, the demo and the page all say: 'failed' (a check
    failed), 'passed', or where a check passed on too few samples to show its budget,
    'passed on 8 samples; 100 show 99%' (never read as a plain pass, never called a failure:
    8 golden samples cannot show a 99 % keep)."""
    if not all(c["passed"] for c in checks):
        return "failed"
    thin = [c for c in checks if c.get("proven") is False]
    return "passed" if not thin else "passed " + thin_words(thin[0])


def thin_words(check: dict[str, Any]) -> str:
    """'on 8 samples; 100 show 99%' from a check's own words ('8 samples cannot show 99%: 100
    needed'), or what can be said without them."""
    found = re.search(r"(\d+) ([a-z][\w ]*?) cannot show ([\d.]+%): (\d+) needed",
                      str(check.get("detail", "")))
    if not found:
        return "on too few samples to show its budget"
    count, unit, keep, needed = found.groups()
    return f"on {count} {unit}; {needed} show {keep}"


def _result(check: dict[str, Any]) -> str:
    if check.get("skipped"):
        return "not checked"
    if not check["passed"]:
        return "FAIL"
    return "passed " + thin_words(check) if check.get("proven") is False else "pass"


def render_markdown(report: dict[str, Any]) -> str:
    word, _, thin = str(report.get("verdict") or ("passed" if report["passed"] else
                                                  "failed")).partition(" ")
    lines = [f"# Verification: {report['bundle']} ({report['target']})", "",
             f"**{word.upper()}**{' ' + thin if thin else ''}"
             f" — {report['precision']}; "
             + (f"bundle {report['digest']}; " if report.get("digest") else "") +
             f"providers: {', '.join(report['providers']) or 'n/a'}"
             + (f"; graph {', '.join(sorted(set(report['graphs'].values())))}"
                if report.get("graphs") else "")
             + (f", loaded from {', '.join(sorted(set(report['loaded'].values())))} "
                "(optimised offline)" if report.get("loaded") else "")
             + (f" (not on the target: {report['target_note']})" if report.get("target_note")
                else ""), "",
             "| check | result | detail |", "| --- | --- | --- |"]
    lines += [f"| {c['name']} | {_result(c)} | {c['detail']} |" for c in report["checks"]]
    bench = report.get("bench")
    if bench:
        dev = bench["device"]
        rss = bench.get("peak_rss_mb")
        threads = (bench.get("session") or {}).get("intra_op_threads") or "auto"
        lines += ["", f"## Benchmark ({bench['runs']} runs after {bench['warmup']} warm-up, "
                      f"{threads} threads)", "",
                  "| model | batch | p50 ms | p10-p90 ms | p99 ms | mean ms | throughput/s | "
                  "others' CPU | noisy |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for part, entry in bench["parts"].items():
            lat = entry["latency_ms"]
            share = (entry.get("load") or {}).get("other_share")
            lines.append(f"| {part} | {entry['batch']} | {lat['p50']:.3f} | "
                         f"{lat.get('p10', lat['min']):.3f}-{lat['p90']:.3f} | "
                         f"{lat['p99']:.3f} | {lat['mean']:.3f} | "
                         f"{entry['throughput_per_s']:.1f} | "
                         f"{'-' if share is None else f'{100 * share:.0f}%'} | "
                         f"{entry.get('noisy') or 'no'} |")
        ceiling = bench.get("roofline")
        for part, entry in bench["parts"].items():
            if entry.get("achieved_gops"):
                share = entry.get("roofline_share")
                lines.append(
                    f"\n{part}: {entry['operations_per_call'] / 1e9:.3g} GOP per call, "
                    f"{entry['achieved_gops']:.1f} GOP/s" + (
                        f", {100 * share:.0f}% of this device's "
                        f"{ceiling['int8_kind'] if entry['precision'] == 'int8' else 'FP32'} "
                        "MatMul rate" if share is not None else "") + ".")
        if ceiling:
            lines.append(f"\nRoofline ({ceiling['size']}x{ceiling['size']} MatMul, "
                         f"{ceiling['threads']} threads): FP32 {ceiling['fp32_gops']:.1f} GOP/s, "
                         f"{ceiling['int8_kind']} MatMulInteger {ceiling['int8_gops']:.1f} "
                         "GOP/s.")
        lines += ["", f"Peak RSS {f'{rss:.1f} MB' if rss is not None else 'n/a'}. "
                      f"Device: {dev.get('cpu') or '?'} ({dev['arch']}, {dev['cores']} cores), "
                      f"onnxruntime {bench['onnxruntime']}, Python {dev.get('python', '?')}."]
        if bench.get("session"):
            lines += ["", f"Session: {describe_session(bench['session'])} (from "
                          f"{bench.get('session_from', 'the manifest')})."]
    tuning = report.get("tuning")
    if tuning:
        lines += ["", f"## Session tuning ({len(tuning['tried'])} settings, {tuning['runs']} runs "
                      f"each, {tuning['cores']} cores)", "",
                  ("Kept the current settings, " if tuning["chosen"] == tuning["current"]
                   else "Chose ") + f"{describe_session(tuning['chosen'])}: {tuning['reason']}"
                  + (f"; kept in {tuning['saved']} on the device" if tuning.get("saved") else "")
                  + ".", "", "| threads | inter-op | mode | opt level | p50 ms | stage |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for t in tuning["tried"]:
            s = t["session"]
            lines.append(f"| {s['intra_op_threads'] or 'auto'} | {s['inter_op_threads'] or 'auto'}"
                         f" | {s['execution_mode']} | {s['graph_optimization_level']} | "
                         f"{t['p50_ms']:.3f} | {t['stage']} |")
    for part, choice in report.get("precision_choice", {}).items():
        lines += ["", f"## Precision chosen at build ({part}): {choice['chosen']}", "",
                  choice["reason"], "", "| candidate | p50 ms | p90 ms | cosine min | bytes | "
                  "within budget |", "| --- | --- | --- | --- | --- | --- |"]
        for c in choice["candidates"]:
            cos = f"{c['cosine_min']:.4f}" if c["cosine_min"] is not None else "-"
            p50, p90 = (f"{c[k]:.3f}" if c.get(k) is not None else "-"
                        for k in ("p50_ms", "p90_ms"))
            lines.append(f"| {c.get('label', c['precision'])} | {p50} | {p90} | {cos} | "
                         f"{c['bytes'] or '-'} | {'yes' if c['meets_budget'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _accuracy_checks(label: str, entry: dict[str, Any], stats: dict[str, Any]) -> list[dict]:
    """Both promises for one output: the host's outputs reproduced, the floor vs the reference."""
    rep = stats.get("reproduce") or {"checked": False, "reason": "the bundle's runner predates it"}
    if rep["checked"]:
        reproduce = {"passed": rep["passed"], "detail": _figure(
            rep, rep["min_cosine"], "the host's outputs of the shipped model",
            "a kernel computes differently on this device")}
    else:
        reproduce = {"passed": True, "skipped": True, "detail": f"not checked: {rep['reason']}"}
    what = ("the FP32 reference (the device's floor: the build's own cosine less a margin, "
            "never below the budget)" if entry.get("reference", "fp32") == "fp32" else
            "the host's outputs (no FP32 reference: the bundle makes no accuracy claim)")
    return [{"name": f"reproduce:{label}", **reproduce},
            {"name": f"accuracy:{label}", "passed": stats["cosine_min"] >= entry["min_cosine"],
             "detail": _figure(stats, entry["min_cosine"], what)}]


def _figure(stats: dict[str, Any], floor: float, what: str, why: str = "") -> str:
    ok = stats["cosine_min"] >= floor
    return (f"cosine min {stats['cosine_min']:.5f} {'>=' if ok else '<'} {floor:.4f} vs {what}"
            + (f": {why}" if why and not ok else ""))


def _label(part: str, output: str, several: bool) -> str:
    return f"{part}/{output}" if several else output
