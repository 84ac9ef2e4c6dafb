"""Load a PyTorch model from what a user has: a factory in a file or package, TorchScript, .pt2."""

import ast
import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import sysconfig
import traceback
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ExportError
from .specs import TensorSpec
from .weights import apply_state_dict, is_torchscript, read_state_dict

TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".jit", ".torchscript")
EXPORTED_SUFFIXES = (".pt2",)
_PACKAGER_DIR = str(Path(__file__).resolve().parent)
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                           "platlib")})


@dataclass
class LoadedModel:
    module: Any                       # torch.nn.Module (or ScriptModule / GraphModule)
    kind: str                         # "factory", "torchscript" or "exported-program"
    description: str                  # how it was made, for logs and the manifest
    files: list[Path] = field(default_factory=list)   # source files, hashed into the manifest
    example_inputs: list[TensorSpec] = field(default_factory=list)   # .pt2 files carry these
    weights: dict[str, Any] | None = None


def is_torch_source(spec: str | Path) -> bool:
    """True for `file.py:factory`, `pkg.mod:factory`, TorchScript and .pt2 files."""
    text = str(spec)
    if text.endswith(EXPORTED_SUFFIXES + TORCHSCRIPT_SUFFIXES):
        return True
    left, sep, right = text.rpartition(":")
    return bool(sep and left and right.replace(".", "").replace("_", "").isalnum()
                and not text.endswith(".onnx"))


@contextlib.contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run the user's code (a model file's import, a factory, forward()) inside edgepack: what
    it prints goes to stderr, since stdout carries --json; a chdir is undone, so a relative -o
    stays where it was checked; sys.exit() is an error naming it, not edgepack's exit status.
    (os._exit() cannot be caught: it ends the process at once.)"""
    cwd = os.getcwd()
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)   # C-level writes too
        with contextlib.redirect_stdout(sys.stderr):
            yield
    except SystemExit as exc:
        raise ExportError(f"{what} called sys.exit({exc.code!r})",
                          "a factory must return the model, not exit; edgepack's exit status "
                          "is its own") from None
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)
        with contextlib.suppress(OSError):
            if os.getcwd() != cwd:
                os.chdir(cwd)


def user_location(tb: Any) -> str:
    """'file.py:LINE' of the innermost frame in the user's code (not torch, not edgepack)."""
    frames = traceback.extract_tb(tb) if tb is not None else []
    for frame in reversed(frames):
        if not is_library_file(frame.filename):
            return f"{_short(frame.filename)}:{frame.lineno}"
    return ""


def is_library_file(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGER_DIR) or any(path.startswith(d) for d in _LIBRARY_DIRS)


def _short(filename: str) -> str:
    try:
        return os.path.relpath(filename)
    except ValueError:
        return filename


def first_line(exc: BaseException, limit: int = 240) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {line[:limit]}" if line else type(exc).__name__


