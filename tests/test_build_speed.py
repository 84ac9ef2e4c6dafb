"""What keeps builds short without changing what they ship: no torch import for an .onnx
build's shape inference. (Wall-clock figures live in `make zoo`'s per-stage times, never here.)"""

import subprocess
import sys


def test_the_symbolic_shape_inference_loads_without_importing_torch():
    code = ("import sys; from packager.graph.shapes import symbolic_inference; "
            "inference = symbolic_inference(); print(hasattr(inference, 'infer_shapes'), "
            "'torch' in sys.modules, 'onnxruntime.tools' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["True", "False", "False"]


def test_the_speed_line_says_when_a_ratio_under_one_is_noise():
    """0.97x 'its speed' for a graph that is the original's read as slower; when the original's
    p50 lies inside the bundle's own p10-p90 the line says it is the same speed within noise."""
    from packager.build.fp32_graph import speed_line

    record = {"measured": True, "bundle_p50_ms": 1.03, "original_p50_ms": 1.0, "speedup": 0.97,
              "bundle_p10_p90_ms": [0.98, 1.09], "measured_on": {"host": "cpu", "cores": 2},
              "load": {"other_share": 0.0, "cores": 2}}
    assert "0.97x its speed" in speed_line(record)
    assert "the same speed within timing noise" in speed_line(record)
    slower = {**record, "bundle_p50_ms": 1.3, "speedup": 0.77, "bundle_p10_p90_ms": [1.25, 1.35]}
    assert "within timing noise" not in speed_line(slower)
    faster = {**record, "bundle_p50_ms": 0.5, "speedup": 2.0, "bundle_p10_p90_ms": [0.45, 1.1]}
    assert "within timing noise" not in speed_line(faster)
