"""Budgets in task terms: --task and --keep on the build, the candidates judged by the task's
figures beside the cosine, the task recorded in the manifest and answered on the device, and a
task suggested (never taken on) from the graph's outputs."""

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from conftest import PREP, run_py
from packager.build.job import build
from packager.cli import main
from packager.errors import SpecError
from packager.quantization.budget import AccuracyBudget
from packager.tasks.declare import parse_task, parse_tasks
from packager.tasks.suggest import suggest


def linear(path, weights):
    """y = x @ W: a classifier head whose weights the test chooses."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"])], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, weights.shape[0]])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, weights.shape[1]])],
        [numpy_helper.from_array(weights.astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def near_tie(tmp_path):
    """Two models whose scores agree to cosine 0.9999 but whose top-1 differs on some samples:
    classes 0 and 1 are nearly tied, and the candidate moves class 1 up a little."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 12)) - 1.0   # (over 8 classes: no absolute-error rule for raw)
    w[:, 0] += 2.0
    w[:, 1] = w[:, 0] + 0.01 * rng.normal(size=16)
    moved = w.copy()
    moved[:, 1] += 0.02
    held = [{"x": (rng.normal(size=(1, 16)) + 3).astype(np.float32)} for _ in range(40)]
    return linear(tmp_path / "fp32.onnx", w), linear(tmp_path / "cand.onnx", moved), held


def test_a_candidate_within_the_cosine_budget_misses_its_classify_budget(tmp_path):
    """38 of 40 top-1 answers flip, each where FP32 gave the loser 5 points less: cosine 0.99+,
    expected drop 3.3 % -> the classify task's budget (1 point) fails; agreement is reported."""
    fp32, cand, held = near_tie(tmp_path)
    raw = AccuracyBudget(min_cosine=0.99).evaluate(cand, fp32, held)
    assert raw["budget"]["passed"] and raw["cosine_min"] > 0.99 and "task" not in raw
    judged = AccuracyBudget(min_cosine=0.99, task={"kind": "classify"}).evaluate(cand, fp32, held)
    task = judged["task"]
    assert task["kind"] == "classify" and not task["passed"]
    assert 0.02 < task["figures"]["expected_drop"]["value"] < 0.05
    assert "top1" not in task["figures"] and "top-1 agrees on 5% of 40 samples" in \
        task["reported"]["top1"]
    assert not judged["budget"]["passed"] and judged["drop"] == \
        task["figures"]["expected_drop"]["value"]
    assert any(f.startswith("expected top-1 drop under FP32's probabilities 3.3% over 40 "
                            "samples (needs at most 1%; 40 samples cannot show 1%: 100 needed) "
                            "[38 flips, FP32's margins 0.0564") for f in
               judged["budget"]["failures"])
    assert "expected_drop <= 1%" in judged["budget"]["spec"]
    # the only output is the head's: its cosine is said, not gated
    assert judged["cosine_reported"] == ["scores"]
    # the user's keep on top-1 judges agreement instead; FP32 against itself always agrees
    agree = AccuracyBudget(min_cosine=0.99, task={"kind": "classify"}, keep={"top1": 0.9})
    found = agree.evaluate(cand, fp32, held)["task"]
    assert set(found["figures"]) == {"top1"} and not found["passed"]
    loose = AccuracyBudget(min_cosine=0.99, task={"kind": "classify"},
                           keep={"expected_drop": 0.05})
    assert loose.evaluate(cand, fp32, held)["budget"]["passed"]
    same = AccuracyBudget(task={"kind": "classify"}).evaluate(fp32, fp32, held)["task"]
    assert same["passed"] and same["figures"]["expected_drop"]["value"] == 0.0
    assert not same["shown"] and "40 samples cannot show 1%: 100 needed" in same["text"]


def scored(path, logits):
    """A model that answers *logits[i]* for input i (one-hot x of len(logits) values)."""
    return linear(path, np.asarray(logits, np.float64))