def parse_factory_args(values: Mapping[str, str]) -> dict[str, Any]:
    """`width=8`, `name=small`, `dims=(1, 2)`: Python literals, else the text as a string."""
    parsed = {}
    for key, text in values.items():
        if not key.isidentifier():
            raise ExportError(f"--factory-arg {key}={text}: '{key}' is not a Python identifier",
                              "use the factory's keyword argument name")
        try:
            parsed[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            parsed[key] = text
    return parsed


def load_source(spec: str, *, factory_args: Mapping[str, Any] | None = None,
                weights: Path | None = None, submodule: str | None = None) -> LoadedModel:
    """Load *spec* into a module in eval mode, apply *weights*, then pick *submodule*."""
    import torch

    text = str(spec)
    if not is_torch_source(text):
        raise ExportError(f"{text} is not a PyTorch model source",
                          "give path/to/file.py:factory, pkg.module:factory, a TorchScript file "
                          "or a .pt2 file; an .onnx file needs no export (use build or simplify)")
    if text.endswith(EXPORTED_SUFFIXES):
        loaded = _load_exported(Path(text))
    elif text.endswith(TORCHSCRIPT_SUFFIXES):
        loaded = _load_torchscript(Path(text))
    else:
        loaded = _load_factory(text, dict(factory_args or {}))
    if factory_args and loaded.kind != "factory":
        raise ExportError(f"--factory-arg given, but {text} is a saved model, not a factory",
                          "drop --factory-arg")
    if weights is not None:
        state = read_state_dict(Path(weights))
        target = loaded.module
        try:
            count = apply_state_dict(target, state, Path(weights))
        except ExportError:
            if not submodule:
                raise
            target = select_submodule(loaded.module, submodule, text)
            count = apply_state_dict(target, state, Path(weights))  # the part's own weights
        from ..hashing import sha256

        loaded.weights = {"file": Path(weights).name, "sha256": sha256(Path(weights)),
                          "tensors": count}
    if submodule:
        loaded.module = select_submodule(loaded.module, submodule, text)
        loaded.description += f" .{submodule}"
        loaded.example_inputs = []
    if not isinstance(loaded.module, torch.nn.Module):
        raise ExportError(f"{text} gave a {type(loaded.module).__name__}, not a torch.nn.Module",
                          "the factory must return an nn.Module instance")
    loaded.module.eval()
    return loaded


def select_submodule(root: Any, path: str, where: str) -> Any:
    """Walk `decoder.layers.0` into *root*; name the children when a step is missing."""
    import torch

    node = root
    walked = []
    for step in path.split("."):
        children = dict(node.named_children()) if isinstance(node, torch.nn.Module) else {}
        if step in children:
            node = children[step]
        elif hasattr(node, step) and isinstance(getattr(node, step), torch.nn.Module):
            node = getattr(node, step)
        else:
            at = ".".join(walked) or type(root).__name__
            names = ", ".join(list(children)[:12]) or "none"
            raise ExportError(f"--submodule {path}: {at} has no submodule '{step}' (in {where})",
                              f"children of {at}: {names}")
        walked.append(step)
    return node


def _load_factory(spec: str, kwargs: dict[str, Any]) -> LoadedModel:
    left, _, attr = spec.rpartition(":")
    files: list[Path] = []
    if left.endswith(".py"):
        path = Path(left)
        if not path.is_file():
            raise ExportError(f"{path}: no such file", "pass path/to/file.py:factory")
        with user_code(f"importing {path}"):
            namespace = _import_file(path)
        files.append(path)
    else:
        with user_code(f"importing {left}"):
            namespace = _import_module(left)
        if getattr(namespace, "__file__", None):
            files.append(Path(namespace.__file__))
    target: Any = namespace
    for step in attr.split("."):
        if not hasattr(target, step):
            public = sorted(n for n in vars(namespace) if not n.startswith("_")
                            and callable(getattr(namespace, n)))[:12]
            raise ExportError(f"{spec}: {left} has no attribute '{attr}'",
                              f"callables there: {', '.join(public) or 'none'}")
        target = getattr(target, step)
    import torch

    if isinstance(target, torch.nn.Module):
        if kwargs:
            raise ExportError(f"{spec} is a module instance, not a factory; it takes no arguments",
                              "drop --factory-arg, or point at a function that builds the module")
        module = target
    elif callable(target):
        try:
            with user_code(f"the factory {spec}"):
                module = target(**kwargs)
        except ExportError:
            raise
        except TypeError as exc:
            if exc.__traceback__ is not None and exc.__traceback__.tb_next is None:
                raise ExportError(f"calling {spec}({_args(kwargs)}) failed: {first_line(exc)}",
                                  "check the --factory-arg names against the factory's "
                                  "signature") from None
            raise _factory_error(spec, kwargs, exc) from None
        except Exception as exc:
            raise _factory_error(spec, kwargs, exc) from None
    else:
        raise ExportError(f"{spec}: '{attr}' is a {type(target).__name__}, not a callable",
                          "point at a function or class that returns an nn.Module")
    return LoadedModel(module, "factory", f"{spec}({_args(kwargs)})", files)


def _factory_error(spec: str, kwargs: dict[str, Any], exc: Exception) -> ExportError:
    where = user_location(exc.__traceback__)
    return ExportError(f"the factory {spec}({_args(kwargs)}) raised {first_line(exc)}"
                       + (f" at {where}" if where else ""),
                       "fix the factory or its --factory-arg values; --debug shows the traceback")


def _args(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _import_file(path: Path) -> types.ModuleType:
    resolved = path.resolve()
    name = f"_edgepack_user_{hashlib.sha1(str(resolved).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    if str(resolved.parent) not in sys.path:
        sys.path.insert(0, str(resolved.parent))  # so the file can import its neighbours
    spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        raise ExportError(f"{_short(exc.filename or str(path))}:{exc.lineno}: syntax error "
                          f"({exc.msg})", "fix the file") from None
    except Exception as exc:
        del sys.modules[name]
        raise _import_error(str(path), exc) from None
    return module


def _import_module(name: str) -> types.ModuleType:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `edgepack export mypkg.net:build` from the project root
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise ExportError(f"no module named '{name}'",
                              "run edgepack from the folder that holds the package, install it, "
                              "or set PYTHONPATH; a file path works too: path/to/file.py:factory"
                              ) from None
        raise _import_error(name, exc) from None
    except SyntaxError as exc:
        raise ExportError(f"{_short(exc.filename or name)}:{exc.lineno}: syntax error "
                          f"({exc.msg})", "fix the file") from None
    except Exception as exc:
        raise _import_error(name, exc) from None


def _import_error(what: str, exc: Exception) -> ExportError:
    where = user_location(exc.__traceback__)
    hint = "fix the module; --debug shows the traceback"
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        hint = f"install '{exc.name}' into the environment edgepack runs in"
    return ExportError(f"importing {what} failed{' at ' + where if where else ''}: "
                       f"{first_line(exc)}", hint)


def _load_torchscript(path: Path) -> LoadedModel:
    import torch

    if not path.is_file():
        raise ExportError(f"{path}: no such file", "check the path")
    if not is_torchscript(path):
        raise ExportError(
            f"{path}: not a TorchScript model (a pickled checkpoint or state dict?); edgepack "
            "does not unpickle models, because pickle runs code from the file",
            f"pass the code that builds the model as file.py:factory with --weights {path.name}, "
            "or save it with torch.jit.save / torch.export.save")
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        raise ExportError(f"{path}: cannot load the TorchScript model ({first_line(exc)})",
                          "save it again with torch.jit.save") from None
    return LoadedModel(module, "torchscript", f"TorchScript {path.name}", [path])


def _load_exported(path: Path) -> LoadedModel:
    import torch

    if not path.is_file():
        raise ExportError(f"{path}: no such file", "check the path")
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise ExportError(f"{path}: cannot load the torch.export program ({first_line(exc)})",
                          "save it again with torch.export.save from this torch version") from None
    module = program.module()
    # The program's train/eval mode was fixed when it was exported, and it refuses train() and
    # eval() calls, which the TorchScript-based ONNX exporter makes: make them no-ops.
    module.train = types.MethodType(lambda self, mode=True: self, module)
    module.eval = types.MethodType(lambda self: self, module)
    examples = []
    args = (program.example_inputs or ((), {}))[0]
    names = [s.arg.name for s in program.graph_signature.input_specs
             if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    dtypes = {torch.float32: "float32", torch.float16: "float16", torch.int64: "int64",
              torch.int32: "int32", torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8"}
    for name, value in zip(names, args, strict=False):
        if isinstance(value, torch.Tensor) and value.dtype in dtypes:
            examples.append(TensorSpec(name, tuple(value.shape), dtypes[value.dtype]))
    return LoadedModel(module, "exported-program", f"torch.export program {path.name}", [path],
                       examples if len(examples) == len(names) else [])
