"""FLOP formulas per operator, and counting a whole graph at concrete input shapes."""

import onnx
import onnx.parser
import pytest
from onnx import helper

from graphaudit.analyses.flops import count_flops, is_counted, node_flops
from graphaudit.errors import UsageError
from graphaudit.graph.build import build_graph
from graphaudit.load.inference import infer_at
from graphaudit.load.model import load_model


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
    (node("Einsum", equation="...ij,...jk->...ik"), [(2, 3, 4, 5), (3, 5, 6)], [(2, 3, 4, 6)],
     2 * 2 * 3 * 4 * 5 * 6),  # `...` aligned from the right, as broadcasting does
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
    mg = build_graph(load_model(model, inline=False).model)
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


@pytest.mark.parametrize("proto, ins, outs", [
    (node("Attention", 6), [(1, 8, 1, 64), (1, 2, 1, 64), (1, 2, 1, 64), None, (1, 2, 31, 64), (1, 2, 31, 64)],
     [(1, 8, 1, 64), (1, 2, 32, 64), (1, 2, 32, 64)]),
    (node("Attention", 5, domain="com.microsoft", num_heads=8), [(1, 1, 512), (512, 1536), (1536,), None,
     (2, 1, 8, 31, 64)], [(1, 1, 512), (2, 1, 8, 32, 64)]),
    (node("MultiHeadAttention", 8, domain="com.microsoft", num_heads=8), [(1, 1, 512), (1, 1, 512), (1, 1, 512),
     None, None, None, (1, 8, 31, 64), (1, 8, 31, 64)], [(1, 1, 512), (1, 8, 32, 64), (1, 8, 32, 64)]),
    (node("GroupQueryAttention", 7, domain="com.microsoft", num_heads=8, kv_num_heads=2),
     [(1, 1, 512), (1, 1, 128), (1, 1, 128), (1, 2, 31, 64), (1, 2, 31, 64), (1,), ()],
     [(1, 1, 512), (1, 2, 32, 64), (1, 2, 32, 64)]),
], ids=["Attention", "ORT Attention", "MultiHeadAttention", "GroupQueryAttention"])
def test_attention_counts_every_cached_key_position(proto, ins, outs):
    """A one-token decode step with 31 cached positions scores and mixes all 32 keys, whether
    the total is read from the present cache or from the past cache plus the new token."""
    scores_and_context = 4 * 1 * 8 * 1 * 32 * 64  # batch, heads, queries, keys, head size
    projection = 2 * 512 * 1536 if proto.op_type == "Attention" and proto.domain else 0
    assert node_flops(proto, ins, outs) == projection + scores_and_context
    assert node_flops(proto, ins, outs[:1]) == projection + scores_and_context


def test_function_body_types_are_its_own():
    """A function's `h` is not the caller's `h`: ONNX's inference on the body at this call
    types it [T, 8] (the caller's [T, 2] would give a quarter), and a type the function
    declares itself stands over the inferred one."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    g (float[T, 2] x, float[2, 8] wu, float[8, 2] wd) => (float[T, 2] y) {
        h = local.Blk (x, wu, wd)
        y = Add (h, x)
    }
    <domain: "local", opset_import: ["" : 17]>
    Blk (a, wu, wd) => (b) {
        h = MatMul (a, wu)
        b = MatMul (h, wd)
    }""")
    mg = build_graph(load_model(model, inline=False).model)
    assert mg.tensors[mg.find_tensor("h")].shape == ("T", 2)
    body_h, = [ref for ref in mg.tensors if ref.name == "h" and ref.scope]
    assert mg.tensors[body_h].shape == ("T", 8)
    count = count_flops(mg, {"x": (4, 2)})
    assert count.per_node == {"MatMul#1": 2 * 4 * 2 * 8, "MatMul#2": 2 * 4 * 8 * 2} and not count.unknown_shape
    assert count.uncounted == (("Add", 1),)  # the call itself is counted in its body, not listed

    model.functions[0].value_info.append(helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, ["T", 9]))
    mg = build_graph(load_model(model, inline=False).model)
    assert mg.tensors[body_h].shape == ("T", 9)


