"""The graph model on tiny graphs written in ONNX text syntax."""

import numpy as np
import onnx
import onnx.parser
from onnx.reference import ReferenceEvaluator

from graphaudit.graph.build import build_graph
from graphaudit.graph.model import TensorRef
from graphaudit.load.model import load_model

NESTED_IF = """
<ir_version: 8, opset_import: ["" : 17]>
nested (float[N] x, bool c1, bool c2) => (float[N] y) {
    w = Constant <value = float[1] {2.0}> ()
    y = If (c1) <
        then_branch = g1 () => (float[N] t1) {
            t1 = If (c2) <
                then_branch = g2 () => (float[N] a) { a = Mul (x, w) },
                else_branch = g3 () => (float[N] b) { b = Add (x, w) }
            >
        },
        else_branch = g4 () => (float[N] e1) { e1 = Neg (x) }
    >
}
"""

LOOP_OUTER = """
<ir_version: 8, opset_import: ["" : 17]>
looped (int64 n, float[2] x0, float[2] step) => (float[2] xf) {
    cond = Constant <value = bool {1}> ()
    xf = Loop (n, cond, x0) <
        body = body (int64 i, bool c, float[2] x) => (bool c_out, float[2] x_out) {
            c_out = Identity (c)
            x_out = Add (x, step)
        }
    >
}
"""

FUNCTION_CALL = """
<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
withfn (float[N] x) => (float[N] y) {
    h = local.Twice (x)
    y = local.Twice (h)
}
<domain: "local", opset_import: ["" : 17]>
Twice (a) => (b) {
    two = Constant <value = float {2.0}> ()
    b = Mul (a, two)
}
"""

NAMES = """
<ir_version: 8, opset_import: ["" : 17]>
names (float[N] x) => (float[N] z) {
    [dup] a = Relu (x)
    [dup] b = Neg (a)
    c = Abs (b)
    [last] z = Abs (c)
}
"""


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


def test_nested_if_nodes_know_their_scope_chain():
    model = parse(NESTED_IF)
    out = ReferenceEvaluator(model).run(None, {"x": np.array([1.0, 2.0], np.float32),
                                               "c1": np.array(True), "c2": np.array(False)})
    np.testing.assert_allclose(out[0], [3.0, 4.0])  # the fixture computes what it says

    mg = build_graph(load_model(model).model)
    by_op = {}
    for n in mg.nodes.values():
        by_op.setdefault(n.op_type, []).append(n)
    outer_if, inner_if = sorted(by_op["If"], key=lambda n: n.depth)
    mul = by_op["Mul"][0]
    assert [s.kind for s in mul.scopes] == ["then_branch", "then_branch"]
    assert [s.owner for s in mul.scopes] == [outer_if.id, inner_if.id]
    assert mul.describe_scope() == (
        f"then-branch of If `{inner_if.id}`, inside then-branch of If `{outer_if.id}`"
    )
    assert by_op["Neg"][0].scopes[0].kind == "else_branch"
    # x is read from the main graph two levels down; w comes from the Constant node.
    w_node = by_op["Constant"][0]
    edge = mg.graph.get_edge_data(w_node.id, mul.id)
    assert [e["via"] for e in edge.values()] == ["outer"]
    # Results of the inner branches flow back into their If.
    vias = {d["via"] for _, _, d in mg.graph.in_edges(inner_if.id, data=True)}
    assert vias == {"subgraph_output"}
    assert mg.inside(outer_if.id) and len(mg.inside(inner_if.id)) == 2
    assert mg.graph.number_of_nodes() == 6


def test_edges_are_listed_as_the_nodes_read_them():
    # Drawn from the node and tensor tables on first use: each node's inputs in node order,
    # a body's results flowing back to their owner right after the body's last node.
    mg = build_graph(load_model(parse(NESTED_IF)).model)
    assert list(mg.nodes) == ["Constant#1", "If#1", "If#2", "Mul#1", "Add#1", "Neg#1"]
    then2, else2 = "If#1/then_branch/If#2/then_branch", "If#1/then_branch/If#2/else_branch"
    assert list(mg.edge_records) == [
        ("Constant#1", "Mul#1", None, TensorRef("w"), "outer"),
        ("Mul#1", "If#2", f"{then2}->a", TensorRef("a", then2), "subgraph_output"),
        ("Constant#1", "Add#1", None, TensorRef("w"), "outer"),
        ("Add#1", "If#2", f"{else2}->b", TensorRef("b", else2), "subgraph_output"),
        ("If#2", "If#1", "If#1/then_branch->t1", TensorRef("t1", "If#1/then_branch"), "subgraph_output"),
        ("Neg#1", "If#1", "If#1/else_branch->e1", TensorRef("e1", "If#1/else_branch"), "subgraph_output"),
    ]
    # the graph's own inputs (x, c1, c2) come from no node: no edge
    assert mg.graph.number_of_edges() == 6


