"""forward() arguments: which ones the exported graph takes as inputs, which ones stay Python
values (`--const`, and every default not fed), and a module that takes the fed ones only.

torch.onnx appends every unfed default to the example arguments and traces a Python `False`
as a tensor, so `if embed:` on a bool default reads as a branch on a tensor's value. Calling
forward through a function that takes only the fed tensors keeps those values Python values.
"""

import copy
import inspect
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ExportError, PackagerError
from .torchload import first_line, is_library_file, user_code, user_location

NUMBER_TYPES = ("int", "float", "bool", "number", "Scalar")
# a tensor's value leaving as Python numbers or an array: what follows is no longer traceable
ESCAPES = ("__int__", "__float__", "__index__", "__complex__", "item", "tolist", "numpy",
           "__array__")


@dataclass(frozen=True)
class Param:
    name: str
    positional: bool       # may be passed by position
    required: bool         # no default
    wants: str             # "tensor", "number" or "" (the annotation or TorchScript type says)


def forward_params(module: Any) -> list[Param] | None:
    """forward()'s parameters, from its TorchScript schema or Python signature (**kwargs left
    out); None when they cannot be told (*args, a builtin)."""
    schema = getattr(getattr(module, "forward", None), "schema", None)
    if schema is not None:   # a TorchScript method: its types are declared
        params = []
        for arg in list(schema.arguments)[1:]:
            kind = str(arg.type)
            wants = "number" if kind in NUMBER_TYPES else "tensor" if "Tensor" in kind else ""
            params.append(Param(arg.name, not arg.kwarg_only, not arg.has_default_value(), wants))
        return params
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError, AttributeError):
        return None
    params = []
    for p in signature.parameters.values():
        if p.kind == p.VAR_POSITIONAL:
            return None
        if p.kind == p.VAR_KEYWORD:   # transformers' **kwargs: nothing to feed by position
            continue
        params.append(Param(p.name, p.kind != p.KEYWORD_ONLY, p.default is p.empty,
                            _wants(p.annotation)))
    return params


def _wants(annotation: Any) -> str:
    import torch

    if annotation in (int, float, bool) or annotation in NUMBER_TYPES:
        return "number"
    if annotation is torch.Tensor or annotation in ("Tensor", "torch.Tensor"):
        return "tensor"
    return ""


def describe_params(params: Sequence[Param] | None) -> str:
    return ", ".join(p.name for p in params or ())


@dataclass(frozen=True)
class Binding:
    """How forward() is called: the fed tensors in order, then the fixed values by name."""
    params: tuple[Param, ...]
    fed: tuple[str, ...]                 # the parameters the graph's inputs feed, in order
    consts: Mapping[str, Any]            # parameter -> the value forward() gets (Python or tensor)

    def call(self, forward: Any, tensors: Sequence[Any]) -> Any:
        if len(tensors) != len(self.fed):
            raise TypeError(f"{len(self.fed)} inputs expected, {len(tensors)} given")
        given = dict(zip(self.fed, tensors, strict=True))
        args, kwargs, by_position = [], {}, True
        for p in self.params:
            if p.name in given and by_position and p.positional:
                args.append(given[p.name])
            elif p.name in given:
                kwargs[p.name] = given[p.name]
            elif p.name in self.consts:
                kwargs[p.name] = self.consts[p.name]
                by_position = False
            else:   # its default, as the Python value forward() declares
                by_position = False
        return forward(*args, **kwargs)

    def passed_as(self, name: str) -> str:
        value = self.consts[name]
        if hasattr(value, "dtype") and hasattr(value, "shape") and not isinstance(value, np.ndarray):
            return f"tensor {str(value.dtype).replace('torch.', '')}"
        return type(value).__name__


def bind(params: Sequence[Param], fed: int, consts: Mapping[str, Any]) -> Binding:
    """Feed the first *fed* positional parameters not in *consts*; refuse a required parameter
    left without a value."""
    free = [p for p in params if p.positional and p.name not in consts]
    names = tuple(p.name for p in free[:fed])
    missing = [p.name for p in params if p.required and p.name not in names and
               p.name not in consts]
    if len(free) < fed or missing:
        head = f"forward({describe_params(params)})"
        if len(free) < fed:
            raise ExportError(f"{head} takes at most {len(free)} inputs besides --const "
                              f"{', '.join(consts) or '(none)'}, --input gave {fed}",
                              "give one --input per forward() argument, in order")
        raise ExportError(f"{head}: no value for '{missing[0]}' (--input gave {fed} inputs"
                          + (f", --const {', '.join(consts)}" if consts else "") + ")",
                          f"feed it with --input, or fix it with --const {missing[0]}=VALUE")
    return Binding(tuple(params), names, dict(consts))


