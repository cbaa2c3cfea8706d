"""FLOPs through control flow: one branch of each If runs, a Loop body runs once per iteration.

The total is the most expensive run (the larger branch of each If, each loop at its largest
trip count); skippable is what the cheapest run that input values can choose saves against
it. Graphs in ONNX text syntax, on the helpers of tests/support/text_graphs.py.
"""

import json

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from graphaudit.analyses.static import audit_static
from graphaudit.load.model import load_model
from graphaudit.report.static_text import render_text

from support.cli import run_main
from support.text_graphs import CONDITIONS, DENSE, DENSE_W, TRIPS, audit, graph, model_of

PER_MATMUL = 2 * 8 * 2 * 2  # one [8, 2] x [2, 2] MatMul, x0 at (8, 2)
SHAPES = {"x0": (8, 2)}

BOTH = """
        ["/model/layers.1/If"] x2 = If (go) <
            then_branch = t () => (float[T, 2] x2a) {
                ["/model/layers.1/a/MatMul"] ha = MatMul (x1, "model.layers.1.fc.weight")
                ["/model/layers.1/a/Add"] x2a = Add (x1, ha)
            },
            else_branch = e () => (float[T, 2] x2b) {
                ["/model/layers.1/b/MatMul"] hb = MatMul (x1, "model.layers.1.fc.weight")
                ["/model/layers.1/b/MatMul_1"] hc = MatMul (hb, "model.layers.1.fc.weight")
                ["/model/layers.1/b/MatMul_2"] x2b = MatMul (hc, "model.layers.1.fc.weight")
            }
        >
"""


# -- If: one branch runs --------------------------------------------------------------------------
def test_an_if_counts_its_larger_branch_and_saves_its_larger_against_its_smaller():
    # then: one MatMul, else: three; before, both were added up (four MatMuls, more than ever run)
    report = audit(graph([DENSE, CONDITIONS["value"] + BOTH, DENSE], [DENSE_W] * 3), shapes=SHAPES)
    assert [b.flops for b in report.blocks] == [PER_MATMUL, 3 * PER_MATMUL, PER_MATMUL]
    assert [b.skippable_flops for b in report.blocks] == [0, 2 * PER_MATMUL, 0]
    assert report.flops.total == 5 * PER_MATMUL and report.flops.skippable == 2 * PER_MATMUL
    assert "the larger branch of each If" in render_text(report)
    assert report.to_json()["flops"]["least"] == 3 * PER_MATMUL


def test_an_if_its_inputs_decide_by_their_shapes_saves_nothing():
    # the same branch runs on every input of a shape: not skippable, and counted at the larger
    report = audit(graph([DENSE, CONDITIONS["shape"] + BOTH], [DENSE_W] * 2), shapes=SHAPES)
    assert report.flops.total == 4 * PER_MATMUL and report.flops.skippable == 0


def test_nested_ifs_take_the_larger_path_and_the_cheapest():
    nested = BOTH.replace(
        '["/model/layers.1/a/MatMul"] ha = MatMul (x1, "model.layers.1.fc.weight")',
        '''ha = If (go) <
                    then_branch = t2 () => (float[T, 2] hx) {
                        ["/model/layers.1/c/MatMul"] hx = MatMul (x1, "model.layers.1.fc.weight") },
                    else_branch = e2 () => (float[T, 2] hy) { hy = Identity (x1) } >''')
    report = audit(graph([DENSE, CONDITIONS["value"] + nested], [DENSE_W] * 2), shapes=SHAPES)
    # most: else-branch (3 MatMuls); least: then-branch with its inner else-branch (none)
    assert report.blocks[1].flops == 3 * PER_MATMUL and report.blocks[1].skippable_flops == 3 * PER_MATMUL


# -- Loop: the body runs once per iteration --------------------------------------------------------
LOOP = """
        yes = Constant <value = bool {1}> ()
        ["/model/repeat/Loop"] x2 = Loop (n, yes, x1) <
            body = b (int64 i, bool c, float[T, 2] a) => (bool c_out, float[T, 2] a_out) {
                c_out = Identity (c)
                ["/model/layers.1/fc/MatMul"] h1 = MatMul (a, "model.layers.1.fc.weight")
                ["/model/layers.1/Add"] a_out = Add (a, h1)
            }
        >
"""


