"""The verdict: a pure function of the three sub-reports, claiming nothing it did not measure."""

import pytest

from graphaudit.verdict.decide import FINDINGS, NO, NOT_MEASURED, YES, check_claim, decide

from support.report_samples import dense, earlyexit, featuregate, mudd, profile_doc, replay_doc, static_doc


def answers(parts):
    verdict = decide(*parts)
    return {name: getattr(verdict, name).answer for name in FINDINGS}


def test_featuregate_varies_but_executes_every_block_and_is_slower():
    got = answers(featuregate())
    assert got == {"coefficient_variation": YES, "functional_dependence": YES,
                   "conditional_execution": NO, "compute_savings": NO}
    verdict = decide(*featuregate())
    assert "91.0%" in verdict.coefficient_variation.statement  # layer η² in the words
    assert "30.8% slower" in verdict.compute_savings.statement
    assert "98.7%" in verdict.functional_dependence.statement  # retained gap of the static profile


def test_mudd_depends_strongly_on_its_coefficients_yet_skips_nothing():
    verdict = decide(*mudd())
    assert verdict.functional_dependence.answer == YES
    assert "+1.9067" in verdict.functional_dependence.statement
    assert "+2.9637" in verdict.functional_dependence.statement
    assert verdict.conditional_execution.answer == NO
    assert not check_claim(verdict, "dynamic-inference").supported


def test_earlyexit_skips_blocks_and_supports_both_claims():
    verdict = decide(*earlyexit())
    assert verdict.conditional_execution.answer == YES
    assert "blocks.2 ran on 50.0% of inputs" in verdict.conditional_execution.statement
    assert check_claim(verdict, "dynamic-inference").supported
    assert check_claim(verdict, "compute-savings").supported


def test_dense_has_nothing_to_vary_or_replay():
    verdict = decide(*dense())
    assert verdict.coefficient_variation.answer == NOT_MEASURED
    assert "no coefficient tensors were declared, given or detected" in verdict.coefficient_variation.statement
    assert verdict.functional_dependence.answer == NOT_MEASURED
    assert verdict.conditional_execution.answer == NO


def test_nothing_run_means_nothing_claimed():
    verdict = decide(None, None, None)
    for name in FINDINGS:
        finding = getattr(verdict, name)
        assert finding.answer == NOT_MEASURED and finding.statement.startswith("Not measured")
        assert finding.evidence == ()
    for claim in ("dynamic-inference", "compute-savings"):
        check = check_claim(verdict, claim)
        assert not check.supported and "not established" in check.reason


def test_skippable_in_the_graph_but_not_profiled_is_not_measured():
    verdict = decide(static_doc(["always", "branch"]), None, None)
    assert verdict.conditional_execution.answer == NOT_MEASURED
    assert any("blocks.1 (branch)" in e.text for e in verdict.conditional_execution.evidence)


def test_skippable_in_the_graph_but_never_skipped_is_no():
    verdict = decide(static_doc(["always", "branch"]), None, profile_doc(fractions=(1.0, 1.0)))
    assert verdict.conditional_execution.answer == NO
    assert "every block ran in full" in verdict.conditional_execution.statement


def test_static_only_without_skippable_blocks_is_no():
    verdict = decide(static_doc(["gated", "masked"]), None, None)
    assert verdict.conditional_execution.answer == NO
    assert "not profiled" in verdict.conditional_execution.statement


def test_shrunk_block_counts_as_conditional_execution():
    profile = profile_doc(fractions=(1.0, 1.0))
    profile["blocks"][1]["node_fraction"] = {"min": 0.5, "median": 1.0, "max": 1.0, "total": 30.0}
    verdict = decide(static_doc(["always", "subset"]), None, profile)
    assert verdict.conditional_execution.answer == YES
    assert "ran only 50.0% of its nodes on some input (100.0% on another)" in verdict.conditional_execution.statement
    # with the FLOPs it executed, when they differ too (a layer whose skipping branch runs a shortcut)
    profile["blocks"][1]["executed_flops"] = {"min": 262_144, "median": 262_144, "max": 7_340_032, "total": 1e7}
    statement = decide(static_doc(["always", "branch"]), None, profile).conditional_execution.statement
    assert "ran only 50.0% of its nodes on some input (100.0% on another): 262,144 to 7,340,032 FLOPs" in statement


