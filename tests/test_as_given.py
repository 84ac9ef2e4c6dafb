"""A model shipped quantized already (ConvInteger/MatMulInteger, or QLinearConv/QGemm) keeps its
INT8 as given: build bundles it labelled "INT8 (as given)" without a search, never quantizes
it again, and quantize refuses it in one line."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from conftest import run_py
from packager.cli import main

PREP = "size=32x32,scale=1/255"


class Reader:
    def __init__(self, count: int = 6):
        rng = np.random.default_rng(0)
        self.samples = [{"image": rng.random((1, 3, 32, 32), dtype=np.float32)}
                        for _ in range(count)]

    def get_next(self):
        return self.samples.pop() if self.samples else None


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, cnn_onnx) -> dict[str, Path]:
    """The tiny CNN quantized by onnxruntime itself, dynamically and as QOperator."""
    from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static

    folder = tmp_path_factory.mktemp("given")
    static = folder / "cnn.static.onnx"
    model = onnx.load(str(cnn_onnx))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(model, str(static))
    out = {"dynamic": folder / "dynamic.onnx", "qoperator": folder / "qoperator.onnx"}
    quantize_dynamic(str(static), str(out["dynamic"]))
    quantize_static(str(static), str(out["qoperator"]), Reader(), quant_format=QuantFormat.QOperator)
    return out


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("kind,ops", [("dynamic", "ConvInteger"), ("qoperator", "QLinearConv")])
def test_an_int8_model_ships_as_given_and_the_device_reproduces_it(quantized, image_dir,
                                                                   tmp_path, kind, ops):
    out = tmp_path / "bundle"
    result = cli("build", quantized[kind], "--calib", image_dir, "--preprocess", PREP, "-o", out)
    assert result.exit_code == 0, result.output
    assert "is quantized already" in result.output and ops in result.output
    assert f"built {out}: INT8 (as given)" in result.output
    part = json.loads((out / "manifest.json").read_text())["parts"][0]
    decision = part["precision"]["decision"]
    assert decision["chosen"] == "INT8 (as given)"
    assert [c["label"] for c in decision["candidates"]] == ["INT8 (as given)"]   # no search
    assert part["precision"]["mode"] == "given" and part["golden"]["reference"] == "shipped"
    # the shipped graph is the given one, ops and all: nothing was quantized again
    shipped = onnx.load(str(out / part["model"]["file"]))
    given = onnx.load(str(quantized[kind]))
    assert sorted(n.op_type for n in shipped.graph.node if "Integer" in n.op_type or
                  n.op_type.startswith("QLinear")) == \
        sorted(n.op_type for n in given.graph.node if "Integer" in n.op_type or
               n.op_type.startswith("QLinear"))
    assert not any(n.op_type == "QuantizeLinear" and n.name.endswith("_QuantizeLinear_1")
                   for n in shipped.graph.node)
    check = run_py(out, "check")
    assert check.returncode == 0 and "check passed" in check.stdout, check.stdout + check.stderr


def test_a_quantized_model_refuses_a_float_precision_and_quantize(quantized, image_dir, tmp_path):
    out = tmp_path / "fp32"
    result = cli("build", quantized["dynamic"], "--calib", image_dir, "--preprocess", PREP,
                 "--precision", "fp32", "-o", out)
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert "--precision fp32: the model is quantized already" in errors[0]
    assert not out.exists()
    target = tmp_path / "again.onnx"
    result = cli("quantize", quantized["qoperator"], "--calib", image_dir, "--preprocess", PREP,
                 "-o", target)
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert "is quantized already (QLinearConv" in errors[0] and "ships its INT8 as given" in errors[0]
    assert not target.exists()
