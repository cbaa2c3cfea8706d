"""The full size of a selection of fixed capacity where the exporter writes k more than once.

A capacity's full size is counted on a variant of the graph whose selections keep every row
(`analyses.widest`). The exporters do not hand k to the selection alone: TorchScript casts and
reshapes the k it computed once, and gives the un-reshaped k to the reshape after a flattened
gather (a Mixture-of-Depths written with index_select on batch × token rows); dynamo computes
every symbolic size at the top of the graph, the slice end of a full argsort and the reshape's
min(N, N // 2) apart (DynamicViT). Each of these must follow k to the whole axis, or the
reshapes after the selection no longer hold their elements and no full size is found.
Graphs in ONNX text syntax, checked against onnx.reference.
"""

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from graphaudit.analyses.static import audit_static
from graphaudit.load.model import load_model
from graphaudit.report.static_text import render_text

from support.text_graphs import EYE

B, T, D = 2, 8, 2
SHAPES = {"x0": (B, T, D)}
DENSE = 2 * B * T * D * D  # a [B, T, D] x [D, D] MatMul


def rows(n: int) -> int:
    """A [B, n, D] x [D, D] MatMul, or twice a [B, n, D] x [D, 1] router."""
    return 2 * B * n * D * D


HEAD = """
        ["/model/layers.0/fc/MatMul"] h0 = MatMul (x0, "model.layers.0.fc.weight")
        ["/model/layers.0/Add"] x1 = Add (x0, h0)
"""
HEAD_W = f'float[2, 2] "model.layers.0.fc.weight" = {EYE}'
ROUTED_W = ('float[2, 1] "model.layers.@.router.weight" = {1.0, 0.5}, '
            f'float[2, 2] "model.layers.@.expert.weight" = {EYE}')

def dims(x: str, t: str) -> str:
    """`x`'s batch `b`, length `t` and width `d`, read off its shape as the exporters do."""
    return f"""        shp = Shape ({x})
        i0 = Constant <value = int64 {{0}}> ()
        i1 = Constant <value = int64 {{1}}> ()
        i2 = Constant <value = int64 {{2}}> ()
        b = Gather <axis = 0> (shp, i0)
        {t} = Gather <axis = 0> (shp, i1)
        d = Gather <axis = 0> (shp, i2)
"""


# k = T // 2, computed once, cast, and reshaped to [1] for TopK; the un-reshaped k goes into
# the shape of the reshape after the flattened gather (TorchScript's index_select / index_add)
FLAT = """
        ["/model/layers.1/router/MatMul"] s2 = MatMul (x1, "model.layers.1.router.weight")
        ax2 = Constant <value = int64[1] {2}> ()
        score = Squeeze (s2, ax2)
""" + dims("x1", "t") + """        two = Constant <value = int64 {2}> ()
        half = Div (t, two)
        kc = Cast <to = 7> (half)
        one1 = Constant <value = int64[1] {1}> ()
        k = Reshape (kc, one1)
        ["/model/layers.1/TopK"] top, idx = TopK <axis = 1> (score, k)
        start = Constant <value = int64 {0}> ()
        step = Constant <value = int64 {1}> ()
        batch = Range (start, b, step)
        col = Unsqueeze (batch, one1)
        offset = Mul (col, t)
        at = Add (idx, offset)
        minus1 = Constant <value = int64[1] {-1}> ()
        ["/model/layers.1/Reshape"] fi = Reshape (at, minus1)
        zero1 = Constant <value = int64[1] {0}> ()
        bt = Mul (b, t)
        bt1 = Unsqueeze (bt, zero1)
        d1 = Unsqueeze (d, zero1)
        flatshape = Concat <axis = 0> (bt1, d1)
        ["/model/layers.1/Reshape_1"] flat = Reshape (x1, flatshape)
        ["/model/layers.1/Gather"] picked = Gather <axis = 0> (flat, fi)
        b1 = Unsqueeze (b, zero1)
        k1 = Unsqueeze (kc, zero1)
        back = Concat <axis = 0> (b1, k1, d1)
        ["/model/layers.1/Reshape_2"] sel = Reshape (picked, back)
        ["/model/layers.1/expert/MatMul"] out = MatMul (sel, "model.layers.1.expert.weight")
        minus1d = Constant <value = int64[2] {-1, 2}> ()
        ["/model/layers.1/Reshape_3"] outflat = Reshape (out, minus1d)
        fi2 = Unsqueeze (fi, one1)
        ["/model/layers.1/ScatterND"] upd = ScatterND <reduction = "add"> (flat, fi2, outflat)
        ["/model/layers.1/Reshape_4"] x2 = Reshape (upd, shp)
        ["/model/head/Identity"] y = Identity (x2)
"""


def flat_mixture_of_depths() -> onnx.ModelProto:
    return _model(HEAD + FLAT, [HEAD_W, ROUTED_W.replace("@", "1")], "float[B, T, 2] y")


