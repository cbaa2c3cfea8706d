"""Data dependence on tiny graphs in ONNX text syntax: the CONST < SHAPE < VALUE lattice."""

import pytest

from graphaudit.analyses.dependence import CONST, SHAPE, VALUE, Dependence, analyse_dependence, data_dependence

from support.text_graphs import graph_of


def dep(mg, name: str) -> Dependence:
    return data_dependence(mg)[mg.find_tensor(name)]


SHAPE_OPS = """
<ir_version: 8, opset_import: ["" : 17]>
shapes (float[N, M] x, float[2, 3] fixed) => (float[N, M] y) {
    zero = Constant <value = int64[1] {0}> ()
    one = Constant <value = int64[1] {1}> ()
    w = Constant <value = float {2.0}> ()
    ww = Mul (w, w)
    s = Shape (x)
    n = Size (x)
    filled = ConstantOfShape (s)
    d0 = Gather <axis = 0> (s, zero)
    tail = Slice (s, one, one)
    d0s = Squeeze (d0)
    ones = Squeeze (one)
    zeros = Squeeze (zero)
    r = Range (zeros, d0s, ones)
    fs = Shape (fixed)
    fixed_filled = ConstantOfShape (fs)
    v = Add (x, x)
    total = ReduceSum (x)
    nz = NonZero (x)
    nzs = Shape (nz)
    rs = Reshape (x, s)
    k = Cast <to = 7> (total)
    k1 = Reshape (k, one)
    grown = Expand (w, k1)
    y = Identity (x)
}
"""


def test_shape_ops_reveal_shapes_not_values():
    mg = graph_of(SHAPE_OPS)
    assert dep(mg, "ww") == CONST
    for name in ("s", "n", "filled", "d0", "tail", "r"):
        assert dep(mg, name) == SHAPE, name
    assert dep(mg, "fs") == CONST and dep(mg, "fixed_filled") == CONST  # fixed input shape
    for name in ("v", "total", "nz", "rs", "k", "grown"):
        assert dep(mg, name) == VALUE, name


def test_value_sized_extents():
    mg = graph_of(SHAPE_OPS)
    dm = analyse_dependence(mg)
    ref = mg.find_tensor
    assert dm.shape(ref("nz")) == VALUE  # NonZero's length depends on x's values
    assert dm.value(ref("nzs")) == VALUE  # so does the Shape of it
    assert dm.shape(ref("rs")) == SHAPE and dm.value(ref("rs")) == VALUE
    assert dm.value(ref("filled")) == CONST and dm.shape(ref("filled")) == SHAPE
    assert dm.shape(ref("grown")) == VALUE  # Expand to a value-dependent size
    assert dm.shape(ref("total")) == CONST  # a scalar


IFS = """
<ir_version: 8, opset_import: ["" : 17]>
ifs (float[N] x) => (float[N] a, float[N] b, float[N] c) {
    t = Constant <value = bool {1}> ()
    a = If (t) <
        then_branch = g1 () => (float[N] o1) { o1 = Relu (x) },
        else_branch = g2 () => (float[N] o2) { o2 = Neg (x) }
    >
    s = Shape (x)
    four = Constant <value = int64[1] {4}> ()
    long = Greater (s, four)
    longs = Squeeze (long)
    b = If (longs) <
        then_branch = g3 () => (float[N] o3) { o3 = Relu (x) },
        else_branch = g4 () => (float[N] o4) { o4 = Neg (x) }
    >
    total = ReduceSum <keepdims = 0> (x)
    zero = Constant <value = float {0.0}> ()
    positive = Greater (total, zero)
    c = If (positive) <
        then_branch = g5 () => (float[N] o5) { o5 = Relu (x) },
        else_branch = g6 () => (float[N] o6) { o6 = Neg (x) }
    >
}
"""


def test_if_conditions_constant_shape_and_value():
    mg = graph_of(IFS)
    dm = analyse_dependence(mg)
    by_output = {n.outputs[0].name: dm.controls[n.id] for n in mg.nodes.values() if n.op_type == "If"}
    assert by_output["a"].dependence == CONST and "constant" in by_output["a"].reason
    assert by_output["b"].dependence == SHAPE
    assert by_output["c"].dependence == VALUE and by_output["c"].tensors[0].name == "positive"
    # values flow out of every branch; the branch outputs are as dependent as x
    assert dep(mg, "a") == VALUE and dep(mg, "c") == VALUE


