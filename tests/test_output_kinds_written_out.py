"""Normalisations written out in elementary operators read as the operator they compute.

ONNX defines Softmax and LogSoftmax by function bodies, and what expands them (ONNX's own
expanded test models, jax2tf through tf2onnx, code that writes exp / sum by hand) leaves an
output that no Softmax node makes. Read by operator name, a shipped classifier's probabilities
(Magika's `target_label`: `Exp(z - max) / Expand(Reshape(ReduceSum(...)))`) were scored as
logits, their log-softmax nearly uniform. The expansions here are ONNX's own
(`function_testcase_helper`, as its backend tests make them), the jax2tf spelling is Magika's,
read from its graph.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.test.case.node import function_testcase_helper

from graphaudit.analyses.output_kinds import LOGPROBS, PROBS, REGRESSION, read_outputs
from graphaudit.analyses.written_out import written_out

from support.heads import CLASSES, classes, headed, live_outputs, logits_head, replay_head


def onnx_expansion(op: str, shape, opset: int, x="x", y="y", **attrs) -> list[onnx.NodeProto]:
    """The nodes of ONNX's own function body for `op` on `x`, at the newest body `opset` takes,
    each named `/head/<op type>_<i>`."""
    node = helper.make_node(op, [x], [y], **attrs)
    typed = helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)
    bodies, _ = function_testcase_helper(node, [typed.type], "head", [helper.make_opsetid("", opset)])
    nodes = max(((next(i.version for i in imports if i.domain in ("", "ai.onnx")), nodes)
                 for nodes, imports in bodies if all(i.version <= opset for i in imports)), key=lambda b: b[0])[1]
    for i, n in enumerate(nodes):
        n.name = f"/head/{n.op_type}_{i}"
    return nodes


def _graph(nodes, shape, opset, inits=()) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("shape, axis", [((3, 4, 5), None), ((3, 4, 5), 2), ((3, 4, 5), -1), ((3, 4, 5), 1),
                                         ((3, 4, 5), 0), ((2, 7), None), ((2, 7), 0)])
def test_onnx_s_own_expansion_of_a_softmax_reads_as_the_operator_does(op, opset, shape, axis):
    attrs = {} if axis is None else {"axis": axis}
    expanded = read_outputs(_graph(onnx_expansion(op, shape, opset, **attrs), shape, opset))["y"]
    operator = read_outputs(_graph([helper.make_node(op, ["x"], ["y"], name="/head/op", **attrs)], shape, opset))["y"]
    assert (expanded.kind, expanded.last_axis, expanded.per_value) == \
           (operator.kind, operator.last_axis, operator.per_value)
    assert expanded.kind == (PROBS if op == "Softmax" else LOGPROBS)
    words = "a softmax written out as Exp, ReduceSum and Div" if op == "Softmax" else \
        "a log-softmax written out as Exp, ReduceSum, Log and Sub"
    assert expanded.reason.startswith(words + " over ")


def _jax2tf_softmax(x: str, y: str, shape: list) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Magika's spelling (jax2tf, tf2onnx; here at opset 18+, where ReduceMax takes its axes as an
    input): max and sum reduced without their axis, then reshaped and expanded back."""
    inits = [numpy_helper.from_array(np.array([1], np.int64), "sum.axes"),
             numpy_helper.from_array(np.array([-1, 1], np.int64), "kept.shape"),
             numpy_helper.from_array(np.array(shape, np.int64), "full.shape")]
    nodes = [helper.make_node("ReduceMax", [x, "sum.axes"], ["m"], name="/get_logits/Max", keepdims=0),
             helper.make_node("Reshape", ["m", "kept.shape"], ["m.r"], name="/get_logits/Reshape"),
             helper.make_node("Expand", ["m.r", "full.shape"], ["m.b"], name="/get_logits/BroadcastTo"),
             helper.make_node("Sub", [x, "m.b"], ["d"], name="/get_logits/Sub"),
             helper.make_node("Exp", ["d"], ["e"], name="/get_logits/Exp"),
             helper.make_node("ReduceSum", ["e", "sum.axes"], ["s"], name="/get_logits/Sum", keepdims=0),
             helper.make_node("Reshape", ["s", "kept.shape"], ["s.r"], name="/get_logits/Reshape_1"),
             helper.make_node("Expand", ["s.r", "full.shape"], ["s.b"], name="/get_logits/BroadcastTo_1"),
             helper.make_node("Div", ["e", "s.b"], [y], name="/get_logits/truediv")]
    return nodes, inits


