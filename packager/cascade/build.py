"""build_pipeline(): a pipeline file's parts built into one bundle, each with its own precision
decision, the manifest's `pipeline` section telling the runner to run them as a cascade."""

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..pipeline import BuildResult, build
from .host import crop_calibration
from .spec import PipelineSpec, load_pipeline


def build_pipeline(pipeline: Path | str | PipelineSpec, output: Path, *,
                   log: Callable[[str], None] = lambda _: None, **options: Any) -> BuildResult:
    """Build every stage of *pipeline* (a pipeline .toml, spec.py) as a part of one bundle at
    *output*; *options* are build()'s (target, quant, holdout, golden, force, tune...). A crop
    stage without calib calibrates on the crops the original detector finds in the detect
    stage's images."""
    spec = pipeline if isinstance(pipeline, PipelineSpec) else load_pipeline(pipeline)
    with tempfile.TemporaryDirectory(prefix="edgepack-pipeline-") as tmp:
        made = crop_calibration(spec, Path(tmp))
        for part in made:
            log(f"[{part}] calibration: the crops the original detector finds in "
                f"{spec.stages[0].calib}")
        return build(spec.path, output, parts={s.part: str(s.model) for s in spec.stages},
                     part_calib={s.part: s.calib or made[s.part] for s in spec.stages},
                     part_preprocess={s.part: s.preprocess for s in spec.stages},
                     part_quant={s.part: {"precision": s.precision} for s in spec.stages
                                 if s.precision},
                     tasks={s.part: s.task for s in spec.stages if s.task},
                     pipeline=spec.section(), log=log, **options)
