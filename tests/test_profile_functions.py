"""A model whose blocks are calls of a local function: ONNX Runtime inlines each call under
names of its own (`_inlfunc_Blk_MatMul`, the same for every call), so graphaudit hands it the
model with every call already inlined, each node named by its graph id (`MatMul#2`), and the
profile maps every event to its call's block."""

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

from graphaudit.graph import build_graph
from graphaudit.load import load_model
from graphaudit.profile import profile_model
from graphaudit.profile.session import inlined_model, runnable_model

FAST = {"runs": 2, "warmup": 1, "profile_runs": 1, "threads": 1}
WIDTH = 8


def function_model() -> onnx.ModelProto:
    """x (2, 5, WIDTH) → two calls of `Blk` (x + Relu(x·W + b)), each with its own weights, → head."""
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    g (float[2, 5, {WIDTH}] x) => (float[2, 5, {WIDTH}] y) {{
        h1 = local.Blk (x, w0, b0)
        h2 = local.Blk (h1, w1, b1)
        y = MatMul (h2, wh)
    }}
    <domain: "local", opset_import: ["" : 17]>
    Blk (a, w, b) => (out) {{
        m = MatMul (a, w)
        s = Add (m, b)
        r = Relu (s)
        out = Add (a, r)
    }}""")
    rng = np.random.default_rng(0)
    for name, shape in [("w0", (WIDTH, WIDTH)), ("b0", (WIDTH,)), ("w1", (WIDTH, WIDTH)), ("b1", (WIDTH,)),
                        ("wh", (WIDTH, WIDTH))]:
        model.graph.initializer.append(onnx.numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name))
    for node, name in zip(model.graph.node, ["/blocks.0/Blk", "/blocks.1/Blk", "/head/MatMul"]):
        node.name = name
    for node, name in zip(model.functions[0].node, ["MatMul", "Add", "Relu", "Add_1"]):
        node.name = name
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("functions")
    onnx.save(function_model(), folder / "model.onnx")
    np.savez(folder / "data.npz", x=np.random.default_rng(1).normal(size=(4, 5, WIDTH)).astype(np.float32))
    return folder


def test_each_call_is_inlined_under_the_graph_ids_of_its_nodes():
    model = function_model()
    mg = build_graph(model)
    inlined, renamed, calls = inlined_model(model)
    assert calls == 2 and not inlined.functions
    names = [n.name for n in inlined.graph.node]
    assert names == ["MatMul#1", "Add#1", "Relu#1", "Add_1#1", "MatMul#2", "Add#2", "Relu#2", "Add_1#2",
                     "/head/MatMul"]
    assert set(names) <= set(mg.nodes)
    assert [mg.nodes[n].op_type for n in names] == [n.op_type for n in inlined.graph.node]
    assert renamed == 8  # the bodies' nodes; the head keeps its name
    assert model.functions and model.graph.node[0].name == "/blocks.0/Blk"  # the argument is unchanged
    x = np.random.default_rng(2).normal(size=(2, 5, WIDTH)).astype(np.float32)
    as_written, = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    as_inlined, = ort.InferenceSession(inlined.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(as_inlined, as_written)


@pytest.mark.parametrize("opt_level", ["all", "disable"])
def test_every_event_of_a_call_is_mapped_to_its_block(files, opt_level):
    report = profile_model(files / "model.onnx", files / "data.npz", opt_level=opt_level, **FAST)
    doc = report.to_json()
    shares = {b["name"]: b for b in doc["blocks"]}
    assert "(unmapped)" not in shares or shares["(unmapped)"]["share"] == 0
    for block in ("blocks.0", "blocks.1"):
        assert shares[block]["executed_fraction"] == 1.0, block
        assert shares[block]["share"] > 0, block
    assert any("2 calls of local functions inlined" in note for note in doc["notes"])
    assert runnable_model(load_model(files / "model.onnx")).inlined_calls == 2
