"""Mixtures of experts written as Hugging Face code writes them, on tiny graphs in ONNX text
syntax: every expert computed and weighted by a dense routing matrix that a scatter of the
router's picked scores builds (`masked`), and the dispatch that runs each expert on its own
tokens (`subset`), whose evidence names the first compute the picked rows reach."""

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from support.text_graphs import DENSE, DENSE_W, EYE, audit, graph, model_of, verdicts

# scores = σ(router(x)); idx = topk(scores + bias, 2); w = scores.gather(1, idx); w /= w.sum(1);
# comb = zeros_like(scores).scatter(1, idx, w); out = Σₑ comb[:, e:e+1] · expertₑ(x)
ROUTER = """
        ["/model/layers.@/mlp/router/MatMul"] logits = MatMul (x@, "model.layers.@.mlp.router.weight")
        ["/model/layers.@/mlp/Sigmoid"] scores = Sigmoid (logits)
        ["/model/layers.@/mlp/Add"] biased = Add (scores, "model.layers.@.mlp.e_bias")
        k = Constant <value = int64[1] {2}> ()
        ["/model/layers.@/mlp/TopK"] top, idx = TopK <axis = -1> (biased, k)
        ["/model/layers.@/mlp/GatherElements"] w = GatherElements <axis = 1> (scores, idx)
        last = Constant <value = int64[1] {-1}> ()
        ["/model/layers.@/mlp/ReduceSum"] total = ReduceSum <keepdims = 1> (w, last)
        ["/model/layers.@/mlp/Div"] wn = Div (w, total)
"""
DENSE_COMBINE = ROUTER + """
        shape = Shape (scores)
        ["/model/layers.@/mlp/ConstantOfShape"] zeros = ConstantOfShape (shape)
        ["/model/layers.@/mlp/ScatterElements"] comb = ScatterElements <axis = 1> (zeros, idx, wn)
        one = Constant <value = int64[1] {1}> ()
        EXPERTS
        ["/model/layers.@/mlp/Add_1"] mix01 = Add (m0, m1)
        ["/model/layers.@/mlp/Add_2"] mix = Add (mix01, m2)
        ["/model/layers.@/Add"] x@+1 = Add (x@, mix)
"""
EXPERT = """
        s# = Constant <value = int64[1] {#}> ()
        e# = Constant <value = int64[1] {#+1}> ()
        ["/model/layers.@/mlp/Slice_#"] c# = Slice (comb, s#, e#, one)
        ["/model/layers.@/mlp/experts.#/MatMul"] y# = MatMul (x@, "model.layers.@.mlp.experts.#.weight")
        ["/model/layers.@/mlp/experts.#/Mul"] m# = Mul (c#, y#)"""
EXPERTS_W = ", ".join(f'float[2, 2] "model.layers.@.mlp.experts.{e}.weight" = {{{e + 1.0}, 0.0, 0.0, {e + 1.0}}}'
                      for e in range(3))
ROUTER_W = ('float[2, 3] "model.layers.@.mlp.router.weight" = {1.0, -1.0, 0.5, -0.5, 1.0, 0.25}, '
            'float[3] "model.layers.@.mlp.e_bias" = {0.0, 0.1, -0.1}')


def densified() -> str:
    experts = "".join(EXPERT.replace("#+1", str(e + 1)).replace("#", str(e)) for e in range(3))
    return graph([DENSE, DENSE_COMBINE.replace("EXPERTS", experts), DENSE],
                 [DENSE_W, f"{ROUTER_W}, {EXPERTS_W}", DENSE_W], opsets='"" : 18')


def test_densified_moe_weighted_by_a_scatter_of_the_picked_scores_is_masked():
    # every expert runs on every token; the routing decides only the weights, which the router's
    # own scores at its top-k choice (GatherElements, not TopK's values) give through a scatter
    text = densified()
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": x})
    x1 = x + x  # DENSE: x + x·I
    scores = 1 / (1 + np.exp(-(x1 @ np.array([[1.0, -1.0, 0.5], [-0.5, 1.0, 0.25]]))))
    idx = np.argsort(-(scores + [0.0, 0.1, -0.1]), axis=1)[:, :2]
    comb = np.zeros_like(scores)
    np.put_along_axis(comb, idx, np.take_along_axis(scores, idx, 1), 1)
    comb /= comb.sum(1, keepdims=True)
    x2 = x1 + sum(comb[:, e:e + 1] * (e + 1) * x1 for e in range(3))
    np.testing.assert_allclose(y, x2 + x2, rtol=1e-5)
    report = audit(text)
    assert verdicts(report) == ["always", "masked", "always"]
    assert not report.dynamic and report.outside_blocks == ()
    masks = [ev for ev in report.blocks[1].evidence if ev.kind == "routing mask"]
    assert [(ev.op, ev.node, ev.tensor) for ev in masks] == [
        ("Mul", f"/model/layers.1/mlp/experts.{e}/Mul", f"c{e}") for e in range(3)]
    assert "TopK `/model/layers.1/mlp/TopK`" in masks[0].detail and "`y0`, computed at full size" in masks[0].detail
    # the router's scores are its coefficient, named in the evidence of the masks they make
    assert ("scores", "router", 1) in [(c.tensor, c.family, c.layer) for c in report.coefficients]
    assert "router coefficient `scores`" in masks[0].detail
    assert report.blocks[2].evidence == ()


