"""Working out the shapes shape inference leaves open takes one inference's memory (issue 37,
item 5): onnxruntime's profiler reports every node's output shapes over plain runs. Asking
for every open tensor as an output instead kept them all alive, two runs at once: a TTS model's
1,159 took 15.6 GB where one inference needs 0.4 GB, and at 128 tokens the kernel killed it."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import save
from packager.graph.shapes import dynamic_tensors, fetched_shapes, profiled_shapes, shapes_from_run

COUNT, LENGTH = 50, 1_000_000   # 50 open tensors of 4 MB: 200 MB held together


def wide_model(path, count=COUNT, length=LENGTH):
    """x (1, 8) -> a length computed from x's values (shape inference cannot know it; every run
    gives the same), then *count* Sin nodes over that many floats."""
    n = helper.make_node
    nodes = [n("ReduceMax", ["x"], ["m"], keepdims=0), n("Mul", ["m", "zero_f"], ["z"]),
             n("Add", ["z", "len_f"], ["lf"]), n("Cast", ["lf"], ["len"], to=TensorProto.INT64),
             n("Range", ["zero_i", "len", "one_i"], ["r"]),
             n("Cast", ["r"], ["t0"], to=TensorProto.FLOAT)]
    nodes += [n("Sin", [f"t{i}"], [f"t{i + 1}"]) for i in range(count)]
    nodes.append(n("ReduceSum", [f"t{count}"], ["y"], keepdims=1))
    const = [helper.make_tensor("zero_f", TensorProto.FLOAT, [], [0.0]),
             helper.make_tensor("len_f", TensorProto.FLOAT, [], [float(length)]),
             helper.make_tensor("zero_i", TensorProto.INT64, [], [0]),
             helper.make_tensor("one_i", TensorProto.INT64, [], [1])]
    graph = helper.make_graph(nodes, "wide",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], const)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def feeds():
    return [{"x": np.random.default_rng(i).standard_normal((1, 8)).astype(np.float32)}
            for i in range(2)]


def test_the_profiler_gives_the_shapes_the_tensors_themselves_give(tmp_path):
    import onnx

    model = onnx.load(wide_model(tmp_path / "wide.onnx", count=4, length=1000))
    open_ = [name for name, _, _ in dynamic_tensors(model)]
    assert "t4" in open_
    profiled, types = profiled_shapes(model, feeds())
    fetched, kinds = fetched_shapes(model, open_, feeds())
    assert {n: profiled[n] for n in open_ if n in profiled} == \
        {n: fetched[n] for n in open_ if n in profiled}
    assert profiled["t4"] == {(1000,)} and types["t4"] == kinds["t4"] == TensorProto.FLOAT
    # a length a Range makes from values stays dynamic, though these two runs agree on it
    fixed, varying = shapes_from_run(model, feeds())
    assert {"r", "t0", "t4"} <= set(varying) and "t4" in [n for n, _, _ in dynamic_tensors(fixed)]


def peak_mb(tmp_path, call: str) -> float:
    """Peak RSS (MB) of a fresh Python that loads the wide model and runs *call* on it."""
    if not Path("/proc/self/status").is_file():
        pytest.skip("needs Linux's /proc/self/status (VmHWM)")
    code = textwrap.dedent(rf"""
        import json, re, sys
        import numpy as np, onnx
        from packager.graph.shapes import dynamic_tensors, fetched_shapes, shapes_from_run
        model = onnx.load({str(tmp_path / 'wide.onnx')!r})
        open_ = [n for n, _, _ in dynamic_tensors(model)]
        feeds = [{{"x": np.random.default_rng(i).standard_normal((1, 8)).astype(np.float32)}}
                 for i in range(2)]
        {call}
        # VmHWM: this process's own peak (getrusage's ru_maxrss keeps pytest's across exec)
        status = open("/proc/self/status").read()
        print(json.dumps(int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_shapes_from_run_holds_one_inference_not_every_tensor(tmp_path):
    wide_model(tmp_path / "wide.onnx")
    profiled = peak_mb(tmp_path, "shapes_from_run(model, feeds)")
    every = peak_mb(tmp_path, "fetched_shapes(model, open_, feeds)")   # the way it was done
    # every open tensor held at once is 200 MB more than the profiler's one inference
    assert every - profiled > 150, (profiled, every)


def test_calibration_counts_the_data_dependent_tensors_it_holds(tmp_path):
    """Static shapes cannot count a waveform that follows the text: the quantizer's memory is
    estimated with the sizes runs gave those tensors, and bounded by the memory free now."""
    import onnx
    from test_ragged import length_regulator

    from packager.graph.shapes import observed_bytes
    from packager.quantization.calibration import (
        CALIB_BYTES,
        available_bytes,
        calibration_budget,
    )

    model = onnx.load(length_regulator(tmp_path / "regulator.onnx"))
    feeds = [{"x": np.random.default_rng(i).standard_normal((1, 8)).astype(np.float32)}
             for i in range(3)]
    fixed, varying = shapes_from_run(model, feeds[:2])
    assert "frames" in varying
    shapes, kinds = fetched_shapes(model, varying, feeds[:2])   # the tensors themselves
    expected = sum(max(int(np.prod(s)) for s in shapes[n]) *
                   helper.tensor_dtype_to_np_dtype(kinds[n]).itemsize
                   for n in dict.fromkeys(varying))
    assert expected > 0 and observed_bytes(model, varying, feeds[:2]) == expected
    free = available_bytes()
    assert free is None or calibration_budget() <= min(CALIB_BYTES, free // 2)


def test_shapes_from_run_hands_back_the_data_dependent_bytes_it_saw(tmp_path):
    """The build counts the calibration's data-dependent tensors from the runs that found them
    (no second profiled run): the same bytes observed_bytes measures on its own."""
    import onnx
    from test_ragged import length_regulator

    from packager.graph.shapes import observed_bytes

    model = onnx.load(length_regulator(tmp_path / "regulator.onnx"))
    sizes: dict[str, int] = {}
    _, varying = shapes_from_run(model, feeds(), sizes)
    assert set(sizes) == set(varying) and sum(sizes.values()) > 0
    assert sum(sizes.values()) == observed_bytes(model, varying, feeds())


def test_a_model_that_is_never_calibrated_is_never_warned_about_calibration_memory(
        tmp_path, monkeypatch):
    """Kokoro-82M, quantized already (its INT8 ships as given), was warned that calibrating it
    would hold 110 GiB and stop the build. With the memory made scarce, the float model is
    warned (it would calibrate); the same model quantized already, or built with --precision
    fp32 or --mode dynamic, is not, and its calibration set is not thinned."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from test_kfold import mlp, samples

    from packager.build import data
    from packager.build.job import build
    from packager.source.specs import TensorSpec

    monkeypatch.setattr(data, "available_bytes", lambda: 1000)
    monkeypatch.setattr(data, "fit_memory", lambda calib, per_sample: calib[:4])
    model = mlp(tmp_path / "m.onnx")
    given = tmp_path / "given.onnx"
    quantize_dynamic(str(model), str(given), weight_type=QuantType.QInt8)
    np.savez(tmp_path / "x.npz", x=np.stack([s["x"] for s in samples(20)]))
    spec = [TensorSpec("x", (1, 64))]

    def logged(source, **options):
        lines: list[str] = []
        build(str(source), tmp_path / f"out{len(list(tmp_path.iterdir()))}",
              target="x86_64-cpu", calib=tmp_path / "x.npz", inputs=spec, force=True,
              log=lines.append, openvino="no", quant=options)
        return "\n".join(lines)

    assert "warning: calibration holds" in logged(model)
    for source, options in ((given, {}), (model, {"precision": "fp32"}),
                            (model, {"mode": "dynamic"})):
        text = logged(source, **options)
        assert "calibration holds" not in text and "samples (evenly spread)" not in text, \
            (source.name, options, text)
