"""Findings from a profile that ran on a sample of the inputs: what the inputs left out could do.

A block that only some inputs skip may skip on none of a sample, and the inputs left out can
then only run less than the sample did: conditional execution is inconclusive, not a "no", and
so is a "no" saving (a "yes" stands); where every sampled input skipped the same blocks, the others
may run them. Every test feeds profile documents or given round timings; none times anything."""

import numpy as np
import pytest

from graphaudit.profile.baseline import compare, ratio_interval
from graphaudit.profile.rounds import sample_rows
from graphaudit.report.tables import summary_phrase
from graphaudit.verdict.compute_savings import SAVINGS_RATIO_MAX, savings_answer
from graphaudit.verdict.decide import NO, YES, check_claim, compute_savings, conditional_execution, decide
from graphaudit.verdict.findings import INCONCLUSIVE

from support.report_samples import profile_doc, static_doc


def test_no_skip_on_a_sample_of_the_inputs_is_inconclusive_not_a_no():
    """A block that only some inputs skip may skip on none of 4 sampled of 32 (one in four inputs
    skipping: none of the 4 about a third of the time): that is no "no", so the claim is left
    unsupported with exit status 4, not refuted; on every input profiled it is a "no"."""
    static = static_doc(["always", "branch", "always", "branch"])
    whole = conditional_execution(static, profile_doc(inputs=4))
    sampled = conditional_execution(static, {**profile_doc(inputs=4), "rounds": {"sample": 4, "inputs": 32}})
    assert whole.answer == NO and sampled.answer == INCONCLUSIVE
    assert whole.statement == ("No: the graph lets some blocks be skipped or shrunk, but every block ran in full on "
                               "every profiled input.")
    assert sampled.statement == (
        "Inconclusive: the graph lets some blocks be skipped or shrunk, and none was on the 4 profiled inputs, but "
        "they are a sample of the 32: the other 28 did not run under the profiler, and a block that only some "
        "inputs skip may skip on none of a sample (a larger sample, --sample (run's --profile-sample), decides more).")
    assert any(e.text.endswith("(4 inputs)") for e in whole.evidence)
    assert any(e.text.endswith("(4 of the 32 inputs, one drawn at random from each of 4 equal stretches of them)")
               for e in sampled.evidence)
    check = check_claim({"conditional_execution": sampled.to_json()}, "dynamic-inference")
    assert not check.supported and check.inconclusive
    doc = {"verdict": {"conditional_execution": sampled.to_json(), "coefficient_variation": {"answer": YES}}}
    assert summary_phrase(doc) == "dynamic parameters; execution undecided on a sample"
    # a block that skipped on the sample is a yes, sampled or not
    skipped = {**profile_doc(fractions=(1.0, 0.5, 1.0, 1.0), inputs=4), "rounds": {"sample": 4, "inputs": 32}}
    assert conditional_execution(static, skipped).answer == YES
    # a graph with nothing to skip is a no on any sample
    assert conditional_execution(static_doc(["always"] * 4), {**profile_doc(inputs=4),
                                                              "rounds": {"sample": 4, "inputs": 32}}).answer == NO


def test_no_saving_on_a_sample_none_of_which_skipped_a_skippable_block_is_inconclusive():
    """The inputs left out of such a sample can only run less than it did: a "no" from it is no
    "no"; a "yes" stands (they can only be faster still), and on every input the "no" stands."""
    static = static_doc(["always", "branch", "always", "branch"])
    sample = {"rounds": {"sample": 4, "inputs": 32}}
    slower, faster = profile_doc(inputs=4, ratio=1.31), profile_doc(inputs=4, ratio=0.8)
    assert compute_savings(static, slower).answer == NO
    undecided = compute_savings(static, {**slower, **sample})
    assert undecided.answer == INCONCLUSIVE
    assert decide(static, None, {**slower, **sample}).compute_savings == undecided  # the verdict's, made once
    assert undecided.statement.startswith("Inconclusive: 31.0% slower than the baseline")
    assert undecided.statement.endswith(
        "but on a sample of 4 of the 32 inputs, none of which skipped or shrank a block the graph lets be skipped "
        "or shrunk: the others may, and can only run less, so the workload may be faster than the sample (a larger "
        "sample, --sample (run's --profile-sample), decides more).")
    assert compute_savings(static, {**faster, **sample}).answer == YES
    # nothing the graph lets be skipped: the sample's "no" stands
    assert compute_savings(static_doc(["always"] * 4), {**slower, **sample}).answer == NO
    # a sample in which a block was skipped shows the variation its interval counts
    skipped = {**profile_doc(fractions=(1.0, 0.5, 1.0, 1.0), inputs=4, ratio=1.31), **sample}
    assert compute_savings(static, skipped).answer == NO


