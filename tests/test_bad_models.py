"""Bad model files: one line naming what was expected and what was found, exit 1, file unchanged."""

import hashlib

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper

from graphaudit.cli import main
from graphaudit.errors import GraphAuditError
from graphaudit.load.model import load_model
from graphaudit.runtime.sessions import create_session, custom_operators, resolve_providers
from graphaudit.testing.synthetic import transformer_graph

from support.cli import sha


def tiny(nodes, opset=17, domains=(), outputs=("y",)):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2]) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]
                              + [helper.make_opsetid(d, 1) for d in domains])
    model.ir_version = 8
    return model


BAD_MODELS = {
    "cycle": (tiny([helper.make_node("Relu", ["b"], ["a"], name="ra"), helper.make_node("Relu", ["a"], ["b"], name="rb"),
                    helper.make_node("Add", ["x", "b"], ["y"], name="add")]), "a cycle through nodes r[ab] -> r[ab]"),
    "dangling": (tiny([helper.make_node("Add", ["x", "nope"], ["y"], name="add")]),
                 "node add reads 'nope', which no node, input or initializer defines"),
    "duplicate-output": (tiny([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]),
                         "single static assignment"),
    "opset-too-new": (tiny([helper.make_node("Relu", ["x"], ["y"])], opset=onnx.defs.onnx_opset_version() + 5),
                      "expected an ai.onnx opset up to"),
    "unknown-standard-op": (tiny([helper.make_node("Frobnicate", ["x"], ["y"])]), "No Op registered for Frobnicate"),
}


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_bad_model_is_one_line_exit_1_and_untouched(tmp_path, capsys, case):
    model, message = BAD_MODELS[case]
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    before = sha(path)
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(path)])
    err = capsys.readouterr().err
    assert info.value.code == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "expected" in err
    import re
    assert re.search(message, err), err
    assert sha(path) == before


def test_ir_version_too_new(tmp_path):
    model = tiny([helper.make_node("Relu", ["x"], ["y"])])
    model.ir_version = onnx.IR_VERSION + 3
    with pytest.raises(GraphAuditError, match="expected an ONNX IR version up to"):
        load_model(model)


def test_custom_operator_loads_but_runtime_names_it():
    model = tiny([helper.make_node("Frob", ["x"], ["y"], domain="acme", name="f")], domains=["acme"])
    loaded = load_model(model)  # the graph is fine: static analysis can proceed
    assert custom_operators(loaded.model) == ["acme.Frob"]
    with pytest.raises(GraphAuditError, match=r"found acme\.Frob, which it lacks; the static audit"):
        create_session(loaded.model)


def test_an_operator_runtime_has_for_other_types_is_named_with_the_types_it_was_given():
    """ONNX Runtime implements Max for some element types only: the error names the ones given."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (int16[2] a, int16[2] b) => (int16[2] y) { y = Max (a, b) }""")
    with pytest.raises(GraphAuditError, match=r"^expected operators ONNX Runtime implements, found Max\(13\) on "
                                              r"int16 inputs, which it lacks; the static audit"):
        create_session(load_model(model).model)


def test_custom_operator_inside_a_subgraph_is_found():
    then = helper.make_graph([helper.make_node("Frob", ["x"], ["t"], domain="acme")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    model = tiny([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                  helper.make_node("Cast", ["s"], ["c"], to=TensorProto.BOOL),
                  helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], domains=["acme"])
    assert custom_operators(model) == ["acme.Frob"]


def test_cuda_asked_for_without_cuda_is_a_clear_error():
    import onnxruntime as ort
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA")
    with pytest.raises(GraphAuditError, match="expected ONNX Runtime with the CUDAExecutionProvider"):
        resolve_providers("cuda")
    assert resolve_providers("auto") == ["CPUExecutionProvider"]


def test_session_runs_a_good_model():
    session = create_session(transformer_graph(layers=1, hidden=8, heads=2, vocab=11, external=None))
    (out,) = session.run(None, {"input_ids": np.zeros((1, 3), np.int64)})
    assert out.shape == (1, 3, 11)


@pytest.mark.parametrize("command", ["inspect", "static"])
def test_non_utf8_name_inside_an_if_branch_is_refused(tmp_path, capsys, command):
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"], name="QQQQNAME")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    model = tiny([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                  helper.make_node("Cast", ["s"], ["c"], to=TensorProto.BOOL),
                  helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString().replace(b"QQQQNAME", b"\xff\xfeQQNAME"))
    before = sha(path)
    with pytest.raises(SystemExit) as info:
        main([command, str(path)])
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.count("\n") == 1
    assert "expected node and value names that are UTF-8 text" in err
    assert sha(path) == before


def test_custom_operator_inside_a_local_function_is_found():
    body = helper.make_graph([helper.make_node("Frob", ["a"], ["t"], domain="acme")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["a"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    function = helper.make_function(
        "local", "Maybe", ["a", "c"], ["b"],
        [helper.make_node("If", ["c"], ["b"], then_branch=body, else_branch=other)],
        [helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
    model = tiny([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                  helper.make_node("Cast", ["s"], ["c"], to=TensorProto.BOOL),
                  helper.make_node("Maybe", ["x", "c"], ["y"], domain="local")], domains=["acme", "local"])
    model.functions.append(function)
    assert custom_operators(model) == ["acme.Frob"]


def test_nodes_out_of_order_are_put_in_order_not_refused(tmp_path):
    # an acyclic graph written out of order (ONNX Runtime's float16 converter appends its Casts
    # at the end): ONNX Runtime runs it; the loader puts its nodes in order, in memory only
    model = tiny([helper.make_node("Add", ["a", "x"], ["y"], name="add"), helper.make_node("Relu", ["x"], ["a"], name="relu"),
                  helper.make_node("Neg", ["x"], ["unused"], name="neg")])
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)
    path = tmp_path / "unsorted.onnx"
    onnx.save(model, path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    loaded = load_model(path)
    assert [n.name for n in loaded.model.graph.node] == ["relu", "add", "neg"]  # moved only what had to move
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    (y,) = create_session(loaded.model).run(None, {"x": np.array([1.0, -2.0], np.float32)})
    assert y.tolist() == [2.0, -2.0]
