"""A Switch Transformer / GShard mixture of experts with a capacity factor, its dispatch written
as DeepSpeed writes it, on tiny graphs in ONNX text syntax: a one-hot mask of each token's slot
in its expert's buffer (ArgMax → OneHot → cumsum − 1 < C, == range(C)) contracted with the
tokens by an Einsum, so that each expert runs on a buffer of C = ⌊1.25·N/E⌋ slots (`subset`, a
capacity), and an Einsum with the router's score that gives the rows back to their tokens.
And the densified per-token skip, where(skip, h, block(h)), whose evidence names block(h)."""

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from test_static import model_of, audit, verdicts, graph, EYE, DENSE, DENSE_W

E, D = 2, 2
# logits = router(x); p = softmax(logits); top = argmax(p); gate = max(p); C = ⌊1.25·N/E⌋;
# oh = one_hot(top); loc = cumsum(oh, 0)·oh − 1; keep = (loc < C) & (oh > 0);
# slot = Σₑ loc·keep; disp[n, e, c] = keep[n, e]·(slot[n] == c)
ROUTING = """
        ["/model/layers.@/mlp/router/MatMul"] logits = MatMul (x@, "model.layers.@.mlp.router.weight")
        ["/model/layers.@/mlp/Softmax"] p = Softmax <axis = -1> (logits)
        ["/model/layers.@/mlp/ArgMax"] top = ArgMax <axis = -1, keepdims = 0> (p)
        ["/model/layers.@/mlp/ReduceMax"] gate = ReduceMax <keepdims = 0> (p, last)
        ["/model/layers.@/mlp/Shape"] shape = Shape (x@)
        ["/model/layers.@/mlp/Gather"] n = Gather <axis = 0> (shape, zero)
        ["/model/layers.@/mlp/Cast"] nf = Cast <to = 1> (n)
        ["/model/layers.@/mlp/Mul"] cf = Mul (nf, factor)
        ["/model/layers.@/mlp/Floor"] cfl = Floor (cf)
        ["/model/layers.@/mlp/Cast_1"] c = Cast <to = 7> (cfl)
        ["/model/layers.@/mlp/OneHot"] oh = OneHot <axis = -1> (top, depth, onoff)
        ["/model/layers.@/mlp/CumSum"] cs = CumSum (oh, zero)
        ["/model/layers.@/mlp/Mul_1"] csm = Mul (cs, oh)
        ["/model/layers.@/mlp/Sub"] loc = Sub (csm, onef)
        ["/model/layers.@/mlp/Less"] under = Less (loc, cfl)
        ["/model/layers.@/mlp/Greater"] chosen = Greater (oh, zerof)
        ["/model/layers.@/mlp/And"] keep = And (under, chosen)
        ["/model/layers.@/mlp/Cast_2"] keepf = Cast <to = 1> (keep)
        ["/model/layers.@/mlp/Mul_2"] lockeep = Mul (loc, keepf)
        ["/model/layers.@/mlp/ReduceSum"] slot = ReduceSum <keepdims = 0> (lockeep, last)
        ["/model/layers.@/mlp/Unsqueeze"] slot3 = Unsqueeze (slot, axes12)
        ["/model/layers.@/mlp/Range"] r = Range (zero, c, onei)
        ["/model/layers.@/mlp/Cast_3"] rf = Cast <to = 1> (r)
        ["/model/layers.@/mlp/Unsqueeze_1"] r3 = Unsqueeze (rf, axes01)
        ["/model/layers.@/mlp/Equal"] at = Equal (slot3, r3)
        ["/model/layers.@/mlp/Cast_4"] atf = Cast <to = 1> (at)
        ["/model/layers.@/mlp/Unsqueeze_2"] keep3 = Unsqueeze (keepf, axes2)
        ["/model/layers.@/mlp/Mul_3"] disp = Mul (keep3, atf)
        ["/model/layers.@/mlp/Unsqueeze_3"] gate3 = Unsqueeze (gate, axes12)
        ["/model/layers.@/mlp/Mul_4"] comb = Mul (disp, gate3)
"""
EXPERTS = """
        ["/model/layers.@/mlp/Einsum"] buf = Einsum <equation = "DISPATCH"> (MASK, x@)
        ["/model/layers.@/mlp/experts/MatMul"] h = MatMul (buf, "model.layers.@.mlp.experts.weight")
        ["/model/layers.@/mlp/experts/Relu"] hr = Relu (h)
        ["/model/layers.@/mlp/Einsum_1"] out = Einsum <equation = "nec,ecd->nd"> (comb, hr)
        ["/model/layers.@/Add"] x@+1 = Add (x@, out)
"""
CONSTANTS = ('int64 "zero" = {0}, int64 "onei" = {1}, int64[1] "last" = {-1}, float "factor" = {0.625}, '
             'int64 "depth" = {2}, float[2] "onoff" = {0.0, 1.0}, float "onef" = {1.0}, float "zerof" = {0.0}, '
             'int64[2] "axes12" = {1, 2}, int64[2] "axes01" = {0, 1}, int64[1] "axes2" = {2}')
