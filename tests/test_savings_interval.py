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
    rounds_only = ratio_interval(model, base)  # seeded
    assert (rounds_only.low, rounds_only.high) == (interval.low, interval.high)
    assert (interval.sample, interval.inputs, interval.sampling) == (6, 6, 0.0)  # every input timed
    doc = result.to_json()["ratio_interval"]
    assert doc["low"] == interval.low and doc["high"] == interval.high and "rounds" in doc["method"]
    assert doc["sampling_halfwidth"] == 0.0 and "left out" not in doc["method"]


def test_a_sampled_profiles_interval_holds_what_the_inputs_left_out_could_change():
    """Timed on 6 of 32 inputs, half of them twice as slow against the baseline as the others:
    the 26 left out could hold any mix of the two, and the interval says so; where the sampled
    inputs agree, the inputs left out widen it by little."""
    rng = np.random.default_rng(0)
    base = rng.normal(1e6, 1e4, (10, 6))
    model = base * np.array([1.0, 1.0, 1.0, 2.0, 2.0, 2.0])
    whole, sampled = compare("dense", model, base), compare("dense", model, base, inputs=32)
    assert sampled.ratio == whole.ratio and sampled.ratio_spread == whole.ratio_spread
    w, s = whole.ratio_interval, sampled.ratio_interval
    assert (s.sample, s.inputs, s.rounds) == (6, 32, 10) and s.sampled and not w.sampled
    # the sampled ratios' sd (0.548) over sqrt(6), finite population corrected, times t(5) = 2.571
    assert s.sampling == pytest.approx(2.571 * np.sqrt((1 - 6 / 32) / 6) * 0.5477, rel=0.01)
    assert s.low < w.low < 1.5 < w.high < s.high and s.high - s.low > 0.9
    assert s.low == pytest.approx(1.5 - np.hypot(1.5 - w.low, s.sampling), abs=0.01)
    doc = sampled.to_json()["ratio_interval"]
    assert (doc["sample"], doc["inputs"]) == (6, 32) and doc["sampling_halfwidth"] == s.sampling
    assert "left out" in doc["method"]
    alike = base * 1.3 * rng.normal(1.0, 0.003, base.shape)  # each call off by 0.3% on its own
    agreeing = compare("dense", alike, base, inputs=32).ratio_interval
    assert 0 < agreeing.sampling < 0.01 and agreeing.high - agreeing.low < 0.02
    assert compare("dense", model, base, inputs=6).ratio_interval == w  # all of them: nothing left out


def _two_kinds(rng, count):
    return np.where(rng.random(count) < 0.5, 0.6, 1.0)


@pytest.mark.parametrize("ratios, least_held", [
    (lambda rng, count: rng.lognormal(0, 0.1, count), 372),  # held in 380: 95%
    (_two_kinds, 330),  # held in 347: a sample of 4 says little of a workload of two kinds
])
def test_the_sampled_interval_holds_the_workloads_ratio_about_19_times_in_20(ratios, least_held):
    """400 seeded workloads of 32 inputs, whose latencies differ by about 30% and whose ratios to
    the baseline by about 10% (or are of two kinds, 0.6 and 1.0), each timed on 4 of them for 5
    rounds: the interval over the rounds alone held the ratio of all 32 in at most 61 (it tells
    nothing of the inputs left out); widened by what they could change, in 380 (and 347)."""
    held = {"rounds": 0, "sampled": 0}
    for seed in range(400):
        rng = np.random.default_rng(seed)
        latency = rng.lognormal(0, 0.3, 32) * 1e6
        ratio = ratios(rng, 32)
        truth = (latency * ratio).sum() / latency.sum()
        pick = rng.choice(32, 4, replace=False)
        load = rng.lognormal(0, 0.01, (5, 4))
        baseline = latency[pick] * load * rng.lognormal(0, 0.01, (5, 4))
        model = latency[pick] * ratio[pick] * load * rng.lognormal(0, 0.01, (5, 4))
        rounds_only, sampled = ratio_interval(model, baseline), compare("dense", model, baseline, inputs=32).ratio_interval
        held["rounds"] += rounds_only.low <= truth <= rounds_only.high
        held["sampled"] += sampled.low <= truth <= sampled.high
    assert held["sampled"] >= least_held and held["rounds"] <= 100, held


