#!/usr/bin/env python3
"""Run an edgepack bundle with ONNX Runtime: check, bench, infer, serve.

The bundle's entry point: the runner is the package in runner/ beside it, every file of it
hashed in manifest.json. Python 3.8+, the standard library, numpy and onnxruntime only (OpenCV
only for image inputs). It never installs anything.

    python3 run.py check                 # integrity, the host's outputs reproduced, FP32 budget
    python3 run.py bench --runs 200 --json | infer photo.jpg --json | serve --port 8080

Exit codes: 0 passed, 1 a check failed (integrity, accuracy, provider), 2 bad input or a broken
bundle, 3 a bug (please report it), 130 interrupted, 141 stdout's reader left (`| head`).
"""

import sys

sys.dont_write_bytecode = True   # no __pycache__ written into the bundle
# a script's folder is first on sys.path (not under -I): set aside before any import could
# search it (-S on 3.8: os is not loaded yet), nothing planted beside run.py is ever imported
FIRST = sys.path[:1]
del sys.path[:1]
import importlib.util  # noqa: E402
import os  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = FIRST   # back only if it is not this folder (-I: the standard library's zip)
sys.path[:] = [p for p in sys.path
               if os.path.realpath(p or os.curdir) != os.path.realpath(HERE)]

RUNNER = "runner"
# runner/ holds these only (a .so, .pyc or other .py could be imported in place of one)
CORE_MODULES = ("__init__.py", "bench.py", "check.py", "cli.py", "contents.py", "errors.py",
                "facts.py", "load.py", "manifest.py", "metrics.py", "places.py", "report.py",
                "sessions.py")
OPTIONAL_MODULES = ("cascade.py", "cascade_face.py", "cascade_judge.py", "cascade_ocr.py",
                    "cascade_spec.py", "cascade_tts.py", "closing.py", "gpu_facts.py",
                    "images.py", "infer.py", "inputs.py", "profile.py", "roofline.py", "serve.py",
                    "serve_body.py", "serve_http.py", "stages.py", "task_classify.py",
                    "task_ctc.py", "task_detect.py", "task_embed.py", "task_figures.py",
                    "task_multilabel.py", "task_segment.py", "task_spec.py", "task_tts.py",
                    "task_vad.py", "tasks.py", "tensorrt.py", "tuned.py", "tuning.py")
RUNNER_MODULES = CORE_MODULES + OPTIONAL_MODULES
EXIT_FAILED, EXIT_BAD_INPUT = 1, 2   # runner/errors.py's, which is not loaded before this check


def command_line():
    """(command, --json given) from sys.argv, read without the runner's parser."""
    args, command = sys.argv[1:], None
    for i, arg in enumerate(args):
        if not arg.startswith("-") and (i == 0 or args[i - 1] != "--bundle"):
            command = arg
            break
    return command, "--json" in args


def refuse(message):
    """A runner/ that fails its check: `check` fails it as an integrity problem (exit 1, and
    its report with --json), the other commands refuse the bundle (exit 2)."""
    line = "%s/%s" % (RUNNER, message)
    sys.stderr.write("error: %s\n" % line)
    command, as_json = command_line()
    if command == "check" and as_json:   # the folder beside run.py is off sys.path: stdlib json
        sys.stdout.write(__import__("json").dumps({"integrity": [line], "parts": {},
                                                   "passed": False}) + "\n")
    return EXIT_FAILED if command == "check" else EXIT_BAD_INPUT


def main():
    """Check that runner/ holds the runner's modules (those the manifest lists) and nothing
    else, load it from there by path (never from sys.path) and run its command line."""
    folder = os.path.join(HERE, RUNNER)
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        return refuse(": cannot read it (%s); copy the bundle again" % exc.strerror)
    try:   # the runner files the manifest lists (unreadable: cli.py loads no optional module)
        with open(os.path.join(HERE, "manifest.json"), "rb") as f:
            table = set(k for k in __import__("json").loads(f.read().decode("utf-8"))["files"]
                        if k.startswith(RUNNER + "/"))
    except Exception:
        table = None
    for name in names:   # an optional module the table does not list would run unchecked
        unlisted = table and name not in CORE_MODULES and RUNNER + "/" + name not in table
        if name not in RUNNER_MODULES or unlisted:
            return refuse("%s: not part of the runner%s; remove it (or copy the bundle again)" % (
                name, " (the manifest's file table does not list it)" if unlisted else ""))
    for name in CORE_MODULES:
        if not os.path.isfile(os.path.join(folder, name)):
            return refuse("%s: missing; copy the bundle again" % name)
    spec = importlib.util.spec_from_file_location(
        RUNNER, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])
    package = importlib.util.module_from_spec(spec)
    package.LISTED = table is not None   # else the parser imports no optional module (cli.py)
    sys.modules[RUNNER] = package
    spec.loader.exec_module(package)
    return importlib.import_module(RUNNER + ".cli").main()


if __name__ == "__main__":
    sys.exit(main())