def test_each_call_of_a_function_is_typed_at_its_own_arguments_and_attributes():
    """Two calls of one function, at widths 8 and 4, with the body's Transpose reading its
    `perm` from the call (or the function's default): each body counted at its own sizes."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    g (float[T, 2] x, float[2, 8] wu, float[8, 2] wd, float[2, 4] wu2, float[4, 2] wd2) => (float[T, 2] y) {
        h1 = local.Blk <perm = [0, 1]> (x, wu, wd)
        h2 = local.Blk (h1, wu2, wd2)
        y = Add (h2, x)
    }
    <domain: "local", opset_import: ["" : 17]>
    Blk <perm: ints = [1, 0]> (a, wu, wd) => (b) {
        h = MatMul (a, wu)
        t = Transpose <perm: ints = @perm> (h)
        u = Transpose <perm: ints = @perm> (t)
        b = MatMul (u, wd)
    }""")
    mg = build_graph(load_model(model, inline=False).model)
    width = {ref.scope: mg.tensors[ref].shape for ref in mg.tensors if ref.name == "t"}
    assert set(width.values()) == {("T", 8), (4, "T")}  # the second call transposes, by default
    count = count_flops(mg, {"x": (3, 2)})
    assert sorted(count.per_node.values()) == sorted([2 * 3 * 2 * 8, 2 * 3 * 8 * 2, 2 * 3 * 2 * 4, 2 * 3 * 4 * 2])
    assert not count.unknown_shape


