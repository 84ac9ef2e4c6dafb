"""A bundle in `compare`: its shipped graph as one more row ("shipped"), timed and judged beside
the alternatives built from the original model; a bundle folder or an INT8 graph given as the
model itself is refused with the way to do it (it used to read as "no such file", or as the
ORT FP32 reference, followed by raw onnxruntime errors)."""

from pathlib import Path
from typing import Any

from .errors import PackagerError

SHIPPED = "shipped"


def refuse_as_model(source: Any, model: Any = None) -> None:
    """PackagerError when *source* is a bundle folder, or *model* (its loaded graph) holds
    quantized ops: compare starts from the float model the bundle was built from."""
    from .graph.quantized import quantized_ops, quantized_summary

    path = Path(str(source))
    if path.is_dir() and (path / "manifest.json").is_file():
        raise PackagerError(f"{source}: an edgepack bundle, not a model",
                            "pass the model you built it from, and the bundle as --bundle "
                            f"{source} (its shipped graph becomes a 'shipped' row)")
    found = quantized_ops(model.graph) if model is not None else {}
    if found:
        raise PackagerError(f"{source}: the model is quantized already "
                            f"({quantized_summary(found)}); compare builds its rows from the "
                            "float model", "pass the float model, and a bundle's INT8 as "
                            "--bundle DIR (a 'shipped' row)")


def shipped_graph(bundle: Path) -> dict[str, Any]:
    """{"path", "label", "batch", "audio_rate"} of the graph *bundle* ships for the CPU
    provider (its first part), read through the manifest as verify reads it (audio_rate: a
    tts task's sample rate, else None)."""
    from ._runtimes.runner.task_spec import settings, task_kind
    from .bundle.manifest import read_manifest

    manifest = read_manifest(bundle)
    if manifest.get("pipeline"):   # its first part is no whole model (it was exit 3)
        raise PackagerError(f"--bundle {bundle}: a pipeline's bundle; compare takes it with "
                            "the pipeline file it was built from",
                            f"edgepack compare PIPELINE.toml --bundle {bundle}")
    part = manifest["parts"][0]
    precision = (part.get("precision") or {}).get("description") or \
        (part.get("precision") or {}).get("precision") or "?"
    shape = part["inputs"][0]["shape"] if part["inputs"] else [1]
    task = part.get("task") or {}
    return {"path": Path(bundle) / part["model"]["file"], "batch": int(shape[0]) if shape else 1,
            "label": f"{SHIPPED} ({manifest['name']}: {precision})",
            "audio_rate": settings(task)["rate"] if task_kind(task) == "tts" else None}
