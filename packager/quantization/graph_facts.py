"""Facts about a graph and its quantized variants that the INT8 search decides by: how many heavy
ops run in INT8, the Q/DQ boundaries onnxruntime leaves after fusing, each op's multiply-adds,
the post-processing tail, the first and last layers, and which quantizer settings saturate."""

from pathlib import Path

import onnx

from .quantize import QuantConfig

HEAVY_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
INTEGER_OPS = {"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger",
               "DynamicQuantizeMatMul", "QGemm"}


QUANTIZE_OPS = ("QuantizeLinear", "DynamicQuantizeLinear")


def count_ops(path: Path) -> tuple[int, int]:
    """(heavy ops computed in INT8, float -> int8 edges onnxruntime runs) of a quantized model.

    The edges are the quantize nodes left after onnxruntime's own fusion, which folds every
    DQ -> op -> Q it has an integer kernel for (QLinearConv, QLinearSigmoid, QLinearAdd...).
    The file's own count misleads: NudeNet's preset has 243 quantize nodes and 4 left when it
    runs, its heavy-ops-only variant 123 and 59 (0.2 against 4.8 ms of Q/DQ), so the preset,
    1.7-1.9x FP32 here against 1.1-1.6x, was ranked below it and never timed."""
    return count_int8(path), fused_boundaries(path)


def count_int8(path: Path) -> int:
    graph = onnx.load(str(path), load_external_data=False).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return sum(1 for n in graph.node if n.op_type in INTEGER_OPS or
               (n.op_type in HEAVY_OPS and any(i in dequantized for i in n.input)))


def quantize_nodes(path: Path) -> int:
    graph = onnx.load(str(path), load_external_data=False).graph
    return sum(1 for n in graph.node if n.op_type in QUANTIZE_OPS)


def fused_boundaries(path: Path) -> int:
    """Quantize nodes in the graph onnxruntime's CPU provider runs (the file's, if it will not
    write that graph out)."""
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="edgepack-fused-") as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        so.optimized_model_filepath = str(Path(tmp) / "fused.onnx")
        try:
            ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            return quantize_nodes(Path(tmp) / "fused.onnx")
        except Exception:   # (a graph over 2 GiB is not written out): the file's own count
            return quantize_nodes(path)


DYNAMIC_OPS = ("MatMul", "Attention", "LSTM")   # what dynamic INT8 computes fast (not Conv)


def dynamic_ops(graph: onnx.GraphProto) -> tuple[str, ...]:
    """Op types worth quantizing dynamically. onnxruntime's dynamic quantizer turns Conv into
    ConvInteger, which its CPU kernels compute several times slower than a float Conv (PP-OCRv4's
    recogniser: 107 ms against 17 ms), so Conv is left float whenever the graph has Convs."""
    present = {n.op_type for n in graph.node}
    return tuple(op for op in DYNAMIC_OPS if op in present)


def boundary_floor(graph: onnx.GraphProto) -> int:
    """The fewest Q/DQ boundaries a heavy-ops-only QDQ graph can have: each heavy node's
    activation inputs and its output are quantized (ResNet-18: 39 against the preset's 33)."""
    weights = {i.name for i in graph.initializer}
    tensors = set()
    for node in graph.node:
        if node.op_type in HEAVY_OPS:
            tensors.update(i for i in node.input[:2] if i and i not in weights)
            tensors.update(node.output[:1])
    return len(tensors)


def saturates(config: QuantConfig) -> bool:
    """U8 activations times S8 weights with full 8-bit weights: x86 CPUs without VNNI multiply
    them with VPMADDUBSW, whose int16 pair sums overflow (255*127*2 > 32767), and a model can
    lose most of its accuracy there (PaddleOCR's text-direction classifier: cosine 0.09 fused,
    0.99 with the same ranges unfused). 7-bit weights (reduce_range) cannot overflow. Dynamic
    quantization always takes U8 activations, whatever the preset says."""
    return (config.precision == "int8" and config.weight_type == "int8"
            and (config.activation_type == "uint8" or config.mode == "dynamic")
            and not config.reduce_range)


TINY_SHARE = 0.005   # a heavy op with less than this share of the graph's MACs is decode work


