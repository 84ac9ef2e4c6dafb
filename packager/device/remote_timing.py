"""Time the precision decision's candidates on the device itself (`build --time-on HOST`)."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..quantization.decision import Log, Timer


def remote_timer(host: Any, *, ssh_config: Path | None = None, python: str = "python3",
                 providers: Sequence[Any] = (), log: Log = lambda _: None) -> Timer:
    """Time the candidates on a device over SSH (copied to a scratch folder, removed after),
    each on the first of the target's *providers* that starts there, as its runner would."""
    import json
    import shlex
    import shutil
    import tempfile
    import uuid

    import numpy as np

    from .._runtimes import time_models
    from .remote import Connection, DeviceError, have_local

    def timer(paths, feed, threads, rounds, block):
        conn = Connection(host, ssh_config=ssh_config)
        remote = f"edgepack/.auto-{uuid.uuid4().hex[:8]}"
        with tempfile.TemporaryDirectory(prefix="edgepack-auto-") as tmp:
            folder = Path(tmp)
            for p in paths:
                shutil.copyfile(p, folder / p.name)
            np.savez(folder / "feed.npz", **feed)
            shutil.copyfile(time_models.__file__, folder / "time_models.py")
            chain = [[p.name, p.options] for p in providers]
            (folder / "providers.json").write_text(json.dumps(chain))
            conn.run(f"mkdir -p {shlex.quote(remote)}")
            probe = conn.run("command -v rsync >/dev/null 2>&1 && echo RSYNC")
            rsync = probe.stdout.startswith("RSYNC") and have_local("rsync")
            method = "rsync" if rsync else "scp"
            log(f"precision auto: timing {len(paths)} candidates on {host.name}")
            conn.copy(folder, remote, method=method)
            names = " ".join(shlex.quote(p.name) for p in paths)
            proc = conn.run(f"cd {shlex.quote(remote)} && {shlex.quote(python)} time_models.py "
                            f"feed.npz {threads} {rounds} {block} "
                            f"{'--providers providers.json ' if chain else ''}{names}; "
                            f"code=$?; cd && rm -rf {shlex.quote(remote)}; exit $code")
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise DeviceError(f"{host.name}: timing the candidates failed ({last})",
                              "check python3, numpy and onnxruntime on the device")
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        by_name = {Path(k).name: v for k, v in data["timings"].items()}
        ran = sorted(set(data.get("providers", {}).values()))
        return {str(p): by_name[p.name] for p in paths}, {**data["device"], "host": host.name,
                                                          "providers": ran}
    return timer