def test_a_loop_of_constant_trip_count_counts_its_body_once_per_iteration():
    report = audit(graph([DENSE, "n = Constant <value = int64 {3}> ()" + LOOP, DENSE], [DENSE_W] * 3),
                   shapes=SHAPES)
    assert [b.flops for b in report.blocks] == [PER_MATMUL, 3 * PER_MATMUL, PER_MATMUL]
    assert report.flops.total == 5 * PER_MATMUL and report.flops.skippable == 0
    (loop,) = report.flops.loops
    assert (loop.trips.exact, loop.per_iteration) == (3, PER_MATMUL)
    assert "each Loop body times its trip count" in render_text(report)


def test_a_loop_whose_trip_count_input_shapes_set_is_counted_at_those_shapes():
    # n = x1's first dimension: 8 at these shapes, computed on the graph at them
    report = audit(graph([DENSE, TRIPS["shape"] + LOOP], [DENSE_W] * 2), shapes=SHAPES)
    assert report.flops.loops[0].trips.exact == 8
    assert report.blocks[1].flops == 8 * PER_MATMUL and report.flops.skippable == 0


# TorchScript's `while`: M = 2**63 - 1, entered unconditionally, the body's condition a value
# test and a step counter kept below a limit
WHILE = """
        forever = Constant <value = int64 {9223372036854775807}> ()
        yes = Constant <value = bool {1}> ()
        start = Constant <value = int64 {0}> ()
        ["/model/repeat/Loop"] x2, steps = Loop (forever, yes, x1, start) <
            body = b (int64 i, bool c, float[T, 2] a, int64 step) => (bool c_out, float[T, 2] a_out, int64 step_out) {
                ["/model/layers.1/fc/MatMul"] h1 = MatMul (a, "model.layers.1.fc.weight")
                ["/model/layers.1/Add"] a_out = Add (a, h1)
                one = Constant <value = int64 {1}> ()
                step_out = Add (step, one)
                total = ReduceSum <keepdims = 0> (a_out)
                limit = Constant <value = float {10.0}> ()
                going = Less (total, limit)
                four = Constant <value = int64 {4}> ()
                more = Less (step_out, four)
                c_out = And (going, more)
            }
        >
"""


def test_a_value_dependent_loop_counts_its_most_iterations_and_saves_all_but_its_fewest():
    text = graph([DENSE, WHILE, DENSE], [DENSE_W] * 3)
    report = audit(text, shapes=SHAPES)
    (loop,) = report.flops.loops
    assert (loop.trips.exact, loop.trips.most, loop.trips.least, loop.per_iteration) == (None, 4, 1, PER_MATMUL)
    assert [b.flops for b in report.blocks] == [PER_MATMUL, 4 * PER_MATMUL, PER_MATMUL]
    assert report.blocks[1].skippable_flops == 3 * PER_MATMUL  # one iteration always runs
    assert report.flops.total == 6 * PER_MATMUL and report.flops.skippable == 3 * PER_MATMUL
    out = render_text(report)
    assert "a value-dependent loop at its most iterations" in out
    assert "Loop `/model/repeat/Loop`: 64 per iteration, trip count depends on input values: 1 to 4 " \
           "(loop counter `step_out` below 4)" in out
    # the bound is the one the graph runs at: no input makes it take a fifth step
    evaluator = ReferenceEvaluator(model_of(text))
    for x in (np.full((8, 2), -1.0, np.float32), np.full((8, 2), 1e-3, np.float32)):
        assert 1 <= evaluator.run(["steps"], {"x0": x})[0] <= 4


def test_a_loop_with_no_bound_counts_one_iteration_and_says_so():
    unbounded = WHILE.replace("c_out = And (going, more)", "c_out = Identity (going)")
    report = audit(graph([DENSE, unbounded], [DENSE_W] * 2), shapes=SHAPES)
    (loop,) = report.flops.loops
    assert loop.trips.most is None and loop.counted_iterations == 1
    assert report.flops.open_loops == ("/model/repeat/Loop",)
    assert report.blocks[1].flops == PER_MATMUL
    out = render_text(report)
    assert "one iteration of Loop `/model/repeat/Loop`, whose trip count has no bound" in out
    assert "trip count depends on input values, with no bound; counted once in the total" in out
    doc = report.to_json()["flops"]
    assert doc["open_loops"] == ["/model/repeat/Loop"] and doc["loops"][0]["max_trip_count"] is None