@pytest.mark.parametrize("part", ["nodes", "block"])
def test_the_same_part_left_out_on_every_input_is_no_conditional_execution(part):
    """An If on a shape runs one branch for every input: fewer nodes, but nothing the input decides.
    Only where the graph says values decide (branch, subset) does it count: no input went the other way."""
    profile = profile_doc(fractions=(1.0, 1.0))
    if part == "nodes":
        profile["blocks"][1]["node_fraction"] = {"min": 0.8, "median": 0.8, "max": 0.8, "total": 64.0}
    else:
        profile["blocks"][1].update(executed_fraction=0.0, inputs_executed=0)
    verdict = decide(static_doc(["always", "always"]), None, profile)
    assert verdict.conditional_execution.answer == NO
    assert "the same on every input" in verdict.conditional_execution.statement
    verdict = decide(static_doc(["always", "branch"]), None, profile)
    assert verdict.conditional_execution.answer == YES
    assert ("on every input" if part == "nodes" else "ran on none of the inputs") in verdict.conditional_execution.statement


def test_small_reassignment_effect_is_no_functional_dependence():
    replay = replay_doc(cross=(0.004, -0.001, 0.009), shuffle=(0.002, -0.003, 0.006))
    verdict = decide(None, replay, None)
    assert verdict.functional_dependence.answer == NO
    texts = [e.text for e in verdict.functional_dependence.evidence]
    assert any("ΔNLL cross_input = +0.0040 nats (95% CI -0.0010 to +0.0090)" in t for t in texts)


def test_failed_parity_makes_the_replay_untrusted():
    replay = replay_doc()
    replay["parity"] = {"max_abs_diff": 0.5, "ok": False}
    verdict = decide(None, replay, None)
    assert verdict.functional_dependence.answer == NOT_MEASURED
    assert "did not reproduce" in verdict.functional_dependence.statement


def test_constant_coefficients_do_not_vary():
    replay = replay_doc(input_share=0.0, token_share=0.0, eta2=1.0)
    assert decide(None, replay, None).coefficient_variation.answer == NO


def test_no_baseline_means_savings_not_measured():
    verdict = decide(None, None, profile_doc(ratio=None))
    assert verdict.compute_savings.answer == NOT_MEASURED
    assert "no baseline" in verdict.compute_savings.statement
    assert "not established" in check_claim(verdict, "compute-savings").reason


def test_claims_refuted_say_so():
    check = check_claim(decide(*featuregate()), "dynamic-inference")
    assert not check.supported and check.reason.startswith("refuted:")
    with pytest.raises(ValueError):
        check_claim(decide(*featuregate()), "magic")


def test_verdict_is_plain_json_and_every_evidence_names_its_source():
    doc = decide(*mudd()).to_json()
    for name in FINDINGS:
        assert doc[name]["answer"] in (YES, NO, NOT_MEASURED)
        for item in doc[name]["evidence"]:
            assert item["source"] in ("static", "replay", "profile") and item["text"]
    assert check_claim(doc, "dynamic-inference").supported is False  # works on the JSON too


def test_savings_evidence_counts_per_profiled_run():
    """A profiled run is one input, or a batch where the model fixes its batch: the evidence says which."""
    static, replay, profile = featuregate()
    profile = {**profile, "flops_executed": 4.0e6}
    one = decide(static, replay, profile, baseline_flops=2.0e6).compute_savings.evidence
    four = decide(static, replay, {**profile, "batch_size": 4}, baseline_flops=2.0e6).compute_savings.evidence
    texts = [" ".join(e.text for e in found) for found in (one, four)]
    assert "executed FLOPs per input: 4,000,000" in texts[0]
    assert "(each input's median of model over baseline run by run, weighted by the baseline's latency)" in texts[0]
    assert "executed FLOPs per batch of 4: 4,000,000" in texts[1]
    assert "(each batch's median of model over baseline run by run, weighted by the baseline's latency)" in texts[1]