def test_a_softmax_as_jax2tf_writes_it_reads_as_probabilities_over_the_last_axis():
    nodes, inits = _jax2tf_softmax("x", "y", [2, 7])
    read = read_outputs(_graph(nodes, [2, 7], 20, inits))["y"]
    assert (read.kind, read.last_axis) == (PROBS, True)
    assert read.reason == "a softmax written out as Exp, ReduceSum and Div over the last axis at node /get_logits/truediv"


def _sigmoid(x: str, y: str, negate: str, last: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """1 / (1 + exp(-x)): -x by `negate` ("Neg" or "Mul" by -1), the division by `last` ("Reciprocal" or "Div")."""
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(-1.0, np.float32), "minus_one")]
    minus = helper.make_node("Neg", [x], ["nx"], name="/sig/Neg") if negate == "Neg" else \
        helper.make_node("Mul", ["minus_one", x], ["nx"], name="/sig/Mul")
    nodes = [minus, helper.make_node("Exp", ["nx"], ["e"], name="/sig/Exp"),
             helper.make_node("Add", ["e", "one"], ["d"], name="/sig/Add"),
             helper.make_node("Reciprocal", ["d"], [y], name="/sig/Reciprocal") if last == "Reciprocal" else
             helper.make_node("Div", ["one", "d"], [y], name="/sig/Div")]
    return nodes, inits


@pytest.mark.parametrize("negate, last", [("Neg", "Reciprocal"), ("Mul", "Div")])
def test_a_sigmoid_written_out_is_one_probability_per_value(negate, last):
    nodes, inits = _sigmoid("x", "y", negate, last)
    read = read_outputs(_graph(nodes, [2, 7], 17, inits))["y"]
    assert read.bernoulli
    assert read.reason == f"a sigmoid written out as Exp, Add and {last}, one probability per value, at node /sig/{last}"


def test_what_only_looks_like_a_written_out_normalisation_stays_unnormalised():
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    # a sum of other values than those it divides: exp(x) / sum(exp(x * x))
    other = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Mul", ["x", "x"], ["xx"]),
             helper.make_node("Exp", ["xx"], ["e2"]), helper.make_node("ReduceSum", ["e2", "axes"], ["s"]),
             helper.make_node("Div", ["e", "s"], ["y"])]
    # a reduction over no axis at all (noop_with_empty_axes): exp(x) / exp(x)
    noop = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("ReduceSum", ["e"], ["s"], noop_with_empty_axes=1),
            helper.make_node("Div", ["e", "s"], ["y"])]
    # 2 / (1 + exp(-x)): twice a sigmoid, not a probability
    twice = [helper.make_node("Neg", ["x"], ["nx"]), helper.make_node("Exp", ["nx"], ["e"]),
             helper.make_node("Add", ["e", "two"], ["d"]), helper.make_node("Div", ["two", "d"], ["y"])]
    for nodes in (other, noop, twice):
        read = read_outputs(_graph(nodes, [2, 7], 17, [two, axes]))["y"]
        assert read.kind is None, (read.reason, [n.op_type for n in nodes])


def test_a_sum_whose_axes_the_graph_computes_leaves_the_axis_to_the_first_batch():
    # the last axis, as rank - 1 of the input's shape
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Size", ["shape"], ["rank"]),
             helper.make_node("Sub", ["rank", "one"], ["last"]), helper.make_node("Unsqueeze", ["last", "zero"], ["axes"]),
             helper.make_node("Exp", ["x"], ["e"]), helper.make_node("ReduceSum", ["e", "axes"], ["s"]),
             helper.make_node("Div", ["e", "s"], ["y"])]
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array([0], np.int64), "zero")]
    read = read_outputs(_graph(nodes, [2, 7], 17, inits))["y"]
    assert (read.kind, read.last_axis) == (PROBS, None)
    assert read.reason == "a softmax written out as Exp, ReduceSum and Div over axes the graph does not give at node Div -> y"


