"""Execution evidence, time breakdown and trace, read from recorded profiler files."""

import dataclasses
import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from graphaudit.graph.build import build_graph
from graphaudit.profile.agreement import compare_verdicts
from graphaudit.profile.breakdown import breakdown
from graphaudit.profile.events import NodeEvent, Run, parse_profile
from graphaudit.profile.execution import aligned_inputs, block_work, read_execution
from graphaudit.profile.mapping import OTHER, assign_blocks, one_to_one, through_optimised
from graphaudit.profile.trace import block_segments, trace_events

from support.profile_models import dynamic_model, prefix_blocks

PROFILES = Path(__file__).parent / "data" / "profiles"
SHAPES = [(("x", (1, 6, 8)),)] * 4
ROWS = [(i, i + 1) for i in range(4)]


def matmul_flops(node, input_shapes, output_shapes):
    """2·M·K·N for MatMul, None for everything else: a stand-in for analyses.flops.node_flops."""
    if node.op_type != "MatMul":
        return None
    return 2 * int(np.prod(output_shapes[0])) * input_shapes[0][-1]


@pytest.fixture(scope="module", params=["dynamic_disable_all", "dynamic_fenced"])
def evidence(request):
    mg = build_graph(dynamic_model())
    runs = parse_profile(PROFILES / f"{request.param}.json").runs
    node_map = one_to_one(mg, {ev.name for run in runs for ev in run.events})
    return read_execution(runs, ROWS, SHAPES, mg, node_map, assign_blocks(mg, prefix_blocks(mg)), matmul_flops)


def by_name(execution):
    return {b.name: b for b in execution.blocks}


def test_blocks_always_run_or_run_for_some_inputs(evidence):
    blocks = by_name(evidence)
    assert blocks["block0"].executed_fraction == 1.0
    assert blocks["loop"].executed_fraction == 1.0 and blocks["moe"].executed_fraction == 1.0
    # block1 sits in the If: its pass-through (an Identity) runs on early exits, which is
    # not the block running; its MatMul / Relu / Add run otherwise
    assert blocks["block1"].executed_fraction == 0.5 and blocks["block1"].nodes == 3
    assert (blocks["block1"].node_fraction.min, blocks["block1"].node_fraction.max) == (0.0, 1.0)
    assert [("block1" in inp.blocks_ran) for inp in evidence.inputs] == [False, True, False, True]
    ran = [set(inp.ran) for inp in evidence.inputs]
    assert ["/block1/MatMul" in r for r in ran] == [False, True, False, True]
    assert ["/block1/skip" in r for r in ran] == [True, False, True, False]


def test_a_block_wholly_inside_the_skipped_branch_runs_on_some_inputs_only():
    mg = build_graph(dynamic_model())
    runs = parse_profile(PROFILES / "dynamic_disable_all.json").runs
    node_map = one_to_one(mg, {ev.name for run in runs for ev in run.events})
    late = prefix_blocks(mg, ("/block0/", "/block1/M", "/block1/R", "/moe/"))
    execution = read_execution(runs, ROWS, SHAPES, mg, node_map, assign_blocks(mg, late))
    blocks = by_name(execution)
    assert blocks["block1/M"].executed_fraction == 0.5 and blocks["block1/M"].inputs_executed == 2
    assert [("block1/M" in inp.blocks_ran) for inp in execution.inputs] == [False, True, False, True]
    assert blocks["block0"].executed_fraction == 1.0
    assert execution.flop_counter is None and blocks["block0"].flops is None


def test_routed_tokens_show_as_value_dependent_shapes(evidence):
    moe = by_name(evidence)["moe"]
    varying = {v.node: v for v in moe.value_dependent}
    assert {"/moe/NonZero", "/moe/GatherND", "/moe/expert/MatMul"} <= set(varying)
    assert "/moe/router/MatMul" not in varying  # the router runs on every token
    expert = varying["/moe/expert/MatMul"]
    assert expert.distinct > 1 and all(s.endswith(",8]") for s in expert.shapes)
    assert not by_name(evidence)["block0"].value_dependent


