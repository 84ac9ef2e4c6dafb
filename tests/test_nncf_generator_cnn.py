"""NNCF's INT8 (quantization/nncf_generator.py) on a small *trained* depthwise / HardSwish / SE
CNN, the kind of net onnxruntime's quantizer loses (PP-LCNet): a valid QDQ graph that runs in
onnxruntime and keeps the outputs, excluded nodes float, and bad input as one-line
QuantizationErrors. (test_nncf_generator.py covers the generator's place in the decision.)"""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from nncf_measure import images

from packager.errors import QuantizationError
from packager.graph.execute import run_model
from packager.quantization import nncf_generator
from packager.quantization.quantize import QuantConfig, quantize_file
from packager.targets import load_target

NNCF = replace(QuantConfig.from_preset(load_target("x86_64-cpu").quantization, precision="int8"),
               generator="nncf")
SIZE = 64


@pytest.fixture(autouse=True, scope="module")
def needs_nncf():   # (module scope: skip before the module's model is trained)
    why = nncf_generator.unavailable()
    if why:   # the optional extra edgepack[nncf]; `make install` installs it
        pytest.skip(why)


def _net():
    """PP-LCNet in small: depthwise convs, HardSwish, an SE block (HardSigmoid multiply)."""
    import torch
    from torch import nn

    def cbh(i: int, o: int, k: int, s: int, groups: int = 1) -> list:
        return [nn.Conv2d(i, o, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(o),
                nn.Hardswish()]

    class SE(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.fc = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c // 4, 1), nn.ReLU(),
                                    nn.Conv2d(c // 4, c, 1), nn.Hardsigmoid())

        def forward(self, x):
            return x * self.fc(x)

    torch.manual_seed(0)
    return nn.Sequential(*cbh(3, 16, 3, 2), *cbh(16, 16, 3, 1, 16), *cbh(16, 32, 1, 1),
                         *cbh(32, 32, 3, 2, 32), *cbh(32, 64, 1, 1), *cbh(64, 64, 5, 2, 64),
                         SE(64), *cbh(64, 64, 1, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 8))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The net trained 150 steps to tell 8 shapes apart (nncf_measure's images; about 55 %
    top-1, against 12.5 % by chance: trained weights and ranges, not random ones), exported."""
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # small convs: a second thread only waits (1 s a step on 2 busy cores)
    net, steps = _net(), 150
    opt = torch.optim.AdamW(net.parameters(), lr=5e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=steps)
    x, labels, _ = images(1024, seed=11, size=SIZE)
    for step in range(steps):
        j = step * 32 % 1024
        loss = F.cross_entropy(net(torch.from_numpy(x[j:j + 32])),
                               torch.from_numpy(labels[j:j + 32]).long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    torch.set_num_threads(threads)
    net.eval()
    path = tmp_path_factory.mktemp("nncf") / "lcnet.onnx"
    with torch.inference_mode():
        torch.onnx.export(net, (torch.zeros(1, 3, SIZE, SIZE),), str(path), dynamo=False,
                          opset_version=17, input_names=["x"], output_names=["y"])
    return path


def _samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    x = images(count, seed=seed, size=SIZE)[0]
    return [{"x": x[i:i + 1]} for i in range(count)]


def _dequantized_inputs(path: Path) -> dict[str, bool]:
    """Per node: whether any of its inputs comes from a DequantizeLinear."""
    graph = onnx.load(str(path)).graph
    dq = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.name: any(i in dq for i in n.input) for n in graph.node}


def test_nncf_int8_of_a_trained_depthwise_se_cnn_runs_and_keeps_its_outputs(trained, tmp_path):
    out = quantize_file(trained, tmp_path / "q.onnx", config=NNCF, samples=_samples(32, seed=7))
    graph = onnx.load(str(out)).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") >= 5 and "DequantizeLinear" in ops
    convs = [n.name for n in graph.node if n.op_type == "Conv"]
    quantized = _dequantized_inputs(out)
    assert sum(quantized[c] for c in convs) >= len(convs) - 2   # (the SE's 1x1 convs may stay)
    held = _samples(16, seed=8)
    ref, got = run_model(trained, held)["y"], run_model(out, held)["y"]   # onnxruntime, CPU EP
    ref, got = ref.reshape(16, -1), got.reshape(16, -1)
    cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    # measured: min 0.974, mean 0.996, top-1 15/16 (onnxruntime's MinMax: 0.956, 0.996, 15/16);
    # a flip is a near-tie of a net this small
    assert cos.min() > 0.95 and cos.mean() > 0.99, cos
    assert (ref.argmax(1) == got.argmax(1)).mean() >= 14 / 16


def test_excluded_nodes_stay_float_and_the_rest_is_quantized(trained, tmp_path):
    graph = onnx.load(str(trained)).graph
    producer = {o: n for n in graph.node for o in n.output}
    se_mul = next(n.name for n in graph.node if n.op_type == "Mul" and any(
        producer.get(i) is not None and producer[i].op_type == "HardSigmoid" for i in n.input))
    last_conv = [n.name for n in graph.node if n.op_type == "Conv"][-1]
    out = quantize_file(trained, tmp_path / "k.onnx", config=replace(NNCF, exclude=(
        se_mul, last_conv)), samples=_samples(16, seed=7))
    quantized = _dequantized_inputs(out)
    assert not quantized[se_mul] and not quantized[last_conv]
    first_conv = next(n.name for n in graph.node if n.op_type == "Conv")
    assert quantized[first_conv]


def test_bad_input_is_a_one_line_quantization_error(trained, tmp_path, monkeypatch):
    def fails(samples, match):
        with pytest.raises(QuantizationError, match=match) as caught:
            quantize_file(trained, tmp_path / "q.onnx", config=NNCF, samples=samples)
        assert "\n" not in str(caught.value) and not (tmp_path / "q.onnx").exists()

    fails([{"x": np.zeros((1, 3, SIZE // 2, SIZE), np.float32)}], "NNCF could not quantize")
    fails([], "calibration data")
    monkeypatch.setitem(sys.modules, "nncf", None)   # as in a venv without the extra
    assert "pip install" in nncf_generator.unavailable()
    fails(_samples(2, seed=7), "NNCF is not installed")
