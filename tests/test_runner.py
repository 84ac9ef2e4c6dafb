"""The runner as the device sees it: a fresh process in an unpacked bundle."""

import ast
import json
import math
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import test_serve
from test_serve import strict_json

from conftest import run_py, start_server

built_fp32 = test_serve.built_fp32   # the FP32 bundle fixture, shared with serve's tests

RUNTIMES = Path(__file__).resolve().parent.parent / "runtimes"
RUNNER = RUNTIMES / "run.py"
RUNNER_PACKAGE = sorted((RUNTIMES / "runner").glob("*.py"))
ALLOWED = set(sys.stdlib_module_names) | {"numpy", "onnxruntime", "cv2"}


def test_runner_imports_only_stdlib_numpy_onnxruntime_cv2():
    assert len(RUNNER_PACKAGE) > 5
    for path in [RUNNER, *RUNNER_PACKAGE]:
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:   # the runner's own modules, never a folder above
                    assert node.level == 1 and path.parent.name == "runner", path
                    continue
                names.add(node.module.split(".")[0])
        assert names <= ALLOWED, (path.name, names - ALLOWED)
        assert "packager" not in names


def test_runner_is_a_short_run_py_and_small_modules_shipped_as_used():
    from packager._runtimes.runner.contents import (
        RUNNER_CORE,
        RUNNER_EXTRAS,
        RUNNER_FILES,
        RUNNER_HEADS,
        RUNNER_TASKS,
    )
    from packager.bundle.assemble import runner_sources

    sizes = {p.name: len(p.read_text().splitlines()) for p in [RUNNER, *RUNNER_PACKAGE]}
    assert sizes["run.py"] <= 100, sizes
    assert max(sizes.values()) <= 500, sizes
    shipped = {"run.py", *(f"runner/{p.name}" for p in RUNNER_PACKAGE)}
    everything = {"parts": [{"task": {"kind": kind}} for kind in RUNNER_HEADS],
                  "pipeline": {"kind": "ocr"},
                  "providers": [{"name": "TensorrtExecutionProvider"}]}
    assert set(RUNNER_FILES) == shipped == set(runner_sources(everything))
    assert set(runner_sources({}, extras=())) == set(RUNNER_CORE)
    extras = {rel for group in RUNNER_EXTRAS.values() for rel in group}
    classifier = {"parts": [{"task": {"kind": "classify"}, "preprocess": {"size": [8, 8]}},
                            {"task": None}, {"task": {"kind": "raw"}}],
                  "providers": [{"name": "OpenVINOExecutionProvider"},
                                {"name": "CPUExecutionProvider"}]}
    assert set(runner_sources(classifier)) == \
        set(RUNNER_CORE) | extras | {RUNNER_HEADS["classify"], "runner/images.py"} | \
        set(RUNNER_TASKS)
    # run.py's own lists of the package's modules (checked before any of them is imported)
    tree = ast.parse(RUNNER.read_text())
    lists = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
             if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") in
             ("CORE_MODULES", "OPTIONAL_MODULES")}
    assert {f"runner/{m}" for m in lists["CORE_MODULES"]} == set(RUNNER_CORE) - {"run.py"}
    assert {f"runner/{m}" for m in lists["OPTIONAL_MODULES"]} == shipped - set(RUNNER_CORE)
    # the core ships in every bundle: it may not grow past what it is (docs/runner.md)
    core = sum(len((RUNTIMES / rel).read_text().splitlines()) for rel in RUNNER_CORE)
    # 2,084 after infer, tune's reading, roofline and TensorRT moved out; + a part's length
    # + the build's evidence verdict said by check (issue 44); + bench's call for a speech
    # part's real-time factor, its body in task_tts.py (issue 45); + bench FILE... on a tts
    # pipeline speaking whole sentences and printing them, its body in cascade.py; + bench's
    # timing loops bounded in seconds (issue 45); + run.py admitting only the runner files the
    # manifest lists, and the parser no optional module where it cannot read it (security);
    # + the cosine scaled before its squares overflow, and --help marking the extras a bundle
    # was built without (hostile-cases-turn5 #20, #17)
    assert core <= 2144, core   # 2,144
    code = sum(code_lines(RUNTIMES / rel) for rel in RUNNER_CORE)
    assert code <= 1598, code   # 1,598 without comments, docstrings and blank lines (issue 35, 45, 46)


def code_lines(path: Path) -> int:
    """*path*'s lines that are code: not blank, not a comment, not a docstring."""
    source = path.read_text()
    docs = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docs)


