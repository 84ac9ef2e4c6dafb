"""The status line of long jobs: time left from weighted steps, drawn in place, cleared after."""

import io
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from packager import progress
from packager.progress import Progress, clock_text


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def screen(text: str) -> list[str]:
    """The lines a terminal shows for *text* (\\r returns to column 0 and overwrites)."""
    lines: list[str] = []
    line: list[str] = []
    col = 0
    for ch in text:
        if ch == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        elif ch == "\r":
            col = 0
        else:
            line[col:col + 1] = [ch]
            col += 1
    return lines + ["".join(line).rstrip()]


def test_clock_text():
    assert [clock_text(s) for s in (0, 9.4, 59.6, 61, 600, 3725)] == \
        ["0:00", "0:09", "1:00", "1:01", "10:00", "1:02:05"]


def test_time_left_weighs_the_steps_done_and_left():
    clock, tty = Clock(), FakeTTY()
    steps = Progress("compare", stream=tty, clock=clock, width=200)
    steps.start("timing", [1, 3, 1, 3])   # rounds x (fast contender, one 3x slower)
    steps.step("round 1/2, ORT FP32")
    assert steps.text() == "compare: timing: step 1/4 (round 1/2, ORT FP32)"   # nothing done
    clock.now += 2   # the fast block took 2 s: 2 s per unit, 3 + 1 + 3 units left
    steps.step("round 1/2, PyTorch eager")
    assert steps.left() == pytest.approx(14.0)   # an unweighted guess would say 6 s
    assert steps.text() == ("compare: timing: step 2/4 (round 1/2, PyTorch eager) · "
                            "about 0:14 left")
    clock.now += 10   # the slow block ran slower than guessed: 12 s for 4 units
    steps.step("round 2/2, ORT FP32")
    assert steps.text().endswith("step 3/4 (round 2/2, ORT FP32) · about 0:12 left")
    clock.now += 100
    steps.start("cold start", 2)   # a new phase starts its own estimate
    steps.step("ORT FP32")
    assert steps.text() == "compare: cold start: step 1/2 (ORT FP32)"
    clock.now += 75
    steps.step("INT8 dynamic")
    assert steps.text().endswith("step 2/2 (INT8 dynamic) · about 1:15 left")


def test_unknown_count_shows_the_time_so_far():
    clock = Clock()
    steps = Progress("quantize", stream=FakeTTY(), clock=clock, width=200)
    steps.start("search", None)
    steps.step("INT8 preset")
    clock.now += 65
    steps.step("INT8 heavy ops only")
    assert steps.text() == "quantize: search: step 2 (INT8 heavy ops only) · 1:05 so far"
    steps.start("search", None, done=2, since=clock.now - 70)   # resumed after timing
    steps.step("INT8 entropy calibration")
    assert steps.text() == "quantize: search: step 3 (INT8 entropy calibration) · 1:10 so far"


def test_the_line_is_redrawn_in_place_and_cleared_at_the_end():
    tty = FakeTTY()
    steps = Progress("compare", stream=tty, clock=Clock(), width=200)
    steps.start("batch 1 (1/1) build", 3)
    steps.step("INT8 QDQ U8S8 with a long name")
    steps.step("FP16")
    assert "\n" not in tty.getvalue() and tty.getvalue().count("\r") >= 2
    assert screen(tty.getvalue()) == ["compare: batch 1 (1/1) build: step 2/3 (FP16) · "
                                      "about 0:00 left"]   # no residue of the longer line
    steps.finish()
    assert screen(tty.getvalue()) == [""]
    assert progress._drawn is None


def test_long_lines_are_cut_to_the_terminal_width():
    tty = FakeTTY()
    steps = Progress("bench 3/3 MiniLM-L6-class sentence encoder", stream=tty, width=40)
    steps.start("batch 8 (2/2) timing", 45)
    steps.step("round 5/5, INT8 QDQ S8S8")
    assert len(screen(tty.getvalue())[0]) == 39   # a wrapped line could not be redrawn
    steps.finish()


def test_log_lines_clear_the_status_line_and_it_comes_back(monkeypatch):
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    steps = Progress("quantize", stream=sys.stderr, clock=Clock(), width=200)
    steps.start("search", None)
    steps.step("INT8 preset")
    progress.echo("search: INT8 preset: cosine 0.9991")
    assert screen(tty.getvalue()) == ["search: INT8 preset: cosine 0.9991",
                                      "quantize: search: step 1 (INT8 preset) · 0:00 so far"]
    steps.finish()
    progress.echo("decision: FP32")
    assert screen(tty.getvalue())[-2:] == ["decision: FP32", ""]