def test_faster_with_as_many_flops_says_the_saving_is_not_skipped_work():
    # an ONNX Runtime-optimised copy of the same model against the original: faster, same FLOPs
    static, replay, profile = featuregate()
    profile = {**profile_doc(ratio=0.90), "flops_executed": 5.0e6}
    same = decide(static, replay, profile, baseline_flops=5.0e6).compute_savings
    assert same.answer == YES and "not by skipping any of it" in same.statement
    less = decide(static, replay, {**profile, "flops_executed": 3.0e6}, baseline_flops=5.0e6).compute_savings
    assert less.answer == YES and "0.60× the baseline's FLOPs" in less.statement and "skipping" not in less.statement


def test_no_dependence_names_only_the_reassignments_that_ran():
    # coefficients without a token axis (a CNN's channel gates): the replay leaves token_shuffle out
    doc = replay_doc(cross=(0.001, -0.002, 0.004), shuffle=(0.0, -0.001, 0.001))
    both = decide(None, doc, None).functional_dependence
    del doc["conditions"]["token_shuffle"]
    cross_only = decide(None, doc, None).functional_dependence
    assert both.answer == cross_only.answer == NO
    assert "or its own shuffled over tokens" in both.statement
    assert "shuffled" not in cross_only.statement and "another input's coefficients raises" in cross_only.statement


@pytest.mark.parametrize("global_gap, better", [(0.004, False), (-0.031, True)])
def test_no_gap_between_global_mean_and_correct_leaves_nothing_for_a_profile_to_keep(global_gap, better):
    # one global mean does as well as the correct coefficients, or better: a retained share of
    # that gap (here 6.3% of −0.031 nats) means nothing, and the answer does not quote it
    doc = replay_doc(cross=(0.001, -0.002, 0.004), shuffle=(0.0, -0.001, 0.001), gap_layer=0.063)
    doc["conditions"]["global_mean"]["delta_nll"] = global_gap
    finding = decide(None, doc, None).functional_dependence
    assert "keeps" not in finding.statement and "6.3%" not in finding.statement
    assert ("as well as the correct coefficients or better, so no gap" in finding.statement) == better
    assert "so no gap is left for a profile" in finding.statement
    line = next(e.text for e in finding.evidence if e.text.startswith("a static layer profile retains"))
    assert "too small to share out" in line


def test_a_fixed_capacity_is_cited_as_such_not_as_a_skippable_share():
    # Mixture-of-Depths: blocks at a fixed capacity run their selected size on every input; the
    # graph's skippable share is 0, and the evidence gives the capacity's FLOPs against every row
    static = static_doc(["always", "subset", "always", "subset"])
    static["flops"] = {"total": 16_007_168, "skippable": 0, "skippable_share": 0.0,
                       "fixed_capacity": {"blocks": ["blocks.1", "blocks.3"], "flops": 4_472_832,
                                          "flops_full_size": 9_453_568, "saving": 4_980_736}}
    texts = [e.text for e in decide(static, None, None).conditional_execution.evidence]
    assert "fixed capacity: blocks.1, blocks.3 run 4,472,832 FLOPs at their selected size against 9,453,568 on " \
           "every row, on every input alike" in texts
    assert not any("0% of the graph's FLOPs" in t for t in texts)


def test_a_global_mean_gap_whose_interval_reaches_zero_is_no_gap_either():
    # +0.026 nats, 95% CI −0.095 to +0.153: not established, so no share of it is quoted
    doc = replay_doc(cross=(0.001, -0.002, 0.004), shuffle=(0.0, -0.001, 0.001), gap_layer=0.0)
    doc["conditions"]["global_mean"].update(delta_nll=0.0258, ci=[-0.0950, 0.1525])
    finding = decide(None, doc, None).functional_dependence
    assert "one global mean is not measurably worse than the correct coefficients, so no gap is left" in finding.statement
    assert "keeps" not in finding.statement


