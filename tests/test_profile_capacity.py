"""A block that runs on a fixed share of the tokens (Mixture-of-Depths' capacity): the profile
reads, from its selection's shapes, the share of the rows it kept on each input, confirms the
`subset` verdict with it, and `run`'s conditional-execution answer says the block was shrunk,
by a fixed capacity, the same on every input."""

import numpy as np
import onnx
import onnx.parser
import pytest

from graphaudit.analyses.static import audit_static
from graphaudit.load import load_model
from graphaudit.profile import profile_model
from graphaudit.verdict import YES, conditional_execution

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


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("capacity")
    model = onnx.parser.parse_model(MIXTURE_OF_DEPTHS)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, folder / "mod.onnx")
    np.savez(folder / "data.npz", x0=np.random.default_rng(0).standard_normal((4, 6, 2)).astype(np.float32))
    static = audit_static(load_model(folder / "mod.onnx"), shapes={"x0": (1, 6, 2)})
    report = profile_model(folder / "mod.onnx", folder / "data.npz", runs=2, warmup=1, profile_runs=1, static=static)
    return static, report


def test_the_share_of_rows_a_fixed_capacity_keeps_is_read_from_the_selection(profiled):
    static, report = profiled
    assert [b.verdict for b in static.blocks] == ["always", "subset", "always"]
    blocks = {b.name: b for b in report.execution.blocks}
    kept = blocks["model.layers.1"].rows_kept
    assert (kept.min, kept.max) == (pytest.approx(2 / 6), pytest.approx(2 / 6))  # 2 of 6 tokens, every input
    assert blocks["model.layers.0"].rows_kept is None and blocks["model.layers.2"].rows_kept is None
    outcome = {a.block: a for a in report.agreements}["model.layers.1"]
    assert outcome.outcome == "confirmed" and "33.3% of the rows on every input" in outcome.detail


def test_conditional_execution_says_the_block_was_shrunk_by_a_fixed_capacity(profiled):
    static, report = profiled
    finding = conditional_execution(static.to_json(), report.to_json())
    assert finding.answer == YES
    assert "model.layers.1 ran on 33.3% of the rows on every input (a fixed capacity" in finding.statement
    assert "model.layers.0" not in finding.statement and "model.layers.2" not in finding.statement