def test_a_function_body_inference_refuses_keeps_its_declared_types(monkeypatch):
    """Where ONNX's inference raises on a body, the body's values stay as the function
    declared them (unknown here): its products are listed as of unknown size, not guessed."""
    import graphaudit.graph.function_types as function_types

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    g (float[T, 2] x, float[2, 8] wu, float[8, 2] wd) => (float[T, 2] y) {
        y = local.Blk (x, wu, wd)
    }
    <domain: "local", opset_import: ["" : 17]>
    Blk (a, wu, wd) => (b) {
        h = MatMul (a, wu)
        b = MatMul (h, wd)
    }""")
    loaded = load_model(model, inline=False).model

    def refuse(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("refused")

    monkeypatch.setattr(function_types.shape_inference, "infer_shapes", refuse)
    count = count_flops(build_graph(loaded), {"x": (4, 2)})
    assert count.per_node == {"MatMul#1": 2 * 4 * 2 * 8} and count.unknown_shape == ("MatMul#2",)


def test_each_branch_types_its_own_values():
    """Both branches of an If define `h`, [T, 8] in one and [T, 4] in the other; each branch's
    second MatMul is counted at its own branch's width."""
    mg = build_graph(load_model(onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[T, 2] x, bool c, float[2, 8] wu, float[8, 2] wd, float[2, 4] wu2, float[4, 2] wd2) => (float[T, 2] y) {
        y = If (c) <
            then_branch = t () => (float[T, 2] ty) { ["up"] h = MatMul (x, wu)
                ["down"] ty = MatMul (h, wd) },
            else_branch = e () => (float[T, 2] ey) { ["up2"] h = MatMul (x, wu2)
                ["down2"] ey = MatMul (h, wd2) } >
    }""")).model)
    count = count_flops(mg, {"x": (4, 2)})
    assert count.per_node == {"up": 2 * 4 * 2 * 8, "down": 2 * 4 * 8 * 2, "up2": 2 * 4 * 2 * 4, "down2": 2 * 4 * 4 * 2}


ROTATE_HALF = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, T, 8] x, float[4, 8] w) => (float[B, T, 4] y) {
        size = Shape <start = -1> (x)
        two = Constant <value = int64[1] {2}> ()
        half = Div (size, two)
        zero = Constant <value = int64[1] {0}> ()
        big = Constant <value = int64[1] {1000}> ()
        axis = Constant <value = int64[1] {2}> ()
        first = Slice (x, zero, half, axis)
        second = Slice (x, half, big, axis)
        rotated = Concat <axis = 2> (second, first)
        y = MatMul (rotated, w)
    }"""


def test_shape_arguments_inference_cannot_compute_are_computed_at_concrete_shapes():
    # ONNX's data propagation does not follow Div: the Slices' ends are unknown, so are their
    # shapes and the MatMul's; infer_at computes `half` and infers again
    loaded = load_model(onnx.parser.parse_model(ROTATE_HALF.replace("float[4, 8] w", "float[8, 4] w")))
    mg = build_graph(loaded.model)
    shapes = {"x": (2, 5, 8)}
    assert count_flops(mg, shapes).unknown_shape
    known = infer_at(loaded.model, shapes)
    assert known["first"] == (2, 5, 4) and known["rotated"] == (2, 5, 8) and known["y"] == (2, 5, 4)
    count = count_flops(mg, shapes, known)
    assert count.unknown_shape == () and count.total == 2 * 2 * 5 * 8 * 4
    assert not any(n.op_type == "Constant" and n.output[0] == "half" for n in loaded.model.graph.node)  # unchanged


def test_shape_arguments_from_input_values_stay_unknown():
    text = ROTATE_HALF.replace("float[4, 8] w", "float[8, 4] w, int64[1] cut").replace(
        "half = Div (size, two)", "half = Div (cut, two)")
    loaded = load_model(onnx.parser.parse_model(text))
    known = infer_at(loaded.model, {"x": (2, 5, 8), "cut": (1,)})
    assert "first" not in known and "y" not in known


def test_shape_arguments_computed_from_shapes_found_a_round_before_are_computed_round_after_round():
    # each step keeps the first half of the tokens left by the step before (token pruning as
    # TorchScript exports it): its Slice end is a Div of the Shape the last step's Slice made, so
    # every step needs one more round of inference; ten steps of 2048 tokens leave 2
    steps = 10
    body = ["two = Constant <value = int64[1] {2}> ()", "zero = Constant <value = int64[1] {0}> ()",
            "axis = Constant <value = int64[1] {1}> ()", "t0 = Identity (x)"]
    for i in range(steps):
        body += [f"size{i} = Shape <start = 1, end = 2> (t{i})", f"half{i} = Div (size{i}, two)",
                 f"t{i + 1} = Slice (t{i}, zero, half{i}, axis)"]
    body.append(f"y = MatMul (t{steps}, w)")
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, T, 8] x, float[8, 4] w) => (float[B, S, 4] y) {{
        {chr(10).join(body)}
    }}"""
    loaded = load_model(onnx.parser.parse_model(text))
    shapes = {"x": (1, 2048, 8)}
    known = infer_at(loaded.model, shapes)
    assert known["t10"] == (1, 2, 8) and known["y"] == (1, 2, 4)
    count = count_flops(build_graph(loaded.model), shapes, known)
    assert count.unknown_shape == () and count.total == 2 * 2 * 8 * 4


def test_products_inside_branches_are_sized_at_the_given_shapes():
    """The main graph computes a size from the input's shape (N·2 rows of 3) that both branches
    reshape by: unknown symbolically, known once N is, inside the branches too (whose values
    have the same names, as a merged decoder's have)."""
    from graphaudit.analyses.static import audit_static

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 6] x, bool c) => (float[M, 3] y) <float[3, 3] w1 = {1, 0, 0, 0, 1, 0, 0, 0, 1},
        float[3, 3] w2 = {2, 0, 0, 0, 2, 0, 0, 0, 2}, int64[1] zero = {0}, int64[1] two = {2},
        int64[1] three = {3}> {
        s = Shape (x)
        n = Gather (s, zero)
        rows = Mul (n, two)
        shape = Concat <axis = 0> (rows, three)
        y = If (c) <
            then_branch = t () => (float[M, 3] ty) {
                r = Reshape (x, shape)
                ty = MatMul (r, w1) },
            else_branch = e () => (float[M, 3] ey) {
                r = Reshape (x, shape)
                ey = MatMul (r, w2) }
        >
    }""")
    mg = build_graph(load_model(model).model)
    assert mg.tensors[mg.find_tensor("r")].shape != (10, 3)  # symbolically, not a size
    flops = audit_static(load_model(model), shapes={"x": (5, 6), "c": ()}).flops
    assert flops.count.unknown_shape == ()
    assert sorted(flops.count.per_node.values()) == [2 * 10 * 3 * 3] * 2