def test_off_a_terminal_nothing_is_written():
    log = io.StringIO()
    steps = Progress("compare", stream=log)
    steps.start("timing", 4)
    for what in "abcd":
        steps.step(what)
    steps.finish()
    assert log.getvalue() == "" and progress._drawn is None


def run_with_tty_stderr(args: list[str], out: Path) -> tuple[str, str]:
    """Run *args* with stderr on a pseudo-terminal, as in a shell; (stdout, what stderr drew)."""
    master, slave = pty.openpty()
    with out.open("wb") as stdout:
        proc = subprocess.Popen(args, stdout=stdout, stderr=slave, stdin=subprocess.DEVNULL,
                                env={**os.environ, "COLUMNS": "300"})
    os.close(slave)
    drawn = b""
    try:
        while select.select([master], [], [], 300)[0]:
            chunk = os.read(master, 65536)
            if not chunk:
                break
            drawn += chunk
    except OSError:   # EIO: the child closed the terminal
        pass
    finally:
        os.close(master)
    assert proc.wait(timeout=60) == 0, drawn.decode()
    return out.read_text(), drawn.decode()


def test_cli_compare_draws_progress_on_a_terminal_and_none_under_json(cnn_onnx, tmp_path):
    import json

    cmd = [sys.executable, "-m", "packager", "compare", str(cnn_onnx), "--batch", "1",
           "--rounds", "2", "--block", "3", "--no-cold", "--variant", "ORT FP32"]
    logs = ["compare: batch 1", "compare: timing 1 rows and the MatMul ceiling, batch 1"]
    _, drawn = run_with_tty_stderr(cmd, tmp_path / "out.txt")
    assert "compare: batch 1 (1/1) build: step 1/3 (fix shapes)" in drawn
    # ORT FP32 and the two roofline MatMuls, two rounds each
    assert "compare: batch 1 (1/1) timing: step 6/6 (round 2/2, ORT FP32) · about" in drawn
    assert [line for line in screen(drawn) if line] == logs   # log lines whole, status cleared
    stdout, drawn = run_with_tty_stderr(cmd + ["--json"], tmp_path / "out.json")
    assert json.loads(stdout)["rows"][0]["variant"] == "ORT FP32"   # stdout: JSON only
    assert "step" not in drawn and "\r" not in drawn.replace("\r\n", "\n")
    assert [line for line in screen(drawn) if line] == logs


def test_a_clearly_slower_contender_gets_a_shorter_block_and_still_a_p50():
    import time

    from packager.timing import blocks, time_blocks

    # within 2x of the fastest: the whole block; 8x: a quarter of it; never under 3 calls
    assert blocks({"a": 1.0, "b": 1.9, "c": 8.0, "d": 100.0}, 20) == {"a": 20, "b": 20, "c": 5,
                                                                      "d": 3}
    times = time_blocks({"fast": lambda: time.sleep(0.001), "slow": lambda: time.sleep(0.012)},
                        rounds=2, block=12, warmup=2, switch_warmup=0)
    assert times["fast"]["calls"] == 2 * 12 and 3 * 2 <= times["slow"]["calls"] < 12 * 2
    assert times["slow"]["p50"] > 5 * times["fast"]["p50"]
    # with settle, a hopeless contender leaves after one round and the race ends; close ones stay
    from packager.timing import SETTLE, hopeless
    assert hopeless({"a": 1.0, "b": 3.0, "c": 1.5}, {"a": [1.0], "b": [2.5], "c": [2.5]}) == {"b"}
    assert not hopeless({"a": 1.0, "b": 3.0}, {"a": [1.0], "b": [1.9]})   # the round says close
    raced = time_blocks({"fast": lambda: time.sleep(0.001), "slow": lambda: time.sleep(0.012)},
                        rounds=5, block=12, warmup=2, switch_warmup=0, settle=SETTLE)
    assert raced["slow"]["rounds"] == raced["fast"]["rounds"] == 1


