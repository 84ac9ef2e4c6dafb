"""What to try when INT8 does not ship: the budget the best candidate missed and by how much,
and the one option that would change the decision.

A MobileNetV3-style net's best INT8 agreed on every top-1 answer and was refused only by the
0.98 cosine rule, and nothing said so: here the build judges that candidate once more under
the task it suggests and names `--task` when that task's figure holds.
"""

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..graph.execute import Sample
from .budget import AccuracyBudget
from .search import Candidate

NOT_CROSS_CHECKED = "not cross-checked"   # (decision._cross_check's failure)


def best_miss(candidates: Sequence[Candidate]) -> Candidate | None:
    """The INT8 candidate that came closest to the budget: the smallest shortfall of the
    figures that gate it (margin), then the higher cosine, then the more ops in INT8. (By
    cosine alone, an OCR detector's NNCF graph with 55 nodes FP32 at pixel IoU 33.8 % was named
    beside one at 75.1 %.) One judged on the held-out split only, where the rotation judged
    others, is named only when nothing else ran: its figures are not comparable."""
    ran = [c for c in candidates if not c.error and c.accuracy.get("budget")
           and c.config.precision == "int8"]
    judged = [c for c in ran if not any(f.startswith(NOT_CROSS_CHECKED)
                                        for f in c.accuracy["budget"].get("failures", ()))]
    ran = judged or ran
    return max(ran, key=lambda c: (margin(c.accuracy), c.accuracy.get("cosine_min", 0.0),
                                   c.int8_nodes), default=None)


def margin(accuracy: dict[str, Any]) -> float:
    """How far the figures that gate a candidate are inside their keep (negative: short of
    it), the worst of them, as a share: the labelled drop where labels judge, else the task's
    figures and the class outputs' expected drops; 0 where only a cosine gates."""
    from .._runtimes.runner.task_figures import AT_MOST

    labelled = accuracy.get("labelled")
    if labelled:
        return float(labelled["keep"] - labelled["value"])
    gaps = [(f["keep"] - f["value"]) if name in AT_MOST else (f["value"] - f["keep"])
            for name, f in ((accuracy.get("task") or {}).get("figures") or {}).items()
            if f.get("value") is not None and f.get("keep") is not None]
    gaps += [e["keep"] - e["value"] for e in (accuracy.get("expected_drop") or {}).values()
             if e.get("value") is not None and e.get("keep") is not None]
    return float(min(gaps)) if gaps else 0.0


def what_to_try(candidates: Sequence[Candidate], budget: AccuracyBudget, fp32: Path,
                held: Sequence[Sample], fp32_outputs: dict[str, Any]) -> str:
    """One sentence: what the best INT8 candidate missed, and the option to try ('' when no
    INT8 candidate ran)."""
    best = best_miss(candidates)
    if best is None:
        return ""
    failures = best.accuracy["budget"]["failures"]
    missed = f"{best.label} missed {'; '.join(failures)}"
    # the rules for raw outputs (cosine, a few values' absolute error), which a task replaces
    cosine_only = all(f.startswith("cosine ") or f.endswith("cannot judge so few values)")
                      for f in failures)
    if budget.suggested and cosine_only:
        text, task = budget.suggested
        judged = replace(budget, task=task, suggested=None).evaluate(
            best.path, fp32, held, None, fp32_outputs)
        if judged["budget"]["passed"]:
            return (f"{missed}, and only the cosine rule refused it: under --task {text} its "
                    f"answers keep the task's budget ({judged['task']['text']}); try --task "
                    f"{text}")
        return f"{missed}; under --task {text} it still misses ({judged['task']['text']})"
    if cosine_only and budget.min_cosine is not None:
        worst = best.accuracy["cosine_min"]
        return (f"{missed}; --min-cosine {max(0.0, worst - 0.0005):.3f} would admit it if the "
                "outputs' use allows, or declare the --task that reads them (judged by what "
                "the answer uses)")
    return (f"{missed}; `edgepack debug-quant` ranks the nodes whose float keeping would close "
            "it (--exclude NODE keeps one float)")
