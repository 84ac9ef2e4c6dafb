"""Rollouts across a fleet: canary hosts first, then rolling batches, stopping past a failure rate.

The same plan runs with either engine (the built-in SSH fan-out or ansible-playbook): each batch
is deployed and verified as a whole before the next starts, and hosts after a stop are left as
they were (never contacted).
"""

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import PackagerError

T = TypeVar("T")


@dataclass(frozen=True)
class Rollout:
    canary: int = 0                 # deploy and verify this many hosts first; any failure stops
    batch: str | None = None        # "N" hosts or "P%" of the fleet per batch (default: all)
    max_fail: float | None = None   # stop once more than this % of the hosts done so far failed

    def __post_init__(self) -> None:
        if self.canary < 0:
            raise PackagerError(f"--canary {self.canary}: not a number of hosts",
                                "give 1 or more")


def parse_batch(text: str | None) -> str | None:
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)(%?)\s*", text)
    if not match or int(match.group(1)) == 0 or (match.group(2) and int(match.group(1)) > 100):
        raise PackagerError(f"--batch {text}: not a number of hosts or a percentage",
                            "give e.g. --batch 8 or --batch 25%")
    return match.group(1) + match.group(2)


def parse_percent(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%?\s*", text)
    if not match or float(match.group(1)) > 100:
        raise PackagerError(f"{option} {text}: not a percentage from 0 to 100",
                            f"give e.g. {option} 10%")
    return float(match.group(1))


def batches(items: Sequence[T], plan: Rollout) -> list[list[T]]:
    """The canary batch (if any), then batches of the plan's size, in inventory order."""
    items = list(items)
    out = []
    if plan.canary:
        out.append(items[:plan.canary])
        items = items[plan.canary:]
    size = len(items) or 1
    if plan.batch:
        number = int(plan.batch.rstrip("%"))
        whole = len(items) + (len(out[0]) if out else 0)
        size = max(1, math.ceil(whole * number / 100)) if plan.batch.endswith("%") else number
    out += [items[i:i + size] for i in range(0, len(items), size)]
    return [b for b in out if b]


def run(items: Sequence[T], deploy_batch: Callable[[list[T]], list], plan: Rollout,
        failed: Callable[[object], bool], log: Callable[[str], None]) -> tuple[list, list[T], str]:
    """Deploy batch after batch: (results, items never deployed, why the rollout stopped or '')."""
    groups = batches(items, plan)
    results: list = []
    for number, group in enumerate(groups):
        canary = plan.canary and number == 0
        if len(groups) > 1:
            log(f"rollout: {'canary' if canary else 'batch'} {number + 1}/{len(groups)}: "
                f"{len(group)} host(s)")
        results += deploy_batch(group)
        bad = sum(1 for r in results if failed(r))
        rest = [x for g in groups[number + 1:] for x in g]
        if not rest:
            break
        if canary and bad:
            return results, rest, (f"the canary failed on {bad} of {len(group)} host(s); the "
                                   f"other {len(rest)} host(s) were not touched")
        if plan.max_fail is not None and 100 * bad / len(results) > plan.max_fail:
            return results, rest, (f"{bad} of {len(results)} host(s) failed "
                                   f"({100 * bad / len(results):.0f} % > --max-fail "
                                   f"{plan.max_fail:g} %); the other {len(rest)} host(s) were "
                                   "not touched")
    return results, [], ""


@dataclass
class HostResult:
    host: str
    exit_code: int                         # 0 passed, 1 a check failed, 2 error
    error: str = ""
    device: dict[str, Any] = field(default_factory=dict)
    copied: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    reports_dir: str = ""
    seconds: float = 0.0
    # on the device: dir, release (this bundle's), current (in use after this deploy),
    # previous (kept for a rollback), switched (whether current moved)
    release: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""                      # not deployed: why the rollout stopped before it
    # no failure, but worth saying: e.g. a provider listed for speed that the device lacks
    notes: list[str] = field(default_factory=list)
    engine: str = "ssh"

    @property
    def status(self) -> str:
        if self.skipped:
            return "skipped"
        return {0: "pass", 1: "FAIL"}.get(self.exit_code, "error")

    @property
    def verdict(self) -> str:
        """The verdict verify says ('passed on 8 samples; 100 show 99%'), for people; status
        stays the machine's word."""
        said = self.report.get("verdict") if isinstance(self.report, dict) else None
        if self.status in ("pass", "FAIL") and isinstance(said, str) and said:
            return said
        return {"pass": "passed", "FAIL": "failed"}.get(self.status, self.status)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "status": self.status, "verdict": self.verdict}
