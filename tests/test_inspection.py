import onnx

from packager.graph.inspection import inspect_model
from packager.quantization.quantize import QuantConfig, quantize
from packager.targets import load_target


def test_inspect_describes_a_real_export(cnn_onnx):
    info = inspect_model(cnn_onnx)
    assert info["opset"] == 17
    assert info["inputs"] == [{"name": "image", "shape": ["batch", 3, 32, 32], "dtype": "float32"}]
    assert info["outputs"][0]["name"] == "scores"
    assert info["ops"]["Conv"] == 3
    # conv weights 3*16*9+16 + 16*32*9+32 + 32*32*9+32, linear 32*10+10
    assert info["parameters"] == 432 + 16 + 4608 + 32 + 9216 + 32 + 330
    assert info["parameter_bytes"] == 4 * info["parameters"]
    assert info["quantized"] is False
    assert info["external_data"] == []


def test_flops_counted_once_shapes_are_static(cnn_onnx, tmp_path):
    from packager.graph.shapes import fix_shapes

    static = fix_shapes(cnn_onnx, tmp_path / "s.onnx", shapes={}, batch=1).output
    # convs: 2*(16*32*32*27 + 32*16*16*144 + 32*16*16*288) + linear 2*10*32
    assert inspect_model(static)["flops"] == 2 * (442368 + 1179648 + 2359296) + 640


def test_inspect_sees_quantization_and_external_data(cnn_onnx, image_dir, tmp_path):
    from conftest import PREP
    from packager.graph.shapes import fix_shapes
    from packager.quantization.calibration import load_samples

    static = fix_shapes(cnn_onnx, tmp_path / "s.onnx", shapes={}, batch=1).output
    samples = load_samples(image_dir, inputs=[{"name": "image", "shape": [1, 3, 32, 32],
                                               "dtype": "float32"}], preprocess=PREP)
    q = quantize(static, tmp_path / "q.onnx",
                 config=QuantConfig.from_preset(load_target("x86_64-cpu").quantization),
                 samples=samples[:4])
    assert inspect_model(q)["quantized"] is True

    model = onnx.load(str(static))
    onnx.save_model(model, str(tmp_path / "ext.onnx"), save_as_external_data=True,
                    location="ext.onnx.data", size_threshold=0)
    assert inspect_model(tmp_path / "ext.onnx")["external_data"] == ["ext.onnx.data"]


def test_inspect_counts_weights_held_in_constant_nodes(tmp_path):
    """Issue 36: a model whose weights are Constant nodes (tf2onnx, paddle2onnx exports) was
    said to have 0 parameters; they count now, and the line says how many sit in Constants."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from packager.graph.inspection import inspect_model

    weight = numpy_helper.from_array(np.ones((64, 32), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["w"], value=weight),
         helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])])
    path = tmp_path / "const.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    info = inspect_model(path)
    assert info["parameters"] == 64 * 32 == info["parameters_in_constant_nodes"]
    assert info["parameter_bytes"] == 64 * 32 * 4