# HF's dispatch: the tokens routed to expert 0 are where idx == 0 (NonZero), their rows gathered
# and run through a gated MLP whose MatMuls are written gate, up, then down (in the file and
# in the order they run; down sorts first by name), weighted by w[tok, slot] and added into zeros
DISPATCH = ROUTER + """
        zero = Constant <value = int64 {0}> ()
        one = Constant <value = int64 {1}> ()
        ["/model/layers.@/mlp/Equal"] is0 = Equal (idx, zero)
        ["/model/layers.@/mlp/NonZero"] nz = NonZero (is0)
        ["/model/layers.@/mlp/Gather"] tok = Gather <axis = 0> (nz, zero)
        ["/model/layers.@/mlp/Gather_1"] slot = Gather <axis = 0> (nz, one)
        ["/model/layers.@/mlp/Gather_2"] rows = Gather <axis = 0> (x@, tok)
        ["/model/layers.@/mlp/experts.0/gate/MatMul"] g = MatMul (rows, "model.layers.@.mlp.experts.0.gate")
        ["/model/layers.@/mlp/experts.0/up/MatMul"] u = MatMul (rows, "model.layers.@.mlp.experts.0.up")
        ["/model/layers.@/mlp/experts.0/Sigmoid"] sg = Sigmoid (g)
        ["/model/layers.@/mlp/experts.0/Mul"] act = Mul (g, sg)
        ["/model/layers.@/mlp/experts.0/Mul_1"] h = Mul (act, u)
        ["/model/layers.@/mlp/experts.0/down/MatMul"] d = MatMul (h, "model.layers.@.mlp.experts.0.down")
        tok1 = Unsqueeze (tok, last)
        slot1 = Unsqueeze (slot, last)
        pair = Concat <axis = -1> (tok1, slot1)
        ["/model/layers.@/mlp/GatherND"] wt = GatherND (wn, pair)
        wt1 = Unsqueeze (wt, last)
        ["/model/layers.@/mlp/Mul"] yw = Mul (WEIGHTED)
        xs = Shape (x@)
        zx = ConstantOfShape (xs)
        ["/model/layers.@/mlp/ScatterND"] routed = ScatterND <reduction = "add"> (zx, tok1, yw)
        ["/model/layers.@/Add"] x@+1 = Add (x@, routed)
"""
DISPATCH_W = (f'{ROUTER_W}, float[2, 2] "model.layers.@.mlp.experts.0.gate" = {EYE}, '
              f'float[2, 2] "model.layers.@.mlp.experts.0.up" = {EYE}, float[2, 2] "model.layers.@.mlp.experts.0.down" = {EYE}')


@pytest.mark.parametrize("weighted", ["d, wt1", "wt1, d"])
def test_dispatch_evidence_names_the_first_compute_the_picked_rows_reach(weighted):
    text = graph([DENSE, DISPATCH.replace("WEIGHTED", weighted), DENSE], [DENSE_W, DISPATCH_W, DENSE_W],
                 opsets='"" : 18')
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": x})
    assert y.shape == (4, 2)
    report = audit(text)
    assert verdicts(report) == ["always", "subset", "always"]
    ev = report.blocks[1].evidence[0]
    assert (ev.kind, ev.node, ev.size) == ("selection", "/model/layers.1/mlp/Gather_2", "data-dependent")
    assert "feeding MatMul `/model/layers.1/mlp/experts.0/gate/MatMul`" in ev.detail
    # the experts' results added into zeros at their tokens are the stream again, not a routing
    # matrix, whichever operand of the weighting comes first: a next block that multiplies the
    # stream by its own result is not masked by it
    text = graph([DENSE, DISPATCH.replace("WEIGHTED", weighted), BILINEAR], [DENSE_W, DISPATCH_W, DENSE_W],
                 opsets='"" : 18')
    assert verdicts(audit(text)) == ["always", "subset", "always"]


BILINEAR = """
        ["/model/layers.@/fc/MatMul"] h@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/Mul"] m@ = Mul (x@, h@)
        ["/model/layers.@/Add"] x@+1 = Add (x@, m@)
"""


def test_a_dispatch_weighted_by_topk_values_leaves_the_stream_unmasked():
    # torch's `weight, chosen = probs.topk(k)` (the zoo's MoE, Mixtral): the routing weights are
    # TopK's own values, a routing decision. Each expert's result on its tokens, weighted by them
    # and added back, is the stream again, not a routing mask: a next block's products of the
    # stream with its own results (a bilinear layer here; attention's causal Where, whose mask
    # the block reads off the stream's shape, in a TorchScript export at opset 14, where no
    # LayerNormalization op stood between) are not masked by it
    values = DISPATCH.replace("WEIGHTED", "d, wt1")
    text = graph([DENSE, ROUTER.replace('["/model/layers.@/mlp/GatherElements"] w = GatherElements <axis = 1> (scores, idx)',
                                        '["/model/layers.@/mlp/Identity"] w = Identity (top)')
                  + values[len(ROUTER):], BILINEAR], [DENSE_W, DISPATCH_W, DENSE_W], opsets='"" : 18')
    assert "GatherElements" not in text and "w = Identity (top)" in text
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": x})
    assert y.shape == (4, 2)
    assert verdicts(audit(text)) == ["always", "subset", "always"]
