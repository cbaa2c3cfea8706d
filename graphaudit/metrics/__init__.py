"""Metrics of the frozen replay, as streaming, mergeable sums.

- `outputs`: per-input sums from one batch of outputs (NLL, KL from `correct`, accuracy, MSE);
- `stats`: ConditionStats (totals and their bootstrap resamples) and the figures read from
  them: value, ΔNLL, retained gap, each with a confidence interval;
- `variance`: the nested variance decomposition of a coefficient family, plus η² of layer;
- `bootstrap`: Poisson resampling weights keyed by input index, so sums merge across shards.
"""

from graphaudit.metrics.bootstrap import PoissonBootstrap, interval
from graphaudit.metrics.outputs import QUANTITIES, Reference, Task, score, task_for
from graphaudit.metrics.stats import ConditionStats, Estimate, difference, retained_gap
from graphaudit.metrics.variance import SHARES, FamilyVariance

__all__ = [
    "QUANTITIES", "SHARES", "ConditionStats", "Estimate", "FamilyVariance", "PoissonBootstrap", "Reference",
    "Task", "difference", "interval", "retained_gap", "score", "task_for",
]
