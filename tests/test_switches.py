"""An If that switches between two modes of one model (a decoder exported with and without its
cache and merged into one graph, as Optimum's `decoder_model_merged.onnx`): branches that run
the same compute on the same weights, or a condition that is a graph input passed on as it is
(the caller's `use_cache_branch`). Not the model's decision (not dynamic, `--expect static`
holds): the graph and the runtime profile say so; where the caller's branches differ, some
compute does run or not as that input decides (conditional execution, decided by the caller).
Branches that differ, on a condition the model computes, stay `branch`."""

import numpy as np
import onnx
import onnx.parser
import pytest

from graphaudit.analyses.static import audit_static
from graphaudit.analyses.switches import SWITCH, switched_nodes, switches
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model
from graphaudit.profile import profile_model

WEIGHTS = ", ".join(["0.1"] * 16)
CONDITION = ('["/model/ReduceMean"] mean = ReduceMean <keepdims = 0> (x)\n'
             '        ["/model/Greater"] c = Greater (mean, zero)')
LAYER = """
            ["/model/layers.{i}/MatMul{s}"] m{i}{s} = MatMul ({x}, "model.layers.{i}.w{w}")
            ["/model/layers.{i}/Relu{s}"] r{i}{s} = Relu (m{i}{s})
            ["/model/layers.{i}/Add{s}"] {out} = Add ({x}, r{i}{s})"""
# the then-branch's layer computes a second product where the cached one reads it: T5's cross-attention keys
COMPUTED = """
            ["/model/layers.{i}/MatMul{s}"] m{i}{s} = MatMul ({x}, "model.layers.{i}.w{w}")
            ["/model/layers.{i}/MatMul_k{s}"] k{i}{s} = MatMul (m{i}{s}, "model.layers.{i}.w{w}")
            ["/model/layers.{i}/Relu{s}"] r{i}{s} = Relu (k{i}{s})
            ["/model/layers.{i}/Add{s}"] {out} = Add ({x}, r{i}{s})"""


