"""The small frozen records the build's stages hand on, and the build's settings."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..graph.execute import Sample
from ..progress import Log, Progress
from ..quantization.budget import AccuracyBudget
from ..quantization.quantize import QuantConfig
from ..source.eager_timing import eager_line
from ..source.torchload import LoadedModel
from ..timing import Stages
from .fp32_graph import GraphChoice, speed_line
from .plan import ExportOptions


@dataclass(frozen=True)
class BuildContext:
    """What every part's stages read: the build's settings, its log and its clock."""

    holdout: float
    golden: int | None                  # None: up to 8 within a bound (data.golden_samples)
    options: ExportOptions
    min_cosine: float | None
    max_drop: float | None
    metric: tuple[Any, str] | None
    timer: Any
    log: Log
    progress: Callable[[int, int], None] | None
    clock: Stages
    steps: Progress | None = None
    fuse: bool = True
    openvino: str = "auto"
    keep: Mapping[str, float] | None = None
    require_proof: bool = False         # INT8 only where the samples could show its budget
    feeds_part: bool = False            # the part's outputs feed the next part
    evaluate: Path | None = None        # --eval: a labelled folder apart from calibration


@dataclass(frozen=True)
class Loaded:
    """The part's model as a file: the user's .onnx, or the PyTorch source exported."""

    path: Path
    module: LoadedModel | None          # the PyTorch source, when there is one
    source: dict[str, Any]              # the manifest's `source` section
    export: dict[str, Any] | None       # the export's record (PyTorch sources)
    samples: list[Sample] | None        # loaded before the export (PyTorch sources, --calib)

    @property
    def where(self) -> Path | str:
        """How errors name the model: its file, or "the model" for a PyTorch source."""
        return self.path if self.module is None else "the model"


@dataclass(frozen=True)
class Frozen:
    """The loaded graph with its constant inputs frozen (--const, or one value in every
    calibration sample)."""

    proto: onnx.ModelProto
    nodes: int                          # before anything changed it
    inputs: tuple[str, ...]             # the graph's inputs before freezing
    consts: Mapping[str, np.ndarray]    # frozen here
    argued: Mapping[str, Any]           # forward() arguments the export fixed
    samples: list[Sample] | None
    source: dict[str, Any]              # the manifest's source section, with the frozen values


@dataclass(frozen=True)
class Shaped:
    """The graph with static input shapes, and simplified."""

    fixed: onnx.ModelProto
    simplified: onnx.ModelProto
    simplifier: str
    fallback: str                       # why onnxsim was not used, or ''
    inputs: tuple[dict[str, Any], ...]  # the simplified graph's inputs (io_specs)


@dataclass(frozen=True)
class PartPlan:
    """What the part asks of the build, decided once: its task, family and precision."""

    task: Mapping[str, Any] | None
    family: str
    requested: str                      # int8, fp16, fp32 or auto
    needs_calib: bool                   # forced static INT8: calibration data is required


@dataclass(frozen=True)
class PartData:
    """The part's samples, loaded once: every stage reads these."""

    kind: str                           # "calibration" or "random"
    samples: list[Sample]
    calib: list[Sample]                 # what calibrates (fitted to memory)
    held: list[Sample]                  # held out to judge accuracy
    given: list[Sample]                 # the user's calibration set before fitting

    @property
    def real(self) -> bool:
        return self.kind != "random"

    @property
    def feed(self) -> Sample:
        """The sample graphs are timed and checked on."""
        return (self.held or self.samples)[0]


@dataclass(frozen=True)
class Reference:
    """The FP32 graph candidates are judged against, and how they are judged."""

    choice: GraphChoice
    path: Path                          # the FP32 graph (fused where that won)
    outputs: dict[str, Any]             # its outputs on the held-out samples
    labelled: dict[str, Any] | None     # FP32 top-1 against the user's class folders
    fusion: dict[str, Any] | None
    time_graphs: Any
    why_not: str                        # why latency is not measured here, or ''
    no_original: str                    # why the original does not run, or ''
    guard: AccuracyBudget
    labels_held: list[Any] | None       # --metric's labels of the held-out samples
    evaluated: dict[str, Any] | None = None   # FP32 top-1 on --eval's labelled images
    eval_samples: list[Sample] | None = None  # those images, preprocessed


