"""The part's samples, loaded once into one value every later stage reads: the calibration
set (fitted to the quantizer's memory) and the held-out set that judges accuracy. A PyTorch
source without data gets random inputs for golden data and accuracy."""

from dataclasses import replace

from ..errors import CalibrationError
from ..graph.quantized import quantized_ops
from ..graph.shapes import dynamic_tensors, shapes_from_run
from ..quantization.calibration import (
    CALIB_BYTES,
    activation_bytes,
    available_bytes,
    calibration_budget,
    fit_memory,
    load_samples,
    split_holdout,
)
from ..source.export import make_inputs
from ..source.specs import TensorSpec
from .plan import SINGLE, PartRequest
from .records import BuildContext, Frozen, Loaded, PartData, PartPlan, Shaped

RANDOM_SAMPLES = 20   # evaluation samples drawn for a part without calibration data
GOLDEN_DEFAULT = 8    # golden samples a bundle keeps when --golden is not given...
GOLDEN_BYTES = 4_000_000   # ...within the larger of this and half the model's size


def golden_samples(held: list, asked: int | None, outputs: dict, files: int,
                   model_bytes: int) -> tuple[list, str | None]:
    """The held-out samples the bundle keeps as golden data, and why fewer (None: as asked).
    *asked* None: up to GOLDEN_DEFAULT, bounded so that every device does not receive tens of
    MB of tensors for a small model (a 6.9 MB detector carried 71 MB): each sample costs its
    inputs plus *files* copies of its outputs (the reference, the shipped, each graph's)."""
    if asked is not None or not held:
        return held[:asked or GOLDEN_DEFAULT], None
    each = sum(v.nbytes for v in held[0].values()) + files * sum(
        v.nbytes for v in outputs.values()) // max(1, len(held))
    bound = max(GOLDEN_BYTES, model_bytes // 2)
    keep = max(1, min(GOLDEN_DEFAULT, len(held), bound // max(1, each)))
    if keep >= min(GOLDEN_DEFAULT, len(held)):
        return held[:keep], None
    return held[:keep], (f"{keep} golden sample{'s' if keep > 1 else ''} kept of the default "
                         f"{GOLDEN_DEFAULT}: {each / 1e6:.2f} MB each, bounded to "
                         f"{bound / 1e6:.1f} MB (the larger of {GOLDEN_BYTES / 1e6:.0f} MB and "
                         f"half the model); --golden N keeps N")


def part_data(req: PartRequest, loaded: Loaded, frozen: Frozen, shaped: Shaped, plan: PartPlan,
              ctx: BuildContext) -> tuple[PartData, Shaped]:
    """The part's samples (loaded here unless the export loaded them), split into calibration
    and held-out sets; shapes the static inputs left open come from a run on two of them."""
    samples = frozen.samples
    if samples is None and req.calib is not None:
        samples = load_samples(req.calib, inputs=list(shaped.inputs), preprocess=req.preprocess,
                               progress=ctx.progress)
    ctx.clock.lap("calibration data")
    kind = "calibration"
    if not samples:
        samples, kind = _random_samples(req, loaded, shaped, plan, ctx), "random"
    varying: list[str] = []
    sizes: dict[str, int] = {}   # the data-dependent tensors' bytes, from the same runs
    if dynamic_tensors(shaped.simplified):
        open_count = len(dynamic_tensors(shaped.simplified))
        simplified, varying = shapes_from_run(shaped.simplified, samples[:2], sizes)
        shaped = replace(shaped, simplified=simplified)
        ctx.log(f"shapes: {open_count - len(varying)} tensor shape(s) that shape inference "
                "could not resolve came from a run at the static input shapes")
        if varying:
            ctx.log(f"shapes: {len(varying)} tensor(s) have data-dependent shapes and stay "
                    f"dynamic ({', '.join(varying[:3])})")
    calib, held = split_holdout(samples, fraction=ctx.holdout)
    given = calib   # the user's set: its size and spread are what the hygiene notes judge
    if kind != "random":
        ctx.log(f"calibration: {len(calib)} samples, {len(held)} held out for accuracy")
        if _calibrates(req, plan, shaped):
            calib = _fitted(calib, shaped, sum(sizes.values()), ctx)
    ctx.clock.lap("shapes")
    return PartData(kind, samples, calib, held, given), shaped


def _calibrates(req: PartRequest, plan: PartPlan, shaped: Shaped) -> bool:
    """Whether a calibration may run: not for FP32 or FP16 asked for, --mode dynamic, or a
    model quantized already (its INT8 ships as given). Kokoro-82M, quantized already, was
    warned that calibrating it would hold 110 GiB and stop the build: it is never calibrated."""
    if plan.requested in ("fp32", "fp16") or req.quant.mode == "dynamic":
        return False
    return not quantized_ops(shaped.simplified.graph)


def _fitted(calib: list, shaped: Shaped, varying_bytes: int, ctx: BuildContext) -> list:
    """The calibration samples the quantizer's memory holds: every tensor of every sample at
    once, the data-dependent ones at the size runs gave them (a TTS model's waveform), within
    CALIB_BYTES or half the memory free now; said when that thins them, or would not suffice."""
    per_sample = activation_bytes(shaped.simplified) + varying_bytes
    fitted = fit_memory(calib, per_sample)
    budget = calibration_budget()
    if len(fitted) < len(calib):
        ctx.log(f"calibration: {len(fitted)} of the {len(calib)} samples (evenly spread) "
                f"calibrate: the quantizer holds every tensor of every sample at once, "
                f"{per_sample / 1e6:.0f} MB each here, and {budget / 2 ** 30:.1f} GiB is its "
                f"share (the smaller of {CALIB_BYTES / 2 ** 30:.0f} GiB and half the memory "
                "free)")
    free = available_bytes()
    if free is not None and len(fitted) * per_sample > free:
        ctx.log(f"warning: calibration holds {len(fitted) * per_sample / 2 ** 30:.1f} GiB of "
                f"activations ({len(fitted)} samples, the fewest that calibrate), more than the "
                f"{free / 2 ** 30:.1f} GiB free: the kernel may stop this build; pass "
                "--precision fp32 or --mode dynamic, or build on a machine with more memory")
    return fitted


def _random_samples(req: PartRequest, loaded: Loaded, shaped: Shaped, plan: PartPlan,
                    ctx: BuildContext) -> list:
    """RANDOM_SAMPLES random inputs of a PyTorch source without data; a CalibrationError where
    the part cannot do without data (forced static INT8, or an .onnx with nothing to run)."""
    if plan.needs_calib:
        raise CalibrationError(f"{req.label()}static INT8 needs calibration data",
                               "pass --calib DIR (images or .npy/.npz)"
                               + (f", e.g. --calib {req.name}=DIR" if req.name != SINGLE
                                  else "") + ", or --mode dynamic / --precision fp32")
    if loaded.module is None:
        raise CalibrationError("no calibration or evaluation samples",
                               "pass --calib DIR: samples are needed for golden data and "
                               "accuracy")
    specs = [TensorSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in shaped.inputs]
    samples = [dict(zip([s.name for s in specs], make_inputs(specs, loaded.module.module, seed=s),
                        strict=True)) for s in range(RANDOM_SAMPLES)]
    ctx.log(f"no calibration data: golden data and accuracy use {RANDOM_SAMPLES} random inputs")
    return samples
