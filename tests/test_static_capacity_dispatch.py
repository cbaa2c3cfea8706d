"""A Switch Transformer / GShard mixture of experts with a capacity factor, its dispatch written
as DeepSpeed writes it, on tiny graphs in ONNX text syntax: a one-hot mask of each token's slot
in its expert's buffer (ArgMax → OneHot → cumsum − 1 < C, == range(C)) contracted with the
tokens by an Einsum, so that each expert runs on a buffer of C = ⌊1.25·N/E⌋ slots (`subset`, a
capacity), and an Einsum with the router's score that gives the rows back to their tokens.
And the densified per-token skip, where(skip, h, block(h)), whose evidence names block(h).
The Switch graph and its numpy reference are in tests/support/switch_moe.py."""

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from support.switch_moe import reference, switch
from support.text_graphs import DENSE_W, EYE, audit, graph, model_of, verdicts


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