def test_what_follows_a_loop_is_counted_its_carried_value_keeping_its_shape():
    # ONNX's inference gives a Loop's results no shape, and so none to the MatMul after it; the
    # body gives its carried value back in the shape it came in, which the result keeps
    report = audit(graph([DENSE, WHILE, DENSE], [DENSE_W] * 3), shapes=SHAPES)
    assert report.flops.count.unknown_shape == ()
    assert report.blocks[2].flops == PER_MATMUL
    # a body that gives it back in a shape of its own naming says nothing of the result's shape
    renamed = WHILE.replace("=> (bool c_out, float[T, 2] a_out,", "=> (bool c_out, float[R, C] a_out,")
    report = audit(graph([DENSE, renamed, DENSE], [DENSE_W] * 3), shapes=SHAPES)
    assert report.flops.count.unknown_shape == ("/model/layers.2/fc/MatMul",) and report.blocks[2].uncounted == 1


def test_a_scan_counts_its_body_once_per_slice():
    scanned = """
        start = Constant <value = float[2] {0.0, 0.0}> ()
        ["/model/layers.1/Scan"] last, x2 = Scan (start, x1) <
            num_scan_inputs = 1,
            body = b (float[2] acc, float[2] x) => (float[2] acc_out, float[2] seen) {
                ["/model/layers.1/fc/MatMul"] h = MatMul (x, "model.layers.1.fc.weight")
                acc_out = Add (acc, h)
                seen = Identity (acc_out)
            }
        >
"""
    report = audit(graph([DENSE, scanned], [DENSE_W] * 2), shapes=SHAPES)
    assert report.flops.loops[0].trips.exact == 8
    assert report.blocks[1].flops == 8 * (2 * 2 * 2)  # eight [2] x [2, 2] products


def test_json_keeps_its_fields_and_adds_the_loops(tmp_path, capsys):
    path = tmp_path / "while.onnx"
    onnx.save(model_of(graph([DENSE, WHILE], [DENSE_W] * 2)), path)
    code, out, _ = run_main(["static", str(path), "--shape", "x0=8,2", "--format", "json"], capsys)
    doc = json.loads(out)["flops"]
    assert code == 0
    assert {"total", "skippable", "skippable_share", "skippable_uncounted_nodes", "outside_blocks",
            "uncounted_ops", "unknown_shape_nodes", "dims", "note", "shapes"} <= set(doc)
    loop = doc["loops"][0]
    assert (loop["max_trip_count"], loop["min_trip_count"], loop["flops_per_iteration"]) == (4, 1, PER_MATMUL)
    assert doc["total"] == 5 * PER_MATMUL and doc["least"] == 2 * PER_MATMUL


@pytest.mark.parametrize("limit, op, expected", [("4", "Less", 4), ("4", "LessOrEqual", 5), ("0", "Less", 1)])
def test_a_loop_counter_limit_gives_the_trip_count_the_graph_runs(limit, op, expected):
    # checked against the reference evaluator: the condition that stops it is the counter's alone
    text = graph([DENSE, WHILE.replace("going = Less (total, limit)", "going = Identity (yes)")
                  .replace("four = Constant <value = int64 {4}>", f"four = Constant <value = int64 {{{limit}}}>")
                  .replace("more = Less", f"more = {op}")], [DENSE_W] * 2)
    report = audit(text, shapes=SHAPES)
    (steps,) = ReferenceEvaluator(model_of(text)).run(["steps"], {"x0": np.ones((8, 2), np.float32)})
    assert report.flops.loops[0].trips.exact == expected == int(steps)


