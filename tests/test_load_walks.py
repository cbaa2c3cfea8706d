"""The loader lists a model's graph and bodies once for the passes that read each, and lists them
again where nodes are moved, added or copied."""

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper

import graphaudit.load.model as loader
import graphaudit.load.protos as protos
from graphaudit.load.inference import INFER_WEIGHTS_OVER
from graphaudit.load.model import load_model
from graphaudit.testing.synthetic import transformer_graph


def test_a_model_without_bodies_is_walked_for_them_once(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    model = transformer_graph(layers=2)
    onnx.save(model, str(path))
    walks: list[int] = []
    bodies = protos._bodies
    walk = loader.walk_graphs

    def counted(nodes):
        walks.append(len(nodes))
        return bodies(nodes)

    def counted_walk(graph):
        walks.append(len(graph.node))
        return walk(graph)

    monkeypatch.setattr(protos, "_bodies", counted)
    monkeypatch.setattr(loader, "walk_graphs", counted_walk)
    loaded = load_model(path, weights=False)
    # one walk reads every node for the checks of names, domains and fused operators; the bodies are
    # looked for among the nodes that may hold one: none here
    assert walks == [len(model.graph.node), 0]
    assert loaded.shape_inference_ok


def test_the_walk_reads_each_graph_and_body_in_order_with_its_nodes_fields():
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
    g (float[3] x, bool c) => (float[3] y) {
        z = If (c) <
            then_branch = t () => (float[3] tb) {
                tb = If (c) < then_branch = tt () => (float[3] ttb) { ttb = Neg (x) },
                              else_branch = te () => (float[3] teb) { teb = Abs (x) } >
            },
            else_branch = e () => (float[3] eb) { eb = Identity (x) }
        >
        y = custom.Op (z)
    }""")
    walked = protos.walk_graphs(model.graph)
    assert [id(g) for g in walked.graphs] == [id(g) for g in protos.graphs(model.graph)]
    assert [g.name for g in walked.graphs] == ["g", "t", "tt", "te", "e"]
    assert walked.fields[0] == [(n.name, n.op_type, n.domain) for n in model.graph.node]
    assert [[op for _, op, _ in fields] for fields in walked.fields] == [["If", "Op"], ["If"], ["Neg"], ["Abs"], ["Identity"]]
    assert walked.domains() == {"", "custom"}


def test_the_bodies_an_inlined_call_brings_are_inferred():
    """The If exists only once its function is inlined: the graphs are listed again after
    inlining, so the values of its branches are typed by inference too."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    g (float[3] x, bool c) => (float[3] y) {
        y = local.F (x, c)
    }
    <domain: "local", opset_import: ["" : 17]>
    F (a, k) => (b) {
        b = If (k) <
            then_branch = t () => (float[3] tb) { n = Neg (a)  tb = Abs (n) },
            else_branch = e () => (float[3] eb) { eb = Identity (a) }
        >
    }""")
    # a weight past INFER_WEIGHTS_OVER: inference runs on a copy, whose findings are written back body by body
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((INFER_WEIGHTS_OVER // 4 + 1,), np.float32), "w"))
    loaded = load_model(model)
    assert loaded.inlined_calls == 1
    (switch,) = [n for n in loaded.model.graph.node if n.op_type == "If"]
    then = next(a.g for a in switch.attribute if a.name == "then_branch")
    (neg,) = [n for n in then.node if n.op_type == "Neg"]
    negated = [v for v in then.value_info if v.name == neg.output[0]]
    assert negated and [d.dim_value for d in negated[0].type.tensor_type.shape.dim] == [3]
