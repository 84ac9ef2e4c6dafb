"""A part's static input shapes, found before anything slow runs (from --input, the
preprocessing size or the first calibration tensor), and its declared task checked against the
graph at those shapes: a task that cannot fit a later part stops the build before the first
part's search, not after it."""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..graph.inspection import dims_of, graph_inputs
from ..graph.modelio import load_model
from ..graph.shapes import fix_shapes_proto
from ..quantization.calibration import peek_shapes
from ..quantization.preprocessing import spec_shape
from ..tasks.part import task_for


def shapes_for(model, shapes: Mapping[str, Sequence[int]], preprocess, calib: Path | None,
               batch: int) -> dict[str, list[int]]:
    """--input shapes first, then the preprocessing size, then the first calibration tensor."""
    resolved = {k: list(v) for k, v in shapes.items()}
    inputs = graph_inputs(model)
    dynamic = [i for i in inputs if i.name not in resolved and
               not all(isinstance(d, int) and d > 0 for d in dims_of(i))]
    if not dynamic:
        return resolved
    if preprocess and len(inputs) == 1:
        resolved[inputs[0].name] = spec_shape(preprocess, batch)
    elif calib is not None:
        peeked = peek_shapes(calib)
        for value in dynamic:
            shape = peeked.get(value.name) or (peeked.get("") if len(inputs) == 1 else None)
            if shape and len(shape) == len(dims_of(value)):
                resolved[value.name] = shape
    return resolved


def check_task_early(source: Any, task: Mapping[str, Any] | None,
                     keep: Mapping[str, float] | None, shapes: Mapping[str, Sequence[int]],
                     preprocess, calib: Path | None, batch: int) -> None:
    """SpecError now when the declared *task* cannot fit the .onnx *source*'s outputs at its
    static shapes (an alphabet one entry short, a head that is not a detector's); a PyTorch
    source is checked once exported, where the part's stages check every task anyway."""
    if task is None or not isinstance(source, str | Path) or not str(source).endswith(".onnx") \
            or not Path(source).is_file():
        return
    try:
        proto = load_model(Path(source), check=False, external_data=False)
        fixed = fix_shapes_proto(proto, shapes_for(proto, shapes, preprocess, calib, batch),
                                 batch=batch, strict=False)
    except Exception:  # noqa: BLE001 - the part's own stages say what is wrong with the model
        return
    task_for(task, keep, fixed, source)
