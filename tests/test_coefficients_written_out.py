"""A gate or mix whose sigmoid or softmax is written out in elementary operators is detected as
the operator's would be (a jax2tf or hand-written `1 / (1 + exp(-x))`, `exp(z) / sum(exp(z))`),
and a SiLU written out, `x * (1 / (1 + exp(-x)))`, is no more a gate than `x * Sigmoid(x)`.
The models are the support models with their Sigmoid / Softmax node replaced by those nodes."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from graphaudit.analyses.coefficients import resolve_coefficients
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model
from graphaudit.replay.pipeline import replay

from support.models import dynamic_conv, se_cnn


def _spelled_sigmoid(x: str, y: str, name: str, one: str, negate: str, last: str) -> list[onnx.NodeProto]:
    """1 / (1 + exp(-x)) from `x` to `y`: -x by `negate` (Neg, or Mul by the constant -1), the
    division by `last` (Reciprocal, or Div of the constant `one`)."""
    minus = helper.make_node("Neg", [x], [f"{y}.neg"], name=f"{name}/Neg") if negate == "Neg" else \
        helper.make_node("Mul", [x, "minus_one"], [f"{y}.neg"], name=f"{name}/Mul")
    return [minus, helper.make_node("Exp", [f"{y}.neg"], [f"{y}.exp"], name=f"{name}/Exp"),
            helper.make_node("Add", [one, f"{y}.exp"], [f"{y}.den"], name=f"{name}/Add"),
            helper.make_node("Reciprocal", [f"{y}.den"], [y], name=f"{name}/Reciprocal") if last == "Reciprocal"
            else helper.make_node("Div", [one, f"{y}.den"], [y], name=f"{name}/Div")]


def _replaced(model: onnx.ModelProto, op: str, spell) -> onnx.ModelProto:
    """`model` with each `op` node replaced by the nodes `spell(node)` gives, in its place."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for node in out.graph.node:
        nodes += spell(node) if node.op_type == op else [node]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _with_constants(model: onnx.ModelProto, as_node: bool) -> onnx.ModelProto:
    """The constants 1 and -1 the written-out sigmoids read, as Constant nodes or as initializers."""
    values = {"one": 1.0, "minus_one": -1.0}
    if as_node:
        constants = [helper.make_node("Constant", [], [name], name=f"/const/{name}",
                                      value=numpy_helper.from_array(np.array(v, np.float32)))
                     for name, v in values.items()]
        nodes = constants + list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    else:
        model.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.float32), name) for name, v in values.items())
    onnx.checker.check_model(model, full_check=True)
    return model


def _detected(model: onnx.ModelProto):
    loaded = load_model(model, weights=False)
    return [(c.tensor, c.family, c.layer, c.axes) for c in resolve_coefficients(loaded, build_graph(loaded.model))]


@pytest.mark.parametrize("negate, last, as_node", [("Neg", "Reciprocal", True), ("Mul", "Div", False),
                                                   ("Neg", "Div", True)])
def test_squeeze_excitation_gates_written_out_are_detected_as_the_sigmoids_are(negate, last, as_node):
    model = _with_constants(_replaced(se_cnn(), "Sigmoid", lambda n: _spelled_sigmoid(
        n.input[0], n.output[0], n.name, "one", negate, last)), as_node)
    assert "Sigmoid" not in {n.op_type for n in model.graph.node}
    assert _detected(model) == _detected(se_cnn()) == [(f"se.{i}", "gate", i, ("batch", "slot")) for i in range(2)]