def test_the_recogniser_names_the_value_normalised_and_its_axes():
    nodes, inits = _jax2tf_softmax("x", "y", [2, 7])
    producers = {o: n for n in nodes for o in n.output}
    values = {t.name: numpy_helper.to_array(t) for t in inits}
    found = written_out(nodes[-1], producers, values.get)
    assert (found.op, found.data, found.summed, found.axes) == ("Softmax", "d", "e", (1,))
    assert written_out(nodes[4], producers, values.get) is None  # the Exp alone normalises nothing


# -- scored on their true scale: the same NLL and KL as the model's logits ----------------------

def onnx_softmax_head():
    return headed(onnx_expansion("Softmax", ["batch", CLASSES], 20, x="z", y="prob", axis=-1), "prob", ["batch", CLASSES])


def onnx_log_softmax_head():
    return headed(onnx_expansion("LogSoftmax", ["batch", CLASSES], 20, x="z", y="logp", axis=-1),
                   "logp", ["batch", CLASSES])


def jax2tf_softmax_head():
    nodes, inits = _jax2tf_softmax("z", "prob", [1, CLASSES])  # broadcast back over the batch by Div
    return headed(nodes, "prob", ["batch", CLASSES], inits)


@pytest.mark.parametrize("build", [onnx_softmax_head, onnx_log_softmax_head, jax2tf_softmax_head])
def test_a_written_out_head_gives_the_nll_and_kl_of_the_same_models_logits(tmp_path, build):
    truth = replay_head(tmp_path / "a", logits_head(), labels=classes)
    written = replay_head(tmp_path / "b", build(), labels=classes)
    assert written.task.kind == "classification" and written.task.read.kind in (PROBS, LOGPROBS)
    assert " written out as " in written.task.read.reason
    live = live_outputs(tmp_path / "b")
    probs = np.exp(live) if written.task.read.kind == LOGPROBS else live
    labels = np.load(tmp_path / "b" / "eval.npz")["labels"]
    nll = -np.log(probs[np.arange(len(labels)), labels]).mean()
    assert written.condition("correct").nll.value == pytest.approx(nll, rel=1e-5)
    for name in ("correct", "cross_input", "static_layer", "global_mean"):
        assert written.condition(name).nll.value == pytest.approx(truth.condition(name).nll.value, rel=1e-5)
        assert written.condition(name).divergence.value == pytest.approx(
            truth.condition(name).divergence.value, rel=1e-3, abs=1e-7)
    assert written.condition("cross_input").divergence.value > 1e-4


# -- feature normalisations written out: features, not logits ---------------------------------

@pytest.mark.parametrize("op, opset", [("LayerNormalization", 17), ("LayerNormalization", 18),
                                       ("RMSNormalization", 23)])
def test_onnx_s_own_expansion_of_a_feature_normalisation_reads_as_features(op, opset):
    node = helper.make_node(op, ["x", "w"], ["y"], axis=-1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [8])
    bodies, _ = function_testcase_helper(node, [x.type, w.type], "norm", [helper.make_opsetid("", opset)])
    nodes = next(nodes for nodes, imports in bodies if imports[0].version == opset)  # its scale flattened, as ONNX writes it
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 8])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(np.ones(8, np.float32), "w")]),
                              opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    read = read_outputs(model)["y"]
    assert read.kind == REGRESSION and read.reason.endswith(": features, not logits")
    assert read.reason.startswith("a layer norm written out as " if op == "LayerNormalization" else
                                  "an RMS norm written out as ")


def _torch_layer_norm(x: str, y: str, affine: bool) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """LayerNorm as torch.onnx.export (TorchScript) writes it below opset 17, over the last axis
    (its constants as Constant nodes, the axes as an attribute, as at opset 11-17)."""
    two = numpy_helper.from_array(np.array(2.0, np.float32))
    eps = numpy_helper.from_array(np.array(1e-5, np.float32))
    nodes = [helper.make_node("ReduceMean", [x], ["mean"], name="/ln/ReduceMean", axes=[-1]),
             helper.make_node("Sub", [x, "mean"], ["centred"], name="/ln/Sub"),
             helper.make_node("Constant", [], ["two"], name="/ln/Constant", value=two),
             helper.make_node("Pow", ["centred", "two"], ["squares"], name="/ln/Pow"),
             helper.make_node("ReduceMean", ["squares"], ["var"], name="/ln/ReduceMean_1", axes=[-1]),
             helper.make_node("Constant", [], ["eps"], name="/ln/Constant_1", value=eps),
             helper.make_node("Add", ["var", "eps"], ["var.eps"], name="/ln/Add"),
             helper.make_node("Sqrt", ["var.eps"], ["std"], name="/ln/Sqrt"),
             helper.make_node("Div", ["centred", "std"], ["normed" if affine else y], name="/ln/Div")]
    inits = []
    if affine:
        inits = [numpy_helper.from_array(np.full(7, 1.5, np.float32), "ln.weight"),
                 numpy_helper.from_array(np.full(7, 0.1, np.float32), "ln.bias")]
        nodes += [helper.make_node("Mul", ["normed", "ln.weight"], ["scaled"], name="/ln/Mul"),
                  helper.make_node("Add", ["scaled", "ln.bias"], [y], name="/ln/Add_1")]
    return nodes, inits


