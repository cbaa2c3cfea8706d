"""The layer of a detected coefficient computed outside the block it serves: a per-token skip
router run in the model's forward before each block, in a TorchScript export (top-level nodes
in no block) and in a dynamo export without name scopes (its nodes put in a block by their
neighbours); and A-ViT's halting scores, summed on from block to block."""

import pytest

from support.text_graphs import EYE, audit, graph

# One float scalar, one int64 index, the bounds of a slice and the axis of an unsqueeze.
CONSTANTS = ('float half = {0.5}, int64 zero = {0}, int64[1] one1 = {1}, int64[1] two1 = {2}, '
             'int64[1] last = {-1}')
BATCHED = dict(inputs="float[batch, seq, 2] x0")


def _text(blocks: list[str], weights: list[str]) -> str:
    text = graph(blocks, weights, **BATCHED).replace("float[T, 2] y", "float[batch, seq, 2] y")
    return text.replace("> {", f", {CONSTANTS}> {{", 1)


# TorchScript: the router's module is named, the ops of the model's forward are not (no block).
SKIP_TS = """
        ["/routers.@/MatMul"] rl@ = MatMul (x@, "routers.@.weight")
        ["/Softmax_@"] p@ = Softmax (rl@)
        ["/ArgMax_@"] c@ = ArgMax <axis = -1, keepdims = 1> (p@)
        ["/Equal_@"] skip@ = Equal (c@, zero)
        ["/model/layers.@/fc/MatMul"] h@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/Add"] b@ = Add (x@, h@)
        ["/Where_@"] x@+1 = Where (skip@, x@, b@)
"""
TS_W = f'float[2, 2] "routers.@.weight" = {EYE}, float[2, 2] "model.layers.@.fc.weight" = {EYE}'


def test_a_skip_router_belongs_to_the_block_whose_result_its_where_takes():
    # h = where(argmax(softmax(router_i(h))) == 0, h, block_i(h)): the choice keeps block i's
    # input or takes its result, so it serves block i, not block i + 1 that reads the Where
    report = audit(_text([SKIP_TS] * 3, [TS_W] * 3))
    assert [(c.tensor, c.family, c.layer) for c in report.coefficients] == [
        ("p0", "router", 0), ("p1", "router", 1), ("p2", "router", 2)]


# dynamo without name scopes: the blocks are found from the weights each node alone reads, the
# rest by neighbours, so router i (its own weights `routers.i`) reads what block i − 1 wrote.
DYNAMO = """
        node_router_@ = MatMul (x@, "routers.@.weight")
        node_softmax_@ = Softmax (node_router_@)
        CHOICE
        node_fc1_@ = MatMul (x@, "blocks.@.fc1.weight")
        node_fc2_@ = MatMul (node_fc1_@, "blocks.@.fc2.weight")
        node_add_@ = Add (x@, node_fc2_@)
        APPLY
"""
WHERE = ("node_argmax_@ = ArgMax <axis = -1, keepdims = 1> (node_softmax_@)\n        node_eq_@ = Equal (node_argmax_@, zero)",
         "x@+1 = Where (node_eq_@, x@, node_add_@)")
MIX = ("node_slice_@ = Slice (node_softmax_@, one1, two1, last)\n        node_gt_@ = Greater (node_slice_@, half)\n"
       "        node_cast_@ = Cast <to = 1> (node_gt_@)",
       "node_sub_@ = Sub (node_add_@, x@)\n        node_mul_@ = Mul (node_cast_@, node_sub_@)\n"
       "        x@+1 = Add (x@, node_mul_@)")
DY_W = f'float[2, 2] "routers.@.weight" = {EYE}, float[2, 2] "blocks.@.fc1.weight" = {EYE}, ' \
       f'float[2, 2] "blocks.@.fc2.weight" = {EYE}'


@pytest.mark.parametrize("choice, apply", [WHERE, MIX], ids=["where", "mix"])
def test_a_router_put_in_the_block_before_by_its_neighbours_serves_the_block_it_decides(choice, apply):
    block = DYNAMO.replace("CHOICE", choice).replace("APPLY", apply)
    report = audit(_text([block] * 3, [DY_W] * 3))
    assert report.block_method == "neighbouring nodes: 3 blocks under `blocks` (6 nodes by initializer names)"
    assert [(c.tensor, c.layer) for c in report.coefficients] == [
        ("node_softmax_0", 0), ("node_softmax_1", 1), ("node_softmax_2", 2)]


# A-ViT: the halting score of each block's output (its first channel), summed on over the
# blocks; the tokens whose sum reaches 1 are masked from then on. Block 0 starts from sum 0 and
# mask 1, made from its input's shape.
AVIT_START = """
        ["/Gather"] g = Gather <axis = 2> (x0, zero)
        ["/Mul"] cum0 = Mul (g, zerof)
        ["/Add"] ones = Add (cum0, onef)
        ["/Unsqueeze"] mu0 = Unsqueeze (ones, last)
"""
AVIT = """
        ["/model/layers.@/fc/MatMul"] h@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/Add"] b@ = Add (x@, h@)
        ["/MulOut_@"] o@ = Mul (b@, mu@)
        ["/Gather_@"] c@ = Gather <axis = 2> (o@, zero)
        ["/Sigmoid_@"] s@ = Sigmoid (c@)
        ["/AddCum_@"] cum@+1 = Add (cum@, s@)
        ["/Less_@"] l@ = Less (cum@+1, onef)
        ["/Cast_@"] mk@ = Cast <to = 1> (l@)
        ["/Unsqueeze_@"] mu@+1 = Unsqueeze (mk@, last)
        ["/MulIn_@"] x@+1 = Mul (o@, mu@+1)
"""


def test_a_halting_score_summed_over_the_blocks_belongs_to_the_block_it_scores():
    # the score of block 0's output reaches every later mask through the running sum; the
    # nearest it makes weights block 0's output, as the input of block 1
    text = _text([AVIT] * 3, [f'float[2, 2] "model.layers.@.fc.weight" = {EYE}'] * 3).replace(
        "> {", ", float zerof = {0.0}, float onef = {1.0}> {" + AVIT_START, 1)
    report = audit(text)
    assert [(c.tensor, c.family, c.layer) for c in report.coefficients] == [
        ("s0", "gate", 0), ("s1", "gate", 1), ("s2", "gate", 2)]
