"""How busy the machine was while something was timed: the share of the CPU cores that other
processes used (from /proc/stat, less this process's own CPU time), and whether a latency
figure is noisy. The device's `run.py bench` and the host's timing use this one measure, so a
figure on a busy machine says so wherever it is taken. Python 3.8, stdlib only."""

import os
import time

BUSY = 0.25     # other processes using a quarter of the cores makes a timing noisy
SPREAD = 1.5    # so does p90 over p10 above this (the calls themselves disagree)
WINDOW = 0.5    # seconds at least: /proc/stat counts in 10 ms ticks


def snapshot():
    """(busy jiffies of all CPUs, all jiffies, this process's CPU seconds, wall seconds), or
    None where /proc/stat cannot be read (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)   # idle + iowait
    times = os.times()   # with the children it waited for: a timing subprocess is our own work
    own = times.user + times.system + times.children_user + times.children_system
    return sum(values) - idle, sum(values), own, time.perf_counter()


def other_share(before, after):
    """The share (0-1) of all cores other processes kept busy between two snapshots, or None."""
    if before is None or after is None:
        return None
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    own = (after[2] - before[2]) * hz
    return max(0.0, min(1.0, (busy - own) / float(total)))


def load_facts(before, after=None, wait=True):
    """{"other_share", "cores", "seconds"} for a report (other_share None where unknown).
    Without *after* the window ends now; it must last WINDOW seconds (/proc/stat counts 10 ms
    ticks: a 2 ms timing spans less than one): with *wait* this process sleeps out the rest,
    else a shorter window is unknown."""
    if after is None and before is not None:
        left = WINDOW - (time.perf_counter() - before[3])
        if left > 0 and wait:
            time.sleep(left)
        after = snapshot()
    short = before is None or after is None or after[3] - before[3] < WINDOW * 0.99
    share = None if short else other_share(before, after)
    return {"other_share": None if share is None else round(share, 3),
            "cores": os.cpu_count() or 1,
            "seconds": None if before is None or after is None else round(after[3] - before[3], 2)}


def noise(load, latency):
    """Why a latency figure is noisy ('' when it is not): a busy machine, or calls that disagree
    (p90 over p10 above SPREAD)."""
    why = []
    share = (load or {}).get("other_share")
    if share is not None and share > BUSY:
        why.append("other processes used %.0f%% of the %d cores" % (100 * share, load["cores"]))
    p10, p90 = latency.get("p10"), latency.get("p90")
    if p10 and p90 and p90 / p10 > SPREAD:
        why.append("p90 is %.1fx p10" % (p90 / p10))
    return "; ".join(why)
