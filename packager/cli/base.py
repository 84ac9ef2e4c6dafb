"""The `edgepack` group and what its commands share: one-line errors, common options, output."""

import json
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import (
    PackagerError,
    SpecError,
    catch_interrupts,
    ending_signal,
    restore_interrupts,
    terminated,
    was_interrupted,
)
from ..textfile import read_text

INPUT_HELP = "static input shape NAME:1x3x224x224[:dtype] (repeatable)"
QUANT_OPTIONS = ("precision", "mode", "format", "activation_type", "weight_type", "per_channel",
                 "reduce_range", "calibration_method", "exclude")


class Command(click.Command):
    """Notes --json in the context's meta (shared with the group) for error reporting, and
    holds the -o lock for the whole command: a second run to the same output fails at once."""

    def invoke(self, ctx: click.Context) -> Any:
        from ..atomic import output_lock

        ctx.meta["edgepack.json"] = bool(ctx.params.get("as_json"))
        output = ctx.params.get("output")
        if not isinstance(output, Path):
            return super().invoke(ctx)
        before = _stamp(output)
        with output_lock(output):
            try:
                return super().invoke(ctx)
            except KeyboardInterrupt:
                if _stamp(output) != before:   # published just before the Ctrl-C landed
                    ctx.meta["edgepack.written"] = str(output)
                raise


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns


def fail(ctx: click.Context, message: str, hint: str, code: int) -> None:
    """One `error:` line on stderr (and, under --json, the same as JSON on stdout); exit."""
    click.echo(f"error: {message}; {hint}" if hint else f"error: {message}", err=True)
    if ctx.meta.get("edgepack.json"):
        click.echo(json.dumps({"error": message, "hint": hint, "exit_code": code}))
    ctx.exit(code)


class Group(click.Group):
    """Turns library errors and Ctrl-C into one line and an exit code, in one place."""

    command_class = Command

    def invoke(self, ctx: click.Context) -> Any:
        debug = ctx.params.get("debug", False)
        previous = _catch_interrupts()
        try:
            return super().invoke(ctx)
        except PackagerError as exc:
            if debug:
                raise
            fail(ctx, exc.message, exc.hint, exc.exit_code)
        except KeyboardInterrupt:
            _interrupted(ctx, terminated())
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # a bug, not bad input: one line unless --debug
            if was_interrupted(exc):   # e.g. ImportError("initialization failed") from Ctrl-C
                _interrupted(ctx, terminated())
            if debug:
                raise
            text = " ".join(str(exc).split())[:300]
            fail(ctx, f"unexpected {type(exc).__name__}: {text}",
                 "this is a bug in edgepack: please report it with the command line "
                 "(rerun with --debug for the traceback)", 3)
        finally:
            if previous is not None and _is_program():
                _outcome_decided()   # (a signal past here would only hide the exit code)
            elif previous is not None:
                restore_interrupts(previous)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        except SystemExit as exc:
            if _is_program():
                _outcome_decided()
                _exit_past_user_threads(exc.code)
            raise