def test_a_sample_whose_every_input_skipped_the_same_blocks_decides_no_yes():
    """Every sampled input skipped blocks.1 and blocks.3: the inputs left out may run them, so a
    "yes" from the sample is inconclusive; a "no" stands, as they can only run more. Where the
    sample still ran a block it could skip (blocks.3), a "no" is inconclusive too."""
    static = static_doc(["always", "branch", "always", "branch"])
    sample = {"rounds": {"sample": 4, "inputs": 32}}

    def savings(fractions, ratio, sampled=True):
        return compute_savings(static, {**profile_doc(fractions=fractions, inputs=4, ratio=ratio),
                                        **(sample if sampled else {})})

    both = (1.0, 0.0, 1.0, 0.0)
    assert conditional_execution(static, {**profile_doc(fractions=both, inputs=4), **sample}).answer == YES
    faster = savings(both, 0.6)
    assert faster.answer == INCONCLUSIVE
    assert faster.statement.endswith(
        "but on a sample of 4 of the 32 inputs, every one of which skipped `blocks.1`, `blocks.3` alike: the others "
        "may run `blocks.1`, `blocks.3`, so the workload may be slower than the sample (a larger sample, --sample "
        "(run's --profile-sample), decides more).")
    assert savings(both, 1.31).answer == NO  # it skipped all it could: the others can only run more
    one = (1.0, 0.0, 1.0, 1.0)
    assert savings(one, 0.6).answer == INCONCLUSIVE
    slower = savings(one, 1.31)
    assert slower.answer == INCONCLUSIVE and "the others may skip `blocks.3` too, so the workload may be faster" in \
        slower.statement
    # every input profiled, or a sample whose inputs went different ways: the answers stand
    assert savings(both, 0.6, sampled=False).answer == YES and savings(one, 1.31, sampled=False).answer == NO
    assert savings((1.0, 0.5, 1.0, 1.0), 0.6).answer == YES


def _two_path_profile(seed: int, exit_share: float, sample: int, inputs: int = 32):
    """(the workload's answer, the rounds' interval's, the verdict's) for a seeded workload whose
    inputs either exit early (0.6x the baseline, blocks.2 and blocks.3 skipped) or run every block
    (1.05x), timed on `sample` of `inputs` for 5 rounds, as the profile draws and reads them."""
    rng = np.random.default_rng(seed)
    exits = rng.random(inputs) < exit_share
    ratio = np.where(exits, 0.6, 1.05) * rng.lognormal(0, 0.02, inputs)
    truth = YES if ratio.mean() <= SAVINGS_RATIO_MAX else NO
    pick = sample_rows(inputs, sample, seed)
    load = rng.lognormal(0, 0.01, (5, sample))
    baseline = 1e6 * load * rng.lognormal(0, 0.01, (5, sample))
    model = 1e6 * ratio[pick] * load * rng.lognormal(0, 0.01, (5, sample))
    rounds_only = ratio_interval(model, baseline)
    comparison = compare("dense", model, baseline, inputs=inputs)
    doc = {**profile_doc(inputs=sample, ratio=comparison.ratio), "baseline": comparison.to_json(),
           "rounds": {"sample": sample, "inputs": inputs}}
    names = ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    doc["per_input"] = [{"index": int(i), "rows": [int(i), int(i) + 1], "blocks_ran": names[:2] if exits[i] else names,
                         "flops": {}, "latency_ms": 1.0} for i in pick]
    ran_late = 1 - exits[pick].mean()
    doc["blocks"] = [{**b, "executed_fraction": ran_late, "inputs_executed": round(ran_late * sample)}
                     if b["name"] in names[2:] else b for b in doc["blocks"]]
    static = static_doc(["always", "always", "branch", "branch"])
    return truth, savings_answer(rounds_only.low, rounds_only.high), compute_savings(static, doc).answer


@pytest.mark.parametrize("exit_share, sample, rounds_wrong, least_right", [
    (0.2, 4, 60, 0),  # the rounds' interval alone: 78 of 200 wrong; now none, and none decided either
    (0.05, 4, 10, 0),  # 20 of 200 wrong: most samples hold no input that exits
    (0.6, 16, 0, 170),  # 187 of 200 decided right, none wrong
])
def test_a_two_path_workload_sampled_is_never_answered_wrong(exit_share, sample, rounds_wrong, least_right):
    """200 seeded workloads of 32 inputs, each either exiting early or running every block: from a
    sample of 4 the rounds' interval alone gave a definite answer the whole workload contradicts
    in 78 (a fifth of the inputs exiting), the verdict never; from 16 it decides most."""
    found = [_two_path_profile(seed, exit_share, sample) for seed in range(200)]
    assert sum(old not in (INCONCLUSIVE, truth) for truth, old, _ in found) >= rounds_wrong
    assert sum(new not in (INCONCLUSIVE, truth) for truth, _, new in found) == 0
    assert sum(new == truth for truth, _, new in found) >= least_right