def test_one_layer_says_nothing_of_layer_identity():
    # a family in a single layer: η² of layer identity is 0 by construction, not a finding
    doc = replay_doc(eta2=0.0)
    doc["coefficients"] = [{"tensor": "score", "family": "gate", "layer": 2}]
    finding = decide(None, doc, None).coefficient_variation
    assert finding.answer == YES and "layer identity" not in finding.statement
    assert any("one layer only, so layer identity explains nothing by construction" in e.text for e in finding.evidence)


def test_a_ratio_just_above_the_threshold_is_not_rounded_onto_it():
    # 0.953× is no saving at the 0.95× threshold: "workload time 0.95×" beside "needs at most
    # 0.95×" would read as a contradiction
    static, replay, _ = featuregate()
    profile = profile_doc(ratio=0.953)
    profile["baseline"]["ratio_interval"].update(low=0.951, high=0.955)
    finding = decide(static, replay, profile).compute_savings
    assert finding.answer == NO and "workload time 0.953×" in finding.statement
    assert "95% interval 0.951–0.955×" in finding.statement
    assert "workload time 0.90×" in decide(static, replay, profile_doc(ratio=0.90)).compute_savings.statement
    # nor an interval's end just below the threshold onto it beside a "yes" that needs it there
    profile = profile_doc(ratio=0.90)
    profile["baseline"]["ratio_interval"].update(low=0.85, high=0.946)
    saving = decide(static, replay, profile).compute_savings
    assert saving.answer == YES and "95% interval 0.85–0.946×" in saving.statement


@pytest.mark.parametrize("kept, varying, words", [
    ([(0.5, 0.5)], 0, "ran behind a selection that kept 50.0% of the rows it picks from, the same on every input "
                      "(a fixed capacity"),  # Mixture-of-Depths
    ([(0.75, 0.75), (0.857, 0.857)], 0, "ran behind 2 selections that kept 75.0% and 85.7% of the rows each picks "
                                        "from, the same on every input"),  # Token Merging: two merges feed a block
    ([(0.1, 0.4)] * 4, 8, "ran at input-dependent sizes (8 compute nodes"),  # 4 experts' selections: told by shapes
    ([(0.333, 0.515)], 6, "ran behind a selection that kept 33.3% to 51.5% of the rows it picks from, as the input "
                          "decides"),  # a threshold
])
def test_a_subset_blocks_rows_say_how_it_was_shrunk(kept, varying, words):
    static = static_doc(["always", "subset", "always", "always"])
    profile = profile_doc()
    block = profile["blocks"][1]
    block["rows_kept"] = [{"node": f"pick{i}", "min": low, "median": low, "max": high, "total": 4 * low}
                          for i, (low, high) in enumerate(kept)]
    block["value_dependent_shapes"] = [{"node": f"n{i}", "op_type": "MatMul", "distinct": 3, "shapes": [],
                                        "compute": True} for i in range(varying)]
    finding = decide(static, None, profile).conditional_execution
    assert finding.answer == YES and f"blocks.1 {words}" in finding.statement
    assert ("fixed capacity" in finding.statement) == (varying == 0)


def test_a_slot_that_explains_most_of_the_variance_is_named_beside_layer_identity():
    # DynamicViT's keep/drop scores: layer identity alone explains next to nothing, the (layer,
    # slot) profile 95.7%: the headline must not read as coefficients that are all input
    doc = replay_doc(eta2=0.0001)
    doc["variance"]["gate"]["layer_slot_share"] = 0.957
    finding = decide(None, doc, None).coefficient_variation
    assert "layer identity alone explains 0.01% of their variance, layer and slot together 95.7% " \
           "(the variance a static per-layer profile reproduces)" in finding.statement
    plain = decide(None, replay_doc(eta2=0.91), None).coefficient_variation
    assert "layer and slot" not in plain.statement