def imported_by(bundle: Path, *argv: str) -> set[str]:
    """The runner modules `run.py ARGV` imported in *bundle* (as runner/NAME.py), and its exit."""
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: sys.stderr.write('MODULES %s\\n' % ','.join(sorted(\n"
            "    m for m in sys.modules if m.startswith('runner.')))))\n"
            f"sys.argv = ['run.py', *{list(argv)!r}]\n"
            "runpy.run_path('run.py', run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-I", "-c", code], cwd=bundle, capture_output=True,
                       text=True, timeout=300)
    found = re.search(r"^MODULES (.*)$", r.stderr, re.M)
    assert found and r.returncode == 0, r.stdout[-1000:] + r.stderr[-2000:]
    return {f"runner/{m.split('.', 1)[1]}.py" for m in found.group(1).split(",")}


def test_a_classify_bundle_ships_only_the_modules_its_commands_import(cnn_onnx, image_dir,
                                                                     tmp_path):
    """Issue 35: a classify bundle's runner/ holds only what check, bench (with --tune and
    --profile), infer and serve import: no other task's head, no cascade, nothing unused."""
    import cv2

    from conftest import PREP
    from packager.build.job import build

    bundle = build(cnn_onnx, tmp_path / "b", target="x86_64-cpu", calib=image_dir,
                   preprocess=PREP, labels=[f"class{i}" for i in range(10)],
                   quant={"precision": "fp32"}, tasks={"model": {"kind": "classify"}}
                   ).bundle.directory
    image = tmp_path / "photo.png"
    cv2.imwrite(str(image), np.full((40, 60, 3), 90, np.uint8))
    used = set()
    for argv in (("check",), ("bench", "--runs", "3", "--warmup", "1", "--profile"),
                 ("bench", "--tune", "--no-save", "--runs", "2", "--warmup", "1"),
                 ("bench", "--roofline", "--runs", "2", "--warmup", "1", str(image)),
                 ("infer", str(image))):
        used |= imported_by(bundle, *argv)
    log = tmp_path / "serve.log"
    proc, url = start_server_traced(bundle, log)
    try:
        import urllib.request

        with urllib.request.urlopen(urllib.request.Request(
                url + "/infer", data=image.read_bytes(),
                headers={"Content-Type": "image/png"}), timeout=60) as answer:
            assert answer.status == 200
    finally:
        proc.send_signal(2)
        proc.wait(timeout=60)
    found = re.search(r"^MODULES (.*)$", log.read_text(), re.M)
    assert found, log.read_text()[-2000:]
    used |= {f"runner/{m.split('.', 1)[1]}.py" for m in found.group(1).split(",")}
    shipped = {p.relative_to(bundle).as_posix() for p in (bundle / "runner").glob("*.py")}
    assert shipped - {"runner/__init__.py"} == used, (sorted(shipped - used), sorted(used - shipped))
    assert not [rel for rel in shipped if "cascade" in rel or "task_detect" in rel]


def start_server_traced(bundle: Path, log: Path):
    """`run.py serve --port 0` in *bundle*, writing the runner modules it imported to *log*
    when it stops: (process, base URL)."""
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: sys.stderr.write('MODULES %s\\n' % ','.join(sorted(\n"
            "    m for m in sys.modules if m.startswith('runner.')))))\n"
            "sys.argv = ['run.py', 'serve', '--port', '0', '--quiet']\n"
            "runpy.run_path('run.py', run_name='__main__')\n")
    return start_server(bundle, log, code=code)


def test_a_bundle_built_without_extras_says_how_to_get_them(cnn_onnx, image_dir, tmp_path):
    """--runner-extras none ships the core and the part's head: check, bench and infer run;
    serve, bench --tune and bench --profile each say in one line how to build a bundle with
    them (exit 2). --tune without tune among the extras is refused before anything is built."""
    from conftest import PREP
    from packager.build.job import build
    from packager.errors import SpecError

    with pytest.raises(SpecError, match="add tune to --runner-extras"):
        build(cnn_onnx, tmp_path / "x", target="x86_64-cpu", runner_extras=("serve",),
              tune=lambda *a, **k: None)
    assert not (tmp_path / "x").exists()
    lean = build(cnn_onnx, tmp_path / "lean", target="x86_64-cpu", calib=image_dir,
                 preprocess=PREP, labels=[f"class{i}" for i in range(10)],
                 quant={"precision": "fp32"}, tasks={"model": {"kind": "classify"}},
                 runner_extras=()).bundle.directory
    runner = sorted(p.name for p in (lean / "runner").iterdir())
    assert not {"serve.py", "tuning.py", "tuned.py", "profile.py", "infer.py", "inputs.py",
                "stages.py", "roofline.py"} & set(runner), runner
    assert "task_classify.py" in runner and not list((lean / "roofline").glob("*"))
    assert run_py(lean, "check").returncode == 0
    r = run_py(lean, "bench", "--runs", "2", "--warmup", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    image = tmp_path / "photo.png"
    image.write_bytes((image_dir / sorted(p.name for p in image_dir.iterdir())[0]).read_bytes())
    for argv, extra in ((("serve", "--port", "0"), "serve"), (("bench", "--tune"), "tune"),
                        (("bench", "--profile", "--runs", "2"), "profile"),
                        (("bench", "--roofline", "--runs", "2"), "roofline"),
                        (("infer", str(image)), "infer"),
                        (("bench", "--runs", "2", str(image)), "infer")):
        r = run_py(lean, *argv)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert f"this bundle was built without `{extra}`" in r.stderr, r.stderr[-2000:]
        assert "--runner-extras infer,serve,tune,profile,roofline" in r.stderr
    # a tuned file copied in from elsewhere: refused in one line, not read by a runner without tune
    (lean / "session.tuned.json").write_text("{}")
    r = run_py(lean, "check")
    assert r.returncode == 2 and "built without `tune`, which reads it; delete it" in r.stderr, \
        r.stderr[-2000:]


def test_a_bundle_without_a_pipeline_ships_no_cascade_code(built, tmp_path):
    """Issue 35: the cascade's five modules (~1,470 lines) ship only in a pipeline bundle. A
    classify bundle's runner/ holds no cascade module and passes its check; a bundle that lists
    them (every bundle built before) still passes; a manifest edited to hold a pipeline fails
    its check naming the missing module in one line, exit 2."""
    from packager._runtimes.runner.contents import RUNNER_CASCADE

    runner = built.bundle.directory / "runner"
    assert not list(runner.glob("cascade*")), sorted(p.name for p in runner.iterdir())
    # a raw-tensor part: no task's checks, heads or judgement either; its images decode
    assert not list(runner.glob("task*")) and (runner / "images.py").is_file()
    assert not [rel for rel in built.bundle.manifest["files"] if "cascade" in rel]
    r = run_py(built.bundle.directory, "check")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    older, manifest = copy_of(built, tmp_path)
    for rel in RUNNER_CASCADE:   # as a bundle built before the split listed them
        shutil.copyfile(RUNTIMES / rel, older / rel)
        manifest["files"][rel] = ""
    resign(older, manifest)
    r = run_py(older, "check")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    edited = tmp_path / "edited"
    shutil.copytree(built.bundle.directory, edited)
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["pipeline"] = {"kind": "ocr"}
    resign(edited, manifest)
    r = run_py(edited, "check")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "runner/cascade_spec.py: missing, and this bundle's manifest needs it" in r.stderr


# the Ansible role's controller script runs on any controller's Python too
ROLE_SCRIPTS = sorted((Path(__file__).parent.parent / "packager" / "device" / "role").glob("*/files/*.py"))


def test_runner_parses_as_python_38():
    assert ROLE_SCRIPTS
    for path in [*RUNTIMES.glob("*.py"), *RUNNER_PACKAGE, *ROLE_SCRIPTS]:
        ast.parse(path.read_text(), str(path), feature_version=(3, 8))


def vermin(path) -> subprocess.CompletedProcess:
    tool = Path(sys.executable).with_name("vermin")   # the console script beside this Python
    return subprocess.run([str(tool), "--no-tips", "--violations", "-t=3.8-", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_runner_needs_nothing_newer_than_python_38(tmp_path):
    for path in [*RUNTIMES.glob("*.py"), *RUNNER_PACKAGE, *ROLE_SCRIPTS]:   # runner, probe, role
        r = vermin(path)
        assert r.returncode == 0, r.stdout + r.stderr
    newer = tmp_path / "newer.py"   # the checker itself: a 3.9 string method must be caught
    newer.write_text("print('v1.2'.removeprefix('v'))\n")
    assert vermin(newer).returncode != 0


def test_check_bench_infer_from_unpacked_archive(built, tmp_path):
    with tarfile.open(built.bundle.archive) as tar:
        tar.extractall(tmp_path, filter="data")
    bundle = tmp_path / built.bundle.directory.name
    assert sorted(p.name for p in bundle.iterdir()) == [
        "README.md", "golden", "manifest.json", "model.onnx", "requirements.txt", "roofline",
        "run.py", "runner"]

    check = run_py(bundle, "check", "--json")
    assert check.returncode == 0, check.stderr
    report = json.loads(check.stdout)
    assert report["passed"] and report["integrity"] == []
    assert report["parts"]["model"]["outputs"]["scores"]["cosine_min"] > 0.98
    assert "model running on CPUExecutionProvider" in check.stderr

    bench = run_py(bundle, "bench", "--runs", "20", "--warmup", "2", "--json")
    assert bench.returncode == 0, bench.stderr
    b = json.loads(bench.stdout)
    lat = b["parts"]["model"]["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] and lat["std"] >= 0
    assert b["parts"]["model"]["throughput_per_s"] > 0 and b["peak_rss_mb"] > 10
    assert b["providers"] == ["CPUExecutionProvider"] and b["runs"] == 20
    assert b["device"]["arch"] and b["device"]["cores"] >= 1 and b["onnxruntime"]

    image = next(p for p in sorted((Path(__file__).parent).glob("*.py")))  # not an image
    bad = run_py(bundle, "infer", str(image))
    assert bad.returncode == 2 and "unsupported input" in bad.stderr

    import cv2
    cv2.imwrite(str(tmp_path / "cat.png"), np.full((50, 70, 3), 128, np.uint8))
    infer = run_py(bundle, "infer", str(tmp_path / "cat.png"), "--json", "--out",
                   str(tmp_path / "out.npz"))
    assert infer.returncode == 0, infer.stderr
    top = json.loads(infer.stdout)["results"][0]["outputs"]["scores"]["top"]
    assert len(top) == 5 and top[0]["label"].startswith("class")
    assert np.load(tmp_path / "out.npz")["cat.png/scores"].shape == (1, 10)
    # --out without .npz: numpy's name (.npz added), said rather than left to be found
    human = run_py(bundle, "infer", str(tmp_path / "cat.png"), "--out", str(tmp_path / "res.txt"))
    assert f"outputs written to {tmp_path / 'res.txt.npz'}" in human.stdout
    assert (tmp_path / "res.txt.npz").is_file() and not (tmp_path / "res.txt").exists()


def test_tampered_model_fails_check(built, tmp_path):
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    data = bytearray((bundle / "model.onnx").read_bytes())
    data[-10] ^= 0xFF
    (bundle / "model.onnx").write_bytes(bytes(data))
    r = run_py(bundle, "check")
    assert r.returncode == 1
    assert "model.onnx: sha256 mismatch" in r.stdout
    assert run_py(bundle, "bench").returncode == 2


def test_not_a_bundle_exits_2(tmp_path):
    (tmp_path / "run.py").write_text(RUNNER.read_text())
    shutil.copytree(RUNTIMES / "runner", tmp_path / "runner",
                    ignore=shutil.ignore_patterns("__pycache__"))
    r = run_py(tmp_path, "check")
    assert r.returncode == 2 and "cannot read the manifest" in r.stderr
    assert "Traceback" not in r.stderr


def test_require_provider_fails_when_it_does_not_run(built):
    r = run_py(built.bundle.directory, "check", "--require-provider", "CUDAExecutionProvider")
    assert r.returncode == 1 and "required provider CUDAExecutionProvider" in r.stderr


def copy_of(built, tmp_path: Path) -> tuple[Path, dict]:
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    return bundle, json.loads((bundle / "manifest.json").read_text())


def resign(bundle: Path, manifest: dict) -> None:
    """Write *manifest* with the files table matching the bundle's files, as the packager does."""
    import hashlib

    manifest["files"] = {rel: hashlib.sha256((bundle / rel).read_bytes()).hexdigest()
                         for rel in manifest["files"] if (bundle / rel).is_file()}
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def turned(outputs: np.ndarray, cosine: float) -> np.ndarray:
    """*outputs* with each sample turned away from itself to exactly *cosine*: what a kernel that
    computes differently would give."""
    rows = outputs.reshape(len(outputs), -1).astype(np.float64)
    away = np.random.default_rng(0).normal(size=rows.shape)
    away -= rows * ((away * rows).sum(1) / (rows * rows).sum(1))[:, None]   # orthogonal to rows
    away *= (np.linalg.norm(rows, axis=1) / np.linalg.norm(away, axis=1))[:, None]
    rows += np.sqrt(1 / cosine ** 2 - 1) * away
    return rows.reshape(outputs.shape).astype(outputs.dtype)


def test_check_reports_reproduction_and_budget(built):
    r = run_py(built.bundle.directory, "check", "--json")
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout)["parts"]["model"]
    out = entry["outputs"]["scores"]
    rep = out["reproduce"]
    assert rep["checked"] and rep["passed"] and rep["cosine_min"] > 0.99999   # same CPU, same kernels
    assert rep["min_cosine"] > out["min_cosine"] >= 0.98 and out["cosine_min"] >= out["min_cosine"]
    assert entry["reference"] == "fp32" and entry["precision"] == "int8"
    human = run_py(built.bundle.directory, "check").stdout
    assert "model/scores: reproduces the host's INT8 outputs: cosine 1.00000 >= " in human
    assert re.search(r"model/scores: vs FP32 reference: cosine (0\.9|1\.0)", human)
    assert "check passed" in human


def test_kernel_that_computes_differently_fails_reproduction(built, tmp_path):
    """The device computes what this bundle's host outputs disagree with, files re-signed: only
    the reproduction check can see it."""
    bundle, manifest = copy_of(built, tmp_path)
    shipped = bundle / "golden" / "model.shipped.npz"
    np.savez(shipped, scores=turned(np.load(shipped)["scores"], 0.95))
    resign(bundle, manifest)
    r = run_py(bundle, "check")
    assert r.returncode == 1, r.stdout + r.stderr
    floor = manifest["parts"][0]["golden"]["reproduce_min_cosine"]
    assert (f"model/scores: reproduces the host's INT8 outputs: cosine 0.95000 < {floor:.4f} "
            "(a kernel computes differently on this device)") in r.stdout
    assert re.search(r"model/scores: vs FP32 reference: cosine (0\.9|1\.0)", r.stdout)   # holds
    report = json.loads(run_py(bundle, "check", "--json").stdout)
    out = report["parts"]["model"]["outputs"]["scores"]
    assert not out["reproduce"]["passed"] and not out["passed"] and not report["passed"]
    assert out["cosine_min"] >= out["min_cosine"]   # the budget itself still holds


def test_budget_above_what_the_model_reaches_fails(built, tmp_path):
    bundle, manifest = copy_of(built, tmp_path)
    golden = manifest["parts"][0]["golden"]
    reached = min(o["cosine_min"] for o in golden["host"].values())
    # just above what the model reaches (on a CPU with VNNI, INT8 reaches 0.99997 here)
    floor = golden["min_cosine"] = math.ceil(reached * 1e4 + 1e-6) / 1e4
    assert reached < floor <= 1.0
    resign(bundle, manifest)
    r = run_py(bundle, "check")
    assert r.returncode == 1
    assert f"model/scores: vs FP32 reference: cosine {reached:.5f} < floor {floor:.4f}" in r.stdout
    assert "reproduces the host's INT8 outputs" in r.stdout and ": ok" in r.stdout
    out = json.loads(run_py(bundle, "check", "--json").stdout)["parts"]["model"]["outputs"]
    assert out["scores"]["reproduce"]["passed"] and not out["scores"]["passed"]


@pytest.mark.parametrize("case, reason", [
    ("older bundle", "the bundle has no host outputs of its model"),
    ("other provider", "the host ran CUDAExecutionProvider, this device runs CPUExecutionProvider"),
])
def test_reproduction_not_checked_says_so(built, tmp_path, case, reason):
    bundle, manifest = copy_of(built, tmp_path)
    golden = manifest["parts"][0]["golden"]
    if case == "older bundle":   # as built before golden data held the host's outputs
        (bundle / golden.pop("shipped")).unlink()
        for key in ("shipped_provider", "reproduce_min_cosine", "exact_cosine"):
            golden.pop(key)
    else:
        golden["shipped_provider"] = "CUDAExecutionProvider"
    resign(bundle, manifest)
    r = run_py(bundle, "check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"model/scores: reproduction not checked: {reason}" in r.stdout
    assert "model/scores: vs FP32 reference: cosine" in r.stdout and "check passed" in r.stdout
    out = json.loads(run_py(bundle, "check", "--json").stdout)["parts"]["model"]["outputs"]
    assert out["scores"]["reproduce"]["checked"] is False and out["scores"]["passed"]


def test_gpu_fact_helpers_read_versions_and_loaded_libraries():
    from packager._runtimes.runner import gpu_facts as r

    assert r._version(12040, 1000) == "12.4" and r._version(13000, 1000) == "13.0"
    assert r._version(90100, 10000) == "9.1.0"       # cuDNN 9, TensorRT 10 (100300)
    assert r._version(8902, 10000) == "8.9.2"        # cuDNN 8, TensorRT 8 (8601)
    assert r._version(100300, 10000) == "10.3.0" and r._version(None, 1000) is None
    assert "libc" in r.loaded_library("libc")          # from /proc/self/maps
    assert r.loaded_library("libnot-a-library") is None
    # no GPU library loaded in this process: every fact unknown, nothing raised
    facts = r.gpu_facts()
    assert facts["cuda_runtime"] is None and facts["cudnn"] is None and facts["tensorrt"] is None


def test_bench_io_binding_times_bound_runs_too(built):
    r = run_py(built.bundle.directory, "bench", "--runs", "5", "--warmup", "1", "--io-binding",
               "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    part = report["parts"]["model"]
    bound = part["io_binding"]
    assert bound["device"] == "cpu" and 0 < bound["latency_ms"]["p50"] <= bound["latency_ms"]["max"]
    assert part["graph"] == "model.onnx" and report["gpu"] is None   # CPU: no GPU facts
    human = run_py(built.bundle.directory, "bench", "--runs", "3", "--io-binding")
    assert "model with I/O binding on cpu: p50 " in human.stdout


def load_runner():
    from packager._runtimes.runner import images

    return images


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The error line of a run that failed cleanly: exit 2, no traceback, one `error:` line."""
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def test_infer_refuses_a_tampered_bundle(built, tmp_path):
    bundle, _ = copy_of(built, tmp_path)
    data = bytearray((bundle / "model.onnx").read_bytes())
    data[-10] ^= 0xFF
    (bundle / "model.onnx").write_bytes(bytes(data))
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 32, 32), np.float32))
    line = one_error_line(run_py(bundle, "infer", str(tmp_path / "x.npy")))
    assert line == ("error: integrity check failed: model.onnx: sha256 mismatch (file changed or "
                    "truncated in transfer); copy the bundle again")


def test_infer_damaged_or_oversized_files_get_one_line(built, tmp_path):
    import zipfile

    from test_serve import big_png

    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "whole.npy", x)
    whole = (tmp_path / "whole.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(whole[:len(whole) // 2])
    np.save(tmp_path / "complex.npy", x.astype(np.complex128))
    np.savez(tmp_path / "whole.npz", image=x)
    (tmp_path / "cut.npz").write_bytes((tmp_path / "whole.npz").read_bytes()[:300])
    (tmp_path / "huge.png").write_bytes(big_png(8000, 8000))
    bomb = tmp_path / "bomb.npz"   # a 300 MB float32 array of zeros in a 300 KB zip
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z, z.open("image.npy", "w") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                 "shape": (75 << 20,)})
        for _ in range(300):
            f.write(bytes(1 << 20))
    assert bomb.stat().st_size < 1_000_000
    bundle = built.bundle.directory
    for name, message in [
        ("cut.npy", "cut.npy: cannot read it (Failed to read all data for array. Expected "
                    "(1, 3, 32, 32) = 3072 elements, could only read 1520 elements."),
        ("complex.npy", "complex.npy: input image is complex128, the model wants float32; "
                        "pass real values"),
        ("cut.npz", "cut.npz: cannot read it ("),
        ("huge.png", "huge.png: the image is 8000x8000 (64 MP), over the 50 MP limit; resize it, "
                     "or raise --max-megapixels"),
        ("bomb.npz", "bomb.npz: the .npz unpacks to 300 MB, over the 256 MB limit; send the "
                     "model's inputs only"),
        ("missing.npy", "missing.npy: no such file or folder"),
    ]:
        line = one_error_line(run_py(bundle, "infer", str(tmp_path / name)))
        assert line.startswith(f"error: {tmp_path / name}: ") and message in line, line
    ok = run_py(bundle, "infer", str(tmp_path / "huge.png"), "--max-megapixels", "70")
    assert ok.returncode == 0, ok.stderr   # the limit is an option


def test_infer_a_folder_runs_its_supported_files_in_order(built, tmp_path):
    import cv2

    folder = tmp_path / "inputs"
    folder.mkdir()
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(folder / "b.npy", x)
    np.savez(folder / "a.npz", image=x)
    cv2.imwrite(str(folder / "c.PNG"), np.full((40, 50, 3), 90, np.uint8))
    (folder / "notes.txt").write_text("not an input")
    (folder / "sub").mkdir()
    np.save(folder / "sub" / "d.npy", x)   # not recursive
    r = run_py(built.bundle.directory, "infer", str(folder), "--json")
    assert r.returncode == 0, r.stderr
    files = [Path(e["file"]).name for e in json.loads(r.stdout)["results"]]
    assert files == ["a.npz", "b.npy", "c.PNG"]

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("")
    line = one_error_line(run_py(built.bundle.directory, "infer", str(tmp_path / "empty")))
    assert line == (f"error: {tmp_path / 'empty'}: a folder with no npy/npz/jpg/jpeg/png/bmp/webp "
                    "files; pass a folder or files this model reads")


def test_image_size_is_read_from_the_header():
    import cv2

    r = load_runner()
    image = np.zeros((37, 53, 3), np.uint8)
    for ext in (".png", ".jpg", ".bmp", ".webp"):
        data = cv2.imencode(ext, image)[1]
        assert r.image_size(data) == (53, 37), ext
    lossless = cv2.imencode(".webp", image, [cv2.IMWRITE_WEBP_QUALITY, 101])[1]   # VP8L
    assert r.image_size(lossless) == (53, 37)
    assert r.image_size(np.frombuffer(b"\x89PNG\r\n\x1a\n", np.uint8)) is None
    assert r.image_size(np.frombuffer(b"\xff\xd8\xff\xe0\x00", np.uint8)) is None


def test_s70_image_header_gives_channels_and_bytes_per_sample():
    """What decoding will allocate, read from the header (hostile case S70): channels as
    OpenCV decodes them and 2 bytes a sample for 16-bit PNGs."""
    import cv2

    r = load_runner()
    for image, ext, expected in [
        (np.zeros((37, 53, 3), np.uint16), ".png", (53, 37, 3, 2)),
        (np.zeros((37, 53, 4), np.uint16), ".png", (53, 37, 4, 2)),
        (np.zeros((37, 53, 4), np.uint8), ".png", (53, 37, 4, 1)),
        (np.zeros((37, 53), np.uint8), ".png", (53, 37, 1, 1)),
        (np.zeros((37, 53, 3), np.uint8), ".jpg", (53, 37, 3, 1)),
        (np.zeros((37, 53), np.uint8), ".jpg", (53, 37, 1, 1)),
        (np.zeros((37, 53, 4), np.uint8), ".bmp", (53, 37, 4, 1)),
    ]:
        assert r.image_header(cv2.imencode(ext, image)[1]) == expected, (ext, image.shape)


def python_without(tmp_path: Path, *, numpy: bool) -> str:
    """A real Python with neither onnxruntime nor (unless *numpy*) numpy: a fresh venv, numpy
    linked in from this one."""
    import sysconfig
    import venv

    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    if numpy:
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                               "['purelib'])"], capture_output=True, text=True).stdout.strip()
        ours = Path(sysconfig.get_paths()["purelib"])
        for name in ("numpy", "numpy.libs"):
            if (ours / name).exists():
                (Path(site) / name).symlink_to(ours / name)
    return str(python)


@pytest.mark.parametrize("missing", ["numpy", "onnxruntime"])
def test_missing_package_says_how_to_install_it(built, tmp_path, missing):
    from packager.device.verify import local_runner, run_runner
    from packager.errors import VerifyError

    python = python_without(tmp_path, numpy=missing == "onnxruntime")
    bundle = built.bundle.directory
    install = json.loads((bundle / "manifest.json").read_text())["target"]["install"]
    r = subprocess.run([python, "run.py", "check"], cwd=bundle, capture_output=True, text=True,
                       timeout=120)
    assert one_error_line(r) == (f"error: {missing} is not installed for {python}; install it "
                                 f"on the device with: {install}")
    with pytest.raises(VerifyError) as caught:
        run_runner(local_runner(bundle, python=python, timeout=120), ["check"], "here")
    assert f"{missing} is not installed for {python}" in caught.value.message
    assert caught.value.hint == "then verify again (or point --python at a Python that has it)"


def test_peak_rss_is_this_process_not_its_parent(built):
    ballast = b"\x01" * (600 << 20)   # this process: 600 MB resident when run.py is started
    r = run_py(built.bundle.directory, "bench", "--runs", "3", "--warmup", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert 10 < json.loads(r.stdout)["peak_rss_mb"] < 400, "ru_maxrss counts the parent's peak"
    del ballast


def test_a_manifest_of_the_wrong_shape_is_one_line_not_a_crash(built, tmp_path):
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["parts"][0]["inputs"][0]["shape"] = "x"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    r = run_py(bundle, "check", "--json")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == (
        "error: manifest.json: parts[0].inputs[0].shape is not a list; rebuild the bundle with "
        "edgepack")


def test_bench_reports_operations_and_the_roofline(built):
    manifest = json.loads((built.bundle.directory / "manifest.json").read_text())
    ops = manifest["parts"][0]["operations"]["per_call"]
    assert ops > 0 and manifest["roofline"]["int8_kind"] == "u8s8"   # x86's preset
    r = run_py(built.bundle.directory, "bench", "--runs", "5", "--warmup", "1", "--roofline",
               "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    part, ceiling = report["parts"]["model"], report["roofline"]
    assert part["operations_per_call"] == ops
    assert part["achieved_gops"] == pytest.approx(ops / (part["latency_ms"]["p50"] * 1e6))
    assert ceiling["fp32_gops"] > 0 and ceiling["int8_gops"] > 0 and ceiling["size"] == 512
    kind = "int8" if part["precision"] == "int8" else "fp32"
    assert part["roofline_share"] == pytest.approx(part["achieved_gops"] /
                                                   ceiling[kind + "_gops"])
    human = run_py(built.bundle.directory, "bench", "--runs", "3", "--roofline")
    assert "GOP per call" in human.stdout and "roofline (best of " in human.stdout


def test_infer_json_writes_non_finite_outputs_as_null(built_fp32, tmp_path):
    """NaN and infinity out of the model: --json stays JSON (null in their place, and said),
    the human report names the output, and the exit code stays 0 (the model ran)."""
    np.save(tmp_path / "a_nan.npy", np.full((1, 3, 32, 32), np.nan, np.float32))
    np.save(tmp_path / "b_inf.npy", np.full((1, 3, 32, 32), -np.inf, np.float32))
    np.save(tmp_path / "c_ok.npy", np.zeros((1, 3, 32, 32), np.float32))
    files = [str(tmp_path / n) for n in ("a_nan.npy", "b_inf.npy", "c_ok.npy")]
    r = run_py(built_fp32.bundle.directory, "infer", *files, "--json")
    assert r.returncode == 0, r.stderr
    report = strict_json(r.stdout)
    nan, inf, ok = report["results"]
    for entry in (nan, inf):
        assert [t["score"] for t in entry["outputs"]["scores"]["top"]] == [None] * 5
        assert entry["notes"] == ["output 'scores' holds 10 non-finite value(s) (NaN or infinity) "
                                  "of 10: the model computed them from this input"]
    assert "notes" not in ok and all(isinstance(t["score"], float)
                                     for t in ok["outputs"]["scores"]["top"])
    assert report["non_finite"]["count"] == 10
    assert report["non_finite"]["paths"][5] == "/results/1/outputs/scores/top/0/score"
    human = run_py(built_fp32.bundle.directory, "infer", *files)
    assert human.returncode == 0
    assert (f"{files[0]}: output 'scores' holds 10 non-finite value(s) (NaN or infinity) of 10"
            in human.stdout)
    assert f"{files[2]}: output" not in human.stdout


def test_to_json_writes_null_for_non_finite_and_names_where():
    from packager._runtimes.runner.report import to_json

    finite = {"p50_ms": 1.5, "parts": {"m": [1, 2.0, None, "x"]}}
    assert to_json(finite, indent=2, sort_keys=True) == json.dumps(finite, indent=2,
                                                                   sort_keys=True)
    report = {"cosine_min": float("nan"), "a/b": {"~x": [0.5, float("-inf")]},
              "nested": [{"v": float("inf")}], "passed": False}
    out = strict_json(to_json(report, sort_keys=True))
    assert out["cosine_min"] is None and out["a/b"]["~x"] == [0.5, None]
    assert out["nested"] == [{"v": None}] and out["passed"] is False
    assert out["non_finite"]["count"] == 3
    assert out["non_finite"]["paths"] == ["/cosine_min", "/a~1b/~0x/1", "/nested/0/v"]
    assert report["cosine_min"] != report["cosine_min"]   # the report itself is left as it was
    assert strict_json(to_json([float("nan")])) == [None]   # not a dict: no field to add


def test_a_reader_that_leaves_early_ends_infer_quietly(built, tmp_path):
    """`run.py infer DIR | head -1`: exit 141, no traceback, no "Exception ignored"."""
    folder = tmp_path / "many"
    folder.mkdir()
    x = np.zeros((1, 3, 32, 32), np.float32)
    for i in range(300):   # --json: about 260 KB, more than a pipe and head -1 take
        np.save(folder / f"x{i:03d}.npy", x)
    bundle = built.bundle.directory
    python = f"{sys.executable} -I run.py infer {folder}"
    for extra in ("--json", "--json 2>&1"):   # stdout's reader leaves; stderr's too
        r = subprocess.run(["bash", "-c", f"{python} {extra} | head -1; "
                                          "echo python-exit=${PIPESTATUS[0]} >&2"],
                           cwd=bundle, capture_output=True, text=True, timeout=300)
        assert r.stdout.splitlines()[0] in ("{", "edgepack: model running on "
                                            "CPUExecutionProvider (model.onnx, INT8)"), r.stdout
        assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
        assert "python-exit=141" in r.stderr, r.stderr
    # the human report, its reader gone before the first line
    proc = subprocess.Popen([sys.executable, "-I", "run.py", "infer", str(folder / "x000.npy")],
                            cwd=bundle, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err and "error:" not in err, err


def test_a_bundle_built_before_a_runner_module_was_added_still_verifies(built, tmp_path):
    """The host checks a bundle's runner by what its file table lists (its own run.py requires
    its own modules): a bundle from before runner/places.py and runner/contents.py existed has
    no problem here, while a table that drops an entry module, or a runner/ file it does not
    list, still does."""
    from packager.device.verify import integrity_problems

    older, manifest = copy_of(built, tmp_path)
    for rel in ("runner/places.py", "runner/contents.py"):
        (older / rel).unlink()
        del manifest["files"][rel]
    resign(older, manifest)
    assert integrity_problems(older, manifest) == []
    (older / "runner" / "places.py").write_text("")   # a file the table does not list
    assert integrity_problems(older, manifest) == [
        "runner/places.py: not part of the runner (the manifest's file table does not list it); "
        "remove it"]
    (older / "runner" / "places.py").unlink()
    del manifest["files"]["runner/cli.py"]
    (older / "runner" / "cli.py").unlink()
    resign(older, manifest)
    assert "manifest: runner/cli.py is not in its file table" in integrity_problems(older, manifest)


def test_commands_other_than_serve_do_not_load_the_http_server(built):
    """run.py's argument defaults read serve's limits from closing.py; http.server (about 25 ms
    of imports) and serve_http.py load only when `serve` listens, as before the serve split."""
    code = ("import runpy, sys\n"
            "sys.argv = ['run.py', 'check', '--json']\n"
            "try:\n    runpy.run_path('run.py', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('http.server', 'runner.serve_http', 'runner.cli')\n"
            "             if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-I", "-c", code], cwd=built.bundle.directory,
                       capture_output=True, text=True, timeout=300)
    # (runner.cli: the check really ran through the runner)
    assert r.stdout.strip().splitlines()[-1] == "['runner.cli']", r.stdout[-500:] + r.stderr[-500:]


def test_one_share_of_the_ceiling_for_bench_verify_and_compare():
    """Issue 36: "% of ceiling" is one definition. A part under the CPU provider is a share of
    the CPU provider's best rate of its kind; one under OpenVINO of the best under either
    (compare held CPU-provider rows to OpenVINO's rates too)."""
    from packager._runtimes.runner.roofline import ceiling_share
    from packager.compare_batch import _roofline_share

    cpu, ov = "CPUExecutionProvider", "OpenVINOExecutionProvider"
    graphs = [{"kind": "int8", "gops": 100.0, "provider": cpu},
              {"kind": "int8", "gops": 400.0, "provider": ov},
              {"kind": "fp32", "gops": 50.0, "provider": cpu}]
    assert ceiling_share(20.0, "int8", graphs) == 0.2
    assert ceiling_share(20.0, "int8", graphs, ov) == 0.05
    assert ceiling_share(10.0, "fp16", graphs) == 0.2       # FP16 runs in FP32 on a CPU
    assert ceiling_share(10.0, "int8", []) is None
    # compare's rows use the same function on the same graphs
    row = _roofline_share("ORT INT8 QDQ U8S8", 20e6, 1.0, {"graphs": graphs})
    assert row["gops"] == 20.0 and row["ceiling_share"] == ceiling_share(20.0, "int8", graphs)


@pytest.mark.parametrize("given, says", [
    ("", "names no extra"), (" , ", "names no extra"),
    ("none,infer", "none means no extras, and cannot be combined with one")])
def test_runner_extras_that_name_nothing_or_none_with_more_are_refused(cnn_onnx, tmp_path,
                                                                     given, says):
    """hostile-cases-turn5 #15, #16: --runner-extras '' built a runner with no extras, silently;
    'none,infer' was answered "none: not one of the runner's extras ... or none"."""
    from click.testing import CliRunner

    from packager.cli import main

    run = CliRunner().invoke(main, ["build", str(cnn_onnx), "--runner-extras", given,
                                    "-o", str(tmp_path / "x")])
    assert run.exit_code == 2 and says in run.output, run.output
    assert not (tmp_path / "x").exists()