def test_executed_flops_follow_the_shapes_run(evidence):
    blocks = by_name(evidence)
    assert blocks["block0"].flops.min == blocks["block0"].flops.max == 2 * 6 * 8 * 8
    per_input = [inp.flops["block1"] for inp in evidence.inputs]
    assert per_input == [0, 2 * 6 * 8 * 8, 0, 2 * 6 * 8 * 8]
    assert blocks["moe"].flops.min < blocks["moe"].flops.max  # expert FLOPs track the routed tokens
    assert evidence.mean_flops() == pytest.approx(np.mean([sum(i.flops.values()) for i in evidence.inputs]))


def test_a_main_graph_node_that_ran_on_no_input_is_not_block_work():
    # ONNX Runtime drops some nodes of the main graph before it runs (TorchScript's Cast of an
    # int64 shape value to int64): no event on any input; nothing decided that, so the block
    # still ran all of its work. A node inside the If that no input took still counts.
    mg = build_graph(dynamic_model())
    runs = parse_profile(PROFILES / "dynamic_disable_all.json").runs
    node_map = one_to_one(mg, {ev.name for run in runs for ev in run.events})
    blocks = assign_blocks(mg, prefix_blocks(mg))
    whole = by_name(read_execution(runs, ROWS, SHAPES, mg, node_map, blocks))["block0"]
    dropped = next(n for n in block_work(mg, blocks)["block0"] if mg.nodes[n].op_type != "MatMul")
    runs = [dataclasses.replace(run, events=tuple(ev for ev in run.events if node_map.node_of(ev.name) != dropped))
            for run in runs]
    block0 = by_name(read_execution(runs, ROWS, SHAPES, mg, node_map, blocks))["block0"]
    assert block0.nodes == whole.nodes - 1 and block0.node_fraction.min == 1.0
    exits = [r for r in runs if any(node_map.node_of(ev.name) == "/block1/skip" for ev in r.events)]
    always_exits = [dataclasses.replace(r, index=i) for i, r in enumerate(exits + exits)]
    block1 = by_name(read_execution(always_exits, ROWS, SHAPES, mg, node_map, blocks))["block1"]
    assert block1.executed_fraction == 0.0 and block1.nodes == 3


def test_event_shapes_line_up_with_the_nodes_inputs():
    mg = build_graph(dynamic_model())
    run = parse_profile(PROFILES / "dynamic_disable_all.json").runs[1]
    events = {ev.name: ev for ev in run.events}
    matmul = events["/block1/MatMul"]
    assert matmul.input_shapes == ((1, 6, 8),)  # ORT prepacked the weight: no shape recorded for it
    assert aligned_inputs(mg.nodes["/block1/MatMul"], matmul.input_shapes, mg) == ((1, 6, 8), (8, 8))
    greater = events["/exit/Greater"]  # an initializer ORT does list stays where it is
    assert aligned_inputs(mg.nodes["/exit/Greater"], greater.input_shapes, mg) == greater.input_shapes


def test_block_work_leaves_out_control_flow_owners():
    mg = build_graph(dynamic_model())
    work = block_work(mg, assign_blocks(mg, prefix_blocks(mg)))
    assert "/exit/If" not in work[OTHER] and "/loop/Loop" not in work["loop"]
    assert "/loop/Add" in work["loop"]


@pytest.mark.parametrize("stem", ["dynamic_disable_all", "dynamic_enable_all"])
def test_breakdown_shares_add_up(stem):
    mg = build_graph(dynamic_model())
    runs = parse_profile(PROFILES / f"{stem}.json").runs
    names = {ev.name for run in runs for ev in run.events}
    node_map = (one_to_one(mg, names) if stem.endswith("disable_all") else
                through_optimised(mg, onnx.load(PROFILES / f"{stem}.optimised.onnx"), "ORT_ENABLE_ALL", names))
    times = breakdown(runs, node_map, assign_blocks(mg, prefix_blocks(mg)))
    node_share = sum(n.share for n in times.nodes)
    assert sum(b.share for b in times.blocks) == pytest.approx(node_share)
    assert sum(o.share for o in times.ops) == pytest.approx(node_share)
    assert 0 < times.coverage <= 1 and node_share == pytest.approx(times.coverage, abs=0.02)
    assert times.unmapped_share == 0 and times.runs == 4
    loop_add = next(n for n in times.nodes if n.name == "/loop/Add")
    assert loop_add.calls == 2 and loop_add.block == "loop"
    assert [b.name for b in times.blocks][-1] == OTHER


