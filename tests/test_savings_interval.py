"""Compute savings rests on timing, so it is decided on the latency ratio's interval over the
timed rounds: yes or no only where the interval lies on one side of the threshold,
"inconclusive" (exit status 4 for `--claim compute-savings`) where it straddles it.

Every test here feeds given round timings or a given profile document; none times anything."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from graphaudit.cli import cli
from graphaudit.profile.baseline import compare, ratio_interval, workload_ratio
from graphaudit.report import render
from graphaudit.verdict.compute_savings import SAVINGS_RATIO_MAX, savings_answer
from graphaudit.verdict.decide import ClaimCheck, check_claim, claims_status, decide
from graphaudit.verdict.findings import ANSWERS, INCONCLUSIVE, NO, YES

from support.json_schema import errors
from support.report_samples import document, earlyexit


@pytest.mark.parametrize("low, high, answer", [
    (0.80, 0.90, YES),
    (0.80, SAVINGS_RATIO_MAX, YES),  # at the threshold is a saving
    (0.93, 0.97, INCONCLUSIVE),  # straddles it
    (0.94, 1.20, INCONCLUSIVE),
    (0.951, 0.96, NO),
    (1.20, 1.40, NO),
    (None, None, INCONCLUSIVE),  # a single round: no interval
])
def test_the_answer_follows_the_interval_not_the_median(low, high, answer):
    assert savings_answer(low, high) == answer


def rounds(ratio: float, noise: float, rng, n_rounds: int = 20, inputs: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(round, input) nanoseconds of a model `ratio` times the baseline's, each call off by
    `noise` (relative) on its own, and each round by a load both share."""
    base = np.linspace(0.5e6, 1.5e6, inputs)[None, :]
    load = rng.lognormal(0.0, noise, (n_rounds, 1))
    model = base * ratio * load * rng.lognormal(0.0, noise, (n_rounds, inputs))
    baseline = base * load * rng.lognormal(0.0, noise, (n_rounds, inputs))
    return model, baseline


def test_the_interval_is_over_rounds_and_keeps_the_inputs():
    rng = np.random.default_rng(0)
    base = rng.normal(1e6, 1e4, (10, 6))  # (round, input) ns
    model = base * np.array([1.0, 1.0, 1.0, 2.0, 2.0, 2.0])  # half the inputs twice as slow: the workload
    result = compare("dense", model, base)
    interval = result.ratio_interval
    assert interval.low < result.ratio < interval.high and interval.rounds == 10 and interval.level == 0.95
    # the inputs' own differences widen the spread over inputs, not the measurement's interval
    assert interval.high - interval.low < (result.ratio_spread.p90 - result.ratio_spread.p10) / 4
    assert ratio_interval(model, base) == interval  # seeded
    doc = result.to_json()["ratio_interval"]
    assert doc["low"] == interval.low and doc["high"] == interval.high and "rounds" in doc["method"]


def test_the_ratio_is_the_workloads_read_pair_by_pair():
    """Without noise, the ratio is the workload's: an input of twice the others' latency weighs
    twice ((1.2 + 1.2 + 2 x 1.45) / 4 = 1.325, not the inputs' mean 1.283), over rounds of any
    speed; with the machine's load changing from pair to pair by 30% and each call off by 0.5%
    on its own, the ratio and its interval stay within 0.5% and 1% of the model's 1.3."""
    load = np.random.default_rng(4).lognormal(0.0, 0.3, (12, 1))  # whole rounds faster or slower
    baseline = np.array([1e6, 1e6, 2e6])[None, :] * load
    model = baseline * np.array([1.2, 1.2, 1.45])[None, :]
    exact = compare("dense", model, baseline)
    assert exact.ratio == pytest.approx(1.325, rel=1e-12)
    assert exact.ratio_interval.high - exact.ratio_interval.low == pytest.approx(0.0, abs=1e-12)
    assert workload_ratio(model[None], baseline[None])[0] == exact.ratio
    rng = np.random.default_rng(5)
    pairs = rng.lognormal(0.0, 0.3, (12, 3))  # what the two runs of each pair share
    model = np.array([1e6, 1e6, 2e6])[None, :] * 1.3 * pairs * rng.lognormal(0.0, 0.005, (12, 3))
    baseline = np.array([1e6, 1e6, 2e6])[None, :] * pairs * rng.lognormal(0.0, 0.005, (12, 3))
    noisy = compare("dense", model, baseline)
    assert noisy.ratio == pytest.approx(1.3, rel=0.005)
    assert 1.3 * 0.99 < noisy.ratio_interval.low <= noisy.ratio <= noisy.ratio_interval.high < 1.3 * 1.01


def test_one_round_gives_no_interval_and_decides_nothing():
    model, baseline = rounds(0.5, 0.01, np.random.default_rng(1), n_rounds=1)
    interval = ratio_interval(model, baseline)
    assert np.isnan(interval.low) and np.isnan(interval.high)
    assert compare("dense", model, baseline).to_json()["ratio_interval"]["low"] is None
    profile = profile_of(compare("dense", model, baseline))
    finding = decide(None, None, profile).compute_savings
    assert finding.answer == INCONCLUSIVE and "a single timed round gives no interval" in finding.statement


def profile_of(comparison) -> dict:
    """A profile document around `comparison`, as ProfileReport.to_json() writes it."""
    return {"model": "model.onnx", "provider": "CPUExecutionProvider", "batch_size": 1,
            "latency_ms": {"median": 1.0, "p10": 0.9, "p90": 1.1, "n": 20}, "baseline": comparison.to_json()}


