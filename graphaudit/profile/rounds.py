"""How much a profile runs: which inputs, how many rounds, and when the timing stops.

A profile runs in four passes (profiler.py), each on the same *sample* of the inputs, the first
three in one session per model: warm-up runs (each input shape); profiled rounds, for per-node
and per-block shares; timed rounds of the model and the baseline beside it, once the profiler
is off, each round running every sampled input once; one run per sampled input at
ORT_DISABLE_ALL for the execution evidence. The old fixed rounds (20 timed after 3 warm-up,
3 profiled, over every input) took under a second on the zoo and 445 s of a 555 s audit at
Pythia-160M's shape.

What is not given is chosen from measured times, so another run may choose otherwise:

- the sample (`plan_sample`): every input where the fewest rounds of every pass over all of
  them fit half the budget at the time of a warm-up run; otherwise as many as do, at least
  FEWEST_SAMPLE (ALIKE_SAMPLE alone where every input does the same work: baseline.same_work),
  one drawn at random (seeded) from each of as many equal stretches of the data
  (`sample_rows`): spread over the data as a systematic sample is, and no pattern that repeats along
  it lines up with the picks, so the sampled inputs stand for a random sample of them all (the
  compute-savings interval counts what those left out could change as for one);
- the profiled rounds (`profiled_rounds`): as few as give each node FEWEST_RUNS profiled runs,
  one round where the sample holds that many inputs;
- the timed rounds (`TimedRounds`): at least FEWEST_TIMED_ROUNDS, then on until the 95% interval of
  the latency ratio to the baseline (without one: of the workload's latency) is within
  ±precision of it, or (`run`, which asks for the compute-savings answer) the answer is decided
  on the verdict's interval widened for each look, or the budget left for them is spent, or
  MOST_CHOSEN_RUNS have run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from graphaudit.errors import UsageError
from graphaudit.profile.settings import (
    ALIKE_SAMPLE,
    DEFAULT_BUDGET_S,
    DEFAULT_PRECISION,
    DEFAULT_WARMUP,
    FEWEST_RUNS,
    FEWEST_SAMPLE,
    FEWEST_TIMED_ROUNDS,
    INTERVAL_LEVEL,
    MOST_CHOSEN_RUNS,
)
from graphaudit.wording import SAME_WORK_WORDS, SAMPLE_OPTION, drawn, pct

__all__ = ["ALIKE_SAMPLE", "DEFAULT_WARMUP", "FEWEST_RUNS", "FEWEST_SAMPLE", "FEWEST_TIMED_ROUNDS", "MOST_CHOSEN_RUNS", "Rounds",
           "TimedRounds", "after_timing_s", "check_budget", "check_decide_at", "check_precision", "check_rounds",
           "interval_halfwidth", "look_level", "plan_sample", "profiled_rounds", "sample_cost", "sample_rows"]
# What the checks of a stopping rule that stops once the answer is decided may miss, over all of
# them: half of what the verdict's one 95% interval may (a wrong answer is then at most about 1.5
# times as likely as with the rounds timed to the precision; at 5% it was about twice as likely)
LOOKS_MISS = (1 - INTERVAL_LEVEL) / 2
SAMPLE_SHARE = 0.5  # of the budget, what the fewest rounds of the sample may take: the rest is for more rounds
PROFILED_COST = 3.0  # a profiled run over a plain one, at most (2.2-3.6x measured on the zoo)
EVIDENCE_COST = 3.0  # a run at ORT_DISABLE_ALL with the profiler on, over a plain optimised one (an estimate)
FIX_THEM = f"{SAMPLE_OPTION}, --runs and --profile-runs fix them"
# Rounds of each kind a profile takes at most: 10,000 timed rounds put a median within a
# fraction of a percent already; more only take time (--runs 1000000000 asked for 238 GiB of timings)
MOST_ROUNDS = 10_000
# Runs of the model whose times a profile holds at most (8 bytes each, per model timed)
MOST_TIMED_RUNS = 10**7


def checkpoints(fewest: int) -> frozenset[int]:
    """Timed rounds after which the interval is computed again, from `fewest`: each time about
    a quarter more."""
    return frozenset(round(fewest * 1.25**k) for k in range(40))


CHECKPOINTS = checkpoints(FEWEST_TIMED_ROUNDS)


@dataclass(frozen=True)
class Rounds:
    """What a profile ran, why, and the measured times it was chosen from."""

    runs: int  # timed rounds
    warmup: int  # runs of each input shape discarded first, in each session
    profile_runs: int  # rounds with the profiler on
    reason: str
    sample: int = 0  # inputs (batches) profiled
    inputs: int = 0  # inputs (batches) there were
    run_s: float | None = None  # one run of the model and the baseline beside it, as measured; None: nothing chosen
    budget_s: float | None = None
    precision: float | None = None  # the interval's half-width asked, relative; None: the rounds were given
    reached: float | None = None  # the half-width the timed rounds reached, relative; None: none (one round)
    stop: str = "given"  # why the timed rounds stopped: precision | decided | budget | most | given
    decide_at: float | None = None  # the ratio the answer is on, where the rounds could stop once it was decided

    @property
    def chosen(self) -> bool:
        """True when something was chosen from a measured time."""
        return self.run_s is not None

    @property
    def sampled(self) -> bool:
        return self.sample < self.inputs

    def describe(self) -> str:
        """The rounds in words, with why."""
        return (f"{self.runs} timed round{'s' if self.runs != 1 else ''} after {self.warmup} warm-up, "
                f"{self.profile_runs} profiled: {self.reason}")

    def to_json(self) -> dict:
        return {"runs": self.runs, "warmup": self.warmup, "profile_runs": self.profile_runs, "chosen": self.chosen,
                "reason": self.reason, "sample": self.sample, "inputs": self.inputs, "run_s": self.run_s,
                "budget_s": self.budget_s, "precision": self.precision, "reached": self.reached, "stop": self.stop,
                "decide_at": self.decide_at}


def sample_rows(n: int, k: int, seed: int = 0) -> list[int]:
    """`k` of 0..n-1 in order, one drawn at random (seeded) from each of `k` stretches of them as
    equal as can be; all of them where `k` >= n. Spread over the data like every n/k-th input, but
    a pattern that repeats along the data (classes taken in turn) cannot line up with the picks,
    as it could with every n/k-th: the every-other inputs of 0, n/2, n/4, ... were all even."""
    if k >= n:
        return list(range(n))
    rng = np.random.default_rng(seed)
    edges = [j * n // k for j in range(k + 1)]
    return [int(rng.integers(lo, hi)) for lo, hi in pairwise(edges)]


def after_timing_s(inputs: int, model_s: float, baseline_s: float = 0.0, profile_runs: int = 1) -> float:
    """Seconds, at most, that `profile_runs` profiled rounds and the evidence runs take on
    `inputs` inputs beside the timed rounds, when a run of the model takes `model_s` (the
    baseline's `baseline_s`: it is profiled and run for evidence alike)."""
    return inputs * (profile_runs * PROFILED_COST + EVIDENCE_COST) * (model_s + baseline_s)


def sample_cost(inputs: int, model_s: float, baseline_s: float = 0.0, profile_runs: int = 1) -> float:
    """Seconds the fewest timed rounds, `profile_runs` profiled rounds and the evidence runs take
    on `inputs` inputs."""
    timed = inputs * FEWEST_TIMED_ROUNDS * (model_s + baseline_s)
    return timed + after_timing_s(inputs, model_s, baseline_s, profile_runs)


def plan_sample(inputs: int, model_s: float, baseline_s: float = 0.0, *, budget_s: float = DEFAULT_BUDGET_S,
                sample: int | None = None, profile_runs: int | None = None, alike: bool = False) -> tuple[int, str]:
    """(inputs to profile, why) out of `inputs`: `sample` where given, else every input where
    their fewest rounds fit SAMPLE_SHARE of `budget_s`, else as many as do, at least FEWEST_SAMPLE;
    ALIKE_SAMPLE where every input does the same work (`alike`: baseline.same_work), whose time
    the rounds tell as well on a few inputs as on many."""
    if sample is not None:
        return min(sample, inputs), "as given"
    share = SAMPLE_SHARE * budget_s
    per_input = sample_cost(1, model_s, baseline_s, profile_runs or 1)
    fits = int(share // per_input) if per_input > 0 else inputs
    if fits >= inputs:
        return inputs, "every input"
    chosen = min(inputs, ALIKE_SAMPLE) if alike else max(min(inputs, FEWEST_SAMPLE), fits)
    return chosen, (f"{chosen} of {inputs} inputs, {drawn(chosen)}: "
                    + (f"the fewest, as {SAME_WORK_WORDS}, and " if alike else "")
                    + f"a run takes {_seconds(model_s + baseline_s)}, "
                    f"so the fewest rounds of all would take about {_seconds(per_input * inputs)}, past half the "
                    f"{_seconds(budget_s)} budget")


def interval_halfwidth(model_ns: np.ndarray, baseline_ns: np.ndarray | None = None) -> float | None:
    """The half-width, relative to the estimate, of the 95% interval the stopping rule reads:
    the workload ratio's (profile/baseline.py) from (round, batch) nanoseconds of model and
    baseline, or without a baseline the workload latency's (each input's median, summed),
    both from a seeded bootstrap over the rounds. None from one round."""
    from graphaudit.profile.baseline import ratio_interval, workload_interval, workload_ratio

    if model_ns.shape[0] < 2:
        return None
    if baseline_ns is not None:
        interval = ratio_interval(model_ns, baseline_ns)
        estimate = float(workload_ratio(model_ns[None], baseline_ns[None])[0])
    else:
        interval = workload_interval(model_ns)
        estimate = float(np.median(model_ns, axis=0).sum())
    if not estimate or math.isnan(interval.low):
        return None
    return (interval.high - interval.low) / 2 / estimate


class TimedRounds:
    """The stopping rule of the timed rounds: `more(samples, elapsed_s)` after each round says
    whether to run another, and `rounds(...)` says what ran and why it stopped.

    Given `runs`, exactly those. Otherwise at least `fewest` (FEWEST_TIMED_ROUNDS); then, at each
    checkpoint (about every quarter more rounds), stop once the interval's half-width is within
    `precision`, or, where `decide_at` is a ratio and a baseline is timed, once the answer on it
    is decided (`decide`: profile.baseline.decided, the verdict's interval on a sample of `inputs`,
    `alike` or not, widened for each look), and in any case once `budget_s` is spent or
    MOST_CHOSEN_RUNS have run."""

    def __init__(self, runs: int | None, precision: float = DEFAULT_PRECISION, budget_s: float = DEFAULT_BUDGET_S,
                 halfwidth: Callable[[np.ndarray, np.ndarray | None], float | None] = interval_halfwidth,
                 fewest: int = FEWEST_TIMED_ROUNDS, decide_at: float | None = None, inputs: int | None = None,
                 alike: bool = False,
                 decide: Callable[[np.ndarray, np.ndarray, int | None, float, float, bool], str | None] | None = None):
        self.runs, self.precision, self.budget_s, self.halfwidth = runs, precision, budget_s, halfwidth
        self.fewest, self.checkpoints = fewest, checkpoints(fewest)
        self.decide_at, self.inputs, self.alike, self.decide = decide_at, inputs, alike, decide or _decided
        self.reached: float | None = None
        self.stop = "given"
        self.looks = 0  # checks of the answer made
        self.side: str | None = None  # "below" / "above" `decide_at`, where the rounds stopped on it

    def more(self, model_ns: np.ndarray, baseline_ns: np.ndarray | None, elapsed_s: float) -> bool:
        done = model_ns.shape[0]
        if self.runs is not None:
            return done < self.runs
        if done < self.fewest:
            return True
        last = elapsed_s >= self.budget_s or done >= MOST_CHOSEN_RUNS
        if done in self.checkpoints or last:
            self.reached = self.halfwidth(model_ns, baseline_ns)
            if self.reached is not None and self.reached <= self.precision:
                self.stop = "precision"
                return False
            if self.decide_at is not None and baseline_ns is not None:
                self.looks += 1
                self.side = self.decide(model_ns, baseline_ns, self.inputs, self.decide_at, look_level(self.looks),
                                        self.alike)
                if self.side is not None:
                    self.stop = "decided"
                    return False
        if last:
            self.stop = "budget" if elapsed_s >= self.budget_s else "most"
            return False
        return True

    def finish(self, model_ns: np.ndarray, baseline_ns: np.ndarray | None) -> None:
        """Read the half-width given rounds reached (chosen ones read it at their last check)."""
        if self.runs is not None:
            self.reached = self.halfwidth(model_ns, baseline_ns)

    def describe(self, done: int) -> str:
        reached = "no interval from one round" if self.reached is None else f"±{pct(self.reached, 1)} reached"
        if self.runs is not None:
            return f"{done} timed rounds as given ({reached})"
        if self.stop == "precision":
            return f"timed until the 95% interval was within ±{pct(self.precision, None)}: {reached} after {done} rounds"
        if self.stop == "decided":
            side = "at or below" if self.side == "below" else "wholly above"
            return (f"timed until the answer at {self.decide_at:.2f}× was decided: the ratio's interval lay {side} "
                    f"{self.decide_at:.2f}× at the {pct(look_level(self.looks), 1)} level of the check made after "
                    f"{done} rounds (each check after a checkpoint reads a wider one, so that together they miss "
                    f"at most half as often as the one 95% interval); {reached}, short of the "
                    f"±{pct(self.precision, None)} asked for the ratio itself (run's --profile-until precision, or "
                    "profile without --decide-at, times on to it)")
        if self.stop == "budget":
            return (f"timed for the {_seconds(self.budget_s)} of the budget left to them: {reached} after {done} "
                    f"rounds, short of the ±{pct(self.precision, None)} asked")
        return (f"timed for the most rounds, {MOST_CHOSEN_RUNS}: {reached}, short of the ±{pct(self.precision, None)} "
                "asked; the noise is the machine's")


def _decided(model_ns: np.ndarray, baseline_ns: np.ndarray, inputs: int | None, at: float,
             level: float, alike: bool) -> str | None:
    from graphaudit.profile.baseline import decided

    return decided(model_ns, baseline_ns, inputs, at, level, alike)


def look_level(look: int) -> float:
    """The level the `look`-th check of a stopping rule that stops once the answer is decided
    reads the interval at: 1 - LOOKS_MISS / (look (look + 1)), so that the chances of a wrong stop
    over every look add up to at most LOOKS_MISS, half the verdict's one interval's."""
    return 1 - LOOKS_MISS / (look * (look + 1))


def profiled_rounds(sample: int, profile_runs: int | None = None) -> int:
    """Profiled rounds over `sample` inputs: `profile_runs` where given, else as few as give each
    node FEWEST_RUNS profiled runs (a median that drops a run another process preempted), one
    round where the sample holds that many inputs. The per-node shares need no more: each run
    profiles every node, and what they cost the timed rounds measure, unprofiled."""
    if profile_runs is not None:
        return profile_runs
    return -(-FEWEST_RUNS // max(1, sample))


def check_budget(budget_s: float) -> None:
    """Refuse a budget that is not a positive number of seconds."""
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not math.isfinite(budget_s) \
            or budget_s <= 0:
        raise UsageError(f"expected the profile's budget to be a positive number of seconds, found {budget_s!r}")


def check_precision(precision: float) -> None:
    """Refuse a precision that is not a fraction between 0 and 1."""
    if isinstance(precision, bool) or not isinstance(precision, (int, float)) or not 0 < precision < 1:
        raise UsageError("expected the profile's precision to be a relative half-width between 0 and 1 "
                         f"(0.02: ±2%), found {precision!r}")


def check_decide_at(ratio: float | None) -> None:
    """Refuse a ratio to decide at that is not a positive number (None: none)."""
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float))
                              or not math.isfinite(ratio) or ratio <= 0):
        raise UsageError(
            f"expected the latency ratio the timed rounds may stop on to be a positive number, found {ratio!r}")


def _seconds(value: float) -> str:
    return f"{value:.3g} s"


def check_rounds(batches: int, runs: int | None = None, warmup: int | None = None,
                 profile_runs: int | None = None, sample: int | None = None) -> None:
    """Refuse rounds past MOST_ROUNDS, or timed rounds of `batches` batches past MOST_TIMED_RUNS
    runs (timed rounds not given counted at MOST_CHOSEN_RUNS), or a sample of no input."""
    for name, value in (("runs", runs), ("warmup", warmup), ("profile-runs", profile_runs)):
        if value is not None and value > MOST_ROUNDS:
            raise UsageError(f"expected --{name} of at most {MOST_ROUNDS} (more rounds only take time), found {value}")
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 1):
        raise UsageError(f"expected --sample to be a number of inputs of at least 1, found {sample!r}")
    rounds = MOST_CHOSEN_RUNS if runs is None else runs
    if rounds * batches > MOST_TIMED_RUNS:
        raise UsageError(f"expected at most {MOST_TIMED_RUNS} timed runs of the model, found {rounds} rounds "
                         f"of {batches} batches: {rounds * batches}; give fewer --runs, a --sample, a --limit or "
                         "a larger --batch-size")
