"""FLOP formulas per operator, and counting a whole graph at concrete input shapes."""

import onnx
import onnx.parser
import pytest
from onnx import helper

from graphaudit.analyses.flops import count_flops, is_counted, node_flops
from graphaudit.errors import UsageError
from graphaudit.graph import build_graph
from graphaudit.load import load_model


def node(op, n_inputs=2, domain="", **attrs):
    return helper.make_node(op, [f"i{k}" for k in range(n_inputs)], ["o"], domain=domain, **attrs)


@pytest.mark.parametrize("proto, ins, outs, expected", [
    (node("MatMul"), [(2, 3, 4), (4, 5)], [(2, 3, 5)], 2 * 2 * 3 * 4 * 5),
    (node("MatMul"), [(4,), (4, 5)], [(5,)], 2 * 4 * 5),
    (node("Gemm", 3), [(3, 4), (4, 5), (5,)], [(3, 5)], 2 * 3 * 4 * 5),
    (node("Gemm", 2, transA=1), [(4, 3), (4, 5)], [(3, 5)], 2 * 3 * 4 * 5),
    (node("Conv", 2), [(1, 3, 8, 8), (16, 3, 3, 3)], [(1, 16, 6, 6)], 2 * 16 * 36 * 27),
    (node("Conv", 2, group=3), [(1, 3, 8, 8), (3, 1, 3, 3)], [(1, 3, 6, 6)], 2 * 3 * 36 * 9),
    (node("ConvTranspose", 2), [(1, 4, 5, 5), (4, 2, 3, 3)], [(1, 2, 7, 7)], 2 * 100 * 18),
    (node("Einsum", equation="bij,bjk->bik"), [(2, 3, 4), (2, 4, 5)], [(2, 3, 5)], 2 * 2 * 3 * 4 * 5),
    (node("Einsum", equation="cbtl,lbtd->cbtd"), [(4, 2, 8, 3), (3, 2, 8, 16)], [(4, 2, 8, 16)],
     2 * 4 * 2 * 8 * 3 * 16),
    (node("Einsum", equation="...ij,...jk->...ik"), [(2, 3, 4), (2, 4, 5)], [(2, 3, 5)], 2 * 2 * 3 * 4 * 5),
    (node("Einsum", 1, equation="ii->"), [(5, 5)], [()], 5),
    (node("Attention", 3), [(2, 4, 8, 16), (2, 4, 10, 16), (2, 4, 10, 16)], [(2, 4, 8, 16)],
     2 * 2 * 4 * 8 * 10 * 16 * 2),
    (node("MultiHeadAttention", 3, domain="com.microsoft", num_heads=4), [(2, 8, 64), (2, 10, 64), (2, 10, 64)],
     [(2, 8, 64)], 4 * 2 * 8 * 10 * 64),
    (node("Attention", 2, domain="com.microsoft", num_heads=4), [(2, 8, 64), (64, 192)], [(2, 8, 64)],
     2 * 2 * 8 * 64 * 192 + 4 * 2 * 8 * 8 * 64),
    (node("MoE", 5, domain="com.microsoft", k=2), [(16, 64), (16, 4), (4, 64, 128), None, (4, 128, 64)],
     [(16, 64)], 2 * 16 * 2 * (64 * 128 * 2)),
    (node("MatMulNBits", 2, domain="com.microsoft", K=64, N=32), [(3, 64), None], [(3, 32)], 2 * 3 * 32 * 64),
])
def test_formulas(proto, ins, outs, expected):
    assert is_counted(proto)
    assert node_flops(proto, ins, outs) == expected


def test_uncounted_ops_and_missing_shapes_give_none():
    assert not is_counted(node("Add")) and node_flops(node("Add"), [(2,), (2,)], [(2,)]) is None
    assert node_flops(node("MatMul"), [None, (4, 5)], [(3, 5)]) is None
    assert node_flops(node("Einsum", equation="ij,jk->ik"), [(2, 3, 4), (4, 5)], [(2, 5)]) is None


MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, seq, 4] x) => (float[batch, seq, 4] y) <float[4, 8] w1 = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    0.0, 0.0}, float[8, 4] w2 = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}> {
    h = MatMul (x, w1)
    r = Relu (h)
    o = MatMul (r, w2)
    y = Add (x, o)
}
"""


def test_count_flops_binds_symbolic_dims():
    mg = build_graph(load_model(onnx.parser.parse_model(MODEL)).model)
    count = count_flops(mg, {"x": (2, 16)[:1] + (16, 4)})
    per_token = 2 * 4 * 8 + 2 * 8 * 4
    assert count.total == 2 * 16 * per_token
    assert dict(count.uncounted) == {"Relu": 1, "Add": 1}
    assert count.unknown_shape == ()
    assert dict(count.dims) == {"batch": 2, "seq": 16}


def test_count_flops_evaluates_dimension_expressions():
    """torch's exporter writes dimensions such as `seq*batch` into value_info."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[batch, seq, 4] x, float[4, 4] w) => (float[N, 4] y) {
        shape = Constant <value = int64[2] {-1, 4}> ()
        flat = Reshape (x, shape)
        y = MatMul (flat, w)
        z = NonZero (y)
        zt = Transpose (z)
        picked = GatherND (y, zt)
        again = MatMul (flat, w)
    }""")
    model.graph.value_info.append(helper.make_tensor_value_info("flat", onnx.TensorProto.FLOAT, ["seq*batch", 4]))
    mg = build_graph(load_model(model).model)
    assert mg.tensors[mg.find_tensor("flat")].shape == ("seq*batch", 4)
    count = count_flops(mg, {"x": (3, 5, 4)})
    assert count.total == 2 * (2 * 15 * 4 * 4)


def test_unknown_sizes_are_listed_not_zero():
    mg = build_graph(load_model(onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x, float[4, 4] w) => (float[M, 4] y) {
        mask = NonZero (x)
        rows = Transpose (mask)
        first = Constant <value = int64[1] {0}> ()
        idx = Gather <axis = 1> (rows, first)
        flat = Squeeze (idx)
        picked = Gather (x, flat)
        y = MatMul (picked, w)
    }""")).model)
    count = count_flops(mg, {"x": (6, 4)})
    matmul = next(n.id for n in mg.nodes.values() if n.op_type == "MatMul")
    assert count.unknown_shape == (matmul,) and count.total == 0


def test_count_flops_rejects_shapes_that_contradict_the_graph():
    mg = build_graph(load_model(onnx.parser.parse_model(MODEL)).model)
    with pytest.raises(UsageError, match="expected 3 dimensions for input 'x'"):
        count_flops(mg, {"x": (2, 16)})
    with pytest.raises(UsageError, match="expected dimension 2 of input 'x' to be 4, found 5"):
        count_flops(mg, {"x": (2, 16, 5)})
    with pytest.raises(UsageError, match="graph input"):
        count_flops(mg, {"ids": (2, 16)})
