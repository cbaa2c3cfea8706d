"""Run-time evidence of blocks that do less work for some inputs, without skipping a branch.

A block that runs on a fixed share of the tokens (Mixture-of-Depths' capacity): the profile
reads, from its selection's shapes, the share of the rows it kept on each input, confirms the
`subset` verdict with it, and `run`'s conditional-execution answer says the block was shrunk,
by a fixed capacity, the same on every input.

A layer applied by a Loop as many times as the input says (adaptive computation time): with
no layer names and no residual chain, the Loop is the block; its nodes run a number of times
that varies between same-shaped inputs, at the same shapes, which confirms its `branch`
verdict and is not taken for a change of shape."""

import numpy as np
import onnx
import onnx.parser
import pytest

from graphaudit.analyses.static import audit_static
from graphaudit.load.model import load_model
from graphaudit.profile import profile_model
from graphaudit.verdict.decide import YES, conditional_execution

# Block 1 picks the 2 best-scored of T tokens (TopK, then the indices in order: torch.sort of the
# indices exports as a second TopK), runs its MatMul on them and adds the weighted result back.
MIXTURE_OF_DEPTHS = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[B, T, 2] x0) => (float[B, T, 2] y) <float[2, 2] "model.layers.0.fc.weight" = {1.0, 0.0, 0.0, 1.0},
    float[2, 1] "model.layers.1.router.weight" = {1.0, -1.0}, float[2, 2] "model.layers.1.fc.weight" = {0.5, 0.0, 0.0, 0.5},
    float[2, 2] "model.layers.2.fc.weight" = {1.0, 0.0, 0.0, 1.0}> {
    two = Constant <value = int64[1] {2}> ()
    ["/model/layers.0/fc/MatMul"] h0 = MatMul (x0, "model.layers.0.fc.weight")
    ["/model/layers.0/Add"] x1 = Add (x0, h0)
    ["/model/layers.1/router/MatMul"] s1 = MatMul (x1, "model.layers.1.router.weight")
    ["/model/layers.1/router/Squeeze"] score = Squeeze (s1, two)
    ["/model/layers.1/TopK"] top, idx = TopK <axis = 1> (score, two)
    ["/model/layers.1/TopK_1"] chosen, order = TopK <axis = 1, largest = 0> (idx, two)
    ["/model/layers.1/Unsqueeze"] idx3 = Unsqueeze (chosen, two)
    wide = Constant <value = int64[3] {1, 1, 2}> ()
    ["/model/layers.1/Expand"] rows = Expand (idx3, wide)
    ["/model/layers.1/GatherElements"] picked = GatherElements <axis = 1> (x1, rows)
    ["/model/layers.1/fc/MatMul"] out = MatMul (picked, "model.layers.1.fc.weight")
    ["/model/layers.1/GatherElements_1"] w = GatherElements <axis = 1> (score, chosen)
    ["/model/layers.1/Sigmoid"] ws = Sigmoid (w)
    ["/model/layers.1/Unsqueeze_1"] wu = Unsqueeze (ws, two)
    ["/model/layers.1/Mul"] update = Mul (out, wu)
    ["/model/layers.1/ScatterElements"] x2 = ScatterElements <axis = 1, reduction = "add"> (x1, rows, update)
    ["/model/layers.2/fc/MatMul"] h2 = MatMul (x2, "model.layers.2.fc.weight")
    ["/model/layers.2/Add"] y = Add (x2, h2)
}"""


def audited(folder, text: str, x: np.ndarray):
    """The static audit of the model `text` at one input of `x`'s, and its profile on all of `x`."""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, folder / "model.onnx")
    np.savez(folder / "data.npz", x0=x)
    static = audit_static(load_model(folder / "model.onnx"), shapes={"x0": (1, *x.shape[1:])})
    report = profile_model(folder / "model.onnx", folder / "data.npz", runs=2, warmup=1, profile_runs=1, static=static)
    return static, report


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    x = np.random.default_rng(0).standard_normal((4, 6, 2)).astype(np.float32)
    return audited(tmp_path_factory.mktemp("capacity"), MIXTURE_OF_DEPTHS, x)