def test_if_output_of_shapes_only_stays_shape_dependent():
    mg = graph_of("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N] x, bool flag_from_shape_only) => (int64[1] out) {
        s = Shape (x)
        one = Constant <value = int64[1] {1}> ()
        big = Greater (s, one)
        bigs = Squeeze (big)
        out = If (bigs) <
            then_branch = t () => (int64[1] o1) { o1 = Identity (s) },
            else_branch = e () => (int64[1] o2) { o2 = Add (s, one) }
        >
    }""")
    assert dep(mg, "out") == SHAPE


LOOPS = """
<ir_version: 8, opset_import: ["" : 17]>
loops (float[N] x) => (float[N] acc, float c_final) {
    total = ReduceSum <keepdims = 0> (x)
    n = Cast <to = 7> (total)
    s = Shape (x)
    zero = Constant <value = int64[1] {0}> ()
    m = Gather <axis = 0> (s, zero)
    ms = Squeeze (m)
    yes = Constant <value = bool {1}> ()
    start = Constant <value = float {0.0}> ()
    acc = Loop (n, yes, x) <
        body = b1 (int64 i, bool c, float[N] a) => (bool c_out, float[N] a_out) {
            c_out = Identity (c)
            a_out = Add (a, x)
        }
    >
    c_final = Loop (ms, yes, start) <
        body = b2 (int64 j, bool c2, float v) => (bool c2_out, float v_out) {
            c2_out = Identity (c2)
            v_out = Identity (v)
        }
    >
}
"""


def test_loop_trip_counts_and_carried_values():
    mg = graph_of(LOOPS)
    dm = analyse_dependence(mg)
    loops = {n.outputs[0].name: dm.controls[n.id] for n in mg.nodes.values() if n.op_type == "Loop"}
    assert loops["acc"].dependence == VALUE and "trip count depends on input values" in loops["acc"].reason
    assert loops["c_final"].dependence == SHAPE
    assert dep(mg, "c_final") == SHAPE  # a constant carried through a shape-counted loop
    body_i = mg.find_tensor("j")
    assert dm.value(body_i) == SHAPE  # the iteration number reveals the trip count


def test_loop_carried_value_reaches_a_fixed_point():
    mg = graph_of("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float x) => (float out) {
        three = Constant <value = int64 {3}> ()
        yes = Constant <value = bool {1}> ()
        start = Constant <value = float {0.0}> ()
        out = Loop (three, yes, start) <
            body = b (int64 i, bool c, float v) => (bool c_out, float v_out) {
                c_out = Identity (c)
                v_out = Add (v, x)
            }
        >
    }""")
    dm = analyse_dependence(mg)
    assert dm.value(mg.find_tensor("v")) == VALUE  # constant at first, x after one turn
    assert dep(mg, "out") == VALUE
    loop = next(n for n in mg.nodes.values() if n.op_type == "Loop")
    assert dm.controls[loop.id].dependence == CONST


def test_loop_condition_computed_from_values_is_dynamic():
    mg = graph_of("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float x) => (float out) {
        yes = Constant <value = bool {1}> ()
        out = Loop ("", yes, x) <
            body = b (int64 i, bool c, float v) => (bool c_out, float v_out) {
                half = Constant <value = float {0.5}> ()
                v_out = Mul (v, half)
                tiny = Constant <value = float {0.01}> ()
                c_out = Greater (v_out, tiny)
            }
        >
    }""")
    loop = next(n for n in mg.nodes.values() if n.op_type == "Loop")
    control = analyse_dependence(mg).controls[loop.id]
    assert control.dependence == VALUE and "condition depends on input values" in control.reason


@pytest.mark.parametrize("step, grows", [("Concat <axis = 0> (a, x)", True), ("Add (a, x)", False)])
def test_loop_carried_shape_follows_a_value_dependent_trip_count_when_it_grows(step, grows):
    before, after = ("K", "L") if grows else ("T", "T")
    mg = graph_of(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[T, 2] x) => (float[N, 2] out) {{
        top = ReduceMax <keepdims = 0> (x)
        n = Cast <to = 7> (top)
        yes = Constant <value = bool {{1}}> ()
        out = Loop (n, yes, x) <
            body = b (int64 i, bool c, float[{before}, 2] a) => (bool c_out, float[{after}, 2] a_out) {{
                c_out = Identity (c)
                a_out = {step}
            }}
        >
    }}""")
    dm = analyse_dependence(mg)
    assert dm.value(mg.find_tensor("out")) == VALUE
    assert dm.shape(mg.find_tensor("out")) == (VALUE if grows else SHAPE)  # grown n times, or kept


