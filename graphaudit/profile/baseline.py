"""A dense baseline doing the same job: same inputs, timed in alternation, the latency ratio.

The baseline must take exactly the model's inputs (names, element types, fixed sizes);
anything else is refused before any timing. Both are timed round by round in alternating
order (see latency.time_rounds); the ratio is taken per round (model round time over
baseline round time), so its spread is that of paired measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from graphaudit.data import InputSpec
from graphaudit.errors import GraphAuditError
from graphaudit.profile.latency import Spread, batch_latency_ms, spread


@dataclass(frozen=True)
class BaselineComparison:
    """The baseline's latency and the model's latency over it."""

    model: str
    latency_ms: Spread
    ratio: Spread  # model / baseline, per round
    flops_executed: float | None = None  # the baseline's mean FLOPs per input

    @property
    def slower_pct(self) -> float:
        """How much slower the model is, in percent (negative: faster)."""
        return (self.ratio.median - 1.0) * 100.0

    def describe(self) -> str:
        word = "slower" if self.slower_pct >= 0 else "faster"
        return f"{abs(self.slower_pct):.1f}% {word} than {self.model}"

    def to_json(self) -> dict:
        return {"model": self.model, "latency_ms": self.latency_ms.median,
                "latency_spread_ms": self.latency_ms.to_json(), "ratio": self.ratio.median,
                "ratio_spread": self.ratio.to_json(), "slower_pct": self.slower_pct,
                "flops_executed": self.flops_executed}


def check_same_inputs(model: Sequence[InputSpec], baseline: Sequence[InputSpec], name: str) -> None:
    """Refuse a baseline whose graph inputs differ from the model's."""
    mine = {s.name: s for s in model}
    theirs = {s.name: s for s in baseline}
    problems = []
    if set(mine) != set(theirs):
        problems.append(f"inputs {sorted(theirs)} instead of {sorted(mine)}")
    for key in sorted(set(mine) & set(theirs)):
        a, b = mine[key], theirs[key]
        if a.dtype != b.dtype:
            problems.append(f"{key} of dtype {b.dtype} instead of {a.dtype}")
        elif a.shape is not None and b.shape is not None:
            fixed_differ = len(a.shape) != len(b.shape) or any(
                isinstance(x, int) and isinstance(y, int) and x > 0 and y > 0 and x != y
                for x, y in zip(a.shape, b.shape)
            )
            if fixed_differ:
                problems.append(f"{b.describe()} instead of {a.describe()}")
    if problems:
        raise GraphAuditError(
            f"expected the baseline {name} to take the same inputs as the model "
            f"({', '.join(s.describe() for s in model)}), found {'; '.join(problems)}"
        )


def compare(name: str, model_ns: np.ndarray, baseline_ns: np.ndarray,
            flops_executed: float | None = None) -> BaselineComparison:
    """The comparison from paired (round, batch) nanosecond samples of model and baseline."""
    ratios = model_ns.sum(axis=1) / baseline_ns.sum(axis=1)
    return BaselineComparison(name, batch_latency_ms(baseline_ns), spread(ratios), flops_executed)