def test_timing_rounds_stop_once_the_order_is_clear_and_count_as_timing():
    import time

    from packager.timing import MIN_ROUNDS, SETTLE, Stages, apart, settled, time_blocks

    assert settled({"a": [1.0, 1.1], "b": [2.0, 2.2]}, SETTLE)          # apart
    assert settled({"a": [1.0, 1.01], "b": [1.005, 1.02]}, SETTLE)      # a tie within 3%
    assert not settled({"a": [1.0, 1.5], "b": [1.2, 1.3]}, SETTLE)      # overlapping, unsure
    # the two slower ones overlap, but which is fastest is known
    assert settled({"a": [1.0, 1.1], "b": [1.5, 1.9], "c": [1.6, 1.7]}, SETTLE)
    assert apart({"a": [1.0, 1.1], "b": [1.4, 2.0]})                    # 1.25x in every round
    assert not apart({"a": [1.0, 1.2], "b": [1.4, 2.0]})                # 1.2 x 1.25 > 1.4
    assert apart({"a": [1.0, 1.1], "b": [1.4, 2.0], "c": [1.5, 1.6]})   # the winner is known
    assert not apart({"a": [1.0, 1.1], "b": [1.3, 2.0], "c": [1.5, 1.6]})   # 1.1 x 1.25 > 1.3
    with Stages() as clock:
        # 3 ms against nothing: clear after one round; 3 against 3.03 ms: a tie after three
        clear = time_blocks({"sleep": lambda: time.sleep(0.003), "none": lambda: None},
                            rounds=8, block=3, warmup=1, switch_warmup=0, settle=SETTLE)
        clock.lap("search")
        tie = time_blocks({"a": lambda: time.sleep(0.003), "b": lambda: time.sleep(0.00303)},
                          rounds=8, block=3, warmup=1, switch_warmup=0, settle=SETTLE)
        full = time_blocks({"none": lambda: None}, rounds=4, block=2, warmup=0)
    # (more than 2x apart in warm-up and in the first round: the loser leaves after one)
    assert clear["sleep"]["rounds"] == 1 and clear["sleep"]["calls"] == 3
    assert MIN_ROUNDS <= tie["a"]["rounds"] <= 8     # a tie is never called after two rounds
    assert full["none"]["rounds"] == 4     # without settle, every round runs
    assert clock.seconds["timing"] >= 3 * 0.003 and "search" in clock.seconds
    clock.add("bundle", 1.3)
    # a stage under 0.05 s is left out of the line, never out of the record
    assert clock.line().endswith("bundle 1.3 s; total "
                                 f"{sum(clock.seconds.values()):.1f} s")
    assert "search " not in clock.line() and "search" in clock.record()


def test_a_slow_model_is_timed_within_a_bound_in_seconds(monkeypatch):
    """Kokoro-82M runs 1.4 s a call: 5 rounds of it and its original took 100 s on a quiet
    machine and a build on a loaded one ran 35 minutes of them. Warm-ups stop after
    WARMUP_SECONDS (one call at least), a slow contender's switch warm-up is one call, and no
    round starts after *seconds* (one round at least): counted in calls, not timed here."""
    import time

    from packager import timing
    from packager._runtimes import time_models

    monkeypatch.setattr(timing, "WARMUP_SECONDS", 0.05)   # (the switch warm-up)
    monkeypatch.setattr(time_models, "WARMUP_SECONDS", 0.05)   # (warm_up's, shared)
    calls = {"a": 0, "b": 0}

    def slow(name):
        def run():
            calls[name] += 1
            time.sleep(0.03)
        return run

    times = timing.time_blocks({"a": slow("a"), "b": slow("b")}, rounds=5, block=3,
                               seconds=0.2)
    assert times["a"]["rounds"] == times["b"]["rounds"] == 1
    assert times["a"]["calls"] == 3
    # warm-up: 1 or 2 calls (0.05 s), not 5; the switch warm-up one call, not 3
    assert 3 + 1 + 1 <= calls["a"] <= 3 + 1 + 2, calls
    full = timing.time_blocks({"none": lambda: None}, rounds=4, block=2, warmup=0)
    assert full["none"]["rounds"] == 4   # a fast one runs every round


def test_the_bundle_is_not_timed_against_the_same_file(tmp_path):
    """A graph is not timed against itself: where the bundle ships the original's bytes the
    speed comparison says so and times nothing; another graph is timed against it."""
    import shutil

    from test_kfold import mlp

    from packager.build.fp32_graph import against_original

    model = mlp(tmp_path / "m.onnx")
    copy = shutil.copy(model, tmp_path / "original.onnx")
    timed = []

    def time_graphs(paths):
        timed.append(paths)
        return {str(p): {"p50": 1.0, "p10": 0.9, "p90": 1.1} for p in paths}, {"cpu": "x"}

    record = against_original(model, copy, time_graphs, "")
    assert record == {"measured": False, "why": "the bundle ships the original file unchanged"}
    assert not timed
    other = mlp(tmp_path / "other.onnx")   # built again, byte for byte: the same file
    assert not against_original(other, copy, time_graphs, "")["measured"]
    from onnx import load, save
    changed = load(str(model))
    changed.doc_string = "simplified"
    save(changed, str(tmp_path / "changed.onnx"))
    assert against_original(tmp_path / "changed.onnx", copy, time_graphs, "")["measured"]
    assert len(timed) == 1
