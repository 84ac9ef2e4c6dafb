"""The command line of run.py (the bundle's entry point): arguments, the command run, its report
printed, and every error turned into one line and an exit code.
"""

import argparse
import os
import sys

try:  # checked in run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .bench import cmd_bench
from .check import cmd_check
from .contents import RUNNER_EXTRAS, extra_module, optional_module, shipped
from .errors import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_BUG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    MAX_PIXELS,
    BundleError,
    ProviderMissing,
    one_line,
)
from .manifest import load_manifest
from .report import print_human, to_json
from .sessions import OPT_LEVELS, SESSION_OVERRIDES, TUNE_MARGIN, TUNED


def parse_args(argv):
    """run.py's command line: its command and options, each checked (exit 2 on a bad one)."""
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle",   # runner/.. : the folder holding run.py
                        default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="bundle directory (default: the one holding run.py)")
    sub = parser.add_subparsers(dest="command")
    absent = _absent_extras() if not argv or {"-h", "--help"} & set(argv) else {}
    for name, text in (("check", "verify file hashes and accuracy against the golden outputs"),
                       ("bench", "measure latency, throughput and peak memory"),
                       ("infer", "run the model on image / .npy / .npz files"),
                       ("serve", "serve the model over HTTP (POST /infer, GET /health, "
                                 "GET /metadata)")):
        text += absent.get(name, "")
        p = sub.add_parser(name, help=text, description=text)
        _common_options(p, name)
        if name == "bench":
            _bench_options(p, absent)
            p.add_argument("files", nargs="*", metavar="FILE",
                           help="also time photo to answer by stage on these images (or "
                                ".npy/.npz): decode, preprocess, model, post-processing")
            _max_megapixels(p)
        if name == "infer":
            p.add_argument("files", nargs="+", help="image, .npy or .npz files")
            p.add_argument("--out", default=None, help="also write all outputs to this .npz")
        if name in ("infer", "serve"):
            _answer_options(p, name)
        if name == "serve":
            _serve_options(p)
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "unshipped", False):
        parser.error("unrecognized arguments: %s" % " ".join(rest))
    if args.command is None:
        parser.print_help()
        raise SystemExit(EXIT_BAD_INPUT)
    problem = _args_problem(args)
    if problem:
        parser.error(problem)
    return args


def _absent_extras():
    """{extra: ' (not in this bundle ...)'} for the extras this bundle was built without, so
    that --help does not offer them as available (none said where the manifest is unreadable)."""
    try:
        manifest = load_manifest(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    except BundleError:
        return {}
    return dict((e, " (not in this bundle: built without `%s`, edgepack build --runner-extras)"
                 % e) for e, files in RUNNER_EXTRAS.items()
                if not all(shipped(manifest, f) for f in files))


def _serve_options(p):
    """serve's own options (serve.py's, which loads no HTTP code); a bundle built without serve
    takes any (run_command then says how to build it with serve)."""
    try:   # not before run.py has checked runner/ against the manifest's file table
        if not getattr(sys.modules.get(__package__), "LISTED", True):
            raise BundleError("runner/ unchecked")
        optional_module("serve").add_options(p)
    except BundleError:
        p.set_defaults(unshipped=True)


def _common_options(p, name):
    if name != "serve":
        p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--require-provider", default=None,
                   help="fail (exit 1) unless this execution provider runs")
    p.add_argument("--part", default=None,
                   help="only this model of a multi-model bundle (default: all)")
    g = p.add_argument_group("session options (default: the target's, from the manifest)")
    g.add_argument("--threads", type=int, default=None, help="intra-op threads (0 = ORT)")
    g.add_argument("--inter-threads", type=int, default=None, help="inter-op threads")
    g.add_argument("--opt-level", choices=sorted(OPT_LEVELS), default=None,
                   help="graph optimisation level")
    g.add_argument("--execution-mode", choices=("sequential", "parallel"), default=None)