def test_a_near_tie_flip_passes_and_a_confident_flip_fails(tmp_path):
    """The expected drop: a flip where FP32's top two were 0.008 apart costs 0.008 of a sample;
    a flip against a confident answer costs nearly the whole sample."""
    n = 20
    held = [{"x": np.eye(n, dtype=np.float32)[i:i + 1]} for i in range(n)]
    confident = np.tile([8.0, 0.0, 0.0], (n, 1))
    tie = confident.copy()
    tie[0] = np.log([0.496, 0.488, 0.016])   # FP32's top two 0.008 apart
    fp32 = scored(tmp_path / "fp32.onnx", tie)
    near = tie.copy()
    near[0, [0, 1]] = near[0, [1, 0]]        # the candidate flips the near-tie
    far = tie.copy()
    far[5] = [0.0, 8.0, 0.0]                 # ... or a confident answer
    task = {"kind": "classify"}
    passed = AccuracyBudget(task=task).evaluate(scored(tmp_path / "near.onnx", near), fp32,
                                                held)
    figure = passed["task"]["figures"]["expected_drop"]
    assert passed["budget"]["passed"] and abs(figure["value"] - 0.008 / n) < 1e-6
    assert "1 flip, FP32's margin 0.008" in figure["text"]
    assert "top-1 agrees on 95% of 20 samples" in passed["task"]["reported"]["top1"]
    failed = AccuracyBudget(task=task).evaluate(scored(tmp_path / "far.onnx", far), fp32, held)
    assert not failed["budget"]["passed"]
    assert failed["task"]["figures"]["expected_drop"]["value"] > 0.049
    # with no task declared, a Softmax-fed (class_outputs) output is judged the same way
    raw = AccuracyBudget(min_cosine=0.0, class_outputs=frozenset({"scores"}))
    assert raw.evaluate(scored(tmp_path / "near2.onnx", near), fp32, held)["budget"]["passed"]
    miss = raw.evaluate(scored(tmp_path / "far2.onnx", far), fp32, held)
    assert not miss["budget"]["passed"] and miss["expected_drop"]["scores"]["flips"][0][
        "sample"] == 5
    assert miss["budget"]["failures"][0].startswith("output 'scores' (class scores): expected "
                                                    "top-1 drop under FP32's probabilities 5%")


def test_task_text_forms(tmp_path):
    assert parse_task("classify") == {"kind": "classify"}
    assert parse_task("detect:decoder=yolov5,score=0.3,agnostic=true") == {
        "kind": "detect", "decoder": "yolov5", "score": 0.3, "agnostic": True}
    (tmp_path / "chars.txt").write_text("-\na\n \nb\n")
    assert parse_task(f"ctc:alphabet=@{tmp_path / 'chars.txt'}")["alphabet"] == ["-", "a", " ", "b"]
    (tmp_path / "t.toml").write_text('kind = "ctc"\nalphabet_file = "chars.txt"\n'
                                     '[keep]\nexact = 0.95\n')
    assert parse_task(str(tmp_path / "t.toml")) == {"kind": "ctc", "alphabet": ["-", "a", " ", "b"],
                                                    "keep": {"exact": 0.95}}
    assert parse_tasks(["rec=ctc", "det=detect:decoder=centernet"], ["det", "rec"]) == {
        "rec": {"kind": "ctc"}, "det": {"kind": "detect", "decoder": "centernet"}}
    for text, words in [("classfy", "no task kind 'classfy'"),
                        ("classify:size=3", "a classify task has no parameter 'size'"),
                        ("detect:score", "'score' is not key=value"),
                        (f"ctc:alphabet=@{tmp_path / 'none.txt'}", "no such file"),
                        (str(tmp_path / "none.toml"), "no such file"),
                        ("classify:keep=recall=0.9", "a classify task has no recall figure")]:
        with pytest.raises(SpecError, match=words):
            parse_task(text)
    with pytest.raises(SpecError, match="which part is it for"):
        parse_tasks(["classify"], ["a", "b"])


