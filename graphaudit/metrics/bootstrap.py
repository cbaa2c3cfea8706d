"""Bootstrap over inputs, in streaming form: Poisson(1) resampling weights keyed by input.

Each input gets, for every resample r, a weight w[r] ~ Poisson(1): a uniform number made by
hashing (seed, input index, r) with the SplitMix64 finaliser, turned into a count through
the Poisson(1) distribution function. A statistic's resample r is then the same statistic with
every input counted w[r] times. Because a weight depends only on the seed and the input's
index, sums can be accumulated batch by batch, shards can be merged by adding them, and
every condition and every figure sees the same resamples (paired differences).
"""

from __future__ import annotations

import math

import numpy as np

from graphaudit.wording import CONFIDENCE

DEFAULT_RESAMPLES = 1000
# P(W <= k) for W ~ Poisson(1), k = 0 … 19 (the remaining mass is below 1e-18)
_POISSON_CDF = np.cumsum([math.exp(-1) / math.factorial(k) for k in range(20)])
# The same bounds on the 53-bit integers k = u·2⁵³ behind each uniform u: cdf ≤ u ⟺ ⌈cdf·2⁵³⌉ ≤ k,
# so counting bounds below the integers gives exactly the inverse CDF's counts on [0, 1).
_POISSON_BOUNDS = np.ceil(_POISSON_CDF * 2.0**53).astype(np.uint64)
_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


class PoissonBootstrap:
    """Resampling weights for inputs by index, the last batch's kept for reuse."""

    def __init__(self, seed: int, resamples: int = DEFAULT_RESAMPLES):
        if resamples < 1:
            raise ValueError(f"expected at least one bootstrap resample, found {resamples}")
        self.seed, self.resamples = seed, resamples
        self._last: tuple[bytes, np.ndarray] | None = None
        self._per_resample = _resample_keys(seed, resamples)  # the part of every key that rows share

    def weights(self, rows: np.ndarray) -> np.ndarray:
        """Weights of the inputs at `rows`, shape (resamples, len(rows))."""
        rows = np.asarray(rows, dtype=np.int64)
        key = rows.tobytes()
        if self._last is None or self._last[0] != key:
            counts = np.empty((self.resamples, len(rows)), dtype=np.float64)
            counts[...] = np.searchsorted(_POISSON_BOUNDS, _bits(rows, self._per_resample), side="right")
            self._last = (key, counts)
        return self._last[1]


def _resample_keys(seed: int, resamples: int) -> np.ndarray:
    with np.errstate(over="ignore"):  # the hash's arithmetic wraps modulo 2**64 on purpose
        keys = mix64(np.arange(resamples, dtype=np.uint64)[:, None] * _GOLDEN + _MIX1)
        keys += np.uint64(seed & (2**64 - 1)) * _GOLDEN
    return keys


def _bits(rows: np.ndarray, per_resample: np.ndarray) -> np.ndarray:
    """53 uniform random bits per (resample, row), shape (resamples, len(rows)), a pure function of the keys."""
    with np.errstate(over="ignore"):
        state = mix64(rows.astype(np.uint64)[None, :] + _GOLDEN) + per_resample
        state = mix64(state, inplace=True)
    state >>= np.uint64(11)
    return state


def mix64(x: np.ndarray, inplace: bool = False) -> np.ndarray:
    """The SplitMix64 finaliser: a bijection of 64-bit integers that scrambles every bit."""
    if not inplace:
        x = x.copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _MIX1
        x ^= x >> np.uint64(27)
        x *= _MIX2
        x ^= x >> np.uint64(31)
    return x


def interval(samples: np.ndarray, level: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile interval of bootstrap `samples` at confidence `level` (NaNs ignored)."""
    samples = np.asarray(samples, dtype=np.float64)
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return (float("nan"), float("nan"))
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return (float(low), float(high))