def _bench_options(p, absent):
    p.add_argument("--runs", type=int, default=100, help="timed runs (default 100)")
    p.add_argument("--warmup", type=int, default=10, help="untimed runs first")
    p.add_argument("--roofline", action="store_true",
                   help="also time the bundle's roofline graphs (GEMMs and convs, FP32 "
                        "and integer) with the same threads, and report the model's "
                        "share of the best rate of its kind" + absent.get("roofline", ""))
    p.add_argument("--tune", action="store_true",
                   help="first try thread counts, optimisation levels and the parallel "
                        "execution mode on this device, keep the fastest (when %d%%%% "
                        "faster and check still passes) in %s, then bench with it; "
                        "--runs applies to each setting tried" % (100 * TUNE_MARGIN, TUNED)
                   + absent.get("tune", ""))
    p.add_argument("--no-save", action="store_true",
                   help="with --tune: report only, write nothing")
    p.add_argument("--profile", action="store_true",
                   help="also run onnxruntime's profiler and print each op type's "
                        "kernel time on this device (CPU provider)" + absent.get("profile", ""))
    p.add_argument("--io-binding", action="store_true",
                   help="also time runs with inputs and outputs bound on the provider's "
                        "device (no host copies per call), as an application would")


def _answer_options(p, name):
    p.add_argument("--top", type=int, default=5, help="classes shown per output")
    p.add_argument("--raw", action="store_true",
                   help="answer with the output tensors, not the part's task results "
                        "(labels, boxes, text...)%s" % (
                            "; one request can ask with ?raw=1" if name == "serve" else ""))
    _max_megapixels(p)


def _max_megapixels(p):
    p.add_argument("--max-megapixels", type=float, default=MAX_PIXELS / 1e6,
                   help="refuse images larger than this, measured from their header "
                        "before decoding (default %(default)g)")


def _args_problem(args):
    """What is wrong with the parsed *args* (argparse's error line), or ''."""
    if args.command == "bench":
        if args.runs < 1 or args.warmup < 0:
            return "--runs must be >= 1 and --warmup >= 0"
        if args.no_save and not args.tune:
            return "--no-save goes with --tune"
        if args.tune and any(getattr(args, attr) is not None for _, attr in SESSION_OVERRIDES):
            return ("--tune tries the session options itself; drop --threads, "
                    "--inter-threads, --opt-level and --execution-mode")
    if args.command in ("infer", "serve", "bench") and not 0 < args.max_megapixels <= 10000:
        return "--max-megapixels must be a number from 0 to 10000 (got %s)" % args.max_megapixels
    if args.command in ("infer", "serve"):
        if not 1 <= args.top <= 100000:
            return "--top must be from 1 to 100000, got %d" % args.top
    if args.command == "serve" and not getattr(args, "unshipped", False):
        return optional_module("serve").options_problem(args)
    return ""


def main(argv=None):
    """run.py's command line; a reader that leaves early (`run.py infer DIR | head -1`) ends it
    quietly with exit 141 (128 + SIGPIPE, as a shell reports it), as `edgepack` ends quietly."""
    try:
        try:
            return run_main(argv)
        finally:   # here, not at exit (where a failed flush is "Exception ignored", exit 120)
            sys.stdout.flush()
    except BrokenPipeError:
        # stdout (or stderr) lost its reader: nothing more can be said. Both go to /dev/null,
        # so that Python's own flush at exit does not fail on them again (a traceback, or
        # exit 120 for a broken stderr).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def run_main(argv):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not getattr(args, "json", False):
        return run_command(args)
    # --json: stdout carries the JSON object only. Whatever else prints there (onnxruntime's
    # fallback banner, a library's warning) goes to stderr.
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        return run_command(args, json_out=os.fdopen(os.dup(json_fd), "w"))
    finally:
        sys.stdout.flush()
        os.dup2(json_fd, 1)
        os.close(json_fd)


def stray_module(name):
    """Where a module onnxruntime needs (numpy, or *name*) was imported from, when that is
    outside this Python's own packages (a numpy.py in the current folder or on PYTHONPATH):
    one phrase naming it, else ''."""
    import sysconfig

    homes = set(os.path.realpath(p) for p in (sysconfig.get_paths().get("purelib"),
                                              sysconfig.get_paths().get("platlib"),
                                              sysconfig.get_paths().get("stdlib")) if p)
    for mod in ("numpy", name):
        module = sys.modules.get(mod) if mod else None
        path = getattr(module, "__file__", None)
        if not path:
            continue
        real = os.path.realpath(path)
        if any(real.startswith(home + os.sep) for home in homes) or \
                "site-packages" in real or "dist-packages" in real:
            continue
        hint = " (PYTHONPATH=%s)" % os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") \
            else ""
        return "the %s imported here is %s, outside this Python's packages%s" % (mod, path, hint)
    return ""


