"""The timed rounds stopping once the compute-savings answer is decided (`decide_at`, as `run`
asks): each check after a checkpoint reads the verdict's interval wider, so that together the
checks miss at most half as often as the verdict's one 95% interval. Simulated timings only; what
stopping early costs near the threshold is counted in benchmarks/profile_rounds.py --answers,
and the profiler's and the command line's wiring is tested in test_profile_rounds.py.
"""

import numpy as np
import pytest

from graphaudit.errors import UsageError
from graphaudit.profile.baseline import decided, decision_interval
from graphaudit.profile.rounds import FEWEST_TIMED_ROUNDS, TimedRounds, check_decide_at, look_level
from graphaudit.profile.settings import SAVINGS_RATIO_MAX
from graphaudit.verdict.compute_savings import savings_answer


def _paired(rng, ratio: float, rounds: int = 40, inputs: int = 4, noise: float = 0.05):
    """(model, baseline) nanoseconds of `rounds` rounds over `inputs` inputs, the model `ratio`
    times as slow, each call off by a seeded `noise` on its own and each round by a shared load."""
    base = np.linspace(0.5e6, 1.5e6, inputs)[None, :]
    load = rng.lognormal(0.0, 0.05, (rounds, 1))
    return (base * ratio * load * rng.lognormal(0.0, noise, (rounds, inputs)),
            base * load * rng.lognormal(0.0, noise, (rounds, inputs)))


def test_timed_rounds_stop_once_the_answer_is_decided_and_say_so():
    model, baseline = _paired(np.random.default_rng(0), 1.5)
    rule = TimedRounds(None, precision=0.001, budget_s=1e9, decide_at=SAVINGS_RATIO_MAX, inputs=4)
    done = next(k for k in range(1, 41) if not rule.more(model[:k], baseline[:k], 0.0))
    assert (done, rule.stop, rule.side, rule.looks) == (FEWEST_TIMED_ROUNDS, "decided", "above", 1)
    assert rule.reached > 0.001  # short of the precision asked
    words = rule.describe(done)
    assert "the ratio's interval lay wholly above 0.95× at the 98.8% level of the check made after 5 rounds" in words
    assert "short of the ±0.1% asked" in words
    # the verdict's 95% interval, narrower than the check's, says the same
    interval = decision_interval(model[:done], baseline[:done], 4)
    assert savings_answer(interval.low, interval.high) == "no"
    # without a ratio to decide at, or without a baseline, the rounds time on to the precision
    for rule, base in ((TimedRounds(None, precision=0.001, budget_s=1e9), baseline),
                       (TimedRounds(None, precision=0.001, budget_s=1e9, decide_at=SAVINGS_RATIO_MAX), None)):
        assert all(rule.more(model[:k], None if base is None else base[:k], 0.0) for k in range(1, 40))
        assert rule.looks == 0 and rule.side is None


def test_timed_rounds_on_one_of_inputs_alike_decide_as_on_every_input():
    """One input timed of 32: what the others could change is unknown, unless every input does
    the same work (`alike`), when the rounds decide as they would on every input."""
    model, baseline = _paired(np.random.default_rng(0), 1.5)
    for alike, stopped_at in ((True, FEWEST_TIMED_ROUNDS), (False, None)):
        rule = TimedRounds(None, precision=0.001, budget_s=1e9, decide_at=SAVINGS_RATIO_MAX, inputs=32, alike=alike)
        done = next((k for k in range(1, 41) if not rule.more(model[:k, :1], baseline[:k, :1], 0.0)), None)
        assert (done, rule.side) == (stopped_at, "above" if alike else None)


def test_stopping_on_a_clear_answer_saves_rounds_and_answers_the_same():
    """Noisy calls (10%) over 4 inputs, 30 seeded profiles each of a model 1.09 and 0.85 times as
    slow as its baseline, at most 40 rounds: timed on, the rounds rarely reach ±2%; stopped once
    the answer is decided, they stop after a handful, with the same answers. (Where the ratio lies
    near 0.95, what stopping early costs in wrong answers is counted in benchmarks/profile_rounds.py
    --answers.)"""
    for ratio, answer in ((1.09, "no"), (0.85, "yes")):
        rounds: dict[float | None, list[int]] = {None: [], SAVINGS_RATIO_MAX: []}
        for seed in range(30):
            model, baseline = _paired(np.random.default_rng(seed), ratio, noise=0.10)
            for decide_at, ran in rounds.items():
                rule = TimedRounds(None, precision=0.02, budget_s=40, decide_at=decide_at, inputs=4)
                done = next(k for k in range(1, 41) if not rule.more(model[:k], baseline[:k], float(k)))
                interval = decision_interval(model[:done], baseline[:done], 4)
                assert savings_answer(interval.low, interval.high) == answer
                ran.append(done)
        assert np.mean(rounds[SAVINGS_RATIO_MAX]) < 12 < 30 < np.mean(rounds[None])


def test_each_check_of_the_answer_reads_a_wider_interval_whose_misses_add_up_to_half_the_verdicts():
    assert look_level(1) == pytest.approx(0.9875) and look_level(2) == pytest.approx(1 - 0.025 / 6)
    assert sum(1 - look_level(j) for j in range(1, 10**5)) == pytest.approx(0.025, abs=1e-6)
    model, baseline = _paired(np.random.default_rng(1), 1.0, rounds=8)
    verdicts = decision_interval(model, baseline)
    assert verdicts.high > verdicts.low > 0.8
    # a threshold just below the verdict's 95% interval: that interval decides it, the first
    # check's 98.75% one does not; one well below, the first check decides and the 30th not
    assert savings_answer(verdicts.low, verdicts.high, verdicts.low - 1e-4) == "no"
    assert decided(model, baseline, None, verdicts.low - 1e-4, look_level(1)) is None
    below = verdicts.low - 0.3 * (verdicts.high - verdicts.low)
    assert decided(model, baseline, None, below, look_level(1)) == "above"
    assert decided(model, baseline, None, below, look_level(30)) is None
    assert decided(model, baseline, None, verdicts.high + 1.0, look_level(1)) == "below"
    assert decided(model[:1], baseline[:1], None, 0.5, look_level(1)) is None  # one round: no interval
    # one input of several: what the others could change is unknown, so nothing is decided
    assert decided(model[:, :1], baseline[:, :1], 32, 0.5, look_level(1)) is None
    assert decided(model[:, :1], baseline[:, :1], None, 0.5, look_level(1)) == "above"  # it was every input
    # inputs that all do the same work: those left out change nothing, one decides as every input would
    assert decided(model[:, :1], baseline[:, :1], 32, 0.5, look_level(1), alike=True) == "above"


def test_a_ratio_to_decide_at_must_be_positive():
    check_decide_at(None)
    check_decide_at(0.95)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "0.95"):
        with pytest.raises(UsageError, match="expected the latency ratio the timed rounds may stop on"):
            check_decide_at(bad)