ROUTER_W = 'float[2, 2] "model.layers.@.mlp.router.weight" = {1.0, -1.0, -0.5, 1.0}'
EXPERTS_W = 'float[2, 2, 2] "model.layers.@.mlp.experts.weight" = {1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0}'


def switch(dispatch: str = "nec,nd->ecd", mask: str = "disp") -> str:
    operands = "(x@, MASK)" if dispatch.startswith("nd,") else "(MASK, x@)"
    moe = ROUTING + EXPERTS.replace("(MASK, x@)", operands).replace("DISPATCH", dispatch).replace("MASK", mask)
    return graph([DENSE, moe, DENSE], [DENSE_W, f"{ROUTER_W}, {EXPERTS_W}, {CONSTANTS}", DENSE_W], opsets='"" : 18')


def reference(x: np.ndarray) -> np.ndarray:
    """The Switch layer of `switch()` between its two dense blocks, in numpy."""
    x1 = x + x
    logits = x1 @ np.array([[1.0, -1.0], [-0.5, 1.0]])
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    n, capacity = len(x), int(np.floor(len(x) * 1.25 / E))
    buffers = np.zeros((E, capacity, D))
    out = np.zeros_like(x1)
    filled = [0] * E
    for t in range(n):  # each token to its expert's next slot, dropped when the buffer is full
        e = int(p[t].argmax())
        if filled[e] < capacity:
            buffers[e, filled[e]] = x1[t]
            out[t] = p[t, e] * np.maximum(0.0, (e + 1) * x1[t])  # expert e: (e+1)·I, then ReLU
            filled[e] += 1
    x2 = x1 + out
    return x2 + x2


def test_the_switch_graph_is_a_capacity_factor_moe():
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0], [2.0, 2.0], [-1.0, -3.0]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model_of(switch())).run(None, {"x0": x})
    np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-6)


def test_a_one_hot_einsum_dispatch_into_a_fixed_capacity_is_subset():
    report = audit(switch(), shapes={"x0": [8, 2]})
    assert verdicts(report) == ["always", "subset", "always"] and not report.conditional_execution
    ev = report.blocks[1].evidence[0]
    assert (ev.kind, ev.op, ev.node, ev.tensor, ev.size) == (
        "selection", "Einsum", "/model/layers.1/mlp/Einsum", "disp", "fixed (capacity)")
    assert "rows of `x1` per expert into its slots (a one-hot dispatch)" in ev.detail
    assert "ArgMax `/model/layers.1/mlp/ArgMax`" in ev.detail
    assert "feeding MatMul `/model/layers.1/mlp/experts/MatMul`" in ev.detail
    # the combine gives the rows back to their tokens: no mask over compute at full size, and
    # what follows runs on every token again
    assert not [e for e in report.blocks[1].evidence if e.node == "/model/layers.1/mlp/Einsum_1"]
    assert report.blocks[2].evidence == () and report.outside_blocks == ()
    # a capacity: it runs at its size on every input, nothing to skip
    assert report.flops.capacity is not None and report.flops.skippable == 0
    assert "model.layers.1" in report.flops.capacity.blocks + report.flops.capacity.unsized