def candidates(value: Any, wants: str) -> list[Any]:
    """The forms to try a --const value in: a Python value (number, list), a tensor, or both,
    the form forward()'s annotation or TorchScript type asks for first."""
    import torch

    array = np.asarray(value)
    if array.dtype == np.float64:
        array = array.astype(np.float32)   # a float tensor argument is float32 in PyTorch
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    python = value.tolist() if isinstance(value, np.ndarray) else \
        list(value) if isinstance(value, tuple) else value
    if wants == "tensor":
        return [tensor]
    if wants == "number":
        return [python]
    # a number is most often a Python number (`if sr == 16000:`); a list or .npy a tensor
    return [python, tensor] if isinstance(value, int | float | bool) else [tensor, python]


def bound_module(module: Any, binding: Binding, example: Sequence[Any]) -> Any:
    """*module*, called with the fed tensors only. A Python module is copied shallowly with its
    own forward (its submodules, and so the exported graph's names, are the same objects). A
    TorchScript module is traced through a wrapper on *example*: torch.onnx converts a script
    module's own graph, in which the argument is still free, and refuses to trace a call into one."""
    import torch

    if isinstance(module, torch.jit.ScriptModule):
        class Bound(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = module

            def forward(self, *tensors: Any) -> Any:
                return binding.call(self.inner, tensors)

        with torch.no_grad():
            return torch.jit.trace(Bound().eval(), tuple(example), check_trace=False)
    original = module.forward
    bound = copy.copy(module)

    def forward(*tensors: Any) -> Any:
        return binding.call(original, tensors)

    object.__setattr__(bound, "forward", forward)
    return bound


def traced(module: Any, binding: Binding, feed: Sequence[np.ndarray], what: str) -> Any:
    """bound_module() on the arrays *feed*; a failure is the user's forward() failing."""
    import torch

    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in feed]
    try:
        with warnings.catch_warnings(), user_code("forward()"):
            warnings.simplefilter("ignore")   # the export's own trace reports what matters
            return bound_module(module, binding, tensors)
    except PackagerError:
        raise
    except Exception as exc:
        where = user_location(exc.__traceback__)
        raise ExportError(f"forward() failed on {what}{' at ' + where if where else ''}: "
                          f"{first_line(exc)}", "check that --input shapes and dtypes match "
                          "what forward() expects") from None


def shown(value: Any) -> str:
    """A --const value for a log line."""
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def plain(value: Any) -> Any:
    """A --const value as JSON holds it (the manifest records it)."""
    return value.tolist() if isinstance(value, np.ndarray) else \
        list(value) if isinstance(value, tuple) else value


def article(kind: str) -> str:
    """'a Python int', 'a tensor int64': how passed_as() reads in a sentence."""
    return ("a Python " + kind) if kind in ("int", "float", "bool", "list") else "a " + kind


def input_branches(module: Any, tensors: Sequence[Any]) -> set[tuple[str, int]] | None:
    """The user's lines (file, line) where forward() turns a tensor computed from *tensors* (the
    fed inputs) into a Python bool: the data-dependent branches. A branch on a --const, a
    default or a parameter takes the same way for every input and is not one. None when the
    run fails, or an input's value leaves as a Python number (`int(x.sum())`), which this does
    not follow: the caller then treats every branch as data-dependent."""
    import os
    import traceback

    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten

    tainted: dict[int, Any] = {}   # id -> the tensor itself, so a reused id cannot match
    found: set[tuple[str, int]] = set()
    escaped: list[Any] = []

    def is_tainted(value: Any) -> bool:
        return isinstance(value, torch.Tensor) and tainted.get(id(value)) is value

    class Taint(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            leaves = tree_flatten((args, kwargs))[0]
            if not any(is_tainted(v) for v in leaves):
                return result
            if getattr(func, "__name__", "") in ESCAPES:
                escaped.append(func)   # the value goes on as a Python number: not followed
            if getattr(func, "__name__", "") in ("__bool__", "is_nonzero"):
                for frame in reversed(traceback.extract_stack()):
                    if not is_library_file(frame.filename):
                        found.add((os.path.abspath(frame.filename), frame.lineno or 0))
                        break
            written = [kwargs.get("out")] + ([args[0]] if args and (
                getattr(func, "__name__", "").endswith("_") or
                getattr(func, "__name__", "") == "__setitem__") else [])
            for value in tree_flatten(result)[0] + tree_flatten(written)[0]:
                if isinstance(value, torch.Tensor):
                    tainted[id(value)] = value
            return result

    inputs = [t.clone() for t in tensors]
    for t in inputs:
        tainted[id(t)] = t
    try:
        with torch.no_grad(), Taint():
            module(*inputs)
    except Exception:
        return None
    return None if escaped else found
