"""One latency answer: the machine's load during a timing (other processes' share of the cores,
from /proc/stat) is measured the same way on the device (`run.py bench`) and on the host (the
build's timing), a busy machine or scattered calls mark the figure noisy, and a decision timed
on a busy machine ships INT8 only when it is clearly faster."""

import json
import subprocess
import sys
import time

import pytest

from conftest import run_py
from packager._runtimes.runner.load import BUSY, load_facts, noise, snapshot

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat")


@pytest.fixture
def busy_cpu():
    """Every core kept busy by another process while the test runs."""
    import os

    spin = "import time\nend = time.time() + 120\nwhile time.time() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)]
    time.sleep(0.3)
    yield
    for proc in procs:
        proc.kill()
        proc.wait()


def test_noise_names_a_busy_machine_and_scattered_calls():
    quiet = {"other_share": 0.02, "cores": 2}
    assert noise(quiet, {"p10": 1.0, "p90": 1.2}) == ""
    assert noise({"other_share": 0.6, "cores": 2}, {"p10": 1.0, "p90": 1.2}) == \
        "other processes used 60% of the 2 cores"
    assert noise(quiet, {"p10": 1.0, "p90": 2.0}) == "p90 is 2.0x p10"
    assert noise({"other_share": None, "cores": 2}, {"p10": 1.0, "p90": 1.1}) == ""


def test_a_short_window_is_unknown_unless_waited_out():
    before = snapshot()
    assert load_facts(before, wait=False)["other_share"] is None    # ticks are 10 ms
    facts = load_facts(before)   # sleeps out the rest of 0.5 s
    assert facts["other_share"] is not None and facts["seconds"] >= 0.49


def test_a_loaded_cpu_is_said_by_bench_and_by_the_host_s_timing(built, busy_cpu):
    from packager.timing import time_blocks

    result = run_py(built.bundle.directory, "bench", "--runs", "30", "--json")
    assert result.returncode == 0, result.stderr
    part = json.loads(result.stdout)["parts"]["model"]
    assert part["load"]["other_share"] > BUSY and "other processes used" in part["noisy"]
    assert part["latency_ms"]["p10"] <= part["latency_ms"]["p50"] <= part["latency_ms"]["p90"]
    human = run_py(built.bundle.directory, "bench", "--runs", "30")
    assert "NOISY (other processes used" in human.stdout
    times = time_blocks({"sleep": lambda: time.sleep(0.01)}, rounds=3, block=20, warmup=1)
    load = times["sleep"]["load"]
    assert load["other_share"] > BUSY and noise(load, times["sleep"]).startswith("other")


def test_a_gain_timed_on_a_busy_machine_must_be_clear():
    from packager.quantization.decision import NOISY_GAIN, within_noise

    assert within_noise(1.1, "other processes used 60% of the 2 cores")
    assert not within_noise(NOISY_GAIN + 0.05, "other processes used 60% of the 2 cores")
    assert not within_noise(1.1, "")
