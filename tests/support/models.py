"""Tiny ONNX models built with onnx.helper, with their inputs, for the runtime tests.

`gated_lm`: a byte-level "language model" small enough to read. Per layer i a controller
computes `gate.i = Sigmoid(x·Wg_i + bg_i)`, shape (batch, token, feature), and the block
adds `gate.i ⊙ tanh(causal_mean(x)·W_i)` to the residual stream; CumSum makes each token
see the ones before it, so token order matters. `mixing_lm`: a MUDD-like model whose
coefficient `mix.0` has axes (way, batch, token, source), the batch not first. Both declare
their coefficients in the metadata. `se_cnn`, `blockdrop_cnn` and `dynamic_conv`: image
classifiers whose coefficients have no token axis, nothing declared. `float_gated`: one gated
block on float inputs, for the bad-input tests. tests/test_replay_models.py checks the
builders themselves: checker-clean, and ONNX Runtime agreeing with onnx.reference.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graphaudit.analyses.declared_coefficients import Coefficient, declared_coefficients, metadata_entry
from graphaudit.load.data import from_arrays, input_specs
from graphaudit.replay.surgery import Trace

VOCAB, WIDTH = 11, 4  # every model here is WIDTH features wide


def _weights(rng: np.random.Generator, name: str, *shape: int, scale: float = 1.0) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _finish(nodes, inits, name: str, coefficients, extra_outputs=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB]), *extra_outputs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    if coefficients:
        model.metadata_props.append(metadata_entry(coefficients))
    onnx.checker.check_model(model, full_check=True)
    return model


def _embed_and_causal(rng, nodes, inits) -> str:
    inits += [_weights(rng, "emb", VOCAB, WIDTH), _weights(rng, "head", WIDTH, VOCAB),
              numpy_helper.from_array(np.array(1, dtype=np.int64), "axis1"),
              numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")]
    nodes.append(helper.make_node("Gather", ["emb", "input_ids"], ["x0"], name="embed"))
    # positions 1..T along the token axis, for a causal mean
    nodes += [helper.make_node("Shape", ["input_ids"], ["ids_shape"], name="shape"),
              helper.make_node("ConstantOfShape", ["ids_shape"], ["ones"], name="ones",
                               value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
              helper.make_node("CumSum", ["ones", "axis1"], ["positions"], name="positions"),
              helper.make_node("Unsqueeze", ["positions", "axis_last"], ["positions3"], name="positions3")]
    inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis_last"))
    return "x0"


def gated_lm(layers: int = 2, seed: int = 0) -> onnx.ModelProto:
    """A gated causal LM with coefficients gate.0 … gate.{layers-1} of shape (batch, token, feature)."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = _embed_and_causal(rng, nodes, inits)
    for i in range(layers):
        inits += [_weights(rng, f"wg.{i}", WIDTH, WIDTH), _weights(rng, f"bg.{i}", WIDTH, scale=0.5),
                  _weights(rng, f"w.{i}", WIDTH, WIDTH)]
        nodes += [
            helper.make_node("MatMul", [x, f"wg.{i}"], [f"gh.{i}"], name=f"gate{i}/matmul"),
            helper.make_node("Add", [f"gh.{i}", f"bg.{i}"], [f"gz.{i}"], name=f"gate{i}/add"),
            helper.make_node("Sigmoid", [f"gz.{i}"], [f"gate.{i}"], name=f"gate{i}/sigmoid"),
            helper.make_node("CumSum", [x, "axis1"], [f"cs.{i}"], name=f"block{i}/cumsum"),
            helper.make_node("Div", [f"cs.{i}", "positions3"], [f"cm.{i}"], name=f"block{i}/mean"),
            helper.make_node("MatMul", [f"cm.{i}", f"w.{i}"], [f"bh.{i}"], name=f"block{i}/matmul"),
            helper.make_node("Tanh", [f"bh.{i}"], [f"bt.{i}"], name=f"block{i}/tanh"),
            helper.make_node("Mul", [f"gate.{i}", f"bt.{i}"], [f"gated.{i}"], name=f"block{i}/gate"),
            helper.make_node("Add", [x, f"gated.{i}"], [f"x.{i + 1}"], name=f"block{i}/residual"),
        ]
        x = f"x.{i + 1}"
    nodes.append(helper.make_node("MatMul", [x, "head"], ["logits"], name="head"))
    coefficients = [Coefficient(f"gate.{i}", "gate", i, ("batch", "token", "feature")) for i in range(layers)]
    return _finish(nodes, inits, "gated_lm", coefficients)


