"""A speech (tts) part's budget, measured on the original before any candidate is judged: the
FP32 graph's own log-mel distance and SNR between a run on one thread and one on all of them
(kernels that sum in another order), sample by sample. The budget is never stricter than that
spread: mel_db at least SPREAD_FACTOR times the original's worst distance to itself, snr_db at
most its worst SNR to itself less a margin; the manifest's task records both."""

from dataclasses import replace
from pathlib import Path

from .._runtimes.runner.task_spec import settings, task_kind
from .._runtimes.runner.task_tts import mel_distance, snr, waveform
from ..graph.modelio import save_model
from ..timing import session
from .records import BuildContext, PartData, PartPlan, Shaped

SPREAD_FACTOR = 3.0   # the budget's mel_db: at least 3x the original's own spread
SNR_MARGIN = 6.0      # its snr_db: at most the original's own worst SNR less 6 dB


def speech_budget(plan: PartPlan, shaped: Shaped, data: PartData, tmp: Path,
                  ctx: BuildContext) -> PartPlan:
    """*plan* with its tts task's mel_db and snr_db held to the original's run-to-run spread
    (and that spread recorded: mel_spread_db, snr_spread_db); any other part as it is."""
    if task_kind(plan.task) != "tts" or not data.held:
        return plan
    conf = settings(plan.task)
    path = save_model(shaped.simplified, tmp / "speech.fp32.onnx")
    runs = []
    for threads in (1, 0):
        s = session(path, threads)
        names = [o.name for o in s.get_outputs()]
        runs.append([dict(zip(names, s.run(names, feed), strict=True)) for feed in data.held])
    pairs = [(waveform(conf, a), waveform(conf, b)) for a, b in zip(*runs, strict=True)]
    if not any(len(a) for a, _ in pairs):   # (durations all 0: it builds, and says nothing)
        ctx.log(f"warning: no held-out sample gives speech: the original's waveform "
                f"is empty on all {len(pairs)} of them; check its durations and its input")
    mel = max(mel_distance(a, b, conf["rate"]) for a, b in pairs)
    worst_snr = min(snr(a, b) for a, b in pairs)
    task = dict(plan.task, mel_spread_db=round(mel, 4),
                snr_spread_db=None if worst_snr == float("inf") else round(min(worst_snr, 200.0),
                                                                            2))
    # recorded whole: the device judges with the build's very budget
    task["mel_db"] = round(max(conf["mel_db"], SPREAD_FACTOR * mel), 4)
    task["snr_db"] = conf["snr_db"] if worst_snr == float("inf") else \
        round(max(0.0, min(conf["snr_db"], worst_snr - SNR_MARGIN)), 2)
    ctx.log(f"speech: the original against itself (1 thread vs all, {len(pairs)} held-out "
            f"samples): log-mel distance up to {mel:.4f} dB, SNR down to "
            f"{'exact' if worst_snr == float('inf') else f'{worst_snr:.1f} dB'}; the budget: "
            f"log-mel distance {task['mel_db']:g} dB at most, SNR {task['snr_db']:g} dB at "
            "least (never stricter than the original)")
    return replace(plan, task=task)
