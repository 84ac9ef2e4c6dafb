"""Issue 25's real cases, each mechanism reproduced on a small generated model.

ddddocr's captcha recogniser (a CRNN with CTC) returns logits in the (steps, 1, classes) layout:
built without a task it shipped INT8 at cosine 0.983 while 2.5 % of unseen captchas read
differently, and no line told the user that `--task ctc` would have judged the candidates by their
strings. The suggestion read only (1, steps, classes) softmax outputs; these tests hold it to
logits in either layout, where the blank wins most steps."""

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from packager.cli import main
from packager.tasks.suggest import suggest

STEPS, FEATURES, CLASSES = 24, 16, 30


def ctc_head(path, weights, bias):
    """logits = x @ W + b over (steps, 1, features): a recogniser's last layer, steps first."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["logits"])],
        "ctc_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [STEPS, 1, FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [STEPS, 1, CLASSES])],
        [numpy_helper.from_array(weights.astype(np.float32), "w"),
         numpy_helper.from_array(bias.astype(np.float32), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def ctc_logits(rng, samples, blank):
    """Logits whose best class is *blank* at most steps, characters between (as a CRNN's)."""
    x = rng.normal(size=(samples, STEPS, 1, CLASSES))
    x[..., blank] += 2.5
    return x


def test_ctc_logits_steps_first_suggest_ctc_with_their_blank():
    rng = np.random.default_rng(0)
    steps_first = [{"name": "387", "shape": [STEPS, 1, CLASSES]}]
    found = suggest(steps_first, {"387": ctc_logits(rng, 10, 0)}, None)
    assert found is not None and found[0] == "ctc:alphabet=@CHARS.txt"
    assert "symbol 0 at most steps" in found[1]
    batch_first = [{"name": "out", "shape": [1, STEPS, CLASSES]}]
    last = suggest(batch_first, {"out": ctc_logits(rng, 10, CLASSES - 1)[:, :, 0]}, None)
    assert last[0] == f"ctc:alphabet=@CHARS.txt,blank={CLASSES - 1}"
    # random scores, and hidden states with one loud middle dimension, are no CTC output
    assert suggest(steps_first, {"387": rng.normal(size=(10, STEPS, 1, CLASSES))}, None) is None
    hidden = rng.normal(size=(10, STEPS, 1, CLASSES))
    hidden[..., 7] += 5.0
    assert suggest(steps_first, {"387": hidden}, None) is None
    # one symbol at every step is a constant, not a recogniser reading characters
    only_blank = rng.normal(size=(10, STEPS, 1, CLASSES))
    only_blank[..., 0] += 50.0
    assert suggest(steps_first, {"387": only_blank}, None) is None
    # a Sigmoid's posteriorgram whose first label is on most frames is multilabel's, not ctc
    frames = [{"name": "notes", "shape": [1, STEPS, CLASSES]}]
    posterior = 1 / (1 + np.exp(-ctc_logits(rng, 10, 0)[:, :, 0]))
    assert suggest(frames, {"notes": posterior}, None, {"notes"})[0] == "multilabel"


def test_a_softmax_recogniser_is_ctc_even_in_yolos_shape():
    """PP-OCR's recogniser gives (1, 40, 6625) probabilities: (1, 4 + C, N) by shape, but rows
    that sum to 1 over the last axis are a distribution per step, which no YOLO head is."""
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(5, 1, 40, 120))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    rec = [{"name": "softmax_11.tmp_0", "shape": [1, 40, 120]}]
    assert suggest(rec, {"softmax_11.tmp_0": probs}, None)[0] == "ctc:alphabet=@CHARS.txt"
    boxes = np.abs(rng.normal(size=(5, 1, 40, 120))) * 50     # pixels and scores: no rows of 1
    assert suggest(rec, {"softmax_11.tmp_0": boxes}, None)[0] == "detect:decoder=yolov8"


def test_a_build_without_a_task_says_ctc_for_steps_first_logits(tmp_path):
    """The real case end to end: a build of a (steps, 1, classes) logits head declares no task,
    ships, and says in one line that --task ctc would judge it (it takes nothing on)."""
    rng = np.random.default_rng(1)
    w = rng.normal(size=(FEATURES, CLASSES)) * 0.3
    b = np.zeros(CLASSES)
    b[0] = 3.0   # the blank wins about 3 steps in 4, as in ddddocr
    model = ctc_head(tmp_path / "rec.onnx", w, b)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.savez(calib / "x.npz", x=rng.normal(size=(60, STEPS, 1, FEATURES)).astype(np.float32))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", str(model), "--calib", str(calib), "-o", str(out),
                                       "--openvino", "no", "--search-seconds", "5"])
    assert result.exit_code == 0, result.output
    line = next(li for li in result.output.splitlines() if li.startswith("task: none declared"))
    assert "--task ctc:alphabet=@CHARS.txt " in line and f"(24, 1, {CLASSES})" in line
    manifest = (out / "manifest.json").read_text()
    assert '"task"' not in manifest or '"task": null' in manifest   # never taken on silently