def _outcome_decided() -> None:
    """The command's outcome is decided and printed: a Ctrl-C or a SIGTERM while the program
    exits or Python tears down its modules must not turn it into a death by the signal (a
    SIGTERM just after a build's last line ended it -15 with the bundle whole)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP"):   # a closed terminal just after the last line: the same
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _is_program() -> bool:
    """True when this process is the edgepack program (not a library user or a test runner)."""
    import os

    program = sys.argv[0] if sys.argv else ""
    return os.path.basename(program) == "edgepack" or \
        program.endswith(os.path.join("packager", "__main__.py"))


def _catch_interrupts() -> object:
    try:
        return catch_interrupts()
    except ValueError:   # not the main thread (an embedding app): leave signals alone
        return None


def _interrupted(ctx: click.Context, terminated: bool = False) -> None:
    """Ctrl-C (exit 130), SIGTERM (143) or SIGHUP (129): one line saying what was left behind."""
    written = ctx.meta.get("edgepack.written")
    note = ("a cut-off copy resumes on the next deploy" if ctx.invoked_subcommand == "deploy"
            else f"{written} was already written in full" if written else
            "nothing was written")
    click.echo(f"{'terminated' if terminated else 'interrupted'}: {note}", err=True)
    ctx.exit(128 + (ending_signal() or 15) if terminated else 130)


def _exit_past_user_threads(code: Any) -> None:
    """End the edgepack program now when threads a factory started would keep it alive after
    its work is done (Python waits for non-daemon threads); the edgepack program only."""
    import os
    import threading

    left = [t for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not left:
        return
    status = code if isinstance(code, int) else (0 if code is None else 1)
    if status in (129, 130, 143):   # interrupted: its line is said; a quantizer's pool (NNCF's) was
        sys.stdout.flush()   # cut off mid-work, which is no news to the user
        sys.stderr.flush()
        os._exit(status)
    try:
        click.echo(f"note: not waiting for {len(left)} thread(s) the model's code left running "
                   f"({', '.join(t.name for t in left[:3])})", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def parse_shapes(values: tuple[str, ...]) -> dict[str, list[int]]:
    from ..source.specs import parse_input, shapes_of

    return shapes_of([parse_input(v) for v in values])


def emit(data: Any, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str) if as_json else text)


def log(message: str) -> None:
    from ..progress import echo

    echo(message)   # clears a status line first (progress.py) and draws it again after


def step_line(label: str, as_json: bool):
    """A status line for a long multi-step job: on a terminal only, and never under --json."""
    from ..progress import Progress

    return None if as_json else Progress(label, stream=sys.stderr)


def progress_bar(label: str):
    """A callback drawing a progress bar on stderr (only on a terminal)."""
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if not sys.stderr.isatty():
            return
        if "bar" not in state or done == 1:
            if "bar" in state:
                state["bar"].render_finish()
            from ..progress import clear

            clear()   # a step_line status line; its next step draws it again
            state["bar"] = click.progressbar(length=total, label=label, file=sys.stderr)
        state["bar"].update(1)
        if done == total:
            state["bar"].render_finish()

    return update


def quant_options(func):
    """Options that override the target's quantization preset."""
    opts = [
        click.option("--precision", type=click.Choice(["int8", "fp16", "fp32", "auto"]),
                     default=None, help="force one precision (build's default, auto: the "
                     "fastest candidate that keeps the accuracy budget; forced INT8 that "
                     "misses it is an error)"),
        click.option("--mode", type=click.Choice(["static", "dynamic"]), default=None,
                     help="INT8 static (calibrated) or dynamic"),
        click.option("--format", "format_", type=click.Choice(["qdq", "qoperator"]), default=None,
                     help="QDQ (default) or QOperator graph"),
        click.option("--activation-type", type=click.Choice(["uint8", "int8"]), default=None),
        click.option("--weight-type", type=click.Choice(["uint8", "int8"]), default=None),
        click.option("--per-channel/--per-tensor", default=None, help="weight scales"),
        click.option("--reduce-range/--no-reduce-range", default=None,
                     help="7-bit weights (AVX2-only CPUs)"),
        click.option("--method", type=click.Choice(["minmax", "entropy", "percentile", "auto"]),
                     default=None, help="calibration method (auto: try all three, keep the "
                     "best within the budget)"),
        click.option("--exclude", multiple=True, help="node name to keep in FP32 (repeatable)"),
        click.option("--search-seconds", type=float, default=None, metavar="SECONDS",
                     help="how long the INT8 search looks for a variant within budget (default "
                     "18: no stage starts later, no bisection probe after 1.25x it; NNCF's "
                     "candidates then get 1.5x it of their own)"),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def budget_options(func):
    """The accuracy budget: what quantization may cost."""
    opts = [
        click.option("--min-cosine", type=float, default=None,
                     help="every held-out output's cosine to FP32 (default: the target's)"),
        click.option("--max-accuracy-drop", default=None, metavar="PERCENT",
                     help="e.g. 1%: accuracy may fall this much (top-1 agreement with FP32, "
                          "or --metric)"),
        click.option("--metric", default=None, metavar="FILE.py:FUNCTION",
                     help="your accuracy: FUNCTION(outputs, labels) -> float, higher is better"),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def budget_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    from ..quantization.budget import check_min_cosine, load_metric, parse_drop

    drop, metric, cosine = kw.pop("max_accuracy_drop"), kw.pop("metric"), kw.pop("min_cosine")
    return {"min_cosine": check_min_cosine(cosine) if cosine is not None else None,
            "max_accuracy_drop": parse_drop(drop) if drop is not None else None,
            "metric": load_metric(metric) if metric else None}


def quant_overrides(kw: dict[str, Any]) -> dict[str, Any]:
    values = {"precision": kw.pop("precision"), "mode": kw.pop("mode"),
              "format": kw.pop("format_"), "activation_type": kw.pop("activation_type"),
              "weight_type": kw.pop("weight_type"), "per_channel": kw.pop("per_channel"),
              "reduce_range": kw.pop("reduce_range"), "calibration_method": kw.pop("method"),
              "exclude": tuple(kw.pop("exclude")) or None,
              "search_seconds": kw.pop("search_seconds")}
    if values["search_seconds"] is not None and not values["search_seconds"] > 0:   # (NaN too)
        from ..errors import PackagerError

        raise PackagerError(f"--search-seconds: {values['search_seconds']:g} is not a number of "
                            "seconds above 0", "for example --search-seconds 60")
    return {k: v for k, v in values.items() if v is not None}


def preprocess_option(value: str | None) -> dict[str, Any] | None:
    from ..quantization.preprocessing import parse_preprocess

    return parse_preprocess(value) if value else None


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="show tracebacks")
@click.version_option(package_name="edgepack")
def main(debug: bool) -> None:
    """Package ONNX models into verified bundles for edge devices."""


def export_options(func=None, *, dynamic: bool = True):
    """Options shared by export and build for PyTorch sources (build has no --dynamic)."""
    if func is None:
        return lambda f: export_options(f, dynamic=dynamic)
    opts = [
        click.option("--weights", type=click.Path(path_type=Path),
                     help=".safetensors, or .pt/.pth state dict (loaded weights_only)"),
        click.option("--factory-arg", "factory_args", multiple=True, metavar="KEY=VALUE",
                     help="keyword argument for the factory (repeatable; Python literals)"),
        click.option("--submodule", help="export only this attribute path, e.g. decoder.g_net"),
        click.option("--opset", type=int, default=None,
                     help="ONNX opset (default: the newest the target's oldest onnxruntime reads)"),
        click.option("--output-name", "output_names", multiple=True,
                     help="name of each output, in order (repeatable)"),
        click.option("--tolerance", type=float, default=None,
                     help="max error vs PyTorch, relative to the output's largest magnitude "
                          "(default 1e-3)"),
    ]
    if dynamic:
        opts.append(click.option("--dynamic", "dynamic", multiple=True,
                                 metavar="NAME:AXIS=label,...",
                                 help="keep these axes dynamic (bundles are always static)"))
    for opt in reversed(opts):
        func = opt(func)
    return func


def export_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    from ..source.export import DEFAULT_TOLERANCE
    from ..source.specs import parse_assignments, parse_dynamic
    from ..source.torchload import parse_factory_args

    tolerance = kw.pop("tolerance")
    return {"weights": kw.pop("weights"), "dynamic": parse_dynamic(kw.pop("dynamic", ())),
            "factory_args": parse_factory_args(parse_assignments(kw.pop("factory_args"),
                                                                 "--factory-arg")),
            "submodule": kw.pop("submodule"),
            "opset": kw.pop("opset"), "output_names": list(kw.pop("output_names")),
            "tolerance": DEFAULT_TOLERANCE if tolerance is None else tolerance}


MAX_LABELS_BYTES = 16 << 20   # ImageNet-21k's names are 0.3 MB


def read_labels(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    text = read_text(path, cap=MAX_LABELS_BYTES, where="--labels",
                     fix="give a text file with one class name per line")
    labels = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not labels:
        raise SpecError(f"--labels {path}: no class names in the file",
                        "one class name per line")
    return labels


if __name__ == "__main__":
    main()
