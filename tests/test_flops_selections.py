"""FLOPs behind selections of rows by value.

A data-dependent selection (NonZero, Compress) leaves the compute after it without a size:
it is counted with every row selected, an upper bound shown as one ("≤"). A selection of
fixed capacity (top-k rows, k a share of the rows) runs at that size on every input: it is
not skippable, and its saving against the same compute on every row is reported apart.
Graphs in ONNX text syntax, on the helpers of tests/support/text_graphs.py.
"""

import json
import re

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from graphaudit.report.static_text import render_text
from graphaudit.report.tables import static_table

from support.cli import run_main
from support.text_graphs import (
    DENSE,
    DENSE_W,
    DISPATCH,
    EYE,
    MOE_W,
    PICK_CAPACITY,
    PICK_NONZERO,
    ROUTE,
    audit,
    graph,
    model_of,
)

T = 8
SHAPES = {"x0": (T, 2)}
DENSE_FLOPS = 2 * T * 2 * 2  # the [T, 2] x [2, 2] MatMul of a dense block
ROUTER = 2 * T * 2 * 1  # the [T, 2] x [2, 1] router
EXPERT_ROW = 2 * 2 * 2  # the expert's MatMul, per row it runs on


def routed(pick: str):
    return audit(graph([DENSE, ROUTE + pick + DISPATCH, DENSE], [DENSE_W, MOE_W, DENSE_W]), shapes=SHAPES)


# -- data-dependent selections: counted with every row selected -----------------------------------
def test_compute_after_nonzero_is_counted_with_every_row_selected():
    report = routed(PICK_NONZERO)
    block = report.blocks[1]
    assert block.verdict == "subset" and block.uncounted == 1  # the expert's size is unknown ...
    assert block.flops == ROUTER and block.flops_every_row == ROUTER + T * EXPERT_ROW  # ... at most every row
    assert block.skippable_flops == T * EXPERT_ROW  # no row selected: the expert runs on none
    f = report.flops
    assert f.every_row == ("/model/layers.1/expert/MatMul",) and f.skippable_uncounted == 0
    assert f.total == 2 * DENSE_FLOPS + ROUTER + T * EXPERT_ROW
    assert f.skippable_share == pytest.approx(T * EXPERT_ROW / f.total)
    out = render_text(report)
    assert "≥ 32, ≤ 96" in out and "(≤: with every row of each value-dependent selection selected)" in out
    assert "FLOPs: ≤ 224 in total (every row of each value-dependent selection selected), ≤ 64 skippable (28.6%" in out
    assert "counted with every row selected (value-dependent size): 1 nodes" in out and "not counted" not in out


def test_a_block_counted_with_every_row_alone_shows_the_bound_alone():
    # nothing of the block has a size of its own: "≥ 0" says nothing, the bound says it all
    text = graph([DENSE, """
        axis1 = Constant <value = int64[1] {1}> ()
        s2 = ReduceSum <keepdims = 1> (x@, axis1)
        score = Squeeze (s2, axis1)
""" + PICK_NONZERO + DISPATCH], [DENSE_W, MOE_W])
    report = audit(text, shapes=SHAPES)
    assert report.blocks[1].flops == 0 and report.blocks[1].flops_every_row == T * EXPERT_ROW
    row = next(line for line in render_text(report).splitlines() if " model.layers.1 " in line)
    assert "≤ 64" in row and "≥" not in row


def test_compress_keeping_every_slice():
    compress = """
        zero = Constant <value = float {0.0}> ()
        positive = Greater (score, zero)
        ["/model/layers.@/Compress"] sel = Compress <axis = 0> (x@, positive)
        ["/model/layers.@/expert/MatMul"] out = MatMul (sel, "model.layers.@.expert.weight")
        zero1 = Constant <value = int64[1] {0}> ()
        ["/model/layers.@/ReduceSum"] summed = ReduceSum <keepdims = 1> (out, zero1)
        ["/model/layers.@/Add"] x@+1 = Add (x@, summed)
"""
    report = audit(graph([DENSE, ROUTE + compress], [DENSE_W, MOE_W]), shapes=SHAPES)
    assert report.blocks[1].flops_every_row == ROUTER + T * EXPERT_ROW
    assert report.flops.skippable == T * EXPERT_ROW