def with_a_large_weight(model: onnx.ModelProto, seed: int = 5, scale: float = 1.0) -> onnx.ModelProto:
    """`model` (gated_lm's output layout: a `head` node making `logits`) whose logits move by the
    mean of `big`, a weight past HANDED_OVER: one the replay hands its sessions as an array and a
    profile reading the model's file holds as a stub."""
    from graphaudit.runtime.handed_weights import HANDED_OVER

    big = (np.random.default_rng(seed).standard_normal(HANDED_OVER // 4 + 16) * scale).astype(np.float32)
    graph = model.graph
    head = next(n for n in graph.node if n.name == "head")
    head.output[0] = "logits.head"
    graph.initializer.append(numpy_helper.from_array(big, "big"))
    graph.node.extend([helper.make_node("ReduceMean", ["big"], ["big.mean"], name="big/mean", keepdims=0),
                       helper.make_node("Add", ["logits.head", "big.mean"], ["logits"], name="big/add")])
    return model


def mixing_lm(seed: int = 0) -> onnx.ModelProto:
    """A model whose coefficient mix.0 has axes (way, batch, token, source): batch on axis 1."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = _embed_and_causal(rng, nodes, inits)
    inits += [_weights(rng, "w1", WIDTH, WIDTH), _weights(rng, "wc", WIDTH, 6),
              numpy_helper.from_array(np.array([0, 0, 2, 3], dtype=np.int64), "mix_shape"),
              numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0")]
    nodes += [
        helper.make_node("CumSum", [x, "axis1"], ["cs"], name="block/cumsum"),
        helper.make_node("Div", ["cs", "positions3"], ["cm"], name="block/mean"),
        helper.make_node("MatMul", ["cm", "w1"], ["bh"], name="block/matmul"),
        helper.make_node("Tanh", ["bh"], ["x1"], name="block/tanh"),
        helper.make_node("MatMul", ["x1", "wc"], ["mz"], name="mix/matmul"),
        helper.make_node("Reshape", ["mz", "mix_shape"], ["mr"], name="mix/reshape"),
        helper.make_node("Softmax", ["mr"], ["ms"], name="mix/softmax", axis=-1),
        helper.make_node("Transpose", ["ms"], ["mix.0"], name="mix/transpose", perm=[2, 0, 1, 3]),
        helper.make_node("Unsqueeze", [x, "axis0"], ["s0"], name="stack/s0"),
        helper.make_node("Unsqueeze", ["x1", "axis0"], ["s1"], name="stack/s1"),
        helper.make_node("Unsqueeze", ["cm", "axis0"], ["s2"], name="stack/s2"),
        helper.make_node("Concat", ["s0", "s1", "s2"], ["sources"], name="stack/concat", axis=0),
        helper.make_node("Einsum", ["mix.0", "sources"], ["streams"], name="mix/apply", equation="cbts,sbtd->cbtd"),
        helper.make_node("ReduceSum", ["streams", "axis0"], ["x2"], name="mix/sum", keepdims=0),
        helper.make_node("MatMul", ["x2", "head"], ["logits"], name="head"),
    ]
    return _finish(nodes, inits, "mixing_lm", [Coefficient("mix.0", "mix", 0, ("way", "batch", "token", "source"))])


def gate_in_branch() -> onnx.ModelProto:
    """A model whose coefficient `gate.b` is computed inside the then-branch of an If."""
    then = helper.make_graph(
        [helper.make_node("Sigmoid", ["x0"], ["gate.b"], name="branch/sigmoid"),
         helper.make_node("Mul", ["gate.b", "x0"], ["y_then"], name="branch/mul")],
        "then", [], [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x0"], ["y_else"], name="else/identity")],
                              "else", [], [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, None)])
    rng = np.random.default_rng(0)
    inits = [_weights(rng, "emb", VOCAB, WIDTH), _weights(rng, "head", WIDTH, VOCAB)]
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["x0"], name="embed"),
             helper.make_node("ReduceMean", ["x0"], ["m"], name="mean", keepdims=0),
             helper.make_node("Constant", [], ["zero"], name="zero", value_float=0.0),
             helper.make_node("Greater", ["m", "zero"], ["cond"], name="cond"),
             helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then, else_branch=other),
             helper.make_node("MatMul", ["y", "head"], ["logits"], name="head")]
    return _finish(nodes, inits, "gate_in_branch", [Coefficient("gate.b", "gate", 0, ("batch", "token", "feature"))])


def save_heavy_pair(folder: Path, heavy: Callable[..., onnx.ModelProto]) -> Path:
    """`folder`, holding model.onnx and dense.onnx (gated_lm's layout, seeds apart, each given a
    weight past HANDED_OVER by `heavy`, called with the model and a `seed`) and eval.npz (six
    token sequences): a model and its baseline for the profile's tests on inline weights."""
    onnx.save(heavy(gated_lm()), folder / "model.onnx")
    onnx.save(heavy(gated_lm(seed=3), seed=7), folder / "dense.onnx")
    np.savez(folder / "eval.npz", input_ids=token_ids(6, seed=2))
    return folder


def token_ids(count: int, length: int = 6, seed: int = 0) -> np.ndarray:
    """`count` random token sequences of `length` for the language models, (count, length) int64."""
    return np.random.default_rng(seed).integers(0, VOCAB, (count, length), dtype=np.int64)


def run_ort(model: onnx.ModelProto, feeds: dict, outputs=None) -> list[np.ndarray]:
    """The `outputs` (all by default) of `model` run by ONNX Runtime on the CPU."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, feeds)


def traced(build, count=10, seed=0):
    """The trace graph of `build()`, its declared coefficients, and `count` token inputs for it."""
    model = build()
    coefs = declared_coefficients(model)
    trace = Trace(coefs)(model).model
    data = from_arrays({"input_ids": token_ids(count, seed=seed)}, input_specs(model))
    return trace, coefs, data


def se_cnn(blocks: int = 2, seed: int = 0, channels: int = 4, classes: int = 3) -> onnx.ModelProto:
    """A tiny CNN classifier whose blocks scale their feature maps (batch, channels, h, w) by a
    squeeze-and-excitation gate `se.i` of shape (batch, channels): coefficients without a token
    axis, nothing declared (for detection)."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "spatial"),
             _weights(rng, "head", channels, classes)]
    x = "pixels"
    for i in range(blocks):
        inits += [_weights(rng, f"conv.{i}", channels, channels, 1, 1, scale=0.5),
                  _weights(rng, f"se.{i}.w", channels, channels)]
        nodes += [
            helper.make_node("Conv", [x, f"conv.{i}"], [f"c.{i}"], name=f"/blocks.{i}/conv/Conv"),
            helper.make_node("Relu", [f"c.{i}"], [f"r.{i}"], name=f"/blocks.{i}/Relu"),
            helper.make_node("ReduceMean", [f"r.{i}", "spatial"], [f"m.{i}"], name=f"/blocks.{i}/se/ReduceMean",
                             keepdims=0),
            helper.make_node("MatMul", [f"m.{i}", f"se.{i}.w"], [f"z.{i}"], name=f"/blocks.{i}/se/MatMul"),
            helper.make_node("Sigmoid", [f"z.{i}"], [f"se.{i}"], name=f"/blocks.{i}/se/Sigmoid"),
            helper.make_node("Unsqueeze", [f"se.{i}", "spatial"], [f"g.{i}"], name=f"/blocks.{i}/se/Unsqueeze"),
            helper.make_node("Mul", [f"r.{i}", f"g.{i}"], [f"s.{i}"], name=f"/blocks.{i}/se/Mul"),
            helper.make_node("Add", [x, f"s.{i}"], [f"x.{i + 1}"], name=f"/blocks.{i}/Add"),
        ]
        x = f"x.{i + 1}"
    return _finish_images(nodes + _pooled_head(x, "pooled"), inits, "se_cnn", channels, classes)


def blockdrop_cnn(blocks: int = 3, seed: int = 0, channels: int = 4, classes: int = 3) -> onnx.ModelProto:
    """BlockDrop densified: a policy network looks at the image once and gives every block its
    keep probability, `policy` (batch, blocks) = σ(pool(pixels)·Wp); block i scales its residual
    branch by its column, policy[:, i] (a Gather of a constant index), viewed as (batch, 1, 1, 1).
    Nothing declared (for detection)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "spatial"),
             numpy_helper.from_array(np.array([-1, 1, 1, 1], dtype=np.int64), "view"),
             _weights(rng, "policy.w", channels, blocks), _weights(rng, "head", channels, classes)]
    nodes = [helper.make_node("ReduceMean", ["pixels", "spatial"], ["pooled"], name="/policy/ReduceMean", keepdims=0),
             helper.make_node("MatMul", ["pooled", "policy.w"], ["pl"], name="/policy/MatMul"),
             helper.make_node("Sigmoid", ["pl"], ["policy"], name="/policy/Sigmoid")]
    x = "pixels"
    for i in range(blocks):
        inits += [_weights(rng, f"conv.{i}", channels, channels, 1, 1, scale=0.5),
                  numpy_helper.from_array(np.array(i, dtype=np.int64), f"column.{i}")]
        nodes += [
            helper.make_node("Gather", ["policy", f"column.{i}"], [f"keep.{i}"], name=f"/Gather_{i}", axis=1),
            helper.make_node("Reshape", [f"keep.{i}", "view"], [f"k.{i}"], name=f"/Reshape_{i}"),
            helper.make_node("Conv", [x, f"conv.{i}"], [f"c.{i}"], name=f"/blocks.{i}/conv/Conv"),
            helper.make_node("Relu", [f"c.{i}"], [f"r.{i}"], name=f"/blocks.{i}/Relu"),
            helper.make_node("Mul", [f"k.{i}", f"r.{i}"], [f"s.{i}"], name=f"/Mul_{i}"),
            helper.make_node("Add", [x, f"s.{i}"], [f"x.{i + 1}"], name=f"/Add_{i}"),
        ]
        x = f"x.{i + 1}"
    return _finish_images(nodes + _pooled_head(x, "pooled.out"), inits, "blockdrop", channels, classes)


def dynamic_conv(seed: int = 0, channels: int = 4, kernels: int = 2, classes: int = 3) -> onnx.ModelProto:
    """A dynamic 1x1 convolution (CondConv / DyConv): attention π = Softmax(pool(x)·Wa) over
    `kernels` stacked weights mixes them into one weight per input, W = Σ_k π_k W_k, applied to
    the feature map by a batched MatMul; π, shape (batch, kernels), is the coefficient. Nothing
    declared (for detection)."""
    rng = np.random.default_rng(seed)
    c, k = channels, kernels
    inits = [numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "spatial"),
             _weights(rng, "attention", c, k), _weights(rng, "stack", k, c * c, scale=0.5),
             numpy_helper.from_array(np.array([-1, c, c], dtype=np.int64), "per_input"),
             numpy_helper.from_array(np.array([0, c, -1], dtype=np.int64), "flat_map"),
             _weights(rng, "head", c, classes)]
    nodes = [
        helper.make_node("ReduceMean", ["pixels", "spatial"], ["pooled"], name="/dyconv/ReduceMean", keepdims=0),
        helper.make_node("MatMul", ["pooled", "attention"], ["att"], name="/dyconv/attention/MatMul"),
        helper.make_node("Softmax", ["att"], ["pi"], name="/dyconv/attention/Softmax", axis=-1),
        helper.make_node("MatMul", ["pi", "stack"], ["mixed"], name="/dyconv/MatMul"),
        helper.make_node("Reshape", ["mixed", "per_input"], ["kernel"], name="/dyconv/Reshape"),
        helper.make_node("Reshape", ["pixels", "flat_map"], ["flat"], name="/dyconv/Reshape_1"),
        helper.make_node("MatMul", ["kernel", "flat"], ["conv"], name="/dyconv/MatMul_1"),
        helper.make_node("ReduceMean", ["conv", "last"], ["summary"], name="/head/ReduceMean", keepdims=0),
        helper.make_node("MatMul", ["summary", "head"], ["logits"], name="/head/MatMul"),
    ]
    inits.append(numpy_helper.from_array(np.array([2], dtype=np.int64), "last"))
    return _finish_images(nodes, inits, "dynamic_conv", c, classes)


def _pooled_head(features: str, pooled: str) -> list[onnx.NodeProto]:
    """The classifier's head: `features` averaged over space (into `pooled`), times `head`."""
    return [helper.make_node("ReduceMean", [features, "spatial"], [pooled], name="/head/ReduceMean", keepdims=0),
            helper.make_node("MatMul", [pooled, "head"], ["logits"], name="/head/MatMul")]


def _finish_images(nodes, inits, name: str, channels: int, classes: int) -> onnx.ModelProto:
    """An image classifier's graph: (batch, channels, 5, 5) `pixels` in, (batch, classes) `logits` out."""
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", channels, 5, 5])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    return model


def float_gated(log_in_controller: bool = False, custom_op: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x (batch, seq, 4) float -> y = x + gate.0 * act(x W), gate.0 = Sigmoid(f(x) Wg), declared.

    `log_in_controller` makes f = Log, so the controller yields NaN for any input with a
    negative entry (the data itself is finite); `custom_op` makes act an `acme.Frob` that
    ONNX Runtime lacks (the graph is valid, the runtime cannot run it)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "wg"),
             numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w")]
    act = helper.make_node("Frob", ["h"], ["t"], name="block0/act", domain="acme") if custom_op else \
        helper.make_node("Tanh", ["h"], ["t"], name="block0/act")
    nodes = [helper.make_node("Log" if log_in_controller else "Identity", ["x"], ["fx"], name="ctl/f"),
             helper.make_node("MatMul", ["fx", "wg"], ["gz"], name="ctl/matmul"),
             helper.make_node("Sigmoid", ["gz"], ["gate.0"], name="ctl/sigmoid"),
             helper.make_node("MatMul", ["x", "w"], ["h"], name="block0/matmul"),
             act,
             helper.make_node("Mul", ["gate.0", "t"], ["g"], name="block0/gate"),
             helper.make_node("Add", ["x", "g"], ["y"], name="block0/residual")]
    graph = helper.make_graph(nodes, "float_gated",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
                              initializer=inits)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("acme", 1)] if custom_op else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    model.metadata_props.append(metadata_entry([Coefficient("gate.0", "gate", 0, ("batch", "token", "feature"))]))
    onnx.checker.check_model(model)
    return model


def float_data(count: int = 8, seed: int = 0) -> np.ndarray:
    """Positive inputs for `float_gated` (Log is finite on them)."""
    return np.random.default_rng(seed).uniform(0.5, 2.0, (count, 5, WIDTH)).astype(np.float32)