def test_an_interval_made_wide_by_the_inputs_left_out_asks_for_a_larger_sample_not_more_rounds():
    rng = np.random.default_rng(0)
    base = rng.normal(1e6, 1e4, (10, 6))
    model = base * np.array([0.6, 0.6, 0.6, 1.2, 1.2, 1.2])  # 0.9x over the six, 0.6x or 1.2x each
    sampled = decide(None, None, profile_of(compare("dense", model, base, inputs=32))).compute_savings
    noisy = decide(None, None, profile_of(compare("dense", *rounds(0.95, 0.03, np.random.default_rng(6))))).compute_savings
    assert sampled.answer == noisy.answer == INCONCLUSIVE
    assert "the sample of the inputs cannot decide" in sampled.statement and "a larger sample, --sample (run's --profile-sample), may decide" in sampled.statement
    assert "the timing cannot decide" in noisy.statement and "--sample" not in noisy.statement


def test_one_timed_input_of_several_says_nothing_of_the_others():
    model, baseline = rounds(0.5, 0.01, np.random.default_rng(1), inputs=1)
    interval = compare("dense", model, baseline, inputs=8).ratio_interval
    assert np.isnan(interval.low) and np.isnan(interval.sampling)
    assert compare("dense", model, baseline, inputs=8).to_json()["ratio_interval"]["sampling_halfwidth"] is None
    profile = profile_of(compare("dense", model, baseline, inputs=8))
    finding = decide(None, None, profile).compute_savings
    assert finding.answer == INCONCLUSIVE
    assert "one input cannot say what the 7 left out would change" in " ".join(e.text for e in finding.evidence)


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
    interval = comparison.ratio_interval
    return {"model": "model.onnx", "provider": "CPUExecutionProvider", "batch_size": 1,
            "latency_ms": {"median": 1.0, "p10": 0.9, "p90": 1.1, "n": 20}, "baseline": comparison.to_json(),
            "rounds": {"sample": interval.sample, "inputs": interval.inputs}}


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


def test_the_answer_says_where_the_rounds_stopped_once_it_was_decided():
    rng = np.random.default_rng(2)
    profile = profile_of(compare("dense", *rounds(1.30, 0.03, rng)))
    stopped = {**profile, "rounds": {"stop": "decided", "decide_at": 0.95}}
    said = {name: " ".join(e.text for e in decide(None, None, p).compute_savings.evidence)
            for name, p in (("timed on", {**profile, "rounds": {"stop": "precision", "decide_at": 0.95}}),
                            ("stopped", stopped))}
    assert "stopped once it was decided, when a wider interval than this one" in said["stopped"]
    assert "lay on one side of 0.95×" in said["stopped"]
    assert "stopped once" not in said["timed on"]
    assert decide(None, None, stopped).compute_savings.answer == NO


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
    model, baseline = rounds(1.30, 0.03, np.random.default_rng(2), inputs=4)
    whole = decide(None, None, profile_of(compare("dense", model, baseline))).compute_savings
    sampled = decide(None, None, profile_of(compare("dense", model, baseline, inputs=32))).compute_savings
    texts = [" ".join(e.text for e in f.evidence) for f in (whole, sampled)]
    assert "timed rounds (a bootstrap that keeps every input)" in texts[0] and "stretches" not in texts[0]
    assert "timed rounds, on 4 of the 32 inputs, one drawn at random from each of 4 equal stretches of them (a bootstrap " \
           "that keeps every sampled " \
           "input, each side widened by ±" in texts[1]
    assert "for what the 28 left out could change" in texts[1] and "Student's t with 3 degrees of freedom" in texts[1]
    # a document written before the inputs left out were counted says the sample, and no widening
    old = profile_of(compare("dense", model, baseline))
    del old["baseline"]["ratio_interval"]["sampling_halfwidth"]
    text = " ".join(e.text for e in decide(None, None, {**old, "rounds": {"sample": 4, "inputs": 32}})
                    .compute_savings.evidence)
    assert "timed rounds, on 4 of the 32 inputs, one drawn at random from each of 4 equal stretches of them (a bootstrap " \
           "that keeps every sampled input), not on its median" in text


@pytest.mark.parametrize("runs, warned", [(2, True), (4, True), (5, False), (20, False)])
def test_an_interval_from_fewer_rounds_than_the_profile_chooses_says_it_holds_less(runs, warned):
    """Given --runs 2-4, the 95% interval rests on each input's median of so few rounds that it
    holds the ratio less often than 95%: the evidence says so; from 5 rounds on it does not."""
    profile = profile_of(compare("dense", *rounds(0.80, 0.03, np.random.default_rng(3), n_rounds=runs)))
    evidence = " ".join(e.text for e in decide(None, None, profile).compute_savings.evidence)
    assert f"over the {runs} timed rounds" in evidence
    assert ("holds the ratio less often than its level says (from 3, about 3 times in 4)" in evidence) is warned