def test_bad_task_and_keep_are_one_line_errors(cnn_onnx, image_dir, tmp_path):
    common = ["build", str(cnn_onnx), "--calib", str(image_dir), "--preprocess",
              "size=32x32,resize=letterbox,color=rgb,layout=nchw,scale=1/255"]
    cases = [(["--task", "detect"], "cnn.onnx: task.output: output 0 has shape [1, 10], not a "
                                    "yolov8 head"),
             (["--task", "classify", "--keep", "recall=0.9"], "a classify task has no recall"),
             (["--keep", "top1=99%"], "--keep needs a task to judge"),
             (["--task", "classify", "--keep", "top1=200%"], "is not a share from 0 to 1")]
    for extra, words in cases:
        out = tmp_path / "o"
        r = CliRunner().invoke(main, [*common, *extra, "-o", str(out)])
        assert r.exit_code == 2, (extra, r.output)
        assert words in r.output and "Traceback" not in r.output, (extra, r.output)
        assert not out.exists()
        # said before the slow stages (a pipeline's last part was checked after the first
        # part's whole search): nothing was simplified or searched
        if "--task" in extra and "--keep" not in extra:
            assert "simplify:" not in r.output and "search:" not in r.output, r.output


def test_a_task_that_cannot_fit_a_later_part_stops_the_build_first(cnn_onnx, image_dir,
                                                                    tmp_path):
    from packager.build.part_shapes import check_task_early

    prep = PREP
    ctc = {"kind": "ctc", "alphabet": ["blank", "a", "b"]}   # the CNN's [1, 10] has no steps
    with pytest.raises(SpecError, match=r"output 0 has shape \[1, 10\], not \(1, steps, classes\)"):
        check_task_early(cnn_onnx, ctc, None, {}, prep, image_dir, 1)
    check_task_early(cnn_onnx, {"kind": "classify"}, None, {}, prep, image_dir, 1)   # fits
    check_task_early("torch_models.py:Net", ctc, None, {}, prep, image_dir, 1)   # after export