def test_a_share_that_rounds_to_zero_has_no_sign():
    # a retained share of exactly -0.0 (a profile no different from one global mean, over a
    # negative gap) printed "-0%" in the evidence, as if something were lost
    from graphaudit.wording import pct

    assert [pct(x) for x in (-0.0, 0.0, -1e-7, -0.25, 0.5)] == ["0%", "0%", "-1e-05%", "-25.0%", "50.0%"]
    # float64 rounding of a variance share that is zero (4.3e-14%) is no measurement either
    assert [pct(x) for x in (4.3e-16, -6.5e-16, 5.2e-5)] == ["0%", "0%", "0.0052%"]
    # a table cell rounds a small share like any other (report.tables: small=False)
    assert [pct(x, missing="—", small=False) for x in (-0.0, -0.0004, 0.0004, -0.25)] == ["0.0%", "0.0%", "0.0%", "-25.0%"]


def test_decisions_left_live_by_the_freezing_qualify_a_no():
    # an early exit decided inside an earlier exit's branch cannot be fed: the replay names such
    # decisions, and a "No" says it speaks of the fed coefficients only
    doc = replay_doc(cross=(0.001, -0.004, 0.006), shuffle=(0.0, -0.003, 0.003))
    doc["settings"] = {"live_decisions": ["/If", "/If_2", "/If_3", "/If_4"]}
    from graphaudit.verdict.decide import functional_dependence

    finding = functional_dependence(doc)
    assert finding.answer == NO
    assert "(4 decisions of control flow stayed live, made from the input: their controllers were not frozen)" \
        in finding.statement
    assert any("4 decisions of control flow in the frozen graph (`/If`, `/If_2`, `/If_3` and 1 more) stayed live"
               in e.text for e in finding.evidence)
    plain = functional_dependence(replay_doc(cross=(0.001, -0.004, 0.006), shuffle=(0.0, -0.003, 0.003)))
    assert "stayed live" not in plain.statement and not any("stayed live" in e.text for e in plain.evidence)


def test_a_reassignment_that_lowers_the_nll_measurably_is_said_with_the_no():
    # a frozen model that does better on other inputs' coefficients (an untrained controller):
    # not "worse", so still No by the definition, but its outputs do change, and the answer says so
    from graphaudit.verdict.decide import functional_dependence

    finding = functional_dependence(replay_doc(cross=(-0.1908, -0.384, -0.042), shuffle=(0.0, -0.003, 0.003)))
    assert finding.answer == NO
    assert "it lowers it measurably (cross-input -0.1908 nats)" in finding.statement
    plain = functional_dependence(replay_doc(cross=(-0.005, -0.02, 0.01), shuffle=(0.0, -0.003, 0.003)))
    assert plain.answer == NO and "lowers" not in plain.statement


def test_blocks_at_a_fixed_capacity_the_profile_saw_no_change_in_are_not_said_to_run_in_full():
    # a capacity-factor MoE's blocks run at C slots per expert on every input: the profile sees
    # one size on every input (no selection it can measure), which is not "ran in full"
    from graphaudit.verdict.decide import conditional_execution

    static = static_doc(["always", "subset", "always", "subset"])
    static["flops"] = {"total": 8e6, "skippable_share": 0.0,
                       "fixed_capacity": {"blocks": ["blocks.1", "blocks.3"], "flops": 4e6,
                                          "flops_full_size": 9e6, "saving": 5e6}}
    finding = conditional_execution(static, profile_doc())
    assert finding.answer == NO
    assert finding.statement.startswith("No: blocks.1, blocks.3 run at a fixed capacity, one size on every input")
    assert any("ran the same on every profiled input (blocks.1, blocks.3 at a fixed capacity)" in e.text
               for e in finding.evidence)
    assert not any("ran in full" in e.text for e in finding.evidence)
    # a subset block of data-dependent size that ran the same on every input stays as it was said
    del static["flops"]["fixed_capacity"]
    assert "ran in full on every profiled input" in conditional_execution(static, profile_doc()).statement


