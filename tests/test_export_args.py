"""forward() arguments: a Python default is no input and no branch on data; --const fixes an
argument of a PyTorch or TorchScript source (as a Python value or a tensor); only a branch on a
value the inputs change is refused. And an ONNX input an If branches on, holding one value in
every calibration sample, is frozen by the build."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from packager.errors import ExportError
from packager.source.export import export
from packager.source.specs import TensorSpec

X = [TensorSpec("x", (1, 16))]

MODELS = '''
import torch
import torch.nn as nn


class Crepe(nn.Module):
    """torchcrepe's shape: forward(x, embed=False) returns the embedding when asked."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Linear(16, 8)
        self.classifier = nn.Linear(8, 4)

    def forward(self, x, embed=False):
        x = torch.relu(self.embedding(x))
        if embed:
            return x
        return self.classifier(x)


class Branchy(nn.Module):
    """A branch on the input's value: the trace would keep one branch for every input."""

    def forward(self, x, embed=False):
        if x.sum() > 0:
            return x * 2
        return x


class RateInt(nn.Module):
    """A VAD's forward(x, sr): sr a Python number that picks the branch."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.at16k = nn.Linear(16, 4)
        self.at8k = nn.Linear(16, 4)

    def forward(self, x, sr):
        if sr == 16000:
            return self.at16k(x)
        return self.at8k(x)


class RateTensor(nn.Module):
    """sr used as a tensor (its .float()), and a branch on it: the branch reads no input."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 4)

    def forward(self, x, sr: torch.Tensor):
        y = self.proj(x) * (sr.float() / 8000)
        if sr == 16000:
            return y + 1
        return y


def with_cache(forward):
    """As transformers' decorators do: a keyword forward() also declares, set by the wrapper."""
    import functools

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        kwargs.setdefault("use_cache", False)
        return forward(self, *args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 4)

    @with_cache
    def forward(self, x, mask=None, use_cache=None, **kwargs):
        y = self.proj(x)
        return y if mask is None else y * mask


def crepe():
    return Crepe()


def decorated():
    return Decorated()


def branchy():
    return Branchy()


def rate_int():
    return RateInt()


def rate_tensor():
    return RateTensor()
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("args") / "arg_models.py"
    path.write_text(MODELS)
    return path


def load(models: Path, name: str) -> torch.nn.Module:
    import importlib.util

    spec = importlib.util.spec_from_file_location("arg_models_ref", models)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)().eval()


