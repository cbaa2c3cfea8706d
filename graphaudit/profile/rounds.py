"""How many rounds a profile runs: as given, or chosen from the time of its first round.

A round runs every batch once. The profile runs its rounds in three passes (profiler.py):
warm-up and timed rounds, un-profiled (and the baseline's beside them); warm-up and profiled
rounds, each interleaved with an un-profiled one; one round for the execution evidence. The
fixed defaults it had (20 timed after 3 warm-up, 3 profiled: 36 rounds of the model) took
under a second on the zoo and 157 s on a text detector at 736 x 736 pixels. `choose_rounds`
keeps them where they fit a time budget and otherwise takes fewer, down to 3 timed rounds (a
median and a spread), from the time of a round measured on the first one (`round_seconds`):
the choice rests on a measured time, so another run may choose otherwise. Rounds given are
kept as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphaudit.errors import UsageError
from graphaudit.profile.settings import DEFAULT_BUDGET_S

MOST_RUNS, MOST_WARMUP, MOST_PROFILE_RUNS = 20, 3, 3  # the rounds of a model that runs fast
FEWEST_RUNS = 3  # a median and a spread
# A new session's first runs are slow: ONNX Runtime plans a shape's memory on the first and
# allocates the plan on the second, which took as long (a detector at 736 x 736 pixels).
FEWEST_WARMUP = 2
ROUNDS_DEFAULT = "20, or as many as fit the budget at the first round's time, at least 3"
FIX_THEM = "--runs, --warmup and --profile-runs fix them"
# Rounds of each kind a profile takes at most: 10,000 timed rounds put a median within a
# fraction of a percent already; more only take time (--runs 1000000000 asked for 238 GiB of timings)
MOST_ROUNDS = 10_000
# Runs of the model whose times a profile holds at most (8 bytes each, per model timed)
MOST_TIMED_RUNS = 10**7


@dataclass(frozen=True)
class Rounds:
    """The rounds a profile runs, why, and the measured time they were chosen from."""

    runs: int  # timed rounds
    warmup: int  # rounds run first and discarded, in each pass
    profile_runs: int  # rounds with the profiler on
    reason: str
    round_s: float | None = None  # a round of the model and the baseline, as measured; None: all given
    budget_s: float | None = None
    estimate_s: float | None = None  # what the rounds take at the first round's time

    @property
    def chosen(self) -> bool:
        """True when some of the rounds were chosen from the first round's time."""
        return self.round_s is not None

    def describe(self) -> str:
        """The rounds in words, with why."""
        return (f"{self.runs} timed round{'s' if self.runs != 1 else ''} after {self.warmup} warm-up, "
                f"{self.profile_runs} profiled: {self.reason}")

    def to_json(self) -> dict:
        return {"runs": self.runs, "warmup": self.warmup, "profile_runs": self.profile_runs, "chosen": self.chosen,
                "reason": self.reason, "round_s": self.round_s, "budget_s": self.budget_s,
                "estimate_s": self.estimate_s}


def rounds_cost(runs: int, warmup: int, profile_runs: int, model_s: float, baseline_s: float = 0.0) -> float:
    """Seconds the profile's rounds take when a round of the model takes `model_s` (and the
    baseline's `baseline_s`): timed rounds of both, profiled rounds paired with plain ones, and
    the evidence round of each (profiling's own overhead left out)."""
    both = model_s + baseline_s
    return (warmup + runs) * both + (warmup + profile_runs) * 2 * model_s + both


def round_seconds(first: np.ndarray) -> float:
    """Seconds a round takes, from the nanoseconds of each batch's run in the first round: the
    median run times the batches, so that the first run's own start-up does not count."""
    return float(np.median(first)) * first.size / 1e9


def choose_rounds(model_s: float, baseline_s: float = 0.0, *, budget_s: float = DEFAULT_BUDGET_S,
                  runs: int | None = None, warmup: int | None = None, profile_runs: int | None = None) -> Rounds:
    """The Rounds of a profile whose round takes `model_s` seconds (the baseline's
    `baseline_s`): the rounds given, and for the others the most that fit `budget_s`.

    The most are 20 timed after 3 warm-up, 3 profiled; fewer run after 2 warm-up, with a
    profiled round for every 5 timed ones (1 to 3); the fewest, 3 timed, run whatever they take."""
    given = {"runs": runs, "warmup": warmup, "profile_runs": profile_runs}
    if runs is not None and warmup is not None and profile_runs is not None:
        return Rounds(runs, warmup, profile_runs, "as given")

    def filled(r: int, w: int, p: int) -> tuple[int, int, int]:
        return (r if runs is None else runs, w if warmup is None else warmup,
                p if profile_runs is None else profile_runs)

    ladder = [filled(MOST_RUNS, MOST_WARMUP, MOST_PROFILE_RUNS)]
    ladder += [filled(r, FEWEST_WARMUP, min(MOST_PROFILE_RUNS, max(1, r // 5)))
               for r in range(MOST_RUNS - 1, FEWEST_RUNS - 1, -1)]
    costs = [rounds_cost(*step, model_s, baseline_s) for step in ladder]
    fits = next((i for i, cost in enumerate(costs) if cost <= budget_s), None)
    pick = len(ladder) - 1 if fits is None else fits
    first = model_s + baseline_s
    took = (f"a round takes {_seconds(first)} (measured on the first), so these take about {_seconds(costs[pick])}, "
            "the profiler's own cost aside")
    fixed = [f"--{k.replace('_', '-')} {v}" for k, v in given.items() if v is not None]
    if fits == 0:
        why = f"the most, within the {_seconds(budget_s)} budget: {took}"
    elif fits is not None:
        why = f"fewer than the most (20 timed after 3 warm-up, 3 profiled) to fit the {_seconds(budget_s)} budget: {took}"
    else:
        why = f"the fewest: {took}, past the {_seconds(budget_s)} budget"
    reason = (f"{why}{' (' + ', '.join(fixed) + ' as given)' if fixed else ''}; chosen from a measured time, so "
              f"another run may choose others ({FIX_THEM})")
    return Rounds(*ladder[pick], reason, first, budget_s, costs[pick])


def check_budget(budget_s: float) -> None:
    """Refuse a budget that is not a positive number of seconds."""
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not math.isfinite(budget_s) \
            or budget_s <= 0:
        raise UsageError(f"expected the profile's budget to be a positive number of seconds, found {budget_s!r}")


def _seconds(value: float) -> str:
    return f"{value:.3g} s"


def check_rounds(batches: int, runs: int | None = None, warmup: int | None = None,
                 profile_runs: int | None = None) -> None:
    """Refuse rounds past MOST_ROUNDS, or timed rounds of `batches` batches past MOST_TIMED_RUNS runs
    (rounds not given counted at their most, 20 timed after 3 warm-up)."""
    for name, value in (("runs", runs), ("warmup", warmup), ("profile-runs", profile_runs)):
        if value is not None and value > MOST_ROUNDS:
            raise UsageError(f"expected --{name} of at most {MOST_ROUNDS} (more rounds only take time), found {value}")
    rounds = (MOST_RUNS if runs is None else runs) + (MOST_WARMUP if warmup is None else warmup)
    if rounds * batches > MOST_TIMED_RUNS:
        raise UsageError(f"expected at most {MOST_TIMED_RUNS} timed runs of the model, found {rounds} rounds "
                         f"(warm-up and timed) of {batches} batches: {rounds * batches}; give fewer --runs, a "
                         "--limit or a larger --batch-size")