def test_scan_iterates_over_a_shape():
    mg = graph_of("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[T, 2] xs) => (float[2] total, float[T, 2] running) {
        start = Constant <value = float[2] {0.0, 0.0}> ()
        total, running = Scan (start, xs) <
            num_scan_inputs = 1,
            body = b (float[2] acc, float[2] x) => (float[2] acc_out, float[2] seen) {
                acc_out = Add (acc, x)
                seen = Identity (acc_out)
            }
        >
    }""")
    dm = analyse_dependence(mg)
    scan = next(n for n in mg.nodes.values() if n.op_type == "Scan")
    assert dm.controls[scan.id].dependence == SHAPE
    assert dep(mg, "total") == VALUE and dep(mg, "running") == VALUE
    assert "its length is an input shape" in dm.controls[scan.id].reason


def test_scan_over_a_value_sized_input_says_so():
    mg = graph_of("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[T] x) => (float total) {
        zero = Constant <value = float {0.0}> ()
        positive = Greater (x, zero)
        where = NonZero (positive)
        flat = Constant <value = int64[1] {-1}> ()
        idx = Reshape (where, flat)
        xs = Gather (x, idx)
        start = Constant <value = float {0.0}> ()
        total = Scan (start, xs) <
            num_scan_inputs = 1,
            body = b (float acc, float v) => (float acc_out) { acc_out = Add (acc, v) }
        >
    }""")
    scan = next(n for n in mg.nodes.values() if n.op_type == "Scan")
    control = analyse_dependence(mg).controls[scan.id]
    assert control.dependence == VALUE
    assert control.reason == "iterates over the scanned axis (its length depends on input values)"


def test_nested_subgraphs_read_outer_values():
    mg = graph_of("""
    <ir_version: 8, opset_import: ["" : 17]>
    nested (float[N] x, bool c1, bool c2) => (float[N] y) {
        w = Constant <value = float[1] {2.0}> ()
        y = If (c1) <
            then_branch = g1 () => (float[N] t1) {
                t1 = If (c2) <
                    then_branch = g2 () => (float[N] a) { ws = Mul (w, w)
                                                          a = Mul (x, ws) },
                    else_branch = g3 () => (float[N] b) { b = Add (x, w) }
                >
            },
            else_branch = g4 () => (float[N] e1) { e1 = Neg (x) }
        >
    }""")
    dm = analyse_dependence(mg)
    assert dep(mg, "ws") == CONST and dep(mg, "a") == VALUE and dep(mg, "y") == VALUE
    assert sorted(c.dependence for c in dm.controls.values()) == [VALUE, VALUE]


def test_function_bodies_carry_dependence_through_calls():
    mg = graph_of("""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    withfn (float[N] x) => (int64[1] y, float[N] z) {
        y = local.ShapeOf (x)
        z = local.Twice (x)
    }
    <domain: "local", opset_import: ["" : 17]>
    ShapeOf (a) => (b) {
        b = Shape (a)
    }
    <domain: "local", opset_import: ["" : 17]>
    Twice (a) => (b) {
        two = Constant <value = float {2.0}> ()
        b = Mul (a, two)
    }""")
    assert dep(mg, "y") == SHAPE
    assert dep(mg, "z") == VALUE


@pytest.mark.parametrize("op", ["RandomNormalLike", "EyeLike"])
def test_filled_like_ops_follow_the_shape(op):
    mg = graph_of(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, N] x) => (float[N, N] y) {{
        y = {op} (x)
    }}""")
    assert dep(mg, "y") == SHAPE
