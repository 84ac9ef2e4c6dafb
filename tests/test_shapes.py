import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import save
from packager.errors import ShapeError
from packager.graph.inspection import dims_of
from packager.graph.shapes import fix_shapes


def all_static(path):
    m = onnx.load(str(path))
    values = list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input)
    return all(all(isinstance(d, int) and d > 0 for d in dims_of(v)) for v in values)


def test_dynamic_batch_becomes_static_everywhere(cnn_onnx, tmp_path):
    r = fix_shapes(cnn_onnx, tmp_path / "s.onnx", shapes={"image": [4, 3, 32, 32]})
    assert r.inputs == {"image": [4, 3, 32, 32]}
    assert r.outputs == {"scores": [4, 10]}
    assert all_static(r.output)
    assert len(onnx.load(str(r.output)).graph.value_info) > 5


def test_batch_default_fixes_dim0(cnn_onnx, tmp_path):
    assert fix_shapes(cnn_onnx, tmp_path / "s.onnx", shapes={}, batch=1).inputs == {
        "image": [1, 3, 32, 32]}


def test_unknown_input_and_rank_mismatch(cnn_onnx, tmp_path):
    with pytest.raises(ShapeError, match="'img'.*inputs are: image"):
        fix_shapes(cnn_onnx, tmp_path / "s.onnx", shapes={"img": [1, 3, 32, 32]})
    with pytest.raises(ShapeError, match="rank 4"):
        fix_shapes(cnn_onnx, tmp_path / "s.onnx", shapes={"image": [1, 3, 32]})
    assert not (tmp_path / "s.onnx").exists()


def test_input_redeclares_a_size_the_model_fixed_when_the_graph_runs_at_it(tmp_path):
    """Exporters fix sizes a convolutional graph does not depend on (CenterFace ships as
    10x3x32x32): --input may re-declare them; a graph with a size baked into a Reshape is
    refused by name, with the size it does run at."""
    def model(reshape_to):
        nodes = [helper.make_node("Relu", ["x"], ["r"])]
        if reshape_to:
            nodes.append(helper.make_node("Reshape", ["r", "to"], ["y"]))
        else:
            nodes.append(helper.make_node("ReduceMean", ["r"], ["y"], axes=[2, 3], keepdims=0))
        inits = [onnx.numpy_helper.from_array(np.array(reshape_to, np.int64), "to")] if reshape_to else []
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [10, 3, 32, 32])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, reshape_to or [10, 3])], inits)
        return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                    tmp_path / f"m{len(reshape_to)}.onnx")

    r = fix_shapes(model([]), tmp_path / "a.onnx", shapes={"x": [1, 3, 48, 64]})
    assert r.inputs == {"x": [1, 3, 48, 64]} and r.outputs == {"y": [1, 3]}
    with pytest.raises(ShapeError, match=r"'x' is declared 10x3x32x32 in the model and --input "
                                         r"gives 1x3x48x64, but the model does not run"):
        fix_shapes(model([10, 3, 1024]), tmp_path / "b.onnx", shapes={"x": [1, 3, 48, 64]})
    assert not (tmp_path / "b.onnx").exists()


def test_unfixable_symbolic_dim_names_the_input(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq"])])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
               tmp_path / "m.onnx")
    with pytest.raises(ShapeError, match=r"input 'x' dim 1 \('seq'\).*--input x:1xN"):
        fix_shapes(src, tmp_path / "s.onnx", shapes={})


def test_data_dependent_shape_names_the_tensor(tmp_path):
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["nz"], name="find")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("nz", TensorProto.INT64, [2, "n"])])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
               tmp_path / "m.onnx")
    from packager.graph.modelio import load_model
    from packager.graph.shapes import fix_shapes_proto

    with pytest.raises(ShapeError, match="tensor 'nz' \\(output of NonZero node 'find'\\) stays "
                                         "dynamic"):
        fix_shapes_proto(load_model(src), {})   # strict: what a caller that needs them gets
    # fix-shapes writes the file: a run at the static shapes shows 'nz' depends on the data
    assert fix_shapes(src, tmp_path / "s.onnx", shapes={}).dynamic == ["nz"]