@dataclass(frozen=True)
class ProviderPick:
    """The graphs the bundle carries beside the CPU provider's, and the faster provider's
    choice (provider_choice.ProviderChoice), if any."""

    graphs: tuple[Any, ...]
    choice: Any


@dataclass(frozen=True)
class Precision:
    """The part's precision record: what ships and why, with its manifest section."""

    config: QuantConfig
    family: str
    calibration_samples: int
    decision: dict[str, Any]
    fp32_graph: dict[str, Any]
    vs_original: dict[str, Any] | None
    stage_seconds: dict[str, float]
    labelled_top1: dict[str, Any] | None = None
    fusion: dict[str, Any] | None = None
    calibration: dict[str, Any] | None = None
    vs_eager: dict[str, Any] | None = None   # PyTorch sources only (always a record there)
    profile: dict[str, Any] | None = None    # per op type and node, FP32 and shipped (insight)
    float_nodes: list[dict[str, str]] | None = None   # the shipped graph's float nodes, why

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's `precision` section of the part."""
        out = {**self.config.__dict__, "exclude": list(self.config.exclude),
               "family": self.family, "description": self.config.describe(),
               "calibration_samples": self.calibration_samples, "decision": self.decision}
        for key in ("labelled_top1", "fusion", "calibration", "profile"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        out["fp32_graph"] = self.fp32_graph
        out["vs_original"] = self.vs_original
        if self.vs_eager is not None:
            out["vs_eager"] = self.vs_eager
        if self.float_nodes is not None:
            out["float_nodes"] = self.float_nodes
        out["stage_seconds"] = self.stage_seconds
        return out


def speed_lines(section: Mapping[str, Any], of: str = "") -> list[str]:
    """The speed lines of a manifest's `precision` *section* (Precision.to_manifest's, or a
    published bundle's: the build says them once tuning and the bundle are written)."""
    lines = []
    if section.get("vs_original"):
        lines.append(f"speed{of}: {speed_line(section['vs_original'])}")
    if section.get("vs_eager"):
        lines.append(f"speed{of}: {eager_line(section['vs_eager'])}")
    choice = (section.get("decision") or {}).get("provider_choice") or {}
    if choice.get("chosen") and choice.get("original_p50_ms"):
        lines.append(
            f"speed{of} under {choice['provider'].replace('ExecutionProvider', '')}: bundle "
            f"{choice['p50_ms']:.3f} ms p50 against the original's "
            f"{choice['original_p50_ms']:.3f} ms on the CPU provider: "
            f"{choice['original_p50_ms'] / choice['p50_ms']:.2f}x its speed (one run, "
            f"onnxruntime {choice.get('measured_on', {}).get('onnxruntime', '?')})")
    return lines


def evidence_line(section: Mapping[str, Any], name: str = "") -> str:
    """'INT8 ... (evidence shown)' or '... (evidence not proven: 19 samples judged, 100 would
    show a 1-point drop)' of a manifest's `precision` *section*; FP32 says only what it is."""
    decision = section.get("decision") or {}
    text = f"{name + ' ' if name else ''}{decision.get('label') or section.get('description', '?')}"
    verdict = (decision.get("evidence") or {}).get("verdict")
    text += f" (evidence {verdict})" if verdict else ""
    choice = decision.get("provider_choice") or {}
    if choice.get("chosen"):
        text += (f"; under {str(choice.get('provider', '')).replace('ExecutionProvider', '')}: "
                 f"{choice.get('graph')}"
                 + (f" (evidence {choice['evidence']})" if choice.get("evidence") else ""))
    return text
