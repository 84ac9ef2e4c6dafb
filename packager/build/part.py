"""build_part(): one part's stages in order, each a short function returning a small frozen
record (records.py) that the next ones read."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bundle.assemble import PartPayload
from ..quantization.quantize import QuantConfig
from ..targets import Target
from ..tasks.part import recorded_task
from .data import golden_samples, part_data
from .insight import insight
from .length import length_part, open_part
from .load import freeze_part, load_part
from .measure import accuracy_of, decide_part, precision_record, providers_part, reference
from .plan import PartRequest
from .records import BuildContext
from .shape import model_labels, plan_part, recognised_fits, shape_part
from .speech import speech_budget


@dataclass(frozen=True)
class PartResult:
    name: str
    nodes_before: int
    nodes_after: int
    simplifier: str
    fallback_reason: str
    family: str
    accuracy: dict[str, Any]
    config: QuantConfig
    calibration_samples: int
    export: dict[str, Any] | None
    consts: tuple[str, ...] = ()
    provider_choice: Any = None   # provider_choice.ProviderChoice: a faster one listed first

    def headline(self) -> str:
        """What ships: the precision, and the faster provider's graph where the build chose one."""
        if self.provider_choice is None:
            return self.config.describe()
        name = self.provider_choice.provider.name.replace("ExecutionProvider", "")
        fast, cpu = self.provider_choice.candidate.config.describe(), self.config.describe()
        if fast == cpu:
            return f"{cpu}, under {name} where the device has it, else the CPU provider"
        return f"{fast} under {name}; {cpu} on the CPU provider where {name} is not installed"

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "nodes_before": self.nodes_before,
                "nodes_after": self.nodes_after, "simplifier": self.simplifier,
                "family": self.family, "precision": self.config.describe(),
                "accuracy": self.accuracy, "calibration_samples": self.calibration_samples,
                "export": self.export, "ships": self.headline()}


def build_part(req: PartRequest, target: Target, tmp: Path, ctx: BuildContext
               ) -> tuple[PartPayload, PartResult]:
    """Load (or export), freeze, shape, plan, load the data, measure, decide, and the graphs
    each provider runs: what the bundle holds for the part, and what the build says of it."""
    started = dict(ctx.clock.seconds)
    loaded = load_part(req, target, tmp, ctx)
    ctx.clock.lap("load/export")
    frozen = freeze_part(req, loaded, ctx)
    shaped = shape_part(req, loaded, frozen, target, ctx)
    req = model_labels(req, frozen, shaped, ctx)
    plan = plan_part(req, loaded, shaped, target, ctx)
    data, shaped = part_data(req, loaded, frozen, shaped, plan, ctx)
    plan = speech_budget(plan, shaped, data, tmp, ctx)   # a tts part: the original's spread
    ref = reference(req, loaded, frozen, shaped, plan, data, target, tmp, ctx)
    plan, ref = recognised_fits(req, plan, shaped, ref, ctx)   # a recognised head that misfits
    decision = decide_part(req, plan, data, ref, target, tmp, ctx)
    picked = providers_part(req, data, ref, decision, target, tmp, ctx)
    shipped = [decision.candidate.path, *(g.model for g in picked.graphs)]
    fits = decision.config.mode == "given" or decision.config.precision == "fp32"
    length = open_part(req, frozen, data, shipped, ctx, fits) or \
        length_part(plan, frozen, data, shipped, ctx, fits)
    seen = insight(req, data, ref, decision, shaped.simplified.graph,
                   int(target.session.get("intra_op_threads", 0)), ctx)
    ctx.clock.lap("profile")
    precision = precision_record(loaded, frozen, plan, data, ref, decision, target, ctx, started,
                                 seen)
    config, accuracy = decision.config, accuracy_of(decision, data)
    # a model quantized already has no FP32 to judge against: the device reproduces it
    golden, bounded = golden_samples(data.held, ctx.golden, ref.outputs, 2 + len(picked.graphs),
                                     decision.candidate.path.stat().st_size)
    if bounded:
        ctx.log(f"golden data: {bounded}")
    payload = PartPayload(req.name, decision.candidate.path,
                          None if config.mode == "given" else ref.path,
                          golden, precision.to_manifest(), accuracy,
                          req.preprocess, req.labels, frozen.source, list(picked.graphs),
                          recorded_task(plan.task, ctx.keep), bounded, length)
    result = PartResult(req.name, frozen.nodes, len(shaped.simplified.graph.node),
                        shaped.simplifier, shaped.fallback, plan.family, accuracy, config,
                        precision.calibration_samples, loaded.export,
                        (*frozen.consts, *frozen.argued), picked.choice)
    return payload, result