def test_a_built_classifier_answers_with_labels_and_its_check_holds_top1(cnn_onnx, image_dir,
                                                                         tmp_path):
    labels = [f"class{i}" for i in range(10)]
    lines = []
    r = build(cnn_onnx, tmp_path / "b", target="x86_64-cpu", calib=image_dir, preprocess=PREP,
              labels=labels, tasks={"model": {"kind": "classify", "top": 3}},
              keep={"top1": 0.9}, log=lines.append)
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    part = manifest["parts"][0]
    assert part["task"] == {"kind": "classify", "top": 3, "keep": {"top1": 0.9}}
    task = r.parts[0].accuracy["task"]
    assert task["passed"] and task["figures"]["top1"]["keep"] == 0.9
    assert any(line.startswith("accuracy vs FP32") and "classify: top-1 agrees on" in line
               for line in lines)
    decision = part["precision"]["decision"]
    assert decision["budget"].endswith("top1 >= 90%")
    assert all("task" in c for c in decision["candidates"] if c["error"] is None)
    photo = sorted(p for p in image_dir.rglob("*") if p.is_file())[0]
    out = run_py(tmp_path / "b", "infer", str(photo), "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)["results"][0]
    assert found["task"]["top"][0]["label"] in labels and len(found["task"]["top"]) == 3
    check = run_py(tmp_path / "b", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "model: classify vs the FP32 reference: top-1 agrees on 100% of 4 samples (needs " \
           "90%; 4 samples cannot show 90%: 10 needed); expected top-1 drop under FP32's " \
           "probabilities 0% over 4 samples (reported): NOT PROVEN (too few" in check.stdout
    from packager.device.verify import verify

    report = verify(tmp_path / "b", runs=3, warmup=1)
    [task_check] = [c for c in report["checks"] if c["name"] == "task:classify"]
    assert task_check["passed"] and task_check["proven"] is False and "cannot show" in \
        task_check["detail"]
    # never a plain pass: the verdict says on how few samples, in the words every surface uses
    # (exit 0: nothing failed)
    from packager.device.verify import render_markdown

    assert report["verdict"] == "passed on 4 samples; 10 show 90%" and report["passed"]
    md = render_markdown(report)
    assert "**PASSED** on 4 samples; 10 show 90%" in md and \
        "| task:classify | passed on 4 samples; 10 show 90% |" in md


def test_suggestions_name_the_task_without_taking_it_on():
    rng = np.random.default_rng(0)
    scores = [{"name": "scores", "shape": [1, 10]}]
    assert suggest(scores, {}, [f"c{i}" for i in range(10)])[0] == "classify"
    assert suggest(scores, {}, None) is None          # no labels: nothing says it classifies
    yolo = [{"name": "output0", "shape": [1, 22, 2100]}]
    assert suggest(yolo, {}, None)[0] == "detect:decoder=yolov8"
    logits = rng.normal(size=(3, 1, 40, 97))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    ctc = [{"name": "softmax", "shape": [1, 40, 97]}]
    assert suggest(ctc, {"softmax": probs}, None)[0].startswith("ctc:")
    assert suggest(ctc, {"softmax": logits}, None) is None
    centerface = [{"name": n, "shape": [1, c, 8, 8]} for n, c in
                  [("heat", 1), ("scale", 2), ("offset", 2), ("lms", 10)]]
    assert suggest(centerface, {}, None)[0] == "detect:decoder=centernet"


def test_the_device_check_fails_a_top1_the_reference_does_not_share(cnn_onnx, image_dir,
                                                                    tmp_path):
    """The golden reference's top two classes swapped (cosine floor lowered, files re-signed):
    only the task's figure can see it."""
    import hashlib

    build(cnn_onnx, tmp_path / "b", target="x86_64-cpu", calib=image_dir, preprocess=PREP,
          tasks={"model": {"kind": "classify"}}, keep={"top1": 0.5})
    bundle = tmp_path / "b"
    manifest = json.loads((bundle / "manifest.json").read_text())
    golden = manifest["parts"][0]["golden"]
    ref = np.load(bundle / golden["outputs"])["scores"]
    swapped = ref.copy()
    for row in swapped.reshape(len(ref), -1):
        first, second = np.argsort(row)[-2:][::-1]
        row[[first, second]] = row[[second, first]]
    np.savez(bundle / golden["outputs"], scores=swapped)
    golden["min_cosine"] = 0.01
    manifest["files"] = {rel: hashlib.sha256((bundle / rel).read_bytes()).hexdigest()
                         for rel in manifest["files"]}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    r = run_py(bundle, "check", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    task = json.loads(r.stdout)["parts"]["model"]["task"]
    assert not task["passed"] and task["shown"] and task["figures"]["top1"]["value"] == 0.0
    assert all(o["passed"] for o in json.loads(r.stdout)["parts"]["model"]["outputs"].values())
    human = run_py(bundle, "check").stdout
    assert "model: classify vs the FP32 reference: top-1 agrees on 0% of 4 samples (needs 50%): " \
           "FAILED; expected top-1 drop under FP32's probabilities" in human


def test_an_output_of_a_few_values_is_held_to_an_absolute_error(tmp_path):
    """A [1, 1] output always has cosine 1 and a few positive numbers stay near it: such outputs
    must stay within 1% of their largest magnitude."""
    rng = np.random.default_rng(0)
    w = np.abs(rng.normal(size=(16, 3))) + 1.0
    held = [{"x": (np.abs(rng.normal(size=(1, 16))) + 0.1).astype(np.float32)} for _ in range(8)]
    fp32 = linear(tmp_path / "mos.onnx", w / 16)
    drift = linear(tmp_path / "drift.onnx", w / 16 * 1.05)   # every score 5% higher
    budget = AccuracyBudget(min_cosine=0.99)
    moved = budget.evaluate(drift, fp32, held)
    assert moved["cosine_min"] > 0.9999 and not moved["budget"]["passed"]
    assert any("output 'scores' (3 values a sample): max abs" in f and "a cosine cannot judge"
               in f for f in moved["budget"]["failures"])
    assert budget.evaluate(fp32, fp32, held)["budget"]["passed"]


# ---------------------------------------------------------------------------------------------
# multilabel: a Sigmoid head of (1, frames, labels), as basic-pitch's posteriorgrams


def sigmoid_head(path, weights, bias, frames=5, extra=False):
    """probs = sigmoid(x @ W + b) as (1, frames, labels) (and, with *extra*, the logits too)."""
    labels = weights.shape[1] // frames
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["logits"]),
             helper.make_node("Sigmoid", ["logits"], ["p"]),
             helper.make_node("Reshape", ["p", "shape"], ["probs"])]
    outputs = [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, frames, labels])]
    if extra:
        nodes.append(helper.make_node("Reshape", ["logits", "shape"], ["scores"]))
        outputs.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT,
                                                     [1, frames, labels]))
    graph = helper.make_graph(
        nodes, "tagger", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                        [1, weights.shape[0]])], outputs,
        [numpy_helper.from_array(weights.astype(np.float32), "w"),
         numpy_helper.from_array(np.asarray(bias, np.float32), "b"),
         numpy_helper.from_array(np.array([1, frames, labels], np.int64), "shape")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_candidate_that_flips_labels_misses_its_multilabel_budget(tmp_path):
    """Every logit 0.1 higher: cosine 0.9998, but the labels just under 0.5 turn on."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 40)) * 0.5
    held = [{"x": rng.normal(size=(1, 16)).astype(np.float32)} for _ in range(40)]
    fp32 = sigmoid_head(tmp_path / "fp32.onnx", w, np.zeros(40))
    cand = sigmoid_head(tmp_path / "cand.onnx", w, np.full(40, 0.1))
    raw = AccuracyBudget(min_cosine=0.99).evaluate(cand, fp32, held)
    assert raw["budget"]["passed"] and raw["cosine_min"] > 0.999
    judged = AccuracyBudget(min_cosine=0.99, task={"kind": "multilabel"}).evaluate(cand, fp32,
                                                                                   held)
    f1 = judged["task"]["figures"]["f1"]
    assert not judged["budget"]["passed"] and not f1["passed"] and f1["shown"]
    assert 0.9 < f1["value"] < 0.99 and "f1 >= 99%" in judged["budget"]["spec"]
    assert any(f.startswith("labels on agree (F1) on ") and "needs 99%" in f
               for f in judged["budget"]["failures"])
    # a higher threshold that the shift cannot cross as often, or a looser keep, lets it by
    loose = AccuracyBudget(min_cosine=0.99, task={"kind": "multilabel"}, keep={"f1": 0.9})
    assert loose.evaluate(cand, fp32, held)["budget"]["passed"]
    same = AccuracyBudget(task={"kind": "multilabel"}).evaluate(fp32, fp32, held)["task"]
    assert same["passed"] and same["figures"]["f1"]["value"] == 1.0


def test_multilabel_task_text_forms(tmp_path):
    assert parse_task("multilabel") == {"kind": "multilabel"}
    assert parse_task("multilabel:output=notes:1|onsets,threshold=0.3|0.5,keep=f1=98%") == {
        "kind": "multilabel", "output": ["notes:1", "onsets"], "threshold": [0.3, 0.5],
        "keep": {"f1": pytest.approx(0.98)}}
    assert parse_task("multilabel:output=1|0,threshold=0.4")["output"] == [1, 0]
    (tmp_path / "keys.txt").write_text("C4\nD4\n")
    assert parse_task(f"multilabel:labels=@{tmp_path / 'keys.txt'}")["labels"] == ["C4", "D4"]
    (tmp_path / "t.toml").write_text('kind = "multilabel"\noutput = ["a", "b"]\n'
                                     'threshold = [0.3, 0.5]\n[keep]\nf1 = 0.97\n')
    assert parse_task(str(tmp_path / "t.toml")) == {
        "kind": "multilabel", "output": ["a", "b"], "threshold": [0.3, 0.5], "keep": {"f1": 0.97}}
    with pytest.raises(SpecError, match="a multilabel task has no top1 figure"):
        parse_task("multilabel:keep=top1=0.9")


def test_a_sigmoid_fed_posteriorgram_suggests_multilabel(tmp_path):
    from packager.tasks.part import say_suggestion
    from packager.tasks.suggest import sigmoid_outputs

    w = np.random.default_rng(0).normal(size=(16, 40))
    model = onnx.load(sigmoid_head(tmp_path / "m.onnx", w, np.zeros(40), extra=True))
    assert sigmoid_outputs(model.graph) == {"probs"}      # through the Reshape; the logits are not
    probs = [{"name": "probs", "shape": [1, 5, 8]}]
    both = probs + [{"name": "scores", "shape": [1, 5, 8]}]
    assert suggest(probs, {}, None, {"probs"})[0] == "multilabel"
    assert suggest(both, {}, None, {"probs"})[0] == "multilabel:output=probs"
    assert suggest(probs, {}, None) is None          # no Sigmoid: nothing says so
    assert suggest([{"name": "probs", "shape": [1, 5, 1]}], {}, None, {"probs"}) is None  # vad's
    lines = []
    say_suggestion(model, {}, None, lines.append)
    assert lines == ["task: none declared; output 'probs' (1, 5, 8) comes from a Sigmoid: an "
                     "independent probability per label (last axis) and frame, a multi-label "
                     "answer: --task multilabel:output=probs would judge the candidates by that "
                     "task's figures and make run.py infer answer in its terms (raw tensors and "
                     "cosine kept)"]


def test_a_built_multilabel_tagger_answers_with_its_labels_on(tmp_path):
    rng = np.random.default_rng(1)
    model = sigmoid_head(tmp_path / "tagger.onnx", rng.normal(size=(16, 40)) * 0.5,
                         np.zeros(40))
    np.savez(tmp_path / "calib.npz", x=rng.normal(size=(60, 16)).astype(np.float32))
    keys = [f"tag{i}" for i in range(8)]
    (tmp_path / "keys.txt").write_text("\n".join(keys) + "\n")
    common = ["build", str(model), "--calib", str(tmp_path / "calib.npz")]
    bad = CliRunner().invoke(main, [*common, "--task", "multilabel:labels=a|b", "-o",
                                    str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "task.labels has 2 entries, output 0 has 8 labels" in bad.output
    assert not (tmp_path / "bad").exists() and "Traceback" not in bad.output

    out = tmp_path / "b"
    r = CliRunner().invoke(main, [*common, "--task", f"multilabel:threshold=0.4,labels=@"
                                  f"{tmp_path / 'keys.txt'}", "--keep", "f1=95%", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "multilabel: labels on agree (F1) on " in r.output
    part = json.loads((out / "manifest.json").read_text())["parts"][0]
    assert part["task"] == {"kind": "multilabel", "threshold": 0.4, "labels": keys,
                            "keep": {"f1": 0.95}}
    assert all("task" in c for c in part["precision"]["decision"]["candidates"]
               if c["error"] is None)

    sample = tmp_path / "x.npy"
    np.save(sample, rng.normal(size=(1, 16)).astype(np.float32))
    infer = run_py(out, "infer", str(sample), "--json", "--out", str(tmp_path / "o.npz"))
    assert infer.returncode == 0, infer.stderr
    [answer] = json.loads(infer.stdout)["results"][0]["task"]["outputs"]
    probs = np.load(tmp_path / "o.npz")["x.npy/probs"][0]    # the bundle's own tensors
    assert answer["frames"] == 5 and answer["classes"] == 8 and answer["threshold"] == 0.4
    assert answer["on"] == [{"frame": t, "on": [keys[c] for c in np.nonzero(row >= 0.4)[0]]}
                            for t, row in enumerate(probs) if (row >= 0.4).any()]
    assert answer["on"]      # a random tagger turns some labels on
    check = run_py(out, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "model: multilabel vs the FP32 reference: labels on agree (F1) on " in check.stdout


def test_with_labels_the_budget_is_the_labelled_top1_drop(tmp_path):
    """Samples with labels (class folders): the labelled top-1's drop against FP32 on the same
    samples gates (1 point by default, as NNCF's accuracy control); agreement is reported. A
    candidate that flips wrong answers to right ones loses nothing; two right answers made
    wrong of 100 are 2 points."""
    from packager.quantization.budget import fingerprint
    from packager.quantization.kfold import Evidence, verdict

    n = 100
    held = [{"x": np.eye(n, dtype=np.float32)[i:i + 1]} for i in range(n)]
    truth = np.arange(n) % 3
    logits = np.full((n, 3), 0.0)
    logits[np.arange(n), truth] = 4.0
    logits[:10] = np.roll(logits[:10], 1, axis=1)           # FP32 is wrong on 10: 90 %
    fp32 = scored(tmp_path / "fp32.onnx", logits)
    labels = {fingerprint(s): int(t) for s, t in zip(held, truth, strict=True)}
    budget = AccuracyBudget(min_cosine=0.99, class_outputs=frozenset({"scores"}), truth=labels,
                            truth_output="scores")
    fixes = logits.copy()
    fixes[:5] = np.roll(fixes[:5], -1, axis=1)              # 5 wrong answers made right
    fixes[50] = np.roll(fixes[50], 1)                       # 1 right answer made wrong
    ok = budget.evaluate(scored(tmp_path / "fixes.onnx", fixes), fp32, held)
    assert ok["budget"]["passed"], ok["budget"]
    assert ok["labelled"]["fp32"] == 0.9 and ok["labelled"]["candidate"] == 0.94
    assert ok["drop"] < 0 and ok["labelled"]["shown"] and ok["cosine_reported"] == ["scores"]
    assert ok["expected_drop"]["scores"]["value"] > 0.05     # said, not gated: labels decide
    assert verdict(ok, Evidence("held-out", n)) == "shown"
    assert "labelled top-1 drop <= 1 point" in ok["budget"]["spec"]
    worse = logits.copy()
    worse[[40, 41]] = np.roll(worse[[40, 41]], 1, axis=1)   # 2 right answers made wrong
    miss = budget.evaluate(scored(tmp_path / "worse.onnx", worse), fp32, held)
    assert not miss["budget"]["passed"] and abs(miss["drop"] - 0.02) < 1e-9
    assert miss["budget"]["failures"] == ["labelled top-1 88.0% against FP32's 90.0% on 100 "
                                          "labelled samples: a drop of 2.0 points (needs at "
                                          "most 1)"]
    # --max-accuracy-drop 3% lets it through; 20 samples cannot show 1 point
    loose = AccuracyBudget(min_cosine=0.99, max_drop=0.03, truth=labels, truth_output="scores")
    found = loose.evaluate(scored(tmp_path / "w2.onnx", worse), fp32, held)
    assert found["budget"]["passed"], found["budget"]
    few = budget.evaluate(scored(tmp_path / "f.onnx", logits), fp32, held[:20])
    assert few["budget"]["passed"] and verdict(few, Evidence("held-out", 20)) == (
        "not proven: 20 samples judged, 100 would show a 1-point drop")


def per_position(path, logits):
    """(1, T, C) probabilities per position: input i (one-hot) -> softmax(logits[i])."""
    n, t, c = logits.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["flat"]),
         helper.make_node("Reshape", ["flat", "shape"], ["z"]),
         helper.make_node("Softmax", ["z"], ["probs"], axis=-1)], "frames",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, t, c])],
        [numpy_helper.from_array(logits.reshape(n, t * c).astype(np.float32), "w"),
         numpy_helper.from_array(np.array([1, t, c], np.int64), "shape")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_scores_per_position_with_no_task_are_judged_by_their_argmax(tmp_path):
    """A (1, T, C) output of probabilities per position (a CTC or frame classifier) with no task
    declared: its argmax per position is judged, expected-drop weighted, beside the cosine. A
    confident character changed on every sample fails however close the cosine; a near-tie
    position flipped passes."""
    n, t, c = 20, 30, 5
    held = [{"x": np.eye(n, dtype=np.float32)[i:i + 1]} for i in range(n)]
    logits = np.zeros((n, t, c))
    logits[:, :, 0] = 6.0                      # blank, confidently, everywhere
    logits[:, 10, :] = 0.0
    logits[:, 10, 1], logits[:, 10, 2] = 3.0, 2.99   # one near-tie position a sample
    fp32 = per_position(tmp_path / "fp32.onnx", logits)
    tie = logits.copy()
    tie[:, 10, 2] = 3.0 + 1e-3
    changed = logits.copy()
    changed[:, 20, 3] = 7.0                    # a confident blank becomes a character
    budget = AccuracyBudget(min_cosine=0.9)
    ok = budget.evaluate(per_position(tmp_path / "tie.onnx", tie), fp32, held)
    assert ok["budget"]["passed"], ok["budget"]
    assert ok["expected_drop"]["probs"]["positions"] == t
    assert ok["expected_drop"]["probs"]["value"] < 1e-3
    miss = budget.evaluate(per_position(tmp_path / "changed.onnx", changed), fp32, held)
    assert miss["cosine_min"] > 0.9 and not miss["budget"]["passed"]
    assert miss["budget"]["failures"][0].startswith(
        "output 'probs' (class scores): expected top-1 drop under FP32's probabilities 3.3%")
