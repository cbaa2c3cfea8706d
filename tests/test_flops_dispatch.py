"""The full size of a capacity-factor MoE's one-hot dispatch: every token to every expert.

A Switch / GShard layer gives each expert C = ⌊cf·N/E⌋ slots, numbered by a Range(0, C) that
the dispatch mask compares each token's place with (`Equal(slot, Range(C))`); the Einsum by
that mask fills each expert's buffer of C rows. With every row selected each expert could
take every token, C = N: the widest variant gives that Range the length of the token axis
the dispatch contracts, and the experts' compute is counted there. Where the mask's slots do
not come from a Range counted from 0, its full size is not found. The Switch graphs of
tests/support/switch_moe.py, in ONNX text syntax.
"""

import numpy as np
from onnx.reference import ReferenceEvaluator

from graphaudit.report.static_text import render_text

from support.switch_moe import reference, switch
from support.text_graphs import audit, model_of, verdicts

N, E, D = 8, 2, 2
C = 5  # ⌊1.25·8/2⌋
SHAPES = {"x0": [N, D]}
ROUTER = 2 * N * D * E  # [N, D] x [D, E]


def moe(slots: int) -> int:
    """The Switch block's FLOPs with `slots` per expert: router, dispatch, experts, combine."""
    return ROUTER + 2 * N * E * slots * D + 2 * E * slots * D * D + 2 * N * E * slots * D


def capacity_of(text: str):
    report = audit(text, shapes=SHAPES)
    assert verdicts(report) == ["always", "subset", "always"]
    return report


def test_the_slot_range_of_a_computed_capacity_gets_every_token():
    report = capacity_of(switch())
    capacity = report.flops.capacity
    assert capacity.blocks == ("model.layers.1",) and capacity.unsized == ()
    assert (capacity.flops, capacity.full_size) == (moe(C), moe(N)) == (784, 1216)
    assert capacity.saving == 432
    # what every input runs is counted at the selected size, as before
    assert report.flops.total == 2 * (2 * N * D * D) + moe(C) and report.flops.skippable == 0
    assert "saved on every input" in render_text(report) and "not found" not in render_text(report)


def test_a_constant_capacity_gets_every_token_too():
    text = switch().replace('["/model/layers.1/mlp/Range"] r = Range (zero, c, onei)',
                            '["/model/layers.1/mlp/Range"] r = Range (zero, five, onei)')
    text = text.replace('int64 "zero" = {0},', 'int64 "zero" = {0}, int64 "five" = {5},', 1)
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0], [2.0, 2.0], [-1.0, -3.0], [1.0, 1.0],
                  [0.0, 2.0]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": x})
    np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-6)  # C = 5 at N = 8
    capacity = capacity_of(text).flops.capacity
    assert (capacity.blocks, capacity.flops, capacity.full_size) == (("model.layers.1",), moe(C), moe(N))


def test_a_capacity_computed_at_the_top_before_the_tokens_it_numbers():
    # dynamo computes every symbolic size first: C from the graph input's shape, and the Range
    # of slots, before the block whose tokens the dispatch contracts
    top = """
        ["/shape_top"] shape_t = Shape (x0)
        ["/gather_top"] n_t = Gather <axis = 0> (shape_t, zero_t)
        ["/cast_top"] nf_t = Cast <to = 1> (n_t)
        ["/mul_top"] cf_t = Mul (nf_t, factor_t)
        ["/floor_top"] cfl_t = Floor (cf_t)
        ["/cast1_top"] c_t = Cast <to = 7> (cfl_t)
        ["/range_top"] r_t = Range (zero_t, c_t, one_t)
"""
    text = switch().replace('["/model/layers.1/mlp/Range"] r = Range (zero, c, onei)',
                            '["/model/layers.1/mlp/Identity_r"] r = Identity (r_t)')
    text = text.replace('["/model/layers.0/fc/MatMul"]', top.strip() + '\n        ["/model/layers.0/fc/MatMul"]', 1)
    text = text.replace('float[2, 2] "model.layers.0.fc.weight"',
                        'int64 "zero_t" = {0}, int64 "one_t" = {1}, float "factor_t" = {0.625}, '
                        'float[2, 2] "model.layers.0.fc.weight"', 1)
    model_of(text)
    capacity = capacity_of(text).flops.capacity
    assert (capacity.blocks, capacity.flops, capacity.full_size) == (("model.layers.1",), moe(C), moe(N))


def test_slots_numbered_from_one_are_not_shown_to_be_the_capacity():
    # Range(1, C + 1) - 1 numbers the same slots, but its limit is not its length and the
    # numbering passes through a subtraction: the full size is not found, as before
    text = switch().replace(
        '["/model/layers.1/mlp/Range"] r = Range (zero, c, onei)\n'
        '        ["/model/layers.1/mlp/Cast_3"] rf = Cast <to = 1> (r)',
        '["/model/layers.1/mlp/Add_r"] c1 = Add (c, onei)\n'
        '        ["/model/layers.1/mlp/Range"] r = Range (onei, c1, onei)\n'
        '        ["/model/layers.1/mlp/Cast_3"] rf1 = Cast <to = 1> (r)\n'
        '        ["/model/layers.1/mlp/Sub_r"] rf = Sub (rf1, onef)')
    assert "rf1" in text
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0], [2.0, 2.0], [-1.0, -3.0]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": x})
    np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-6)
    report = capacity_of(text)
    assert report.flops.capacity.blocks == () and report.flops.capacity.unsized == ("model.layers.1",)
    assert "was not found" in render_text(report)