@pytest.mark.parametrize("condition, matmuls", [("1", 1), ("0", 3)], ids=["then", "else"])
def test_an_if_of_a_constant_condition_counts_the_branch_it_takes(condition, matmuls):
    # true takes the smaller branch (one MatMul), false the larger (three): only that one runs
    constant = CONDITIONS["const"].replace("{1}", f"{{{condition}}}")
    report = audit(graph([DENSE, constant + BOTH], [DENSE_W] * 2), shapes=SHAPES)
    assert report.blocks[1].flops == matmuls * PER_MATMUL and report.flops.skippable == 0
    assert "the larger branch of each If" not in render_text(report)


def test_a_loops_scan_output_gets_a_leading_axis_of_its_trip_count():
    # each iteration's h1 is stacked: [3, T, 2] after three iterations, and the MatMul reading
    # the stack is counted at that size (ONNX's inference gives the loop's results no shape)
    scanning = """
        n = Constant <value = int64 {3}> ()
        yes = Constant <value = bool {1}> ()
        ["/model/repeat/Loop"] x2, stack = Loop (n, yes, x1) <
            body = b (int64 i, bool c, float[T, 2] a) => (bool c_out, float[T, 2] a_out, float[T, 2] h1) {
                c_out = Identity (c)
                ["/model/layers.1/fc/MatMul"] h1 = MatMul (a, "model.layers.1.fc.weight")
                ["/model/layers.1/Add"] a_out = Add (a, h1)
            }
        >
        ["/model/layers.1/stack/MatMul"] mixed = MatMul (stack, "model.layers.1.fc.weight")
"""
    report = audit(graph([DENSE, scanning], [DENSE_W] * 2), shapes=SHAPES)
    assert report.flops.count.unknown_shape == ()
    assert report.blocks[1].flops == 3 * PER_MATMUL + 3 * PER_MATMUL  # the body three times, the stack once


def test_a_trip_count_and_a_counter_limit_passed_through_identity_are_read():
    # TorchScript writes constants through Identity: the trip count M and the counter's limit
    # are the constants' values all the same (they were read as no bound)
    counted = "n0 = Constant <value = int64 {3}> ()\n        n = Identity (n0)" + LOOP
    report = audit(graph([DENSE, counted], [DENSE_W] * 2), shapes=SHAPES)
    assert report.flops.loops[0].trips.exact == 3 and report.blocks[1].flops == 3 * PER_MATMUL
    limited = WHILE.replace("going = Less (total, limit)", "going = Identity (yes)").replace(
        "more = Less (step_out, four)", "four_ = Identity (four)\n                more = Less (step_out, four_)")
    text = graph([DENSE, limited], [DENSE_W] * 2)
    (steps,) = ReferenceEvaluator(model_of(text)).run(["steps"], {"x0": np.ones((8, 2), np.float32)})
    assert audit(text, shapes=SHAPES).flops.loops[0].trips.exact == 4 == int(steps)


# Paddle2ONNX's `while step < max_len` (SLANet's decoder): M a large constant; the counter and the
# limit are both carried values, the limit passed on unchanged; each update and the condition go
# through Casts, Unsqueeze / Squeeze and Paddle's assignment `Add(x, 0)`; the first condition is
# computed from constants in the main graph
PADDLE_WHILE = """
        m = Constant <value = int64 {1024}> ()
        step0 = Constant <value = int64[1] {0}> ()
        limit0 = Constant <value = int64[1] {LIMIT}> ()
        one_f = Constant <value = float[1] {1.0}> ()
        limit_f = Cast <to = 1> (limit0)
        limit_1 = Add (limit_f, one_f)
        limit_i = Cast <to = 7> (limit_1)
        go = Less (step0, limit_i)
        ["/model/decoder/Loop"] x2, steps, kept = Loop (m, go, x1, step0, limit0) <
            body = b (int64 i, bool c, float[T, 2] a, int64[1] s, int64[1] top) => (bool c_out, float[T, 2] a_out,
                                                                                     int64[1] s_out, int64[1] top_out) {
                ["/model/layers.1/fc/MatMul"] a_out = MatMul (a, "model.layers.1.fc.weight")
                one = Constant <value = float[1] {1.0}> ()
                zero = Constant <value = int64[1] {0}> ()
                axis = Constant <value = int64[1] {0}> ()
                s_f = Cast <to = 1> (s)
                s_1 = Add (s_f, one)
                next_s = Cast <to = 7> (s_1)
                next_u = Unsqueeze (next_s, axis)
                next_a = Add (next_u, zero)
                s_out = Squeeze (next_a, axis)
                top_u = Unsqueeze (top, axis)
                top_a = Add (top_u, zero)
                top_out = Squeeze (top_a, axis)
                top_f = Cast <to = 1> (top)
                top_1 = Add (top_f, one)
                bound = Cast <to = 7> (top_1)
                more = Less (next_s, bound)
                more_i = Cast <to = 7> (more)
                more_a = Add (more_i, zero)
                c_out = Cast <to = 9> (more_a)
            }
        >
"""


