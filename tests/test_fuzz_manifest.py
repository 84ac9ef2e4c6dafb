"""Damaged manifests: `run.py check` and `bench` (the device) and the host's integrity check
(`edgepack verify`, `deploy`) on mutated copies of a real bundle's manifest.json either pass,
fail a check (exit 1) or say in one line what is wrong (exit 2): never an unexpected exception,
never a traceback.

Mutations: a key dropped, a value replaced by one of another type or range, a list emptied or
doubled, bytes flipped or cut. Fixed seed: case N is the same manifest on every run.
EDGEPACK_FUZZ_CASES sets how many (`make fuzz` runs 5000); a failure names the case.
"""

import copy
import json
import os
import random
import shutil

import pytest

pytestmark = pytest.mark.fuzz
CASES = int(os.environ.get("EDGEPACK_FUZZ_CASES", "300"))
SEED = 20251123
ODD = [None, True, 0, -1, 2, 1e308, float("nan"), "", "x", "../../etc/passwd", [], {}, [1, "a"],
       {"a": 1}, "model.onnx", 10 ** 30, [[-5, 0]], "\u0000"]


def runner():
    """The runner's command line, run in this process (main(argv) -> exit code)."""
    from packager._runtimes.runner import cli

    return cli


def paths(value, prefix=()):
    """Every (path, value) in a JSON tree."""
    yield prefix, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))


def mutate(manifest: dict, text: str, case: int) -> tuple[str, str]:
    rng = random.Random(SEED * 100_003 + case)
    kind = rng.choice(["drop", "replace", "replace", "replace", "list", "bytes"])
    if kind == "bytes":
        raw = bytearray(text.encode())
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        if rng.random() < 0.3:
            raw = raw[:rng.randrange(len(raw))]
        return raw.decode("utf-8", "replace"), "bytes"
    data = copy.deepcopy(manifest)
    spots = [p for p, _ in paths(data) if p]
    path = rng.choice(spots)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if kind == "drop":
        del parent[key]
    elif kind == "list" and isinstance(parent[key], list):
        parent[key] = [] if rng.random() < 0.5 else parent[key] * 2
    else:
        parent[key] = rng.choice(ODD)
    return json.dumps(data), f"{kind} {'/'.join(map(str, path))}"


def test_damaged_manifests_never_crash_the_runner_or_the_host_check(built, tmp_path, capfd):
    from packager.bundle.manifest import read_manifest
    from packager.device.verify import integrity_problems
    from packager.errors import PackagerError

    r = runner()
    bundle = tmp_path / "b"
    shutil.copytree(built.bundle.directory, bundle)
    text = (bundle / "manifest.json").read_text()
    manifest = json.loads(text)
    failures = []
    codes = {}
    for case in range(CASES):
        mutated, what = mutate(manifest, text, case)
        (bundle / "manifest.json").write_text(mutated)
        for argv in (["check", "--json"], ["bench", "--runs", "1", "--warmup", "0"]):
            try:
                code = r.main(["--bundle", str(bundle), *argv])
            except SystemExit as exc:      # argparse only
                code = exc.code
            except Exception as exc:       # noqa: BLE001 - what the fuzz looks for
                failures.append(f"case {case} ({what}): run.py {argv[0]} raised "
                                f"{type(exc).__name__}: {exc}")
                continue
            out, err = capfd.readouterr()
            codes[code] = codes.get(code, 0) + 1
            if code not in (0, 1, 2) or "Traceback" in err:
                failures.append(f"case {case} ({what}): run.py {argv[0]} exit {code}: "
                                f"{err.strip()[-300:]}")
            elif argv[0] == "check" and code in (0, 1):
                json.loads(out)   # --json: stdout is the JSON object and nothing else
        try:
            integrity_problems(bundle, read_manifest(bundle))
        except PackagerError:
            pass
        except Exception as exc:          # noqa: BLE001
            failures.append(f"case {case} ({what}): host check raised {type(exc).__name__}: "
                            f"{exc}")
    assert not failures, f"{len(failures)} of {CASES} cases:\n" + "\n".join(failures[:20])
    assert codes.get(2, 0) and codes.get(0, 0)   # the mutations reach both ends
