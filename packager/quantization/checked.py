"""`edgepack quantize` with an accuracy budget: run the INT8 search and write the variant it keeps."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import PackagerError
from ..graph.execute import Sample
from ..progress import Log
from .budget import AccuracyBudget
from .quantize import QuantConfig


def quantize_checked(model: Path, output: Path, *, config: QuantConfig,
                     calib: Sequence[Sample], held: Sequence[Sample], budget: AccuracyBudget,
                     labels: Sequence[Any] | None = None, pinned: frozenset[str] = frozenset(),
                     force: bool = False, log: Log = lambda _: None,
                     progress=None, steps=None, search_seconds: float | None = None
                     ) -> tuple[QuantConfig, dict, dict]:
    """`edgepack quantize` with a budget: the INT8 search (search.py) from *model* into *output*.

    Ships the variant within budget with the most ops in INT8 (fewest Q/DQ boundaries next);
    raises BudgetMissed when no variant keeps the budget. *pinned* names config fields the
    user set, which the search leaves alone. *steps* (a progress.Progress) shows each variant.
    *search_seconds* bounds the search (search.SEARCH_SECONDS by default).
    """
    import tempfile

    from ..atomic import atomic_file
    from ..errors import BudgetMissed
    from ..graph.modelio import load_model, save_model
    from .quantize import check_exclude, check_float
    from .search import Search
    from .sensitivity import name_nodes

    if not held:
        raise PackagerError("an accuracy budget needs held-out samples",
                            "pass --calib (a fraction is held out, see --holdout)")
    check_float(model)
    named = name_nodes(load_model(model))
    check_exclude(config.exclude, named.graph, model)
    with tempfile.TemporaryDirectory(prefix="edgepack-budget-") as tmp:
        fp32 = save_model(named, Path(tmp) / "fp32.onnx")
        search = Search(fp32, Path(tmp), calib=calib, held=held, budget=budget, labels=labels,
                        log=log, progress=progress, steps=steps, seconds=search_seconds)
        tried = search.run(config, set(pinned))
        search.steps.finish()
        passing = sorted((c for c in tried if c.passed), key=lambda c: (-c.int8_nodes,
                                                                          c.boundaries))
        record = {"budget": budget.describe(), "passed": bool(passing),
                  "search_seconds": round(search.elapsed, 2),
                  "candidates": [c.summary() for c in tried]}
        if not passing:
            best = search.best()
            raise BudgetMissed(f"no INT8 variant keeps the accuracy budget ({budget.describe()}): "
                               f"best of {len(tried)} was "
                               f"{best.line() if best else 'none (every variant failed)'}",
                               "loosen --min-cosine / --max-accuracy-drop, or ship FP32 "
                               "(edgepack build decides this by itself)")
        chosen = passing[0]
        record.update({"chosen": chosen.label, "excluded": list(chosen.config.exclude),
                       "op_types": list(chosen.config.op_types)})
        log(f"chosen: {chosen.label} ({chosen.config.describe()})")
        with atomic_file(Path(output), force=force) as out:
            save_model(load_model(chosen.path), out, location=Path(output).name + ".data")
    return chosen.config, chosen.accuracy, record