def onnx_run(path: Path, x: np.ndarray) -> tuple[list[str], np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [i.name for i in session.get_inputs()], session.run(None, {"x": x})[0]


def sample() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((1, 16)).astype(np.float32)


def test_a_python_bool_default_is_no_input_and_no_refusal(models, tmp_path):
    r = export(f"{models}:crepe", tmp_path / "crepe.onnx", inputs=X)
    names, got = onnx_run(r.path, sample())
    with torch.no_grad():
        ref = load(models, "crepe")(torch.from_numpy(sample())).numpy()
    assert names == ["x"] and got.shape == (1, 4) == ref.shape
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert r.validation["max_rel"] < 1e-5 and not r.warnings and r.consts == {}


def test_defaults_and_kwargs_of_a_decorated_forward_are_not_fed_twice(models, tmp_path):
    # torch.onnx alone appends every default by position, and the decorator's use_cache=False
    # then clashes: "forward() got multiple values for argument 'use_cache'" (transformers'
    # BertModel fails so)
    module = load(models, "decorated")
    with pytest.raises(TypeError, match="multiple values for argument 'use_cache'"):
        torch.onnx.export(module, (torch.zeros(1, 16),), str(tmp_path / "plain.onnx"),
                          dynamo=False)
    r = export(f"{models}:decorated", tmp_path / "d.onnx", inputs=X)
    names, got = onnx_run(r.path, sample())
    with torch.no_grad():
        ref = module(torch.from_numpy(sample())).numpy()
    assert names == ["x"]
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_const_picks_the_other_side_of_a_bool_default(models, tmp_path):
    r = export(f"{models}:crepe", tmp_path / "embed.onnx", inputs=X, consts={"embed": True})
    names, got = onnx_run(r.path, sample())
    with torch.no_grad():
        ref = load(models, "crepe")(torch.from_numpy(sample()), embed=True).numpy()
    assert names == ["x"] and got.shape == (1, 8)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert r.consts == {"embed": {"value": True, "passed_as": "bool"}}


@pytest.mark.parametrize("factory", ["branchy"])
def test_a_branch_on_the_inputs_value_is_still_refused(models, tmp_path, factory):
    out = tmp_path / "b.onnx"
    with pytest.raises(ExportError, match=r"data-dependent control flow at \S*arg_models.py:\d+: "
                                          r"an if/while on a tensor value") as err:
        export(f"{models}:{factory}", out, inputs=X)
    assert "\n" not in str(err.value) and not out.exists()


@pytest.mark.parametrize("sr", [16000, 8000])
def test_const_python_int_picks_the_branch(models, tmp_path, sr):
    logged = []
    r = export(f"{models}:rate_int", tmp_path / "vad.onnx", inputs=X, consts={"sr": sr},
               log=logged.append)
    names, got = onnx_run(r.path, sample())
    with torch.no_grad():
        ref = load(models, "rate_int")(torch.from_numpy(sample()), sr).numpy()
    assert names == ["x"] and [i["name"] for i in r.inputs] == ["x"]
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert r.consts == {"sr": {"value": sr, "passed_as": "int"}}
    assert f"const: sr={sr} passed to forward() as a Python int (not an input of the graph)" \
        in logged
    # the other rate's weights never reach the graph: the branch is decided, not exported
    other = {16000: "at8k", 8000: "at16k"}[sr]
    assert not [t for t in onnx.load(str(r.path)).graph.initializer if other in t.name]


def test_const_passed_as_a_tensor_where_forward_needs_one(models, tmp_path):
    r = export(f"{models}:rate_tensor", tmp_path / "t.onnx", inputs=X, consts={"sr": 16000})
    names, got = onnx_run(r.path, sample())
    with torch.no_grad():
        ref = load(models, "rate_tensor")(torch.from_numpy(sample()),
                                          torch.tensor(16000)).numpy()
    assert names == ["x"] and r.consts["sr"] == {"value": 16000, "passed_as": "tensor int64"}
    np.testing.assert_allclose(got, ref, atol=1e-4)
    # the `if sr == 16000` reads a tensor, but no input changes it: noted, not refused
    assert any("no input changes" in w for w in r.warnings)


def test_const_without_annotation_falls_back_to_a_tensor(tmp_path):
    path = tmp_path / "item.py"
    path.write_text("import torch\n\nclass M(torch.nn.Module):\n"
                    "    def forward(self, x, gain):\n        return x * gain.float()\n\n"
                    "def make():\n    return M()\n")
    r = export(f"{path}:make", tmp_path / "g.onnx", inputs=X, consts={"gain": 3})
    names, got = onnx_run(r.path, sample())
    assert names == ["x"] and r.consts["gain"]["passed_as"] == "tensor int64"
    np.testing.assert_allclose(got, sample() * 3, atol=1e-6)


def test_torchscript_source_takes_a_const(tmp_path):
    class Rate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.at16k = torch.nn.Linear(16, 4)
            self.at8k = torch.nn.Linear(16, 4)

        def forward(self, x, sr: int):
            if sr == 16000:
                return self.at16k(x)
            return self.at8k(x)

    scripted = torch.jit.script(Rate().eval())
    torch.jit.save(scripted, str(tmp_path / "vad.pt"))
    with pytest.raises(ExportError, match=r"forward\(x, sr\) takes 2 inputs, --input gave 1 "
                                          r"\(x\); .*--const NAME=VALUE"):
        export(tmp_path / "vad.pt", tmp_path / "no.onnx", inputs=X)
    for sr in (16000, 8000):
        r = export(tmp_path / "vad.pt", tmp_path / f"{sr}.onnx", inputs=X, consts={"sr": sr})
        names, got = onnx_run(r.path, sample())
        with torch.no_grad():
            ref = scripted(torch.from_numpy(sample()), sr).numpy()
        assert names == ["x"] and r.consts["sr"] == {"value": sr, "passed_as": "int"}
        np.testing.assert_allclose(got, ref, atol=1e-5)
        assert "If" not in {n.op_type for n in onnx.load(str(r.path)).graph.node}


def test_const_mistakes_are_one_line(models, tmp_path):
    out = tmp_path / "m.onnx"
    with pytest.raises(ExportError, match=r"--const rate: forward\(\) has no argument 'rate'; "
                                          r"forward\(\) takes: x, sr$"):
        export(f"{models}:rate_int", out, inputs=X, consts={"rate": 16000})
    with pytest.raises(ExportError, match=r"--const fixes every input of forward\(\) \(x, sr\)"):
        export(f"{models}:rate_int", out, inputs=X, consts={"x": 1, "sr": 16000})
    assert not out.exists()


def test_build_cli_const_on_a_pytorch_source(models, tmp_path):
    cmd = [sys.executable, "-m", "packager", "build", f"{models}:rate_int", "--input", "x:1x16",
           "--const", "sr=8000", "--precision", "fp32", "-o", str(tmp_path / "b"), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "const: sr=8000 passed to forward() as a Python int" in r.stderr
    part = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0]
    assert [i["name"] for i in part["inputs"]] == ["x"]
    assert part["source"]["consts"] == {"sr": 8000}
    assert part["source"]["export"]["consts"] == {"sr": {"value": 8000, "passed_as": "int"}}
    names, got = onnx_run(tmp_path / "b" / "model.onnx", sample())
    with torch.no_grad():
        ref = load(models, "rate_int")(torch.from_numpy(sample()), 8000).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-5)

    bad = cmd[:cmd.index("sr=8000")] + ["rate=8000"] + cmd[cmd.index("sr=8000") + 1:]
    bad[bad.index(str(tmp_path / "b"))] = str(tmp_path / "c")
    r = subprocess.run(bad, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--const rate: forward() has no argument 'rate'; forward() takes: x, sr" in r.stderr
    assert not (tmp_path / "c").exists()


def test_export_cli_const_on_a_pytorch_source(models, tmp_path):
    from click.testing import CliRunner

    from packager.cli import main

    out = tmp_path / "vad.onnx"
    r = CliRunner().invoke(main, ["export", f"{models}:rate_int", "--input", "x:1x16",
                                  "--const", "sr=8000", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert "const: sr=8000 passed to forward() as a Python int" in r.output
    names, got = onnx_run(out, sample())
    with torch.no_grad():
        ref = load(models, "rate_int")(torch.from_numpy(sample()), 8000).numpy()
    assert names == ["x"]
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert not [t for t in onnx.load(str(out)).graph.initializer if "at16k" in t.name]
    # the build's parsing and messages: a name forward() lacks, a value that is no number
    for const, said in (("rate=8000", "--const rate: forward() has no argument 'rate'; "
                                      "forward() takes: x, sr"),
                        ("sr=fast", "--const sr='fast' is not a number, list or .npy file")):
        bad = tmp_path / f"{const.split('=')[0]}.onnx"
        r = CliRunner().invoke(main, ["export", f"{models}:rate_int", "--input", "x:1x16",
                                      "--const", const, "-o", str(bad)])
        assert r.exit_code == 2 and said in r.output and not bad.exists(), r.output
        assert "Traceback" not in r.output
    r = CliRunner().invoke(main, ["export", f"{models}:rate_int", "--input", "x:1x16",
                                  "-o", str(tmp_path / "none.onnx")])
    assert r.exit_code == 2 and "--const NAME=VALUE" in r.output, r.output


# --------------------------------------------------------------------------- ONNX: If on an input


def rate_graph(path: Path, *, same_shapes: bool) -> Path:
    """audio [1, 64] and an int64 scalar sr; If sr == 16000 one MatMul, else another: to [1, 8]
    as well (same_shapes), or to [2, 4] through a Reshape (the branches disagree). The branches
    declare no output shapes, as exporters often write them."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(64, 8)).astype(np.float32), "w16"),
             numpy_helper.from_array(rng.normal(size=(64, 8)).astype(np.float32), "w8"),
             numpy_helper.from_array(np.array([2, 4], np.int64), "to_shape"),
             numpy_helper.from_array(np.array(16000, np.int64), "sixteen_k")]
    out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, None]) for n in ("f16", "f8")]
    then = helper.make_graph([helper.make_node("MatMul", ["audio", "w16"], ["f16"])], "at16k",
                             [], [out[0]])
    other = helper.make_graph([helper.make_node("MatMul", ["audio", "w8"], ["f8"])] if same_shapes
                              else [helper.make_node("MatMul", ["audio", "w8"], ["wide"]),
                                    helper.make_node("Reshape", ["wide", "to_shape"], ["f8"])],
                              "at8k", [], [out[1]])
    nodes = [helper.make_node("Equal", ["sr", "sixteen_k"], ["is16k"], name="eq"),
             helper.make_node("If", ["is16k"], ["feat"], name="by_rate", then_branch=then,
                              else_branch=other),
             helper.make_node("Tanh", ["feat"], ["prob"], name="tanh")]
    graph = helper.make_graph(
        nodes, "rate", [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 64]),
                        helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [None, None])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def calibration(path: Path, rates: list[int]) -> Path:
    rng = np.random.default_rng(3)
    np.savez(path, audio=rng.normal(size=(len(rates), 1, 64)).astype(np.float32),
             sr=np.array(rates, np.int64))
    return path


def test_an_input_an_if_branches_on_with_one_value_is_frozen(tmp_path):
    from packager.build.job import build
    from packager.graph.freeze import branch_inputs

    model = rate_graph(tmp_path / "rate.onnx", same_shapes=False)
    assert branch_inputs(onnx.load(str(model))) == {"sr": ["by_rate"]}
    logged = []
    build(model, tmp_path / "b", target="x86_64-cpu",
          calib=calibration(tmp_path / "c.npz", [16000] * 20), log=logged.append)
    assert "input sr is 16000 in every calibration sample and an If branches on it: frozen " \
           "(pass --const sr=... to choose)" in logged
    part = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0]
    assert [i["name"] for i in part["inputs"]] == ["audio"]
    assert part["source"]["consts"] == {"sr": 16000}
    shipped = onnx.load(str(tmp_path / "b" / "model.onnx"))
    assert "If" not in {n.op_type for n in shipped.graph.node}
    audio = np.linspace(-1, 1, 64, dtype=np.float32)[None]
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
        None, {"audio": audio, "sr": np.array(16000, np.int64)})[0]
    got = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"),
                               providers=["CPUExecutionProvider"]).run(None, {"audio": audio})[0]
    assert got.shape == ref.shape == (1, 8) and np.abs(got - ref).max() < 0.05


def test_an_input_with_several_values_and_disagreeing_branches_is_refused(tmp_path):
    model = rate_graph(tmp_path / "rate.onnx", same_shapes=False)
    data = calibration(tmp_path / "c.npz", [16000, 8000] * 10)
    r = subprocess.run([sys.executable, "-m", "packager", "build", str(model), "--calib",
                        str(data), "-o", str(tmp_path / "b")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "input sr holds 2 values in the calibration samples (16000, 8000) and the If " \
           "'by_rate' branches on it into outputs of other shapes" in r.stderr
    assert "pass --const sr=VALUE to build for one value" in r.stderr
    assert not (tmp_path / "b").exists()
    # the way out the message names works
    r = subprocess.run([sys.executable, "-m", "packager", "build", str(model), "--calib",
                        str(data), "--const", "sr=8000", "-o", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    part = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0]
    assert part["source"]["consts"] == {"sr": 8000} and part["outputs"][0]["shape"] == [2, 4]


def test_an_input_with_several_values_and_agreeing_branches_stays_an_input(tmp_path):
    from packager.build.job import build

    model = rate_graph(tmp_path / "rate.onnx", same_shapes=True)
    logged = []
    build(model, tmp_path / "b", target="x86_64-cpu", log=logged.append,
          calib=calibration(tmp_path / "c.npz", [16000, 8000] * 10))
    part = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"][0]
    assert [i["name"] for i in part["inputs"]] == ["audio", "sr"]
    assert "consts" not in part["source"] and not [m for m in logged if "frozen" in m]


def test_a_const_and_an_input_of_one_name_are_refused(models, tmp_path):
    with pytest.raises(ExportError, match=r"--const sr and --input sr both given: .*; drop "
                                          r"--input sr to fix it, or --const sr to feed it"):
        export(f"{models}:rate_int", tmp_path / "m.onnx", consts={"sr": 16000},
               inputs=X + [TensorSpec("sr", (1,), "int64")])


def test_a_branch_after_an_inputs_value_became_a_python_number_is_refused(tmp_path):
    # the value leaves the tensors (int()) and comes back as a new tensor: not followed, so
    # the branch on it counts as data-dependent, as every branch did before
    path = tmp_path / "detour.py"
    path.write_text("import torch\n\nclass M(torch.nn.Module):\n"
                    "    def forward(self, x):\n        n = torch.tensor(int(x.sum() > 0))\n"
                    "        if n > 0:\n            return x * 2\n        return x\n\n"
                    "def make():\n    return M()\n")
    with pytest.raises(ExportError, match=r"data-dependent control flow at \S*detour.py:6"):
        export(f"{path}:make", tmp_path / "d.onnx", inputs=X)


def test_list_const_is_a_tensor_and_a_keyword_only_argument_needs_a_value(tmp_path):
    path = tmp_path / "scale.py"
    path.write_text("import torch\n\nclass M(torch.nn.Module):\n"
                    "    def forward(self, x, scale, *, bias):\n"
                    "        return x[:, :2] * scale + bias\n\n"
                    "def make():\n    return M()\n")
    with pytest.raises(ExportError, match=r"forward\(x, scale, bias\): no value for 'bias' .*"
                                          r"fix it with --const bias=VALUE"):
        export(f"{path}:make", tmp_path / "s.onnx", inputs=X, consts={"scale": [2.0, 3.0]})
    r = export(f"{path}:make", tmp_path / "s.onnx", inputs=X,
               consts={"scale": [2.0, 3.0], "bias": 0.5})
    names, got = onnx_run(r.path, sample())
    assert names == ["x"] and r.consts["scale"] == {"value": [2.0, 3.0],
                                                    "passed_as": "tensor float32"}
    assert r.consts["bias"] == {"value": 0.5, "passed_as": "float"}
    np.testing.assert_allclose(got, sample()[:, :2] * [2.0, 3.0] + 0.5, atol=1e-6)
