"""Load weights safely: .safetensors, or .pt/.pth with weights_only=True. Never unpickle code."""

import pickle
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ExportError

NESTED_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "weights")
WRAPPER_PREFIXES = ("module.", "_orig_mod.")   # DataParallel / DDP, torch.compile

CONVERT = ("convert it once, where you trust the file: python -c \"import torch; "
           "from safetensors.torch import save_file; "
           "sd = torch.load('{name}', weights_only=False); "
           "save_file(sd.get('state_dict', sd) if isinstance(sd, dict) else sd.state_dict(), "
           "'{stem}.safetensors')\" and pass --weights {stem}.safetensors")


def is_torchscript(path: Path) -> bool:
    """A TorchScript archive is a zip with a code/ folder; torch.save checkpoints have none."""
    try:
        with zipfile.ZipFile(path) as z:
            return any("/code/" in n for n in z.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def read_state_dict(path: Path) -> dict[str, Any]:
    """Return {name: tensor} from a .safetensors or weights-only .pt/.pth file."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise ExportError(f"--weights {path}: no such file", "check the path")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return dict(load_file(str(path), device="cpu"))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ExportError(f"--weights {path}: not a readable safetensors file ({exc})",
                              "save it again with safetensors.torch.save_file") from None
    if path.suffix not in (".pt", ".pth", ".bin", ".ckpt"):
        raise ExportError(f"--weights {path}: unknown weights format '{path.suffix}'",
                          "use .safetensors, or a .pt/.pth saved with torch.save(state_dict)")
    if is_torchscript(path):
        raise ExportError(f"--weights {path}: this is a TorchScript model, not a state dict",
                          f"pass it as the model itself: edgepack export {path} --input ...")
    try:
        data = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" (it references {found.group(1)})" if found else ""
        raise ExportError(
            f"--weights {path}: refused: loading it needs pickle to run code from the file{what}, "
            "and edgepack loads checkpoints with weights_only=True only",
            CONVERT.format(name=path.name, stem=path.stem)) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ExportError(f"--weights {path}: not a readable PyTorch checkpoint ({first})",
                          "save it again with torch.save(model.state_dict(), path)") from None
    return _unwrap(data, path)


def _unwrap(data: Any, path: Path) -> dict[str, Any]:
    import torch

    if isinstance(data, torch.nn.Module):  # cannot happen with weights_only, kept for clarity
        return data.state_dict()
    if not isinstance(data, Mapping):
        raise ExportError(f"--weights {path}: holds a {type(data).__name__}, not a state dict",
                          "save model.state_dict() instead")
    if data and all(isinstance(v, torch.Tensor) for v in data.values()):
        return dict(data)
    for key in NESTED_KEYS:
        inner = data.get(key)
        if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor)
                                                         for v in inner.values()):
            return dict(inner)
    raise ExportError(f"--weights {path}: no state dict found (top-level keys: "
                      f"{', '.join(map(str, list(data)[:8]))})",
                      f"save model.state_dict(), or put it under one of: {', '.join(NESTED_KEYS)}")


def apply_state_dict(module: Any, state: Mapping[str, Any], path: Path) -> int:
    """Load *state* into *module* strictly; name missing, unexpected and mis-shaped keys."""
    own = module.state_dict()
    state = _strip_prefixes(dict(state), own)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} (file {_dims(state[k])}, model {_dims(own[k])})" for k in own
              if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected),
                            ("wrong shape", shapes)):
            if keys:
                shown = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
                parts.append(f"{len(keys)} {label}: {shown}")
        raise ExportError(f"--weights {path} does not match the model: {'; '.join(parts)}",
                          "check the factory and its --factory-arg values (or --submodule): "
                          "the weights were saved from a differently built model")
    module.load_state_dict(state, strict=True)
    return len(state)


def _strip_prefixes(state: dict[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    for prefix in WRAPPER_PREFIXES:
        if state and all(k.startswith(prefix) for k in state) and \
                not any(k.startswith(prefix) for k in own):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def _dims(tensor: Any) -> str:
    return "x".join(map(str, tensor.shape)) or "scalar"
