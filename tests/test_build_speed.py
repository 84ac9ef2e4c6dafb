"""What keeps builds short without changing what they ship: no torch import for an .onnx
build's shape inference. (Wall-clock figures live in `make zoo`'s per-stage times, never here.)"""

import subprocess
import sys


def test_the_symbolic_shape_engine_loads_without_importing_torch():
    code = ("import sys; from packager.graph.shapes import symbolic_engine; "
            "engine = symbolic_engine(); print(hasattr(engine, 'infer_shapes'), "
            "'torch' in sys.modules, 'onnxruntime.tools' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["True", "False", "False"]
