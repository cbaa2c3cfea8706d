"""Reading what each output holds from the graph model the caller has built gives the readings
the proto gives: the same operators followed back, the same ranks."""

import onnx
import pytest

from graphaudit.analyses.output_kinds import read_outputs
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model

from support.models import blockdrop_cnn, float_gated, gate_in_branch, gated_lm, se_cnn
from support.text_graphs import model_of
from support.zoo import FIXTURES, ZOO

TEXTS = {
    "softmax over axis 1 of a rank-3 value": """<ir_version: 8, opset_import: ["" : 17]>
        g (float[B, T, 5] x) => (float[B, T, 5] p) { p = Softmax <axis = 1> (x) }""",
    "softmax over the last axis, named positively, behind a reshape": """<ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 5] x) => (float[B, 5] p) {
            s = Shape (x)
            q = Softmax <axis = 1> (x)
            p = Reshape (q, s) }""",
    "a transposed log-softmax and a sigmoid beside it": """<ir_version: 8, opset_import: ["" : 17]>
        g (float[B, T, 5] x) => (float[B, 5, T] p, float[B, T, 5] s) {
            q = LogSoftmax <axis = -1> (x)
            p = Transpose <perm = [0, 2, 1]> (q)
            s = Sigmoid (x) }""",
    "a concat of a softmax and raw values": """<ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 5] x) => (float[B, 10] y) {
            a = Softmax (x)
            y = Concat <axis = 1> (a, x) }""",
    "the branches of an If, each a sigmoid": """<ir_version: 8, opset_import: ["" : 17]>
        g (bool c, float[B, 5] x) => (float[B, 5] y) {
            y = If (c) <then_branch = t () => (float[B, 5] a) { a = Sigmoid (x) },
                        else_branch = e () => (float[B, 5] b) { h = Neg (x)  b = Sigmoid (h) }> }""",
    "a mean of softmaxes, and a layer norm": """<ir_version: 8, opset_import: ["" : 17]>
        g (float[B, T, 5] x, float[5] w) => (float[B, 5] m, float[B, T, 5] n) {
            p = Softmax (x)
            m = ReduceMean <axes = [1], keepdims = 0> (p)
            n = LayerNormalization <axis = -1> (x, w) }""",
}
BUILT = {"gated_lm": gated_lm, "gate_in_branch": gate_in_branch, "se_cnn": se_cnn, "blockdrop_cnn": blockdrop_cnn,
         "float_gated": float_gated}


@pytest.mark.parametrize("name", [*TEXTS, *BUILT, *ZOO])
def test_the_graph_models_readings_are_the_protos(name):
    model = model_of(TEXTS[name]) if name in TEXTS else BUILT[name]() if name in BUILT else onnx.load(
        FIXTURES / name / "model.onnx")
    loaded = load_model(model, weights=False)
    from_proto = read_outputs(loaded.model)
    from_graph = read_outputs(loaded.model, graph_model=build_graph(loaded.model))
    assert from_graph == from_proto
    assert len(from_proto) == len(loaded.model.graph.output)
    if name in TEXTS:  # each graph here says something of its outputs
        assert any(k.kind is not None for k in from_proto.values()), from_proto