def test_the_dispatch_operands_either_way_round_are_subset():
    report = audit(switch("nd,nec->ecd"))
    assert verdicts(report) == ["always", "subset", "always"]
    assert report.blocks[1].evidence[0].node == "/model/layers.1/mlp/Einsum"


@pytest.mark.parametrize("dispatch", ["nec,nd->ecd", "nd,nec->ecd"])
def test_an_einsum_by_a_weighted_routing_mask_selects_nothing(dispatch):
    # a mask weighted by the router's score holds more than 0s and 1s: no one-hot dispatch
    report = audit(switch(dispatch, "comb"))
    assert report.blocks[1].verdict == "masked"
    assert "selection" not in [ev.kind for ev in report.blocks[1].evidence]


def test_an_einsum_that_sums_each_experts_tokens_is_no_dispatch():
    # the one-hot mask without its slot axis: each expert's row is the sum of its tokens, no
    # rows picked into slots
    text = switch("nec,nd->ecd").replace('["/model/layers.1/mlp/Einsum"]',
                                         '["/model/layers.1/mlp/ReduceSum_1"] disp2 = ReduceSum <keepdims = 0> '
                                         '(disp, last)\n        ["/model/layers.1/mlp/Einsum"]').replace(
        'Einsum <equation = "nec,nd->ecd"> (disp, x1)', 'Einsum <equation = "ne,nd->ed"> (disp2, x1)').replace(
        'Einsum <equation = "nec,ecd->nd"> (comb, hr)', 'Einsum <equation = "nec,ed->nd"> (comb, hr)').replace(
        'MatMul (buf, "model.layers.1.mlp.experts.weight")', 'MatMul (buf, "model.layers.1.fc2.weight")').replace(
        '"model.layers.1.mlp.experts.weight" = {1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0}',
        '"model.layers.1.fc2.weight" = {1.0, 0.0, 0.0, 1.0}').replace('float[2, 2, 2] "model.layers.1.fc2', 'float[2, 2] "model.layers.1.fc2')
    model_of(text)
    assert audit(text).blocks[1].verdict == "masked"


def test_a_densified_layer_skip_names_the_blocks_own_result():
    # h = where(skip, h, block(h)) after each block, the router between the blocks: every block
    # runs on every token; the evidence names what the block made, not the state it may keep
    step = """
        ["/model/layers.@/fc/MatMul"] f@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/Add"] h@ = Add (x@, f@)
        ["/routers.@/MatMul"] e@ = MatMul (x@, "routers.@.weight")
        ["/Softmax_@"] p@ = Softmax <axis = -1> (e@)
        ["/ArgMax_@"] a@ = ArgMax <axis = -1, keepdims = 1> (p@)
        ["/Equal_@"] skip@ = Equal (a@, zero@)
        ["/Where_@"] x@+1 = Where (skip@, x@, h@)
"""
    weights = DENSE_W + f', float[2, 2] "routers.@.weight" = {EYE}, int64 "zero@" = {{0}}'
    text = graph([step] * 3, [weights] * 3, opsets='"" : 18')
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": x})
    h = x
    for _ in range(3):
        h = np.where((h.argmax(1) == 0)[:, None], h, h + h)
    np.testing.assert_allclose(y, h)
    report = audit(text)
    assert verdicts(report) == ["masked", "masked", "masked"]
    for i, block in enumerate(report.blocks):
        ev = block.evidence[0]
        assert (ev.kind, ev.node) == ("routing mask", f"/Where_{i}")
        assert f"weights `h{i}`, computed at full size" in ev.detail, ev.detail
