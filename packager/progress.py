"""Progress of the long multi-step jobs (compare, the precision search, make bench) on one line.

On a terminal, `compare: batch 8 (2/2) timing: step 14/45 (round 2/5, FP16) · about 0:40 left`
is redrawn in place and cleared when the phase ends. Off a terminal it writes nothing (CI logs keep
their log lines only); the CLI passes no reporter at all under --json. The time left is the
elapsed time per completed unit of work times the units left, where a step's units are its
weight (a timing block of a slow contender weighs more than one of a fast one).
"""

import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

import click

Log = Callable[[str], None]   # every stage's log: one line at a time


def clock_text(seconds: float) -> str:
    """M:SS, or H:MM:SS from an hour on."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """One status line for a job made of phases, each a sequence of steps.

    `start(phase, steps)` opens a phase of *steps* steps (a count, or one weight per step:
    relative cost); `step(what)` says the next step begins (the one before is done); `finish()`
    clears the line. Disabled (every call a no-op) unless *stream* is a terminal.
    """

    def __init__(self, label: str, *, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, width: int | None = None,
                 enabled: bool | None = None):
        self.label, self.clock, self.width = label, clock, width
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.phase = ""
        self.weights: list[float] | None = None
        self.index = 0          # the step now running, from 1; 0 before the first
        self.what = ""
        self.started = 0.0
        self.shown = 0          # characters of the line on screen

    def start(self, phase: str, steps: int | Sequence[float] | None, *, done: int = 0,
              since: float | None = None) -> None:
        """Begin *phase*: *steps* steps of equal cost, one weight per step, or None (unknown).

        *done* and *since* (a time of this reporter's clock) resume a phase left for another.
        """
        if not self.enabled:
            return
        self.phase = phase
        self.weights = ([1.0] * steps if isinstance(steps, int) else
                        None if steps is None else [max(float(w), 0.0) for w in steps])
        self.index, self.started = done, self.clock() if since is None else since

    def step(self, what: str = "") -> None:
        """The next step of the phase begins; redraw the line."""
        if not self.enabled:
            return
        self.index += 1
        self.what = what
        self._draw(self.text())

    def left(self) -> float | None:
        """Seconds left in the phase, from the time per unit of the steps done (None: unknown)."""
        if self.weights is None or self.index < 2:
            return None
        done = sum(self.weights[:self.index - 1])
        if done <= 0:
            return None
        return (self.clock() - self.started) / done * sum(self.weights[self.index - 1:])

    def text(self) -> str:
        count = "" if self.weights is None else f"/{len(self.weights)}"
        head = f"{self.label}: {self.phase}: " if self.phase else f"{self.label}: "
        line = f"{head}step {self.index}{count}" + (f" ({self.what})" if self.what else "")
        left = self.left()
        if left is not None:
            line += f" · about {clock_text(left)} left"
        elif self.weights is None:
            line += f" · {clock_text(self.clock() - self.started)} so far"
        return line

    def finish(self) -> None:
        """Clear the line (the phase is over, or the job); the next step draws it again."""
        global _drawn
        if self.enabled and self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.stream.flush()
            self.shown = 0
        if _drawn is self:
            _drawn = None

    def _draw(self, line: str) -> None:
        global _drawn
        if _drawn is not None and _drawn is not self:
            _drawn.finish()
        width = self.width or shutil.get_terminal_size((80, 24)).columns
        line = line[:max(width - 1, 10)]   # a wrapped line cannot be redrawn with \r
        self.stream.write("\r" + line.ljust(self.shown))   # pad over a longer line before
        self.stream.flush()
        self.shown, _drawn = len(line), self


_drawn: Progress | None = None   # the status line on screen, if any (one terminal, one line)
OFF = Progress("", enabled=False)   # what the library uses when given no reporter


def clear() -> Progress | None:
    """Take the status line off the screen (before other output); returns whose it was."""
    drawn = _drawn
    if drawn is not None:
        drawn.finish()
    return drawn


def echo(message: str, *, err: bool = True) -> None:
    """click.echo that does not tear the status line: clear it, write, draw it again."""
    drawn = clear()
    click.echo(message, err=err)
    if drawn is not None:
        drawn._draw(drawn.text())
