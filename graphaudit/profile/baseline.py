"""A dense baseline doing the same job: same inputs, timed in alternation, the latency ratio.

The baseline must take exactly the model's inputs (names, element types, fixed sizes);
anything else is refused before any timing. Both are timed on the same inputs, interleaved
(see latency.time_rounds), their sessions' intra-op threads blocking between runs: spinning,
one session's idle threads took the cores the other's next run needed. The ratio is that of the
whole workload, read pair by pair (`workload_ratio`): each input's median over the rounds of its
model run over the baseline run beside it, weighted by the baseline's median latency of that
input. The machine's load, which the two runs of a pair share, divides out of each pair's ratio,
so a load that drifts from round to round does not widen the interval: in three recordings of
30 rounds on a shared machine its interval reached ±2% after 6, 19 and 30 rounds, where that of
the ratio of the two workloads' medians, read before, did not within 30
(benchmarks/profile_rounds.py). Its spread (median, 10th and 90th
percentiles) comes from a seeded bootstrap that resamples both the inputs and the rounds,
so it holds the variation between inputs and the noise of the measurement. The verdict's
interval (`decision_interval`, 95%) resamples the rounds (`ratio_interval`): the inputs are the
workload the ratio is about, so what another run on them may change is the measurement's noise,
and a saving is decided only where that interval lies on one side of the threshold. Where the
profile timed a sample of the inputs, the inputs left out are part of that workload too, and
what they could change is added (`sampling_halfwidth`): the spread of the sampled inputs'
ratios, as for a ratio estimated from a simple random sample (finite population corrected,
Student's t at the sample's size), in quadrature with each side of the rounds' interval, unless
every input does the same work in both graphs (`same_work`: nothing in either depends on input
values, and every input has the same shapes), where an input's ratio differs from another's by
the measurement's noise alone, which the rounds' part already holds. More
rounds narrow the first part only, so the stopping rule reads the rounds' interval alone for
its precision. Where it may also stop once the answer on a threshold is decided (`decided`, as
`run` asks), it reads the verdict's interval, the rounds' part widened for having looked after
each checkpoint: at the j-th look each side is scaled to the level 1 - 0.025 / (j (j + 1)), whose
misses add up to at most 2.5%, half the verdict's one interval's (98.75% at the first, 99.6% at
the second). On simulated profiles whose ratio lies just past the threshold, a wrong answer came
about 1.5 times as often as with the rounds timed to the precision, under 5% (benchmarks/
profile_rounds.py --answers).

The baseline's executed FLOPs are measured as the model's are (one run per input, profiled at
ORT_DISABLE_ALL), except where its static count already is them (`counted_flops`): a graph in
which nothing depends on input values runs every node once at the sizes its input shapes fix,
so on inputs of the shapes it was counted at it executes its whole count, and measuring it
again (its file read once more, each input run under the profiler) would count it twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import numpy as np

from graphaudit.errors import GraphAuditError
from graphaudit.load.data import InputSpec
from graphaudit.profile.breakdown import GroupTime
from graphaudit.profile.latency import Spread, batch_latency_ms, spread
from graphaudit.profile.settings import INTERVAL_LEVEL
from graphaudit.wording import SAME_WORK_WORDS, pct

RESAMPLES = 500
RATIO_METHOD = ("each input's median over rounds of its model run's latency over the baseline run's beside it, "
                "weighted by the baseline's median latency of that input; timed in alternation with ONNX "
                "Runtime's intra-op threads blocking between runs (not spinning on the cores the other session's "
                "run needs); spread from a bootstrap over inputs and rounds (seed 0)")
INTERVAL_METHOD = ("bootstrap over the timed rounds, each resampled round the same for both models and every "
                   "input kept (seed 0): the noise of the measurement on this workload, not the drift of a "
                   "machine's load between runs; none from a single round")
SAMPLED_METHOD = (INTERVAL_METHOD + "; the profile timed a sample of the inputs, so each side is widened, in "
                  "quadrature, by what the inputs left out could change: Student's t at the sample's size times "
                  "the standard error of a ratio from a simple random sample, finite population corrected")
ALIKE_METHOD = (INTERVAL_METHOD + f"; the profile timed a sample of the inputs, but {SAME_WORK_WORDS}, so what "
                "the inputs left out could change is the measurement's noise the rounds hold: not widened")
# Student's t quantile at 97.5% (a two-sided 95% interval) by degrees of freedom; past the table,
# 1.96 + 2.4 / df is within 0.002 of it
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# where the baseline's executed FLOPs come from
MEASURED = "measured"
COUNTED = "counted from its graph: nothing in it depends on input values"
FLOPS_SOURCES = (MEASURED, COUNTED)


@dataclass(frozen=True)
class Interval:
    """An interval of the workload ratio at a confidence level (NaN ends: none could be had)."""

    low: float
    high: float
    level: float = INTERVAL_LEVEL
    rounds: int = 0  # the timed rounds it was resampled from
    sample: int = 0  # the inputs timed; 0: not said
    inputs: int = 0  # the inputs of the workload the sample was drawn from; 0: not said
    sampling: float = 0.0  # the half-width, in ratio, the inputs left out add (0: none was left out, or `alike`)
    alike: bool = False  # every input does the same work in both graphs (same_work): those left out add nothing

    @property
    def sampled(self) -> bool:
        return 0 < self.sample < self.inputs

    def to_json(self) -> dict:
        return {"low": _finite(self.low), "high": _finite(self.high), "level": self.level, "rounds": self.rounds,
                "sample": self.sample, "inputs": self.inputs, "sampling_halfwidth": _finite(self.sampling),
                **({"inputs_alike": True} if self.alike and self.sampled else {}),
                "method": (ALIKE_METHOD if self.alike else SAMPLED_METHOD) if self.sampled else INTERVAL_METHOD}


@dataclass(frozen=True)
class BaselineComparison:
    """The baseline's latency and the model's latency over it."""

    model: str
    latency_ms: Spread
    ratio: float  # model / baseline, whole workload
    ratio_spread: Spread  # bootstrap over inputs and rounds
    flops_executed: float | None = None  # the baseline's mean FLOPs per input
    flops_source: str | None = None  # MEASURED or COUNTED; None: no FLOPs
    ratio_interval: Interval | None = None  # what the verdict decides on (decision_interval)
    blocks: tuple[GroupTime, ...] | None = None  # its time per block, profiled as the model's was

    @property
    def slower_pct(self) -> float:
        """How much slower the model is, in percent (negative: faster)."""
        return (self.ratio - 1.0) * 100.0

    def describe(self) -> str:
        word = "slower" if self.slower_pct >= 0 else "faster"
        return f"{pct(abs(self.ratio - 1.0), small=False)} {word} than {self.model}"

    def to_json(self) -> dict:
        return {"model": self.model, "latency_ms": self.latency_ms.median,
                "latency_spread_ms": self.latency_ms.to_json(), "ratio": self.ratio,
                "ratio_spread": self.ratio_spread.to_json(), "ratio_method": RATIO_METHOD,
                "slower_pct": self.slower_pct, "flops_executed": self.flops_executed, "flops_source": self.flops_source,
                "ratio_interval": None if self.ratio_interval is None else self.ratio_interval.to_json(),
                "blocks": None if self.blocks is None else [b.to_json() for b in self.blocks]}


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


def compare(name: str, model_ns: np.ndarray, baseline_ns: np.ndarray, flops_executed: float | None = None,
            resamples: int = RESAMPLES, seed: int = 0, blocks: Sequence[GroupTime] | None = None,
            flops_source: str | None = None, inputs: int | None = None, alike: bool = False) -> BaselineComparison:
    """The comparison from (round, batch) nanosecond samples of model and baseline; `blocks`: the
    baseline's time per block (breakdown.breakdown of its profiled rounds); `flops_source`: where
    `flops_executed` came from (MEASURED, COUNTED); `inputs`: the inputs (batches) the timed ones
    were a sample of (None: they were all); `alike`: every input does the same work (`same_work`)."""
    ratio = float(workload_ratio(model_ns[None], baseline_ns[None])[0])
    rng = np.random.default_rng(seed)
    rounds, timed = map(int, model_ns.shape)  # ints, so `integers` below is typed as giving arrays
    boot = np.empty(resamples)
    for k in range(resamples):
        r = rng.integers(0, rounds, rounds)[:, None]
        i = rng.integers(0, timed, timed)[None, :]
        boot[k] = workload_ratio(model_ns[r, i][None], baseline_ns[r, i][None])[0]
    return BaselineComparison(name, batch_latency_ms(baseline_ns), ratio, spread(boot), flops_executed, flops_source,
                              decision_interval(model_ns, baseline_ns, inputs, resamples=resamples, seed=seed,
                                                alike=alike),
                              None if blocks is None else tuple(blocks))


def counted_flops(static: Any | None, feed_shapes: Sequence[tuple[tuple[str, tuple[int, ...]], ...]]) -> float | None:
    """The FLOPs each run fed `feed_shapes` executes, from the static count of `static` (the
    baseline's StaticReport), where that count is what every such run executes; None where they
    must be measured.

    It is where nothing in the graph depends on input values (`StaticReport.fixed_work`) and
    every run is fed exactly the shapes it was counted at: a run is one input, or the model's
    fixed batch, both for the count (`audit._shapes`) and for `flops_executed` (per run, mean
    over runs), so another batch or sequence length is another shape and is measured."""
    if static is None or not static.fixed_work or not static.flops.shapes:  # no shapes: counted at none given
        return None
    counted_at = dict(static.flops.shapes)
    if not feed_shapes or any(dict(shapes) != counted_at for shapes in feed_shapes):
        return None
    return float(static.flops.total)


def same_work(statics: Sequence[Any | None], feed_shapes: Sequence[tuple[tuple[str, tuple[int, ...]], ...]]) -> bool:
    """Whether every input (batch) does the same work in each graph timed, the model's and the
    baseline's where there is one: their StaticReports (`statics`) say they run every node once at
    the sizes the input shapes fix, nothing in them depending on input values
    (`StaticReport.fixed_work`), and every input is fed the same shapes (`feed_shapes`, one entry
    per input). One input's time, or pair ratio, then differs from another's by the measurement's
    noise alone, which the rounds' bootstrap holds: read as a difference between inputs, the noise
    of a busy machine widened a 160M FeatureGate's interval by ±11% and kept its profile timing to
    its budget (benchmarks/NOTES.md). False where a report is missing (nothing then says so)."""
    if not statics or any(static is None or not static.fixed_work for static in statics):
        return False
    return len(set(feed_shapes)) == 1


def ratio_interval(model_ns: np.ndarray, baseline_ns: np.ndarray, level: float = INTERVAL_LEVEL,
                   resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """The `level` interval of the workload ratio from (round, batch) nanoseconds of model and
    baseline: a seeded bootstrap over the rounds, each input kept.

    A resampled round is the same round for both, as they were timed in pairs. One round has
    no spread to resample: its interval is NaN, which decides nothing."""
    return over_rounds(workload_ratio, (model_ns, baseline_ns), level, resamples, seed)


def decision_interval(model_ns: np.ndarray, baseline_ns: np.ndarray, inputs: int | None = None,
                      resamples: int = RESAMPLES, seed: int = 0, level: float = INTERVAL_LEVEL,
                      alike: bool = False) -> Interval:
    """The 95% interval compute savings is decided on: the rounds' (`ratio_interval`), and where
    the timed inputs were a sample of `inputs`, each side widened in quadrature by what the
    inputs left out could change (`sampling_halfwidth`), unless they are `alike`: every input
    does the same work in both graphs (`same_work`), so they could change nothing the rounds'
    part does not hold.

    `level`: the rounds' part read wider, at that level, as a stopping rule's check reads it
    (`decided`): each side of their 95% interval scaled by the normal quantile of `level` over
    1.96. What the inputs left out could change is not: it is one draw, the same at every check,
    which looking again does not give another chance."""
    rounds = ratio_interval(model_ns, baseline_ns, resamples=resamples, seed=seed)
    sample = int(model_ns.shape[1])
    total = sample if inputs is None else max(int(inputs), sample)
    widen = 0.0 if alike else sampling_halfwidth(model_ns, baseline_ns, total)
    scale = 1.0
    if level != INTERVAL_LEVEL:
        normal = NormalDist()
        scale = normal.inv_cdf(1 - (1 - level) / 2) / normal.inv_cdf(1 - (1 - INTERVAL_LEVEL) / 2)
    if (not widen and scale == 1.0) or np.isnan(rounds.low):
        return replace(rounds, sample=sample, inputs=total, sampling=widen, alike=alike)
    estimate = float(workload_ratio(model_ns[None], baseline_ns[None])[0])
    low = estimate - float(np.hypot(scale * (estimate - rounds.low), widen))
    high = estimate + float(np.hypot(scale * (rounds.high - estimate), widen))
    return Interval(low, high, level, rounds.rounds, sample, total, widen, alike)


def decided(model_ns: np.ndarray, baseline_ns: np.ndarray, inputs: int | None, at: float,
            level: float, alike: bool = False) -> str | None:
    """"below" where the verdict's interval of the workload ratio (`decision_interval`, on a
    sample of `inputs`, `alike` or not), its rounds' part read at `level` (a stopping rule's
    check: rounds.look_level), lies at or below `at`, "above" where it lies wholly above, else
    None (also where there is none: one round, or one input of several not alike)."""
    interval = decision_interval(model_ns, baseline_ns, inputs, level=level, alike=alike)
    return "below" if interval.high <= at else "above" if interval.low > at else None


def sampling_halfwidth(model_ns: np.ndarray, baseline_ns: np.ndarray, inputs: int) -> float:
    """The half-width, in ratio, of the 95% interval of what the `inputs` - n inputs left out of
    the n timed could change the workload ratio: Student's t with n - 1 degrees of freedom times
    the standard error of a ratio estimated from a simple random sample of n of `inputs`,
    sqrt((1 - n / inputs) / n) * sd(w_i (r_i - R)) / mean(w_i), where r_i is an input's pair
    ratio (its median over rounds), w_i its weight (the baseline's median latency) and R the
    workload ratio. 0 where every input was timed, NaN from one input of several."""
    n = int(model_ns.shape[1])
    if inputs <= n:
        return 0.0
    if n < 2:
        return float("nan")
    weights = np.median(baseline_ns, axis=0).astype(np.float64)
    ratios = np.median(model_ns / baseline_ns, axis=0)
    estimate = (weights * ratios).sum() / weights.sum()
    error = np.sqrt((1 - n / inputs) / n) * np.std(weights * (ratios - estimate), ddof=1) / weights.mean()
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96 + 2.4 / (n - 1)
    return float(t * error)


def workload_ratio(model_ns: np.ndarray, baseline_ns: np.ndarray) -> np.ndarray:
    """Each resample's workload ratio from (resample, round, batch) nanoseconds of model and
    baseline: each input's median over the rounds of model over baseline run by run, weighted by
    the baseline's median latency of that input. Without noise it is the ratio of the two
    workloads; a load both runs of a pair share divides out."""
    weights = np.median(baseline_ns, axis=1)
    return (weights * np.median(model_ns / baseline_ns, axis=1)).sum(axis=1) / weights.sum(axis=1)


def workload_interval(model_ns: np.ndarray, level: float = INTERVAL_LEVEL, resamples: int = RESAMPLES,
                      seed: int = 0) -> Interval:
    """The `level` interval of the workload's latency (each input's median over rounds, summed)
    from (round, batch) nanoseconds: the bootstrap of `ratio_interval`, for a model timed alone."""
    return over_rounds(workload_latency, (model_ns,), level, resamples, seed)


def workload_latency(ns: np.ndarray) -> np.ndarray:
    """Each resample's workload time from (resample, round, batch) nanoseconds."""
    return np.median(ns, axis=1).sum(axis=1)


def over_rounds(statistic, arrays: tuple[np.ndarray, ...], level: float, resamples: int, seed: int) -> Interval:
    """The `level` interval of `statistic` over a seeded bootstrap of the rounds (axis 0) of
    `arrays`, the same rounds drawn for each; NaN ends from one round."""
    rounds, inputs = arrays[0].shape
    if rounds < 2:
        return Interval(float("nan"), float("nan"), level, rounds)
    picks = np.random.default_rng(seed).integers(0, rounds, (resamples, rounds))
    boot = np.concatenate([  # a few resamples at a time: (resamples, rounds, inputs) at once can be large
        statistic(*(a[chunk] for a in arrays)) for chunk in np.array_split(picks, max(1, picks.size * inputs // 2**22))])
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(boot, [tail, 100 - tail])
    return Interval(float(low), float(high), level, rounds)


def _finite(value: float) -> float | None:
    return None if np.isnan(value) else value
