"""A part's task in the build: checked against the graph's outputs, suggested where none is
declared, and recorded for the manifest with what it keeps."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from .._runtimes.runner.task_figures import keep_for
from .._runtimes.runner.task_spec import task_kind
from ..graph.inspection import io_specs
from .declare import check_keep, check_task
from .suggest import sigmoid_outputs, suggest


def task_for(task: Mapping[str, Any] | None, keep: Mapping[str, float] | None,
             graph: onnx.ModelProto, where: Any) -> dict[str, Any] | None:
    """The declared *task* checked against *graph*'s outputs (SpecError naming --task when it
    does not fit, or --keep when it names a figure the task lacks); None for raw."""
    if task is not None and task_kind(task) != "raw":
        check_task(task, io_specs(graph.graph.output), str(where))
        if task_kind(task) == "tts":
            _speaks(graph, where)
        if keep:
            check_keep(task, keep)
        return dict(task)
    if keep:
        from ..errors import SpecError

        raise SpecError("--keep needs a task to judge: the model's task is raw",
                        "declare it: --task classify (or detect, embed, ctc, segment, vad, "
                        "multilabel)")
    return None


def _speaks(graph: onnx.ModelProto, where: Any) -> None:
    """SpecError naming --task tts where *graph* takes no integer token ids of shape (1, T) (an
    image classifier "spoke" 4 samples a photo)."""
    from ..errors import SpecError
    from ..graph.inspection import graph_inputs

    inputs = io_specs(graph_inputs(graph))
    if not any(i["dtype"].startswith(("int", "uint")) and len(i["shape"]) == 2 for i in inputs):
        raise SpecError(f"--task tts does not fit {where}: a speech model takes integer token "
                        "ids of shape (1, T), this one takes " + ", ".join(
                            f"{i['name']} {i['dtype']} {'x'.join(map(str, i['shape']))}"
                            for i in inputs), "drop --task tts, or build the speech model")


def say_suggestion(graph: onnx.ModelProto, reference: Mapping[str, np.ndarray],
                   labels: Sequence[str] | None, log: Callable[[str], None]) -> str | None:
    """One line where a model that declares no task looks like one (suggest.py); returns the
    --task text suggested (the decision names it again when only the cosine kept INT8 out)."""
    found = suggest(io_specs(graph.graph.output), reference, labels,
                    sigmoid_outputs(graph.graph))
    if not found:
        return None
    text, why = found
    log(f"task: none declared; {why}: --task {text} would judge the candidates by that "
        "task's figures and make run.py infer answer in its terms (raw tensors and cosine "
        "kept)")
    return text


def recorded_task(task: Mapping[str, Any] | None, keep: Mapping[str, float] | None
                  ) -> dict[str, Any] | None:
    """The task as the manifest records it: its parameters and what it keeps (the defaults,
    its own keep, --keep), so that the device's check holds the host's figures."""
    if task is None or task_kind(task) == "raw":
        return None
    return {**task, "keep": keep_for(task, keep)}