def test_trace_has_block_spans_that_do_not_overlap(tmp_path):
    mg = build_graph(dynamic_model())
    runs = parse_profile(PROFILES / "dynamic_disable_all.json").runs
    node_map = one_to_one(mg, {ev.name for run in runs for ev in run.events})
    blocks = assign_blocks(mg, prefix_blocks(mg))
    for run in runs:
        segments = block_segments(run, node_map, blocks)
        assert all(a[2] <= b[1] for a, b in itertools.pairwise(segments))
        assert {s[0] for s in segments} >= {"block0", "moe", "loop"}
    events = trace_events(runs, 4, node_map, blocks, "test")
    json.dumps(events)  # serialisable
    spans = [e for e in events if e.get("cat") == "block"]
    nodes = [e for e in events if e.get("cat") == "node"]
    assert spans and all(e["ph"] == "X" and e["dur"] >= 0 for e in spans)
    assert next(e for e in nodes if e["name"] == "/block1/Relu")["args"]["block"] == "block1"
    assert [e["args"]["input"] for e in events if e.get("cat") == "run"] == [0, 1, 2, 3]


def test_static_verdicts_are_confirmed_or_contradicted_by_the_run(evidence):
    static = SimpleNamespace(blocks=[SimpleNamespace(name=n, verdict=v) for n, v in (
        ("block0", "always"), ("block1", "branch"), ("moe", "subset"), ("loop", "always"), ("absent", "gated"))])
    outcomes = {a.block: a for a in compare_verdicts(static, evidence.blocks)}
    assert set(outcomes) == {"block0", "block1", "moe", "loop"}
    assert outcomes["block0"].outcome == "confirmed"
    assert outcomes["block1"].outcome == "confirmed" and "ran on 2 of 4 inputs" in outcomes["block1"].detail
    assert outcomes["moe"].outcome == "confirmed" and "value-dependent" in outcomes["moe"].detail
    wrong = SimpleNamespace(blocks=[SimpleNamespace(name="moe", verdict="gated"),
                                    SimpleNamespace(name="block0", verdict="branch")])
    outcomes = {a.block: a.outcome for a in compare_verdicts(wrong, evidence.blocks)}
    assert outcomes == {"moe": "contradicted", "block0": "not_observed"}


def test_breakdown_takes_each_inputs_median_over_rounds():
    mg = build_graph(dynamic_model())

    def run(k, a_us, b_us):
        events = (NodeEvent("/block0/Relu", "Relu", "CPUExecutionProvider", 0, a_us, 1, None, None, None, None, a_us),
                  NodeEvent("/head/MatMul", "MatMul", "CPUExecutionProvider", a_us, b_us, 1, None, None, None, None, b_us))
        return Run(k, 0, a_us + b_us, events)

    # two inputs, three rounds; round 2 of input 0 was preempted (1000 µs)
    runs = [run(0, 10, 10), run(1, 20, 10), run(2, 10, 10), run(3, 20, 10), run(4, 1000, 10), run(5, 20, 10)]
    names = {"/block0/Relu", "/head/MatMul"}
    times = breakdown(runs, one_to_one(mg, names), assign_blocks(mg, prefix_blocks(mg)), inputs=2)
    relu = next(n for n in times.nodes if n.name == "/block0/Relu")
    assert relu.mean_ms == pytest.approx((10 + 20) / 2 / 1e3)
    assert relu.share == pytest.approx(30 / 50)
    assert times.coverage == pytest.approx(1.0) and times.runs == 6
