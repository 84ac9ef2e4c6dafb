"""Time the precision decision's candidates on the device itself (`build --time-on HOST`)."""

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..progress import Log
from ..quantization.decision import Timer

TIMEOUT = 900.0   # seconds for each remote step: the copy, the timing, the clean-up


def remote_timer(host: Any, *, ssh_config: Path | None = None, python: str = "python3",
                 providers: Sequence[Any] = (), log: Log = lambda _: None,
                 timeout: float = TIMEOUT) -> Timer:
    """Time the candidates on a device over SSH (copied to a scratch folder, removed after),
    each on the first of the target's *providers* that starts there, as its runner would.
    Every remote step ends within *timeout* seconds; the device's answer is checked before it
    is used."""
    import json
    import shlex
    import shutil
    import tempfile

    import numpy as np

    from .._runtimes import time_models
    from .remote import Connection, DeviceError, device_scratch

    def timer(paths, feed, threads, rounds, block):
        conn = Connection(host, ssh_config=ssh_config)
        with tempfile.TemporaryDirectory(prefix="edgepack-auto-") as tmp:
            folder = Path(tmp)
            for p in paths:
                shutil.copyfile(p, folder / p.name)
            np.savez(folder / "feed.npz", **feed)
            shutil.copyfile(time_models.__file__, folder / "time_models.py")
            chain = [[p.name, p.options] for p in providers]
            (folder / "providers.json").write_text(json.dumps(chain))
            log(f"precision auto: timing {len(paths)} candidates on {host.name}")
            with device_scratch(conn, folder, "time-on", "auto", timeout=timeout,
                                copy_timeout=timeout) as remote:
                names = " ".join(shlex.quote(p.name) for p in paths)
                proc = conn.run(f"cd -- {shlex.quote(remote)} && {shlex.quote(python)} "
                                f"time_models.py feed.npz {threads} {rounds} {block} "
                                f"{'--providers providers.json ' if chain else ''}{names}",
                                timeout=timeout, step="time-on: timing the candidates")
        if proc.returncode != 0:
            raise DeviceError(f"{host.name}: timing the candidates failed "
                              f"({_last(proc.stderr) or 'no output'})",
                              "check python3, numpy and onnxruntime on the device")
        data = _answer(proc.stdout, [p.name for p in paths])
        if data is None:
            raise DeviceError(f"{host.name}: time-on: the device's answer is not what "
                              "time_models.py prints (a timing for each candidate)",
                              f"check that {python} on the device is a plain Python 3.8+")
        by_name = data["timings"]
        ran = sorted(set(data["providers"].values()))
        return {str(p): by_name[p.name] for p in paths}, {**data["device"], "host": host.name,
                                                          "providers": ran}
    return timer


def _answer(stdout: str, names: list[str]) -> dict[str, Any] | None:
    """time_models.py's JSON, checked: a p50 and p90 (finite, > 0) for each of *names*, text
    device facts and provider names; or None."""
    import json

    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    timings, device, providers = data.get("timings"), data.get("device"), data.get("providers",
                                                                                    {})
    if not isinstance(timings, dict) or not isinstance(device, dict) or \
            not isinstance(providers, dict):
        return None
    by_name = {Path(str(k)).name: v for k, v in timings.items()}
    for name in names:
        entry = by_name.get(name)
        if not isinstance(entry, dict) or not all(
                isinstance(entry.get(k), int | float) and not isinstance(entry.get(k), bool)
                and math.isfinite(entry[k]) and entry[k] > 0 for k in ("p50", "p90")):
            return None
    if not all(isinstance(v, str | None) and (v is None or len(v) < 200)
               for v in device.values()) or \
            not all(isinstance(v, str) and len(v) < 100 for v in providers.values()):
        return None
    return {"timings": {n: {"p50": float(by_name[n]["p50"]), "p90": float(by_name[n]["p90"])}
                        for n in names},
            "device": {str(k)[:40]: v for k, v in device.items()}, "providers": providers}


def _last(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:200] if lines else ""
