"""What an ONNX file says of itself in its metadata: its class names, and its head's task.

Exporters write them under a few common keys: Ultralytics `names` (a Python dict literal
{0: 'person', ...}), PaddlePaddle `character` (one name per line), Hugging Face `id2label`
(JSON {"0": "cat"}), and `labels` / `classes` / `class_names` (a JSON list, or one name per
line, or comma-separated). Ultralytics also writes the head's task (`task`: detect, segment,
classify, pose, obb).
"""

import ast
import json
from typing import Any

import onnx

KEYS = ("names", "character", "id2label", "labels", "classes", "class_names")
MAX_TEXT = 4 << 20   # a metadata value longer than this is not a list of class names


def class_names(model: onnx.ModelProto) -> tuple[list[str], str] | None:
    """(class names in class order, the metadata key they came from), or None when no common
    key holds a list of names."""
    props = {prop.key: prop.value for prop in model.metadata_props}
    for key in KEYS:
        text = props.get(key)
        if text and len(text) <= MAX_TEXT:
            names = _names(key, text)
            if names:
                return names, key
    return None


def _names(key: str, text: str) -> list[str] | None:
    if key == "character":
        return [line for line in text.splitlines() if line.strip()]
    value: Any = None
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(text)
            break
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            continue
    if isinstance(value, dict):
        try:
            order = sorted(value, key=lambda k: int(k))
        except (TypeError, ValueError):
            return None
        if [int(k) for k in order] != list(range(len(order))):
            return None   # not every class 0..N-1 named
        return [str(value[k]) for k in order]
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    if value is None and key != "names":
        split = text.splitlines() if "\n" in text else text.split(",")
        return [s.strip() for s in split if s.strip()]
    return None


def head_task(model: onnx.ModelProto) -> str:
    """The task the exporter wrote for the model's head ('detect' for an Ultralytics YOLO
    detector), or ''."""
    props = {prop.key: prop.value for prop in model.metadata_props}
    task = props.get("task", "").strip()
    return task if task.isidentifier() and len(task) <= 32 else ""