# -- fixed capacity: the same size on every input ---------------------------------------------------
HALF = """
        shape@ = Shape (score)
        two@ = Constant <value = int64[1] {2}> ()
        ["/model/layers.@/Div"] k = Div (shape@, two@)
        ["/model/layers.@/TopK"] top, idx = TopK <axis = 0> (score, k)
"""


@pytest.mark.parametrize("pick, k", [(PICK_CAPACITY, 2), (HALF, T // 2)], ids=["constant k", "half the rows"])
def test_a_fixed_capacity_is_not_skippable_and_its_saving_against_every_row_is_reported(pick, k):
    report = routed(pick)
    block = report.blocks[1]
    assert block.verdict == "subset" and block.evidence[0].size == "fixed (capacity)"
    assert block.flops == ROUTER + k * EXPERT_ROW and block.skippable_flops == 0  # every input runs k rows
    assert block.flops_full_size == ROUTER + T * EXPERT_ROW
    f = report.flops
    assert f.skippable == 0 and f.total == 2 * DENSE_FLOPS + ROUTER + k * EXPERT_ROW
    assert (f.capacity.blocks, f.capacity.saving) == (("model.layers.1",), (T - k) * EXPERT_ROW)
    out = render_text(report)
    assert f"{ROUTER + k * EXPERT_ROW} ({ROUTER + T * EXPERT_ROW} at full size)" in out
    assert f"fixed capacity: model.layers.1 run {ROUTER + k * EXPERT_ROW} at their selected size, against " \
           f"{ROUTER + T * EXPERT_ROW} on every row: {(T - k) * EXPERT_ROW} saved on every input" in out


def test_chained_capacities_each_keep_every_row():
    # the second selection picks half of what the first kept: with every row, both keep all T
    second = re.sub(r"\b(s2|axis1|score|k|top|idx|sel|out|idx2)\b", r"\1_b", ROUTE + HALF + DISPATCH)
    report = audit(graph([DENSE, ROUTE + HALF + DISPATCH, second], [DENSE_W, MOE_W, MOE_W]), shapes=SHAPES)
    assert [b.flops_full_size for b in report.blocks] == [None, ROUTER + T * EXPERT_ROW, ROUTER + T * EXPERT_ROW]


def _computed_twice(again: str):
    """The selection of HALF with its k computed again by `again` (as k2) for a reshape after it."""
    twice = HALF + again + """
        width@ = Constant <value = int64[1] {2}> ()
        back@ = Concat <axis = 0> (k2, width@)
"""
    dispatch = DISPATCH.replace('sel = Gather <axis = 0> (x@, idx)', 'picked = Gather <axis = 0> (x@, idx)\n'
                                '        sel = Reshape (picked, back@)')
    return audit(graph([DENSE, ROUTE + twice + dispatch], [DENSE_W, MOE_W]), shapes=SHAPES)


def test_a_capacity_computed_twice_from_the_same_values_keeps_every_row_in_both():
    # k computed a second time for a reshape after the selection, by the same operators on the
    # same tensor and constants: the same value on every input, so both get the whole axis
    report = _computed_twice("""
        shape2@ = Shape (score)
        two2@ = Constant <value = int64[1] {2}> ()
        k2 = Div (shape2@, two2@)
""")
    assert report.blocks[1].flops == ROUTER + (T // 2) * EXPERT_ROW
    assert report.blocks[1].flops_full_size == ROUTER + T * EXPERT_ROW
    assert report.flops.capacity.unsized == () and report.flops.skippable == 0


def test_a_capacity_computed_again_from_another_tensor_leaves_the_full_size_unfound():
    # k2 is T // 2 too, but from the input's shape, not the scores': equal at these shapes,
    # not provably the same size, so keeping every row gives no consistent graph, and no figure
    report = _computed_twice("""
        shape2@ = Shape (x@)
        zero2@ = Constant <value = int64[1] {0}> ()
        rows2@ = Gather (shape2@, zero2@)
        two2@ = Constant <value = int64[1] {2}> ()
        k2 = Div (rows2@, two2@)
""")
    assert report.blocks[1].flops == ROUTER + (T // 2) * EXPERT_ROW and report.blocks[1].flops_full_size is None
    assert report.flops.capacity.unsized == ("model.layers.1",) and report.flops.skippable == 0
    assert "their size with every row selected was not found" in render_text(report)


def test_json_keeps_the_documented_fields_and_adds_the_new_ones(tmp_path, capsys):
    path = tmp_path / "capacity.onnx"
    onnx.save(model_of(graph([DENSE, ROUTE + HALF + DISPATCH], [DENSE_W, MOE_W])), path)
    code, out, _ = run_main(["static", str(path), "--shape", f"x0={T},2", "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0
    block = doc["blocks"][1]
    assert {"name", "index", "verdict", "flops", "evidence", "flops_uncounted_nodes", "skippable_flops"} <= set(block)
    assert (block["flops_full_size"], block["flops_every_row_selected"], block["skippable_flops"]) == \
        (ROUTER + T * EXPERT_ROW, None, 0)
    assert doc["flops"]["fixed_capacity"] == {"blocks": ["model.layers.1"], "flops": ROUTER + (T // 2) * EXPERT_ROW,
                                              "flops_full_size": ROUTER + T * EXPERT_ROW,
                                              "saving": (T // 2) * EXPERT_ROW, "full_size_not_found": []}
    table = static_table({"static": doc})
    assert "a fixed capacity (model.layers.1) saves 32 FLOPs on every input" in table.note
    assert table.rows[1][3] == f"{ROUTER + (T // 2) * EXPERT_ROW} ({ROUTER + T * EXPERT_ROW} at full size)"


def test_the_report_table_shows_the_bound_of_every_row_selected():
    doc = {"static": routed(PICK_NONZERO).to_json()}
    table = static_table(doc)
    assert table.rows[1][3] == "≥ 32, ≤ 96"
    assert "at most 224 FLOPs at input shapes" in table.note and "at most 28.6% where input values can skip" in table.note


# -- routed experts: at most k of them per routed row ---------------------------------------------
E, K = 3, 2
EXPERTS_ROUTER = 2 * T * 2 * E  # the [T, 2] x [2, E] router


def experts(expert: str = '["/model/layers.@/expert{e}/MatMul"] out{e} = MatMul (sel{e}, "w{e}")',
            numbers=range(E), k: str = f"int64[1] {{{K}}}") -> str:
    """A mixture of E experts as the exporters write its dispatch loop: TopK of K experts per row,
    then for each expert e the rows whose indices equal e (nonzero(chosen == e)) through it and
    added back in place. `expert` is each expert's compute on its rows sel{e}, giving out{e}."""
    lines = [f"""
        ["/model/layers.@/router/MatMul"] probs = MatMul (x@, "model.layers.@.router.weight")
        k = Constant <value = {k}> ()
        ["/model/layers.@/TopK"] weight, chosen = TopK <axis = -1> (probs, k)
        zero = Constant <value = int64 {{0}}> ()
        axis1 = Constant <value = int64[1] {{1}}> ()
        acc{E} = Identity (x@)"""]
    for e, number in enumerate(numbers):
        lines.append(f"""
        n{e} = Constant <value = int64 {{{number}}}> ()
        ["/model/layers.@/Equal{e}"] mask{e} = Equal (chosen, n{e})
        ["/model/layers.@/NonZero{e}"] nz{e} = NonZero (mask{e})
        rows{e} = Gather <axis = 0> (nz{e}, zero)
        ["/model/layers.@/Gather{e}"] sel{e} = Gather <axis = 0> (x@, rows{e})
        {expert.format(e=e)}
        at{e} = Unsqueeze (rows{e}, axis1)
        ["/model/layers.@/ScatterND{e}"] acc{e} = ScatterND <reduction = "add"> (acc{e - 1 if e else E}, at{e}, out{e})""")
    return "".join(lines) + f"\n        x@+1 = Identity (acc{len(numbers) - 1})\n"


def experts_weights() -> str:
    return 'float[2, 3] "model.layers.@.router.weight" = {1.0, 0.5, -1.0, 0.2, 0.3, -0.4}, ' + ", ".join(
        f'float[2, 2] "w{e}" = {EYE}' for e in range(E))


def test_experts_routed_by_a_topk_are_bounded_by_k_rows_per_routed_row(tmp_path, capsys):
    text = graph([DENSE, experts()], [DENSE_W, experts_weights()])
    report = audit(text, shapes=SHAPES)
    block = report.blocks[1]
    assert block.verdict == "subset" and block.flops == EXPERTS_ROUTER
    # with every row selected, each expert gets every element of a TopK widened to all E
    # experts (E·T rows, E·E·T in all); each row reaches K experts: K·T rows in all
    assert block.flops_every_row == EXPERTS_ROUTER + K * T * EXPERT_ROW
    # the experts are numbered 0 … E − 1, every index the TopK gives: the K·T rows are taken
    # on every input, so no input runs less (with equal experts, nothing is skippable)
    assert block.skippable_flops == 0 and report.flops.skippable == 0
    assert "≤ 0 skippable" not in render_text(report) and ", 0 skippable (0.0%" in render_text(report)
    said = f"at most k = {K} of {E} experts per routed row behind TopK `/model/layers.1/TopK`"
    assert said in render_text(report) and "each expert's FLOPs in proportion to its rows" in render_text(report)
    path = tmp_path / "experts.onnx"
    onnx.save(model_of(text), path)
    code, out, _ = run_main(["static", str(path), "--shape", f"x0={T},2", "--format", "json"], capsys)
    assert code == 0 and said in json.loads(out)["flops"]["counted_as"][0]
    # the bound holds where the graph runs: the experts' rows add up to K per row
    x = np.random.default_rng(0).standard_normal((T, 2)).astype(np.float32)
    ran = ReferenceEvaluator(model_of(text)).run([f"sel{e}" for e in range(E)], {"x0": x})
    assert sum(len(rows) for rows in ran) == K * T


QUADRATIC = ('["/model/layers.@/expert{e}/MatMul"] out{e} = MatMul (sel{e}, "w{e}")\n'
             '        t{e} = Transpose (sel{e})\n'
             '        ["/model/layers.@/expert{e}/MatMul_1"] o{e} = MatMul (sel{e}, t{e})')


@pytest.mark.parametrize("expert, numbers", [(None, [0, 1, 1]), (QUADRATIC, range(E))],
                         ids=["an expert number twice", "compute not in proportion to the rows"])
def test_experts_keep_the_bound_of_every_row_where_k_per_row_is_not_shown(expert, numbers):
    text = graph([DENSE, experts(**({"expert": expert} if expert else {}), numbers=numbers)],
                 [DENSE_W, experts_weights()])
    report = audit(text, shapes=SHAPES)
    assert report.blocks[1].flops_every_row > EXPERTS_ROUTER + E * T * EXPERT_ROW
    assert "experts per routed row" not in render_text(report)


def test_experts_that_leave_an_index_to_no_expert_keep_the_cheapest_run_at_none():
    # experts for indices 0 and 1 only, of the TopK's 3: an element equal to 2 is in no mask, so
    # the rows do not add up to exactly K per row; the bound from above holds (each expert at
    # most T rows), the least is not proven and stays at no expert run, so skippable stays an
    # upper bound on the savings
    text = graph([DENSE, experts(numbers=[0, 1])], [DENSE_W, experts_weights()])
    report = audit(text, shapes=SHAPES)
    block = report.blocks[1]
    assert block.flops_every_row == EXPERTS_ROUTER + 2 * T * EXPERT_ROW
    assert block.skippable_flops == 2 * T * EXPERT_ROW
    assert "at most k = 2 of 3 experts per routed row" in render_text(report)