def test_the_share_of_rows_a_fixed_capacity_keeps_is_read_from_the_selection(profiled):
    static, report = profiled
    assert [b.verdict for b in static.blocks] == ["always", "subset", "always"]
    blocks = {b.name: b for b in report.execution.blocks}
    ((node, kept),) = blocks["model.layers.1"].rows_kept
    assert node == "/model/layers.1/GatherElements"
    assert (kept.min, kept.max) == (pytest.approx(2 / 6), pytest.approx(2 / 6))  # 2 of 6 tokens, every input
    assert blocks["model.layers.0"].rows_kept == () and blocks["model.layers.2"].rows_kept == ()
    outcome = {a.block: a for a in report.agreements}["model.layers.1"]
    assert outcome.outcome == "confirmed" and "a selection that kept 33.3% of the rows it picks from, the same on every input" in outcome.detail


def test_conditional_execution_says_the_block_was_shrunk_by_a_fixed_capacity(profiled):
    static, report = profiled
    finding = conditional_execution(static.to_json(), report.to_json())
    assert finding.answer == YES
    assert ("model.layers.1 ran behind a selection that kept 33.3% of the rows it picks from, the same on every input "
            "(a fixed capacity") in finding.statement
    assert "model.layers.0" not in finding.statement and "model.layers.2" not in finding.statement


# One layer applied min(floor(|sum of the input|), 6) times: a halting rule decided by values.
PONDER = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[B, T, 2] x0) => (float[B, T, 2] y) <float[2, 2] w = {0.9, -0.3, 0.2, 0.8}, int64 most = {6}> {
    total = ReduceSum <keepdims = 0> (x0)
    size = Abs (total)
    steps_f = Floor (size)
    steps_all = Cast <to = 7> (steps_f)
    steps = Min (steps_all, most)
    go = Constant <value = bool {1}> ()
    ["/ponder/Loop"] y = Loop (steps, go, x0) <body = step (int64 i, bool c, float[B, T, 2] h) => (bool c_out, float[B, T, 2] h_out) {
        c_out = Identity (c)
        m = MatMul (h, w)
        h_out = Tanh (m)
    }>
}"""


@pytest.fixture(scope="module")
def pondered(tmp_path_factory):
    x = 4 * np.random.default_rng(0).standard_normal((6, 3, 2)).astype(np.float32)  # 2, 1, 6, 6, 3, 1 steps
    return audited(tmp_path_factory.mktemp("ponder"), PONDER, x)


def test_a_loop_with_a_value_dependent_trip_count_is_a_block_of_its_own(pondered):
    static, _ = pondered
    assert [(b.name, b.verdict) for b in static.blocks] == [("/ponder/Loop", "branch")]
    assert static.blocks[0].evidence[0].detail.endswith("trip count depends on input values")
    assert "control-flow bodies that hold compute: 1 block, one per Loop" in static.block_method


def test_a_varying_number_of_iterations_is_no_change_of_shape(pondered):
    static, report = pondered
    (loop,) = [b for b in report.execution.blocks if b.name == "/ponder/Loop"]
    assert loop.executed_fraction == 1.0
    assert loop.calls_vary and (loop.calls.min, loop.calls.max) == (2 * 1, 2 * 6)  # MatMul and Tanh, 1 to 6 times
    assert (loop.iterations.min, loop.iterations.max) == (1, 6)
    assert loop.value_dependent == ()  # every iteration ran at the same shapes
    outcome = {a.block: a for a in report.agreements}["/ponder/Loop"]
    assert outcome.outcome == "confirmed" and "its loop ran 1 to 6 iterations" in outcome.detail
    finding = conditional_execution(static.to_json(), report.to_json())
    assert finding.answer == YES and "/ponder/Loop ran its loop 1 to 6 iterations" in finding.statement


def test_the_profile_table_gives_rows_kept_and_loop_iterations(profiled, pondered):
    from graphaudit.report.profile_text import render_text

    capacity = render_text(profiled[1]).splitlines()
    header = next(line for line in capacity if line.startswith("block "))
    assert "rows kept" in header and "loop iterations" in header
    row = next(line for line in capacity if line.startswith("model.layers.1 "))
    assert "33.3%" in row
    loop = next(line for line in render_text(pondered[1]).splitlines() if line.startswith("/ponder/Loop "))
    assert " 1..6 " in loop