def test_loop_body_reads_an_outer_tensor():
    model = parse(LOOP_OUTER)
    mg = build_graph(load_model(model).model)
    add = next(n for n in mg.nodes.values() if n.op_type == "Add")
    loop = next(n for n in mg.nodes.values() if n.op_type == "Loop")
    assert add.scopes[0].kind == "body" and add.scopes[0].owner == loop.id
    # `step` is a main-graph input read inside the body; `x` is the body's own input.
    assert add.inputs[1] == TensorRef("step")
    assert mg.tensors[add.inputs[0]].kind == "subgraph_input"
    assert mg.tensors[add.inputs[0]].producer == loop.id
    assert add.inputs[0].scope == f"{loop.id}/body"
    assert mg.consumers(TensorRef("step")) == [add]
    assert ("step" in mg.graph.graph) is False
    assert any(d["via"] == "subgraph_output" for _, _, d in mg.graph.in_edges(loop.id, data=True))
    import networkx as nx
    assert nx.is_directed_acyclic_graph(mg.graph)


def test_function_calls_are_expanded_per_call_site():
    model = parse(FUNCTION_CALL)
    out = ReferenceEvaluator(model).run(None, {"x": np.array([1.5], np.float32)})
    np.testing.assert_allclose(out[0], [6.0])
    mg = build_graph(load_model(model, inline=False).model)
    calls = [n for n in mg.nodes.values() if n.op_type == "Twice"]
    muls = [n for n in mg.nodes.values() if n.op_type == "Mul"]
    assert len(calls) == 2 and len(muls) == 2
    for call in calls:
        inner = mg.inside(call.id)
        assert {n.op_type for n in inner} == {"Constant", "Mul"}
        assert all(n.scopes[-1].describe() == f"function Twice called by `{call.id}`" for n in inner)
    first, second = sorted(calls, key=lambda n: n.outputs[0].name)  # "h" < "y"
    mul_in_second = next(n for n in mg.inside(second.id) if n.op_type == "Mul")
    # The formal parameter `a` of the second call is the first call's result `h`.
    assert mul_in_second.inputs[0] == TensorRef("h")
    data = mg.graph.get_edge_data(first.id, mul_in_second.id)
    assert [d["via"] for d in data.values()] == ["function_input"]
    assert len(set(mg.nodes)) == 6


def test_missing_and_repeated_names_get_unique_ids():
    model = parse(NAMES)
    model.graph.node[3].name = "Abs#1"  # the id a naive suffix would give the unnamed Abs
    mg = build_graph(model)
    ids = list(mg.nodes)
    assert len(ids) == len(set(ids)) == 4
    names = [n.name for n in mg.nodes.values()]
    assert names == ["dup", "dup", "", "Abs#1"]
    # Repeated names get suffixes; the unnamed Abs does not take the id a real node holds.
    assert ids[0] != ids[1] and ids[0].startswith("dup") and ids[1].startswith("dup")
    assert ids[3] == "Abs#1" and ids[2] != "Abs#1" and ids[2].startswith("Abs")
    a, b = ids[0], ids[1]
    assert mg.graph.has_edge(a, b)
    assert mg.producer(TensorRef("z")).id == "Abs#1"


def test_shapes_from_inference_keep_symbolic_dims():
    mg = build_graph(load_model(parse(NESTED_IF)).model)
    assert mg.tensors[TensorRef("x")].shape == ("N",)
    assert mg.tensors[TensorRef("y")].shape == ("N",)
    assert mg.inputs == (TensorRef("x"), TensorRef("c1"), TensorRef("c2"))


def test_a_node_compares_and_hashes_without_its_proto():
    """Node is a named tuple; equality and hashing leave out the NodeProto, as they did when it
    was a dataclass (a NodeProto has no hash), and so does its repr."""
    from graphaudit.graph.build import build_graph as built
    from graphaudit.testing.synthetic import transformer_graph

    first, again = (built(transformer_graph(layers=1, hidden=8, heads=2, vocab=13)) for _ in range(2))
    node = next(iter(first.nodes.values()))
    twin = again.nodes[node.id]
    assert node.proto is not twin.proto
    assert node == twin and (node != twin) is False and hash(node) == hash(twin)
    assert len({node, twin}) == 1
    assert node != node._replace(op_type="Other") and node != tuple(node)
    assert "proto" not in repr(node) and repr(node).startswith("Node(id=")
    info = first.tensors[node.outputs[0]]
    assert (info.kind, info.producer) == ("node_output", node.id)