# DynamicViT as dynamo writes it: every size at the top of the graph (N // 2, min(N, N // 2)
# and the next block's from that one), a full argsort sliced to its first N // 2 indices, the
# kept tokens gathered flat and reshaped with min(N, N // 2); the next block prunes again
SIZES = dims("x0", "n") + """        two = Constant <value = int64 {2}> ()
        half1 = Div (n, two)
        kept1 = Min (n, half1)
        half2 = Div (kept1, two)
        kept2 = Min (kept1, half2)
        zero1 = Constant <value = int64[1] {0}> ()
        one1 = Constant <value = int64[1] {1}> ()
        b1 = Unsqueeze (b, zero1)
        d1 = Unsqueeze (d, zero1)
"""
PRUNE = """
        ["/model/layers.@/router/MatMul"] s2_@ = MatMul (x@, "model.layers.@.router.weight")
        ax2_@ = Constant <value = int64[1] {2}> ()
        score@ = Squeeze (s2_@, ax2_@)
        sshape@ = Shape (score@)
        all@ = Gather <axis = 0> (sshape@, one1)
        ["/model/layers.@/TopK"] top@, order@ = TopK <axis = 1> (score@, all@)
        end@ = Reshape (HALF, one1)
        ["/model/layers.@/Slice"] idx@ = Slice (order@, zero1, end@, one1)
        xs@ = Shape (x@)
        rows@ = Gather <axis = 0> (xs@, i1)
        start@ = Constant <value = int64 {0}> ()
        step@ = Constant <value = int64 {1}> ()
        batch@ = Range (start@, b, step@)
        col@ = Unsqueeze (batch@, one1)
        offset@ = Mul (col@, rows@)
        at@ = Add (idx@, offset@)
        minus1_@ = Constant <value = int64[1] {-1}> ()
        fi@ = Reshape (at@, minus1_@)
        flat_@ = Constant <value = int64[2] {-1, 2}> ()
        ["/model/layers.@/Reshape"] flat@ = Reshape (x@, flat_@)
        ["/model/layers.@/Gather"] picked@ = Gather <axis = 0> (flat@, fi@)
        k1_@ = Unsqueeze (KEPT, zero1)
        back@ = Concat <axis = 0> (b1, k1_@, d1)
        ["/model/layers.@/Reshape_1"] sel@ = Reshape (picked@, back@)
        ["/model/layers.@/expert/MatMul"] x@+1 = MatMul (sel@, "model.layers.@.expert.weight")
"""


def pruned_twice() -> onnx.ModelProto:
    blocks = [PRUNE.replace("HALF", f"half{i}").replace("KEPT", f"kept{i}").replace("@+1", str(i + 1))
              .replace("@", str(i)) for i in (1, 2)]
    return _model(SIZES + HEAD + "".join(blocks) + '        ["/model/head/Identity"] y = Identity (x3)\n',
                  [HEAD_W] + [ROUTED_W.replace("@", str(i)) for i in (1, 2)], "float[B, M, 2] y")


def _model(body: str, weights: list[str], output: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[B, T, 2] x0) => ({output}) <{", ".join(weights)}> {{
{body}
    }}""")
    onnx.checker.check_model(model)
    return model


def _audit(model: onnx.ModelProto):
    return audit_static(load_model(model), shapes=SHAPES)


def test_the_graphs_run():
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype(np.float32)
    (y,) = ReferenceEvaluator(flat_mixture_of_depths()).run(None, {"x0": x})
    assert y.shape == (B, T, D)
    (y,) = ReferenceEvaluator(pruned_twice()).run(None, {"x0": x})
    assert y.shape == (B, T // 4, D)


def test_k_cast_and_reshaped_for_the_selection_and_given_whole_to_the_reshape_after_it():
    report = _audit(flat_mixture_of_depths())
    block = report.blocks[1]
    assert block.verdict == "subset" and block.evidence[0].size == "fixed (capacity)"
    assert (block.flops, block.flops_full_size) == (rows(T) // 2 + rows(T // 2), rows(T) // 2 + rows(T))
    c = report.flops.capacity
    assert (c.blocks, c.unsized, c.saving) == (("model.layers.1",), (), rows(T // 2))
    assert report.flops.skippable == 0 and report.flops.total == DENSE + rows(T) // 2 + rows(T // 2)
    assert "saved on every input" in render_text(report) and "not found" not in render_text(report)


def test_sizes_computed_at_the_top_follow_each_chained_selection_to_every_row():
    report = _audit(pruned_twice())
    one, two = report.blocks[1], report.blocks[2]
    assert (one.flops, two.flops) == (rows(T) // 2 + rows(T // 2), rows(T // 2) // 2 + rows(T // 4))
    # with every row kept by both, the second block runs on all T tokens too
    assert one.flops_full_size == two.flops_full_size == rows(T) // 2 + rows(T)
    c = report.flops.capacity
    assert (c.blocks, c.unsized) == (("model.layers.1", "model.layers.2"), ())
    assert c.full_size == 2 * (rows(T) // 2 + rows(T)) and c.saving == c.full_size - one.flops - two.flops
