"""Metrics of the frozen replay, as streaming, mergeable sums (the variance decomposition of a
coefficient family, which reads the replay's cache, is graphaudit.replay.variance).

- `tasks`: what the scored output is (a causal LM's, a classifier's, ...), decided once from its
  first batch (`task_for`);
- `outputs`: per-input sums from one batch of outputs (NLL, KL from `correct`, accuracy, MSE);
- `stats`: ConditionStats (totals and their bootstrap resamples) and the figures read from
  them: value, ΔNLL, retained gap, each with a confidence interval;
- `bootstrap`: Poisson resampling weights keyed by input index, so sums merge across shards.
"""

from graphaudit.metrics.bootstrap import PoissonBootstrap, interval
from graphaudit.metrics.outputs import QUANTITIES, Reference, score
from graphaudit.metrics.stats import ConditionStats, Estimate, difference, retained_gap
from graphaudit.metrics.tasks import Task, task_for

__all__ = [
    "QUANTITIES", "ConditionStats", "Estimate", "PoissonBootstrap", "Reference",
    "Task", "difference", "interval", "retained_gap", "score", "task_for",
]