def _silu_before_excitation(spell: bool) -> onnx.ModelProto:
    """se_cnn with a SiLU on each block's squeezed vector, (batch, channels), before the excitation's
    MatMul: x * Sigmoid(x), or written out, x * (1 / (1 + exp(-x)))."""
    def silu(node):
        if node.op_type != "MatMul" or "/se/" not in node.name:
            return [node]
        x, y = node.input[0], f"{node.input[0]}.silu"
        sig = _spelled_sigmoid(x, f"{y}.sig", node.name + "/act", "one", "Neg", "Reciprocal") if spell else \
            [helper.make_node("Sigmoid", [x], [f"{y}.sig"], name=node.name + "/act/Sigmoid")]
        matmul = helper.make_node("MatMul", [y, node.input[1]], list(node.output), name=node.name)
        return sig + [helper.make_node("Mul", [x, f"{y}.sig"], [y], name=node.name + "/act/Mul"), matmul]

    return _with_constants(_replaced(se_cnn(), "MatMul", silu), as_node=False)


def test_a_silu_written_out_is_no_more_a_gate_than_one_with_a_sigmoid():
    # the product meets the sigmoid's own input: an activation, not a gate
    assert _detected(_silu_before_excitation(spell=True)) == _detected(_silu_before_excitation(spell=False)) \
        == _detected(se_cnn())


def _spelled_softmax(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """exp(z - max) / sum(exp(z - max)) over the last axis, as ONNX's function body writes it (opset 18+)."""
    z, y, name = node.input[0], node.output[0], node.name
    return [helper.make_node("ReduceMax", [z, "last_axis"], [f"{y}.max"], name=f"{name}/ReduceMax", keepdims=1),
            helper.make_node("Sub", [z, f"{y}.max"], [f"{y}.sub"], name=f"{name}/Sub"),
            helper.make_node("Exp", [f"{y}.sub"], [f"{y}.exp"], name=f"{name}/Exp"),
            helper.make_node("ReduceSum", [f"{y}.exp", "last_axis"], [f"{y}.sum"], name=f"{name}/ReduceSum", keepdims=1),
            helper.make_node("Div", [f"{y}.exp", f"{y}.sum"], [y], name=f"{name}/Div")]


def test_a_dynamic_convolutions_kernel_attention_written_out_is_detected_and_replayed(tmp_path):
    model = _replaced(dynamic_conv(), "Softmax", _spelled_softmax)
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "last_axis"))
    onnx.checker.check_model(model, full_check=True)
    assert _detected(model) == _detected(dynamic_conv()) and _detected(model)[0][:2] == ("pi", "mix")
    onnx.save(model, tmp_path / "model.onnx")
    rng = np.random.default_rng(3)
    for name, count in (("calib", 12), ("eval", 10)):
        np.savez(tmp_path / f"{name}.npz", pixels=rng.standard_normal((count, 4, 5, 5)).astype(np.float32),
                 labels=rng.integers(0, 3, count))
    report = replay(tmp_path / "model.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=20)
    assert [c.tensor for c in report.coefficients] == ["pi"] and report.parity.ok
    assert report.condition("cross_input").delta_nll.value != 0.0


def test_a_switch_routers_softmax_written_out_is_the_router_and_its_dispatch_still_a_subset():
    from support.switch_moe import switch
    from support.text_graphs import audit, verdicts

    plain = switch()
    spelled = plain.replace(
        '["/model/layers.1/mlp/Softmax"] p = Softmax <axis = -1> (logits)',
        '["/model/layers.1/mlp/ReduceMax_0"] mx = ReduceMax <keepdims = 1> (logits, last)\n'
        '        ["/model/layers.1/mlp/Sub_0"] sh = Sub (logits, mx)\n'
        '        ["/model/layers.1/mlp/Exp"] ex = Exp (sh)\n'
        '        ["/model/layers.1/mlp/ReduceSum_0"] sm = ReduceSum <keepdims = 1> (ex, last)\n'
        '        ["/model/layers.1/mlp/Div"] p = Div (ex, sm)')
    assert spelled != plain and "Softmax" not in spelled
    for text in (plain, spelled):
        report = audit(text, shapes={"x0": [8, 2]})
        assert verdicts(report) == ["always", "subset", "always"]
        assert [(c.tensor, c.family, c.layer) for c in report.coefficients] == [("p", "router", 1)]