def macs(graph: onnx.GraphProto) -> dict[int, int | None]:
    """Multiply-accumulates of each heavy node (by its index in the graph) from its weight and
    output shapes; None where the shapes are not known (such a node counts as substantial)."""
    weights = {i.name: list(i.dims) for i in graph.initializer}
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(graph.value_info) + list(graph.output)}
    found: dict[int, int | None] = {}
    for index, node in enumerate(graph.node):
        if node.op_type not in HEAVY_OPS:
            continue
        w = weights.get(node.input[1]) if len(node.input) > 1 else None
        out = shapes.get(node.output[0])
        if not w or not out or not all(out):
            found[index] = None
            continue
        per_output = 1
        for dim in (w[:1] if node.op_type in ("MatMul", "Gemm") else w[1:]):
            per_output *= dim   # MatMul/Gemm: K (weights K x N); Conv: Cin/group x kernel
        elements = 1
        for dim in out:
            elements *= dim
        found[index] = elements * per_output
    return found


def post_processing(graph: onnx.GraphProto) -> list[str]:
    """Nodes after the last substantial heavy op on every path to the outputs (a detector's
    decode: Concat, Split, Softmax, YOLOv8's 16-to-1 DFL conv, Sigmoid, Mul by the strides).
    INT8 saves nothing there, and one Q/DQ range over tensors of different scales erases the
    small ones: YOLOv8 concatenates box logits with class logits before its DFL, and quantized
    as one tensor the class scores lost detections (NudeNet: recall 24% at cosine 0.998, which
    the boxes dominate)."""
    nodes = list(graph.node)
    cost = macs(graph)
    total = sum(c for c in cost.values() if c is not None) or 1
    substantial = {i for i, c in cost.items() if c is None or c >= TINY_SHARE * total}
    users: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        for i in node.input:
            users.setdefault(i, []).append(index)
    feeds_heavy = [False] * len(nodes)
    for index in reversed(range(len(nodes))):   # (topological order: consumers first)
        feeds_heavy[index] = any(u in substantial or feeds_heavy[u]
                                 for o in nodes[index].output for u in users.get(o, []))
    producer = {o: index for index, n in enumerate(nodes) for o in n.output}
    after_heavy = [False] * len(nodes)
    for index, node in enumerate(nodes):
        after_heavy[index] = any(producer[i] in substantial or after_heavy[producer[i]]
                                 for i in node.input if i in producer)
    # a Relu/Clip right after a large op is folded into its integer kernel's output range
    folded = {index for index, n in enumerate(nodes) if n.op_type in ("Relu", "Clip")
              and n.input and producer.get(n.input[0]) in substantial}
    return [n.name for index, n in enumerate(nodes) if n.name and index not in substantial
            and index not in folded and after_heavy[index] and not feeds_heavy[index]]


def last_layers(graph: onnx.GraphProto) -> list[str]:
    """The last heavy node before each graph output: a detector's heads (CenterFace has four:
    heatmap, scale, offset, landmarks), a classifier's one."""
    producer = {o: n for n in graph.node for o in n.output}
    found: list[str] = []
    for out in graph.output:
        todo, seen = [out.name], set()
        while todo:
            node = producer.get(todo.pop(0))
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type in HEAVY_OPS:
                if node.name and node.name not in found:
                    found.append(node.name)
                continue
            todo.extend(node.input)
    return found


def entropy_differs() -> bool:
    """Whether onnxruntime's quantize_static passes histogram bins to its entropy calibrator.
    Up to 1.32 it does not: the calibrator keeps 128 bins for 128 quantized levels, so its
    threshold is the histogram's end and its ranges are MinMax's (CenterFace: cosine 0.7346
    with either), and an entropy variant only costs a search its histograms."""
    import importlib
    import inspect

    try:
        module = importlib.import_module("onnxruntime.quantization.quantize")
        return "CalibNumBins" in inspect.getsource(module.quantize_static)
    except (ImportError, OSError, TypeError, AttributeError):   # no source: try it anyway
        return True


def heavy_nodes(path: Path) -> list[onnx.NodeProto]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return [n for n in graph.node if n.op_type in HEAVY_OPS]

