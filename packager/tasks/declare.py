"""A part's declared task: `--task KIND[:key=value,...]` or `--task FILE.toml`, and `--keep`.

The task object is what the manifest records as `parts[i].task` and what the runner's heads
read (runtimes/runner/task_spec.py holds its kinds, parameters and their check). Text forms:

    --task classify                          top-1 with the part's --labels
    --task detect:decoder=yolov8,score=0.3   key=value pairs: numbers, true/false, text
    --task ctc:alphabet=@chars.txt,blank=0   @FILE: a list, one entry per line
    --task ocr.toml                          kind = "ctc", alphabet = [...], [keep] top1 = 0.99
    --task rec=ctc:alphabet=@keys.txt        one part of a --part build
    --task multilabel:output=notes|onsets,threshold=0.3|0.5   a list: entries split by '|'
"""

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._runtimes.runner.errors import BundleError
from .._runtimes.runner.task_figures import keep_for, parse_keep
from .._runtimes.runner.task_spec import KINDS, PARAMETERS, task_kind, task_problem
from ..errors import SpecError
from ..textfile import read_text

LIST_KEYS = ("labels", "alphabet", "outputs")   # parameters that are lists (@FILE reads one)
NUMBER_LISTS = ("output", "threshold")   # multilabel's: 'a|b' lists, each entry a number or name
MAX_LIST_FILE = 10_000_000


def parse_tasks(values: Sequence[str], parts: Sequence[str]) -> dict[str, dict[str, Any]]:
    """{part name: task} from the --task values; a value without PART= is every part's when
    there is one part (*parts*: the build's part names)."""
    tasks: dict[str, dict[str, Any]] = {}
    for text in values:
        head, sep, rest = text.partition("=")
        part = None
        if sep and ":" not in head and head not in KINDS and not head.endswith(".toml"):
            part, text = head, rest
        if part is None:
            if len(parts) != 1:
                raise SpecError(f"--task {text}: which part is it for?",
                                f"prefix it with the part: --task {parts[0]}={text}")
            part = parts[0]
        if part not in parts:
            raise SpecError(f"--task {part}=...: no part '{part}'",
                            f"parts: {', '.join(parts)}")
        if part in tasks:
            raise SpecError(f"--task given twice for {part}", "give one --task per part")
        tasks[part] = parse_task(text)
    return tasks


def parse_task(text: str) -> dict[str, Any]:
    """One task object from `KIND[:key=value,...]` or a .toml file's path."""
    text = text.strip()
    if text.endswith(".toml"):
        return _from_toml(Path(text))
    kind, _, params = text.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise SpecError(f"--task {text[:60]}: no task kind '{kind[:30]}'",
                        f"kinds: {', '.join(KINDS)} (or a .toml file)")
    task: dict[str, Any] = {"kind": kind}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(f"--task {text[:60]}: '{item[:40]}' is not key=value",
                            f"for example --task {kind}:{_example(kind)}")
        if key not in PARAMETERS[kind] and key != "keep":
            known = ", ".join(PARAMETERS[kind]) or "none"
            raise SpecError(f"--task {text[:60]}: a {kind} task has no parameter '{key[:30]}'",
                            f"its parameters: {known}")
        task[key] = _value(key, value.strip(), text)
    if "keep" in task:
        task["keep"] = keep_of(str(task["keep"]).replace(";", ","), task)
    return task


def _example(kind: str) -> str:
    return {"classify": "top=5", "detect": "decoder=yolov8,score=0.25", "embed": "pooling=mean",
            "ctc": "alphabet=@chars.txt", "segment": "threshold=0.5",
            "vad": "threshold=0.5", "multilabel": "threshold=0.5",
            "tts": "rate=24000"}.get(kind, "key=value")


def _value(key: str, value: str, text: str) -> Any:
    if value.startswith("@"):
        return _list_file(Path(value[1:]), f"--task {text[:60]}: {key}")
    if key in LIST_KEYS and "|" in value:
        return value.split("|")
    if key in NUMBER_LISTS and "|" in value:
        return [_value(key, v.strip(), text) for v in value.split("|")]
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _list_file(path: Path, where: str) -> list[str]:
    """One entry per line (a CTC alphabet's characters, labels): the file as given, only the
    line ends dropped (a space is a character of some alphabets)."""
    lines = read_text(path, cap=MAX_LIST_FILE, where=where,
                      fix="pass a UTF-8 text file, one entry per line").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def _from_toml(path: Path) -> dict[str, Any]:
    text = read_text(path, cap=MAX_LIST_FILE, where="--task",
                     fix=f"pass a task .toml file or a kind ({', '.join(KINDS)})")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"--task {path}: cannot read it ({exc})",
                        "fix the TOML (kind = \"classify\", ...)") from None
    kind = data.get("kind")
    if kind not in KINDS:
        raise SpecError(f"--task {path}: kind = {kind!r:.40} is not one of {', '.join(KINDS)}",
                        "set kind = \"classify\" (or another)")
    task: dict[str, Any] = {}
    for key, value in data.items():
        if key.endswith("_file") and key[:-5] in LIST_KEYS:   # alphabet_file = "chars.txt"
            task[key[:-5]] = _list_file(path.parent / str(value), f"--task {path}: {key}")
        elif key in PARAMETERS[kind] or key in ("kind", "keep"):
            task[key] = value
        else:
            raise SpecError(f"--task {path}: a {kind} task has no key '{key[:30]}'",
                            f"its keys: kind, keep, {', '.join(PARAMETERS[kind])}")
    if "keep" in task:
        if not isinstance(task["keep"], dict):
            raise SpecError(f"--task {path}: keep must be a table ([keep] top1 = 0.99)",
                            "write [keep] and one FIGURE = VALUE per line")
        task["keep"] = keep_of(",".join(f"{k}={v}" for k, v in task["keep"].items()), task)
    return task


def keep_of(text: str, task: Mapping[str, Any] | None) -> dict[str, float]:
    """--keep's text as {figure: value}, checked against the task's figures."""
    try:
        keep = parse_keep(text)
        if task is not None:
            keep_for({k: v for k, v in task.items() if k != "keep"}, keep)
    except BundleError as exc:
        raise SpecError(str(exc), "for example --keep top1=99% (figures: top1 for classify, "
                        "recall and precision for detect, retrieval1 and cosine for embed, "
                        "exact and cer for ctc, pixels for segment, frames for vad, f1 for "
                        "multilabel)") from None
    return keep


def check_keep(task: Mapping[str, Any], keep: Mapping[str, float]) -> None:
    """SpecError naming --keep when *keep* names a figure *task* does not have."""
    try:
        keep_for(dict(task), dict(keep))
    except BundleError as exc:
        raise SpecError(str(exc), "name the task's own figures") from None


def check_task(task: Mapping[str, Any] | None, outputs: Sequence[Mapping[str, Any]],
               where: str) -> None:
    """SpecError naming --task when *task* does not fit the model's *outputs* ({name, shape})."""
    if task is None or task_kind(task) == "raw":
        return
    problem = task_problem(dict(task), [dict(o) for o in outputs])
    if problem:
        shapes = ", ".join(o["name"] + " " + "x".join(map(str, o["shape"])) for o in outputs)
        raise SpecError(f"--task {task['kind']} does not fit {where}: {problem}",
                        f"outputs: {shapes}")
