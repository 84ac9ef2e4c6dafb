"""Errors the packager raises; the CLI turns each into one line and a non-zero exit."""

from typing import Any


class PackagerError(Exception):
    """A problem the user can fix: what went wrong, and the fix."""

    exit_code = 2

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


class ModelError(PackagerError):
    """The model file is missing, corrupt or not ONNX."""


class SpecError(PackagerError):
    """A --input / --dynamic / --part / --factory-arg value is malformed."""


class ExportError(PackagerError):
    """A PyTorch model cannot be loaded, exported, or its export disagrees with PyTorch."""


class ExportInvalid(ExportError):
    """The export ran, but its outputs hold NaN or infinity: validation failed (as a build that
    misses its accuracy budget), not malformed input."""

    exit_code = 1


class ShapeError(PackagerError):
    """Shapes cannot be made static."""


class CalibrationError(PackagerError):
    """Calibration data is missing, unreadable or does not fit the model."""


class PreprocessError(PackagerError):
    """A preprocessing spec is malformed or does not fit the model input."""


class QuantizationError(PackagerError):
    """The quantizer failed or produced a model that does not run."""


class TargetError(PackagerError):
    """A target profile is unknown or invalid."""


class BundleError(PackagerError):
    """A bundle cannot be written or read."""


class VerifyError(PackagerError):
    """The bundle could not be verified (broken bundle, runner crashed)."""


class CheckFailed(PackagerError):
    """Verification ran and a check failed: accuracy, integrity or a latency budget."""

    exit_code = 1


class PreprocessSuspect(PackagerError):
    """The FP32 model itself scores about chance on the user's labelled images: the
    preprocessing (colour order, mean/std, scale, layout) is most likely wrong."""

    exit_code = 1


class BudgetMissed(PackagerError):
    """A forced precision cannot keep the accuracy budget: the bundle would break its promise."""

    exit_code = 1


# --------------------------------------------------------------------------- Ctrl-C

_interrupted = 0   # the signal (SIGINT, SIGTERM) that ended the command, once one did


def exit_on_early_interrupt() -> None:
    """When this process is the edgepack program, make a Ctrl-C that lands while it is still
    importing its libraries exit 130 with one line: nothing has been written yet, and an
    interrupt inside a C extension's import would otherwise show a traceback or a bogus
    ImportError. The CLI replaces this handler once a command runs (catch_interrupts)."""
    import os
    import signal
    import sys

    program = os.path.basename(sys.argv[0]) if sys.argv else ""
    orig = list(getattr(sys, "orig_argv", []))
    module = orig[orig.index("-m") + 1] if "-m" in orig[:-1] else ""
    if program != "edgepack" and not (sys.argv[:1] == ["-m"] and
                                      module.split(".")[0] == "packager"):
        return   # a library user's process: their signal handling is theirs
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def quit_now(signum: int, frame: object) -> None:
        ended = signum in _ENDING   # SIGTERM, SIGHUP: as the command's handler ends them
        os.write(2, b"terminated: nothing was written\n" if ended else
                 b"interrupted: nothing was written\n")
        os._exit(128 + signum if ended else 130)

    signal.signal(signal.SIGINT, quit_now)
    for signum in _ENDING:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, quit_now)


_ENDING = tuple(getattr(__import__("signal"), name) for name in ("SIGTERM", "SIGHUP")
                if hasattr(__import__("signal"), name))   # signals that end a command as a kill


class Terminated(KeyboardInterrupt):
    """SIGTERM during a command: it ends as a Ctrl-C does (every cleanup a Ctrl-C runs runs,
    locks and half-written outputs go), with exit code 143 (128 + SIGTERM)."""


def catch_interrupts() -> object:
    """Install the command-time SIGINT and SIGTERM handler and return the handlers it replaced.
    It raises KeyboardInterrupt (Terminated for SIGTERM; and remembers it: a C extension may
    turn it into another exception), except while a module is being imported: an exception
    thrown into a C extension's import can abort the process (torch's pybind11 code calls
    std::terminate), so there the signal is re-sent every 50 ms until the import is done."""
    import _thread
    import signal
    import threading
    import time

    global _interrupted
    _interrupted = 0   # the signal that ended the command (0: none yet)

    def resend(signum: int) -> None:
        time.sleep(0.05)
        if signal.getsignal(signum) is interrupted:   # still this command's
            _thread.interrupt_main(signum)

    def interrupted(signum: int, frame: Any) -> None:
        global _interrupted
        _interrupted = signum
        if _importing(frame):
            threading.Thread(target=resend, args=(signum,), daemon=True).start()
            return
        raise Terminated if signum in _ENDING else KeyboardInterrupt

    previous = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM),
                signal.getsignal(signal.SIGHUP) if hasattr(signal, "SIGHUP") else None)
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    if hasattr(signal, "SIGHUP"):   # a closed terminal ends it as SIGTERM does (no lock left)
        signal.signal(signal.SIGHUP, interrupted)
    return previous


def _importing(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def restore_interrupts(previous: object) -> None:
    import signal

    before_int, before_term, before_hup = (tuple(previous) + (None, None))[:3] \
        if isinstance(previous, tuple) else (previous, None, None)
    early = getattr(before_int, "__name__", "") == "quit_now"   # output may exist by now
    signal.signal(signal.SIGINT, signal.default_int_handler if early or before_int is None
                  else before_int)
    for signum, before in ((signal.SIGTERM, before_term),
                           (getattr(signal, "SIGHUP", None), before_hup)):
        if signum is not None:   # the early handler says "nothing was written": not now
            signal.signal(signum, signal.SIG_DFL if before is None or
                          getattr(before, "__name__", "") == "quit_now" else before)


def terminated() -> bool:
    """Whether the command was ended by SIGTERM (not by Ctrl-C)."""
    import signal

    return _interrupted in (signal.SIGTERM, getattr(signal, "SIGHUP", signal.SIGTERM))


def ending_signal() -> int:
    """The signal that ended the command (0: none)."""
    return _interrupted


def was_interrupted(exc: BaseException) -> bool:
    """True when *exc* is, or came from, a Ctrl-C (pybind11 modules turn a KeyboardInterrupt
    during their import into "ImportError: initialization failed")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return bool(_interrupted)