def merged(else_weights: str = "", else_layers: int = 2, computed: bool = False, cached: bool = False) -> onnx.ModelProto:
    """x → If(use_cache_branch), or with `computed` If(mean(x) > 0): each branch two residual
    layers; the else-branch reads weights `w{else_weights}` (the same as the then-branch's when
    empty) and holds `else_layers` layers (0: it passes x through, as an early exit does); with
    `cached`, each then-branch layer computes a second product the else-branch reads instead."""
    def branch(suffix: str, weights: str, layers: int, result: str, layer: str = LAYER) -> str:
        if not layers:
            return f'["/exit/Identity"] {result} = Identity (x)'
        x, text = "x", ""
        for i in range(layers):
            out = result if i == layers - 1 else f"h{i}{suffix}"
            text += layer.format(i=i, s=suffix, x=x, w=weights, out=out)
            x = out
        return text

    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, S, 4] x, bool[1] use_cache_branch) => (float[B, S, 4] y)
      <float[4, 4] "model.layers.0.w" = {{{WEIGHTS}}}, float[4, 4] "model.layers.1.w" = {{{WEIGHTS}}},
       float[4, 4] "model.layers.0.wb" = {{{WEIGHTS}}}, float[4, 4] "model.layers.1.wb" = {{{WEIGHTS}}},
       float zero = {{0.0}}> {{
        {CONDITION if computed else 'c = Identity (use_cache_branch)'}
        y = If (c) <
            then_branch = t () => (float[B, S, 4] ty) {{ {branch("", "", 2, "ty", COMPUTED if cached else LAYER)} }},
            else_branch = e () => (float[B, S, 4] ey) {{ {branch("_1", else_weights, else_layers, "ey")} }}
        >
    }}"""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("computed", [False, True], ids=["input-flag", "computed-condition"])
def test_branches_of_the_same_compute_are_a_switch_and_no_block_can_be_skipped(computed):
    report = audit_static(load_model(merged(computed=computed)), shapes={"x": [1, 3, 4], "use_cache_branch": [1]})
    assert [b.verdict for b in report.blocks] == ["always", "always"]
    assert not report.conditional_execution and not report.dynamic
    (control,) = report.controls
    assert (control.kind, control.dependence) == (SWITCH, "value")
    assert "both branches run the same 2 compute nodes on the same weights" in control.detail
    assert report.contradiction("static") is None
    assert report.flops.skippable == 0 and report.flops.total == 2 * 2 * 3 * 4 * 4


@pytest.mark.parametrize("else_weights, else_layers", [("b", 2), ("", 1), ("", 0)],
                         ids=["other-weights", "fewer-layers", "pass-through"])
def test_the_callers_flag_is_a_switch_whatever_the_branches_hold(else_weights, else_layers):
    # T5's merged decoder: the cached branch reads the cross-attention keys instead of computing them
    report = audit_static(load_model(merged(else_weights, else_layers)))
    (control,) = report.controls
    assert control.kind == SWITCH and "the graph input `use_cache_branch` passed on as it is" in control.detail
    assert "the caller chooses the branch" in control.detail
    assert "branch" not in [b.verdict for b in report.blocks]
    assert not report.dynamic and report.contradiction("static") is None
    # what runs does depend on that input: the caller decides
    assert report.conditional_execution and report.deciders == {"If#1": "caller"}
    assert report.to_json()["decided_by"] == {"If#1": "caller"}


@pytest.mark.parametrize("else_weights, else_layers", [("b", 2), ("", 1), ("", 0)],
                         ids=["other-weights", "fewer-layers", "pass-through"])
def test_branches_that_differ_on_a_computed_condition_stay_conditional(else_weights, else_layers):
    model = merged(else_weights, else_layers, computed=True)
    assert switches(build_graph(load_model(model).model)) == {}
    report = audit_static(load_model(model))
    assert report.conditional_execution
    assert "branch" in [b.verdict for b in report.blocks]


def test_every_node_of_a_switch_belongs_to_it():
    mg = build_graph(load_model(merged()).model)
    assert list(switches(mg)) == ["If#1"]
    assert set(switched_nodes(mg)) == {n.id for n in mg.nodes.values() if n.scopes}


def test_the_profile_counts_a_block_whole_when_its_switch_ran_either_branch(tmp_path):
    onnx.save(merged(), tmp_path / "model.onnx")
    np.savez(tmp_path / "data.npz", x=np.random.default_rng(0).normal(size=(4, 3, 4)).astype(np.float32),
             use_cache_branch=np.array([False, True, False, True]))
    report = profile_model(tmp_path / "model.onnx", tmp_path / "data.npz", runs=2, warmup=1, profile_runs=1,
                           threads=1, opt_level="disable")
    blocks = {b["name"]: b for b in report.to_json()["blocks"]}
    for name in ("model.layers.0", "model.layers.1"):
        assert blocks[name]["executed_fraction"] == 1.0
        assert blocks[name]["node_fraction"]["min"] == 1.0, name  # half its nodes, in the branch not taken


def test_inputs_that_choose_other_modes_are_not_read_as_shrinking(tmp_path):
    """T5's merged decoder fed a mix of `use_cache_branch` values: the cached branch runs fewer
    nodes and FLOPs (its cross-attention keys are read). Inputs are compared with those whose
    switches took the same branch, so no block reads as skipped or shrunk."""
    from graphaudit.profile.what_ran import shrunk

    onnx.save(merged(cached=True), tmp_path / "model.onnx")
    np.savez(tmp_path / "data.npz", x=np.random.default_rng(0).normal(size=(4, 3, 4)).astype(np.float32),
             use_cache_branch=np.array([False, True, False, True]))
    report = profile_model(tmp_path / "model.onnx", tmp_path / "data.npz", runs=2, warmup=1, profile_runs=1,
                           threads=1, opt_level="disable")
    blocks = {b["name"]: b for b in report.to_json()["blocks"]}
    layer = blocks["model.layers.0"]
    assert layer["executed_flops"]["min"] < layer["executed_flops"]["max"]  # the modes differ...
    assert not layer["calls_vary"] and not layer["flops_vary"]  # ...not the inputs of one mode
    assert [shrunk(b) for b in blocks.values()] == [None] * len(blocks)


def test_a_block_only_one_mode_runs_is_the_callers_choice_at_run_time(tmp_path):
    """A mode without the second layer (`use_cache_branch` False), fed a mix of modes: that layer
    runs on half the inputs, all of those in the mode that has it; not a skip the model decides."""
    from graphaudit.profile.what_ran import reduction

    onnx.save(merged(else_layers=1), tmp_path / "model.onnx")
    np.savez(tmp_path / "data.npz", x=np.random.default_rng(0).normal(size=(4, 3, 4)).astype(np.float32),
             use_cache_branch=np.array([False, True, False, True]))
    report = profile_model(tmp_path / "model.onnx", tmp_path / "data.npz", runs=2, warmup=1, profile_runs=1,
                           threads=1, opt_level="disable")
    second = {b["name"]: b for b in report.to_json()["blocks"]}["model.layers.1"]
    assert second["executed_fraction"] == 0.5 and second["ran_by_mode"]
    assert reduction(second) is None


def test_a_flag_compared_with_a_constant_node_is_the_callers_choice():
    """TorchScript writes a threshold as a Constant node: the flag cast and compared with it is
    still the graph input passed on as it is."""
    model = merged(else_layers=1)
    model.graph.node[0].CopyFrom(onnx.helper.make_node("Cast", ["use_cache_branch"], ["f"], to=1))
    model.graph.node.insert(1, onnx.helper.make_node("Constant", [], ["half"], value=onnx.helper.make_tensor(
        "half", onnx.TensorProto.FLOAT, [], [0.5])))
    model.graph.node.insert(2, onnx.helper.make_node("Greater", ["f", "half"], ["c"]))
    onnx.checker.check_model(model, full_check=True)
    (control,) = audit_static(load_model(model)).controls
    assert control.kind == SWITCH and "`use_cache_branch`" in control.detail


def test_a_block_no_input_ran_says_why_and_the_rest_are_not_said_to_run_in_full(tmp_path):
    """Every input chose the mode without the second layer: that layer ran on none of them. The
    verdict says so, with the caller's switch that left it out, and does not say every block ran."""
    from graphaudit.verdict.decide import check_claim, conditional_execution

    onnx.save(merged(else_layers=1), tmp_path / "model.onnx")
    np.savez(tmp_path / "data.npz", x=np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32),
             use_cache_branch=np.array([False, False]))
    report = profile_model(tmp_path / "model.onnx", tmp_path / "data.npz", runs=2, warmup=1, profile_runs=1,
                           threads=1, opt_level="disable")
    static = audit_static(load_model(merged(else_layers=1)))
    finding = conditional_execution(static.to_json(), report.to_json())
    texts = [finding.statement] + [e.text for e in finding.evidence]
    # conditional execution, literally: the caller's switch picks branches of different compute; the
    # model decides nothing, so the claim of dynamic inference is refuted
    assert (finding.answer, finding.decided_by) == ("yes", "caller")
    assert finding.statement.startswith("Yes, by the caller's choice only: If `If#1` by `use_cache_branch` chooses "
                                        "between branches of different compute; the model itself decides nothing")
    claim = check_claim({"conditional_execution": finding.to_json()}, "dynamic-inference")
    assert not claim.supported and claim.reason.startswith("refuted: only the caller decides what runs")
    assert not any("every one of" in t for t in texts), texts
    assert any("1 of 2 blocks ran in full on every profiled input" in t for t in texts), texts
    assert any("model.layers.1 ran on none of the inputs: it lies inside If `If#1`, a switch the caller decides by "
               "`use_cache_branch`" in t for t in texts), texts


def test_the_callers_switch_alone_is_no_dynamic_inference_in_the_summary():
    from graphaudit.report.tables import comparison_column, summary_phrase

    switched = {"answer": "yes", "statement": "Yes, by the caller's choice only: …", "evidence": [],
                "decided_by": "caller"}
    doc = {"verdict": {"coefficient_variation": {"answer": "no"}, "conditional_execution": switched}}
    assert summary_phrase(doc) == "the caller's switches only"
    assert comparison_column(doc)[-2:] == ("no (the caller's switches)", "the caller's switches only")
    doc["verdict"]["conditional_execution"] = {**switched, "decided_by": "model"}
    assert summary_phrase(doc) == "dynamic inference" and comparison_column(doc)[-2] == "yes"