@pytest.mark.parametrize("limit", [0, 3, 500])
def test_a_paddle_while_loop_runs_its_counter_to_a_carried_limit(limit):
    # the trip count is the counter's: limit + 1 steps (the counter, raised by one before the
    # test, stays below limit + 1), not M, and constants set it, not input shapes
    text = graph([DENSE, PADDLE_WHILE.replace("LIMIT", str(limit))], [DENSE_W] * 2)
    (steps,) = ReferenceEvaluator(model_of(text)).run(["steps"], {"x0": np.ones((8, 2), np.float32)})
    trips = audit(text, shapes=SHAPES).flops.loops[0].trips
    assert trips.exact == limit + 1 == int(steps[0])
    assert trips.how == f"trip count {limit + 1:,} (loop counter `next_s` below {limit + 1})"


def test_a_loop_constants_decide_is_said_to_be_set_by_constants_where_its_count_is_not_found():
    # the first condition computed by an operator the trip count's reading does not fold (Max)
    text = graph([DENSE, PADDLE_WHILE.replace("LIMIT", "3").replace(
        "go = Less (step0, limit_i)", "top = Max (limit_i, step0)\n        go = Less (step0, top)")], [DENSE_W] * 2)
    trips = audit(text, shapes=SHAPES).flops.loops[0].trips
    assert trips.exact is None and trips.how.startswith("trip count set by constants, not found; at most 4"), trips


def test_a_loop_body_declaring_its_carried_values_with_symbols_of_its_own_is_counted_at_their_sizes():
    # Paddle2ONNX declares each carried value with a symbol of its own (SLANet's decoder), and
    # ONNX's inference hands the body no shapes: its products were of unknown size
    own = LOOP.replace("float[T, 2] a) => (bool c_out, float[T, 2] a_out)",
                       "float[N, 2] a) => (bool c_out, float[M, 2] a_out)")
    model = model_of(graph([DENSE, "n = Constant <value = int64 {3}> ()" + own], [DENSE_W] * 2))
    encoded = model.SerializeToString()
    report = audit_static(load_model(model), shapes=SHAPES)
    assert report.flops.count.unknown_shape == ()
    assert report.blocks[1].flops == 3 * PER_MATMUL and report.flops.total == 4 * PER_MATMUL
    assert model.SerializeToString() == encoded  # declared in the variant's copy only


def test_a_carried_value_the_body_grows_is_not_counted_at_its_first_size():
    # the buffer gains a row each step: its product is of another size every iteration, so it is
    # left uncounted (and said so), never counted three times at the size it started at
    grown = """
        n = Constant <value = int64 {3}> ()
        yes = Constant <value = bool {1}> ()
        ["/model/repeat/Loop"] x2 = Loop (n, yes, x1) <
            body = b (int64 i, bool c, float[N, 2] a) => (bool c_out, float[M, 2] a_out) {
                c_out = Identity (c)
                ["/model/layers.1/fc/MatMul"] h1 = MatMul (a, "model.layers.1.fc.weight")
                first = Constant <value = int64[1] {0}> ()
                one = Constant <value = int64[1] {1}> ()
                row = Slice (h1, first, one)
                a_out = Concat <axis = 0> (a, row)
            }
        >
"""
    text = graph([DENSE, grown], [DENSE_W] * 2)
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": np.ones((8, 2), np.float32)})
    assert y.shape == (11, 2)  # 8 rows, and one more each of 3 steps
    report = audit(text, shapes=SHAPES)
    assert report.flops.count.unknown_shape == ("/model/layers.1/fc/MatMul",)
    assert report.blocks[1].flops == 0
