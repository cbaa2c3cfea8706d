"""Mergeable sums for one replay condition, and the figures read from them with CIs.

ConditionStats holds, for each of QUANTITIES, its total over the inputs seen and the same
total under every bootstrap resample (weights from PoissonBootstrap). Its size is fixed
by the number of resamples, whatever the number of inputs; two stats over disjoint inputs
merge by adding. Figures are ratios of totals, and every resample gives the same ratio for
its confidence interval; differences between conditions are paired, since all conditions
share one set of weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphaudit.metrics.bootstrap import interval
from graphaudit.metrics.outputs import QUANTITIES, column

# figure -> (numerator, denominator) quantities
FIGURES = {
    "nll": ("nll", "targets"),
    "divergence": ("divergence", "positions"),
    "accuracy": ("hits", "targets"),
    "mse": ("sq_err", "values"),
}


@dataclass
class ConditionStats:
    """Totals of QUANTITIES over inputs, plain and under each bootstrap resample."""

    total: np.ndarray  # (len(QUANTITIES),)
    resampled: np.ndarray  # (resamples, len(QUANTITIES))
    inputs: int = 0

    @classmethod
    def empty(cls, resamples: int) -> ConditionStats:
        return cls(np.zeros(len(QUANTITIES)), np.zeros((resamples, len(QUANTITIES))))

    def update(self, sums: np.ndarray, weights: np.ndarray) -> None:
        """Add per-input `sums` (inputs × QUANTITIES) with their resampling `weights` (R × inputs)."""
        ConditionStats.update_each([self], [sums], weights)

    @staticmethod
    def update_each(stats: Sequence[ConditionStats], sums: Sequence[np.ndarray], weights: np.ndarray) -> None:
        """Add `sums[i]` to `stats[i]` for every i (see `update`), with one matrix product for them all."""
        stacked = np.concatenate(sums, axis=1)  # inputs × (len(stats) · QUANTITIES)
        resampled = (weights @ stacked).reshape(weights.shape[0], len(stats), -1)
        totals = stacked.sum(axis=0).reshape(len(stats), -1)
        for i, s in enumerate(stats):
            s.total += totals[i]
            s.resampled += resampled[:, i]
            s.inputs += stacked.shape[0]

    def merge(self, other: ConditionStats) -> ConditionStats:
        """The stats of both sets of inputs (disjoint, same seed and resamples)."""
        return ConditionStats(self.total + other.total, self.resampled + other.resampled, self.inputs + other.inputs)

    def figure(self, name: str) -> tuple[float | None, np.ndarray]:
        """(value, resampled values) of FIGURES[name]; None when nothing was counted."""
        num, den = (column(q) for q in FIGURES[name])
        if self.total[den] == 0:
            return None, np.full(self.resampled.shape[0], np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(self.total[num] / self.total[den]), self.resampled[:, num] / self.resampled[:, den]


@dataclass(frozen=True)
class Estimate:
    """A figure with its bootstrap percentile interval."""

    value: float | None
    ci: tuple[float, float] | None

    def to_json(self) -> dict:
        return {"value": self.value, "ci": list(self.ci) if self.ci else None}


def estimate(value: float | None, samples: np.ndarray, level: float) -> Estimate:
    """`value` with the percentile interval of its resampled `samples`; None where undefined (NaN)."""
    if value is None or not np.isfinite(value):
        return Estimate(None, None)
    ci = interval(samples, level)
    return Estimate(value, ci if all(np.isfinite(ci)) else None)


def difference(a: ConditionStats, b: ConditionStats, name: str, level: float) -> Estimate:
    """figure(a) − figure(b), paired over resamples."""
    (va, sa), (vb, sb) = a.figure(name), b.figure(name)
    if va is None or vb is None:
        return Estimate(None, None)
    return estimate(va - vb, sa - sb, level)


def retained_gap(profile: ConditionStats, correct: ConditionStats, floor: ConditionStats,
                 name: str, level: float) -> Estimate:
    """(floor − profile) / (floor − correct) of figure `name`: the share of the gap a profile keeps."""
    (vp, sp), (vc, sc), (vf, sf) = profile.figure(name), correct.figure(name), floor.figure(name)
    if vp is None or vc is None or vf is None or vf == vc:
        return Estimate(None, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        samples = (sf - sp) / (sf - sc)
    return estimate((vf - vp) / (vf - vc), samples, level)