def test_shares_of_two_families_that_print_alike_are_not_a_range():
    # Soft MoE's two families at random init: η² 0 in both printed "0%–0%"
    from graphaudit.verdict.decide import coefficient_variation

    doc = replay_doc(eta2=0.0, input_share=0.05, token_share=0.9)
    doc["variance"]["token-mix"] = dict(doc["variance"]["gate"], eta2_layer=1e-12)
    doc["variance"]["gate"]["eta2_layer"] = 0.0
    statement = coefficient_variation(static_doc(["gated"] * 2), doc).statement
    assert "layer identity alone explains 0% of their variance" in statement and "0%–0%" not in statement


@pytest.mark.parametrize("gap, ci, words", [
    (0.42, [0.30, 0.55], "a static per-layer profile keeps 42.0% of what the coefficients contribute over one global mean"),
    (-0.085, [-0.271, 0.066], "a static per-layer profile keeps no measurable part of what the coefficients "
                              "contribute over one global mean (-8.5%, 95% CI -27.1% to 6.6%)"),
    (-0.3, [-0.5, -0.1], "a static per-layer profile does worse than one global mean (it keeps -30.0% of what the "
                         "coefficients contribute over it)"),
])
def test_the_retained_gap_is_worded_by_what_its_interval_shows(gap, ci, words):
    # the MoE zoo model's static profile keeps -8.5% (95% CI -27.1% to 6.6%): "keeps -8.5%" read as
    # a share kept; it is no measurable share at all
    from graphaudit.verdict.decide import functional_dependence

    doc = replay_doc(cross=(1.0, 0.9, 1.1), gap_layer=gap)
    doc["retained_gap_ci"] = {"static_layer": ci}
    statement = functional_dependence(doc).statement
    assert statement.endswith(f"; {words}.")


def test_a_no_says_when_the_output_distribution_moves_without_costing_nll():
    # reassigned coefficients that change what the model predicts, token by token, but not how
    # well on the whole: no measurable ΔNLL, a KL from correct wholly above the threshold
    from graphaudit.verdict.decide import functional_dependence

    doc = replay_doc(cross=(0.002, -0.004, 0.008), shuffle=(0.0, -0.003, 0.003))
    doc["conditions"]["cross_input"].update(kl=0.052, kl_ci=[0.041, 0.063])
    doc["conditions"]["token_shuffle"].update(kl=0.006, kl_ci=[0.004, 0.009])
    finding = functional_dependence(doc)
    assert finding.answer == NO
    assert ("its output distribution does move (KL from correct: cross-input 0.052 nats), without a measurable "
            "cost in NLL") in finding.statement
    assert "KL from correct, cross_input = 0.052 nats (95% CI 0.041 to 0.063)" in [e.text for e in finding.evidence]
    assert not any("token_shuffle" in e.text and "KL" in e.text for e in finding.evidence)
    doc["conditions"]["cross_input"].update(kl=0.012, kl_ci=[0.007, 0.019])  # not wholly above 0.01 nats
    assert "does move" not in functional_dependence(doc).statement


def test_coefficients_without_any_variance_are_said_to_be_constant():
    # timm's ECA and CBAM gates at random init (zero_init_last): every gate exactly 0.5, so no
    # share is defined; they were reported with "?" shares and "less than 0.1%" of the variance
    from graphaudit.verdict.decide import coefficient_variation

    doc = replay_doc()
    doc["variance"]["gate"] = {k: None for k in ("eta2_layer", "layer_slot_share", "input_share", "token_share")}
    finding = coefficient_variation(static_doc(["gated"] * 2), doc)
    assert finding.answer == NO
    assert finding.statement == "No: the coefficients are constant, the same value for every input and position (gate)."
    assert [e.text for e in finding.evidence] == [
        "gate: the same value at every input, position and slot: no variance to share out"]
    assert "?" not in " ".join(e.text for e in finding.evidence)