def check_dependencies(manifest):
    """numpy and onnxruntime importable here, else one line naming the manifest's install line
    (the import error alone names neither this Python nor the fix)."""
    install = (manifest.get("target") or {}).get("install") or \
        "python3 -m venv ~/ort && ~/ort/bin/pip install -r requirements.txt"
    missing = "numpy" if np is None else None
    if missing is None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            if exc.name != "onnxruntime":   # installed, but broken (a library it loads)
                stray = stray_module(exc.name)
                if stray:   # a numpy.py on PYTHONPATH: not a broken onnxruntime
                    raise BundleError("onnxruntime does not import (%s) because %s; remove it "
                                      "or run without it on the path" % (one_line(exc), stray)) \
                        from None
                raise BundleError("onnxruntime is installed for %s but does not import (%s); "
                                  "reinstall it on the device with: %s"
                                  % (sys.executable, one_line(exc), install)) from None
            missing = "onnxruntime"
    if missing:
        raise BundleError("%s is not installed for %s; install it on the device with: %s"
                          % (missing, sys.executable, install))


def cmd_infer(bundle, manifest, args):
    """infer.py's command, in a bundle that ships it (else one line saying how to get it)."""
    return extra_module("infer", manifest).cmd_infer(bundle, manifest, args)


def cmd_serve(bundle, manifest, args):
    """serve.py's command, in a bundle that ships it (else one line saying how to get it)."""
    return extra_module("serve", manifest).cmd_serve(bundle, manifest, args)


def load_tuned(bundle, manifest):
    """This device's tuned session options (tuned.py, shipped with tune), or None: none saved."""
    if not os.path.isfile(os.path.join(bundle, TUNED)):
        return None
    if not shipped(manifest, "runner/tuned.py"):
        raise BundleError("%s: this bundle was built without `tune`, which reads it; delete it"
                          % TUNED)
    return optional_module("tuned").load_tuned(bundle, manifest)


def run_command(args, json_out=None):
    commands = {"check": cmd_check, "bench": cmd_bench, "infer": cmd_infer, "serve": cmd_serve}
    try:
        manifest = load_manifest(args.bundle)
        check_dependencies(manifest)
        args.tuned = load_tuned(args.bundle, manifest)
        if getattr(args, "max_megapixels", None):
            # for formats whose header decode_image does not read (TIFF, ...): OpenCV's own
            # limit, which it reads once, when it first decodes
            os.environ["OPENCV_IO_MAX_IMAGE_PIXELS"] = str(int(args.max_megapixels * 1e6))
        report = commands[args.command](args.bundle, manifest, args)
        if args.command == "bench" and args.profile:
            report = extra_module("profile", manifest).cmd_profile(args.bundle, manifest, args,
                                                                   report)
    except KeyboardInterrupt:   # Ctrl-C; serve has closed its socket by now
        sys.stderr.write("interrupted%s\n" % (": the server is closed"
                                              if args.command == "serve" else ""))
        return EXIT_INTERRUPTED
    except BundleError as exc:
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_BAD_INPUT
    except ProviderMissing as exc:
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_FAILED
    except BrokenPipeError:   # stdout or stderr lost its reader: main ends quietly
        raise
    except OSError as exc:  # e.g. serve's port in use
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_BAD_INPUT
    except Exception as exc:  # a bug in run.py (or a bundle it does not know how to refuse)
        if os.environ.get("EDGEPACK_DEBUG"):
            raise
        sys.stderr.write("error: unexpected %s: %s; this is a bug in run.py: please report it "
                         "with the command line (EDGEPACK_DEBUG=1 shows the traceback)\n"
                         % (type(exc).__name__, one_line(exc)))
        return EXIT_BUG
    if report is None:  # serve: stopped with Ctrl-C
        return EXIT_OK
    if json_out is not None:
        with json_out:
            json_out.write(to_json(report, indent=2, sort_keys=True) + "\n")
    else:
        print_human(args.command, report)
    return EXIT_OK if report.get("passed", True) else EXIT_FAILED