@pytest.mark.parametrize("ratio", [0.92, 0.94, 0.95, 0.96, 0.98])
def test_repeated_runs_of_the_same_inputs_never_answer_both_yes_and_no(ratio):
    # Runs of a model near the threshold, each its own draw of the measurement's noise: some
    # may be inconclusive, but a yes and a no never come from the same inputs.
    rng = np.random.default_rng(int(ratio * 1000))
    answers = set()
    for _ in range(12):
        model, baseline = rounds(ratio, 0.03, rng)
        interval = ratio_interval(model, baseline).to_json()
        profile = profile_of_ratio(float(np.median(model, axis=0).sum() / np.median(baseline, axis=0).sum()), interval)
        answers.add(decide(None, None, profile).compute_savings.answer)
    assert not {YES, NO} <= answers, answers


def profile_of_ratio(ratio: float, interval: dict) -> dict:
    return {"model": "model.onnx", "provider": "CPUExecutionProvider", "latency_ms": {"median": 1.0, "n": 20},
            "baseline": {"model": "dense.onnx", "ratio": ratio, "ratio_interval": interval}}


def test_clear_cases_are_decided():
    rng = np.random.default_rng(2)
    assert decide(None, None, profile_of(compare("dense", *rounds(0.80, 0.03, rng)))).compute_savings.answer == YES
    assert decide(None, None, profile_of(compare("dense", *rounds(1.30, 0.03, rng)))).compute_savings.answer == NO


def straddling_profile(profile: dict) -> dict:
    """`profile` with a ratio of 0.94× whose interval over rounds, 0.91–0.97×, straddles 0.95×."""
    baseline = {**profile["baseline"], "ratio": 0.94,
                "ratio_spread": {"median": 0.94, "p10": 0.90, "p90": 0.98, "n": 500},
                "ratio_interval": {"low": 0.91, "high": 0.97, "level": 0.95, "rounds": 20}}
    return {**profile, "baseline": baseline}


def test_a_straddling_interval_is_inconclusive_in_the_verdict_the_claim_and_the_document():
    static, replay, profile = earlyexit()
    verdict = decide(static, replay, straddling_profile(profile))
    finding = verdict.compute_savings
    assert finding.answer == INCONCLUSIVE and finding.answer in ANSWERS
    assert finding.statement.startswith("Inconclusive: ")
    assert "95% interval 0.91–0.97×" in finding.statement and "straddles the 0.95×" in finding.statement
    assert any("timed rounds" in e.text for e in finding.evidence)
    check = check_claim(verdict, "compute-savings")
    assert not check.supported and check.inconclusive and check.reason.startswith("not established (inconclusive)")
    assert check.to_json()["inconclusive"] is True
    assert claims_status([check]) == 4
    assert claims_status([check, check_claim(verdict, "dynamic-inference")]) == 4  # the other is supported
    refuted = ClaimCheck("dynamic-inference", False, "refuted: No")
    assert claims_status([check, refuted]) == 3  # a refutation outweighs an undecided timing
    assert claims_status([check_claim(verdict, "dynamic-inference")]) == 0
    doc = document((static, replay, straddling_profile(profile)), claims=[check.to_json()])
    assert errors(json.loads(render(doc, "json"))) == []
    for fmt in ("text", "markdown", "html"):
        assert "inconclusive" in render(doc, fmt)


class _Report:
    """What `graphaudit run` uses of an audit's report."""

    def __init__(self, claims):
        self.claims = claims

    def render(self, fmt):
        return "report\n"


def test_run_exits_4_when_the_claim_is_inconclusive(monkeypatch, tmp_path):
    import sys

    run_module = sys.modules["graphaudit.audit"]  # the module (graphaudit.audit is the function), as run imports it

    static, replay, profile = earlyexit()
    check = check_claim(decide(static, replay, straddling_profile(profile)), "compute-savings")
    monkeypatch.setattr(run_module, "audit", lambda *args, **kwargs: _Report((check,)))
    for name in ("m.onnx", "c.npz", "b.onnx"):
        (tmp_path / name).write_bytes(b"")
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "c.npz"),
                                      "--baseline", str(tmp_path / "b.onnx"), "--claim", "compute-savings", "-q"])
    assert result.exit_code == 4, result.output
    assert "claim compute-savings not established (inconclusive)" in result.output
    assert "4 when none is refuted but one is inconclusive" in CliRunner().invoke(cli, ["run", "--help"]).output


def test_the_evidence_says_when_the_rounds_ran_on_a_sample_of_the_inputs():
    rng = np.random.default_rng(2)
    profile = profile_of(compare("dense", *rounds(1.30, 0.03, rng)))
    whole = decide(None, None, {**profile, "rounds": {"sample": 8, "inputs": 8}}).compute_savings
    sampled = decide(None, None, {**profile, "rounds": {"sample": 4, "inputs": 32}}).compute_savings
    texts = [" ".join(e.text for e in f.evidence) for f in (whole, sampled)]
    assert "timed rounds (a bootstrap" in texts[0] and "inputs, spread evenly" not in texts[0]
    assert "timed rounds, on 4 of the 32 inputs, spread evenly over them (a bootstrap" in texts[1]


@pytest.mark.parametrize("runs, warned", [(2, True), (4, True), (5, False), (20, False)])
def test_an_interval_from_fewer_rounds_than_the_profile_chooses_says_it_holds_less(runs, warned):
    """Given --runs 2-4, the 95% interval rests on each input's median of so few rounds that it
    holds the ratio less often than 95%: the evidence says so; from 5 rounds on it does not."""
    profile = profile_of(compare("dense", *rounds(0.80, 0.03, np.random.default_rng(3), n_rounds=runs)))
    evidence = " ".join(e.text for e in decide(None, None, profile).compute_savings.evidence)
    assert f"over the {runs} timed rounds" in evidence
    assert ("holds the ratio less often than its level says (from 3, about 3 times in 4)" in evidence) is warned
