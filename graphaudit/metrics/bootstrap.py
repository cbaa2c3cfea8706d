"""Bootstrap over inputs, in streaming form: Poisson(1) resampling weights keyed by input.

Each input gets, for every resample r, a weight w[r] ~ Poisson(1) drawn from a generator
seeded by (seed, input index). A statistic's resample r is then the same statistic with
every input counted w[r] times. Because a weight depends only on the seed and the input's
index, sums can be accumulated batch by batch, shards can be merged by adding them, and
every condition and every figure sees the same resamples (paired differences).
"""

from __future__ import annotations

import numpy as np

DEFAULT_RESAMPLES = 1000
_STREAM = 0x6761  # separates these draws from the replay's permutations of the same seed


class PoissonBootstrap:
    """Resampling weights for inputs by index, the last batch's kept for reuse."""

    def __init__(self, seed: int, resamples: int = DEFAULT_RESAMPLES):
        if resamples < 1:
            raise ValueError(f"expected at least one bootstrap resample, found {resamples}")
        self.seed, self.resamples = seed, resamples
        self._last: tuple[bytes, np.ndarray] | None = None

    def weights(self, rows: np.ndarray) -> np.ndarray:
        """Weights of the inputs at `rows`, shape (resamples, len(rows))."""
        rows = np.asarray(rows, dtype=np.int64)
        key = rows.tobytes()
        if self._last is None or self._last[0] != key:
            columns = [np.random.default_rng([self.seed, _STREAM, int(i)]).poisson(1.0, self.resamples) for i in rows]
            self._last = (key, np.stack(columns, axis=1).astype(np.float64))
        return self._last[1]


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap `samples` at confidence `level` (NaNs ignored)."""
    samples = np.asarray(samples, dtype=np.float64)
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return (float("nan"), float("nan"))
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return (float(low), float(high))
