"""Local functions inlined at load: each call replaced by its body, each inlined node named by
the path of calls it came through, so that blocks, coefficients, the replay and the profile
see a block written as a function as they see any other."""

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

from graphaudit.analyses.static import audit_static
from graphaudit.load.inline import inline_functions
from graphaudit.load.model import load_model
from graphaudit.profile import profile_model

WIDTH = 8
FAST = {"runs": 2, "warmup": 1, "profile_runs": 1, "threads": 1}


def function_model(names=("/blocks.0/Blk", "/blocks.1/Blk"), body_opset=17) -> onnx.ModelProto:
    """x (2, 5, WIDTH) → two calls of `Blk` (x + Relu(x·W + b) · σ(x·g), each with its own
    weights) → a head; the gate σ(x·g) is a coefficient inside the function."""
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    g (float[2, 5, {WIDTH}] x) => (float[2, 5, {WIDTH}] y) {{
        h1 = local.Blk (x, w0, b0, g0)
        h2 = local.Blk (h1, w1, b1, g1)
        y = MatMul (h2, wh)
    }}
    <domain: "local", opset_import: ["" : {body_opset}]>
    Blk (a, w, b, g) => (out) {{
        m = MatMul (a, w)
        s = Add (m, b)
        r = Relu (s)
        z = MatMul (a, g)
        gate = Sigmoid (z)
        mixed = Mul (r, gate)
        out = Add (a, mixed)
    }}""")
    rng = np.random.default_rng(0)
    for name, shape in [("w0", (WIDTH, WIDTH)), ("b0", (WIDTH,)), ("g0", (WIDTH, 1)), ("w1", (WIDTH, WIDTH)),
                        ("b1", (WIDTH,)), ("g1", (WIDTH, 1)), ("wh", (WIDTH, WIDTH))]:
        model.graph.initializer.append(onnx.numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name))
    for node, name in zip(model.graph.node, [*names, "/head/MatMul"]):
        node.name = name
    for node, name in zip(model.functions[0].node, ["MatMul", "Add", "Relu", "MatMul_1", "Sigmoid", "Mul", "Add_1"]):
        node.name = name
    return model


BODY = ["MatMul", "Add", "Relu", "MatMul_1", "Sigmoid", "Mul", "Add_1"]


def _run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_each_inlined_node_is_named_by_its_call_and_computes_the_same():
    model = function_model()
    before = model.SerializeToString()
    inlined, calls = inline_functions(model)
    assert calls == 2 and not inlined.functions
    assert [n.name for n in inlined.graph.node] == ([f"/blocks.0/Blk/{n}" for n in BODY]
                                                     + [f"/blocks.1/Blk/{n}" for n in BODY] + ["/head/MatMul"])
    assert model.SerializeToString() == before  # the argument is not changed
    x = np.random.default_rng(1).normal(size=(2, 5, WIDTH)).astype(np.float32)
    np.testing.assert_array_equal(_run(inlined, x), _run(model, x))


def test_unnamed_calls_are_named_by_their_graph_ids():
    inlined, _ = inline_functions(function_model(names=("", "")))
    assert [n.name for n in inlined.graph.node][:2] == ["Blk#1/MatMul", "Blk#1/Add"]
    assert inlined.graph.node[7].name == "Blk#2/MatMul"


def test_nested_calls_and_calls_inside_a_branch_are_named_by_their_path():
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    g (float[3] x, bool c) => (float[3] y) {
        y = If (c) <
            then_branch = t () => (float[3] ty) { ty = local.Outer (x) },
            else_branch = e () => (float[3] ey) { ey = Identity (x) }
        >
    }
    <domain: "local", opset_import: ["" : 17, "local" : 1]>
    Inner (a) => (b) { b = Neg (a) }
    <domain: "local", opset_import: ["" : 17, "local" : 1]>
    Outer (a) => (b) {
        i = local.Inner (a)
        b = Abs (i)
    }""")
    model.graph.node[0].name = "if"
    model.graph.node[0].attribute[0].g.node[0].name = "outer"
    model.functions[1].node[0].name = "inner"
    inlined, calls = inline_functions(model)
    assert calls == 2
    then = next(a.g for a in inlined.graph.node[0].attribute if a.name == "then_branch")
    assert [(n.name, n.op_type) for n in then.node] == [("outer/inner/Neg", "Neg"), ("outer/Abs", "Abs")]


def test_a_function_at_another_opset_is_left_as_a_function():
    """ONNX's inliner leaves such a call in place (it would need a version conversion): the
    model keeps its functions and the analyses read through the calls."""
    model = function_model(body_opset=18)
    assert inline_functions(model) is None
    loaded = load_model(model)
    assert loaded.model.functions and loaded.inlined_calls == 0
    assert len(audit_static(loaded).blocks) == 2


def test_load_inlines_and_the_static_audit_finds_the_gates_inside():
    loaded = load_model(function_model())
    assert not loaded.model.functions
    assert (loaded.inlined_calls, loaded.inlined_functions) == (2, ("local.Blk",))
    report = audit_static(loaded)
    assert [b.name for b in report.blocks] == ["blocks.0", "blocks.1"]
    assert [b.verdict for b in report.blocks] == ["gated", "gated"]
    assert [(c.family, c.layer) for c in report.coefficients] == [("gate", 0), ("gate", 1)]
    assert report.to_json()["inlined_function_calls"] == 2
    assert report.flops.count.unknown_shape == () and report.flops.total > 0
    kept = audit_static(load_model(function_model(), inline=False))
    assert kept.flops.total == report.flops.total and not kept.coefficients  # what inlining brings


@pytest.mark.parametrize("opt_level", ["all", "disable"])
def test_every_profiled_event_of_a_call_is_mapped_to_its_block(tmp_path, opt_level):
    """ORT inlines a call under names of its own, alike for every call: here it is given the
    model inlined at load, whose node names say which call each event belongs to."""
    onnx.save(function_model(), tmp_path / "model.onnx")
    np.savez(tmp_path / "data.npz", x=np.random.default_rng(1).normal(size=(4, 5, WIDTH)).astype(np.float32))
    report = profile_model(tmp_path / "model.onnx", tmp_path / "data.npz", opt_level=opt_level, **FAST)
    blocks = {b["name"]: b for b in report.to_json()["blocks"]}
    assert "(unmapped)" not in blocks or blocks["(unmapped)"]["share"] == 0
    for name in ("blocks.0", "blocks.1"):
        assert blocks[name]["executed_fraction"] == 1.0 and blocks[name]["share"] > 0, name