def _torch_rms_norm(x: str, y: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """An RMSNorm as torch writes `w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))`:
    rsqrt as Div(1, Sqrt(...))."""
    consts = {"two": 2.0, "eps": 1e-6, "one": 1.0}
    nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(np.array(v, np.float32)))
             for k, v in consts.items()]
    nodes += [helper.make_node("Pow", [x, "two"], ["squares"], name="/rms/Pow"),
              helper.make_node("ReduceMean", ["squares"], ["ms"], name="/rms/ReduceMean", axes=[-1]),
              helper.make_node("Add", ["ms", "eps"], ["ms.eps"], name="/rms/Add"),
              helper.make_node("Sqrt", ["ms.eps"], ["rms"], name="/rms/Sqrt"),
              helper.make_node("Div", ["one", "rms"], ["inv"], name="/rms/Div"),
              helper.make_node("Mul", [x, "inv"], ["normed"], name="/rms/Mul"),
              helper.make_node("Mul", ["rms.weight", "normed"], [y], name="/rms/Mul_1")]
    return nodes, [numpy_helper.from_array(np.full(7, 2.0, np.float32), "rms.weight")]


@pytest.mark.parametrize("build, words", [
    (lambda: _torch_layer_norm("x", "y", affine=True), "a layer norm written out as ReduceMean, Sub, Pow, ReduceMean, "
                                                       "Sqrt and Div at node /ln/Add_1"),
    (lambda: _torch_layer_norm("x", "y", affine=False), "a layer norm written out as ReduceMean, Sub, Pow, ReduceMean, "
                                                        "Sqrt and Div at node /ln/Div"),
    (lambda: _torch_rms_norm("x", "y"), "an RMS norm written out as Pow, ReduceMean, Sqrt, a reciprocal and Mul at "
                                        "node /rms/Mul_1"),
])
def test_a_layer_norm_or_rms_norm_as_torch_writes_it_below_opset_17_is_features_not_logits(build, words):
    nodes, inits = build()
    read = read_outputs(_graph(nodes, [2, 7], 14, inits))["y"]
    assert (read.kind, read.reason) == (REGRESSION, f"{words}: features, not logits")


def test_what_only_looks_like_a_written_out_norm_stays_unnormalised():
    nodes, inits = _torch_layer_norm("x", "y", affine=True)
    # divided by the root mean square of another value than the one it divides
    other = [helper.make_node("Mul", ["x", "x"], ["xx"], name="/other/Mul")] + \
        [helper.make_node(n.op_type, ["xx" if i == "centred" and n.op_type == "Pow" else i for i in n.input],
                          list(n.output), name=n.name, **{a.name: helper.get_attribute_value(a) for a in n.attribute})
         for n in nodes]
    # the mean of cubes, not of squares
    cubes = [helper.make_node("Constant", [], ["two"], name=n.name, value=numpy_helper.from_array(np.array(3.0, np.float32)))
             if n.op_type == "Constant" and n.output[0] == "two" else n for n in nodes]
    # scaled by a value the input computes, not a weight: (normed * x)
    unweighted = [helper.make_node("Mul", ["normed", "x"], ["scaled"], name="/ln/Mul") if n.name == "/ln/Mul" else n
                  for n in nodes]
    for changed in (other, cubes, unweighted):
        read = read_outputs(_graph(changed, [2, 7], 14, inits))["y"]
        assert read.kind is None, read.reason
