"""Tiny graphs for the profiler's tests (tests/test_profile_models.py checks them against
ONNX's reference evaluator).

`dynamic_model` has one block of each kind the profile must tell apart, named by scope:

- `/block0/...`  always runs (MatMul + bias + Relu);
- `/block1/...`  inside the else-branch of an If that skips it when the mean of the input
  exceeds `EXIT_THRESHOLD` (a value-dependent branch, like EarlyExit);
- `/moe/...`     a router picks the tokens whose score is positive (NonZero), only those rows
  go through the expert (GatherND → MatMul) and come back by ScatterND (real dispatch,
  input-dependent token counts, like MoE);
- `/loop/...`    a Loop body run twice per input (a node with several events per run);
- `/head/...`    the output projection.
"""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphaudit.testing.synthetic import transformer_graph

TOKENS, WIDTH = 6, 8
EXIT_THRESHOLD = 0.5
BLOCK_PREFIXES = ("/block0/", "/block1/", "/moe/", "/loop/")


def _weight(name, rows, cols, seed):
    values = np.random.default_rng(seed).normal(0, 0.5, (rows, cols)).astype(np.float32)
    return helper.make_tensor(name, TensorProto.FLOAT, [rows, cols], values.ravel().tolist())


def dynamic_model() -> onnx.ModelProto:
    """The graph described in the module docstring: x (1, TOKENS, WIDTH) → y, same shape."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    node = helper.make_node
    skip = helper.make_graph(
        [node("Identity", ["h0"], ["skipped"], name="/block1/skip")], "exit_early", [],
        [helper.make_tensor_value_info("skipped", f, [1, TOKENS, WIDTH])])
    run_block1 = helper.make_graph(
        [node("MatMul", ["h0", "w1"], ["m1"], name="/block1/MatMul"),
         node("Relu", ["m1"], ["r1"], name="/block1/Relu"),
         node("Add", ["h0", "r1"], ["ran"], name="/block1/Add")], "run_late_blocks", [],
        [helper.make_tensor_value_info("ran", f, [1, TOKENS, WIDTH])])
    body = helper.make_graph(
        [node("Add", ["carried", "one"], ["carried_out"], name="/loop/Add"),
         node("Identity", ["cond_in"], ["cond_out"], name="/loop/cond")], "loop_body",
        [helper.make_tensor_value_info("iter", i64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("carried", f, [1, TOKENS, WIDTH])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("carried_out", f, [1, TOKENS, WIDTH])])
    nodes = [
        node("MatMul", ["x", "w0"], ["m0"], name="/block0/MatMul"),
        node("Add", ["m0", "b0"], ["a0"], name="/block0/Add"),
        node("Relu", ["a0"], ["h0"], name="/block0/Relu"),
        node("ReduceMean", ["x"], ["mean"], name="/exit/ReduceMean", keepdims=0),
        node("Greater", ["mean", "threshold"], ["exits"], name="/exit/Greater"),
        node("If", ["exits"], ["h1"], name="/exit/If", then_branch=skip, else_branch=run_block1),
        node("Reshape", ["h1", "flat_shape"], ["flat"], name="/moe/Reshape"),
        node("MatMul", ["flat", "wr"], ["score"], name="/moe/router/MatMul"),
        node("Squeeze", ["score", "last_axis"], ["score1"], name="/moe/router/Squeeze"),
        node("Greater", ["score1", "zero"], ["picked"], name="/moe/router/Greater"),
        node("NonZero", ["picked"], ["nz"], name="/moe/NonZero"),
        node("Transpose", ["nz"], ["index"], name="/moe/Transpose", perm=[1, 0]),
        node("GatherND", ["flat", "index"], ["rows"], name="/moe/GatherND"),
        node("MatMul", ["rows", "we"], ["expert"], name="/moe/expert/MatMul"),
        node("ScatterND", ["flat", "index", "expert"], ["mixed"], name="/moe/ScatterND"),
        node("Reshape", ["mixed", "full_shape"], ["h2"], name="/moe/Reshape_1"),
        node("Loop", ["trips", "keep_going", "h2"], ["h3"], name="/loop/Loop", body=body),
        node("MatMul", ["h3", "wh"], ["y"], name="/head/MatMul"),
    ]
    inits = [
        _weight("w0", WIDTH, WIDTH, 0), helper.make_tensor("b0", f, [WIDTH], [0.1] * WIDTH),
        _weight("w1", WIDTH, WIDTH, 1), _weight("wr", WIDTH, 1, 2), _weight("we", WIDTH, WIDTH, 3),
        _weight("wh", WIDTH, WIDTH, 4),
        helper.make_tensor("threshold", f, [], [EXIT_THRESHOLD]), helper.make_tensor("zero", f, [], [0.0]),
        helper.make_tensor("one", f, [], [1.0]), helper.make_tensor("trips", i64, [], [2]),
        helper.make_tensor("keep_going", TensorProto.BOOL, [], [True]),
        helper.make_tensor("last_axis", i64, [1], [1]),
        helper.make_tensor("flat_shape", i64, [2], [TOKENS, WIDTH]),
        helper.make_tensor("full_shape", i64, [3], [1, TOKENS, WIDTH]),
    ]
    graph = helper.make_graph(nodes, "dynamic", [helper.make_tensor_value_info("x", f, [1, TOKENS, WIDTH])],
                              [helper.make_tensor_value_info("y", f, [1, TOKENS, WIDTH])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def dense_model() -> onnx.ModelProto:
    """A baseline taking the same input: block0 and the head only."""
    model = dynamic_model()
    keep = [n for n in model.graph.node if n.name.startswith(("/block0/", "/head/"))]
    keep[-1].input[0] = "h0"
    del model.graph.node[:]
    model.graph.node.extend(keep)
    used = {i for n in keep for i in n.input}
    inits = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    return model


def transformer_model() -> onnx.ModelProto:
    """A two-layer decoder ORT's optimiser fuses and renames nodes in (inline weights)."""
    return transformer_graph(layers=2, hidden=16, heads=2, vocab=32, external=None)


def prefix_blocks(mg, prefixes=BLOCK_PREFIXES) -> SimpleNamespace:
    """A BlockMap-shaped table grouping nodes by name prefix (blocks.find_blocks stands in)."""
    blocks = [SimpleNamespace(index=i, name=p.strip("/"), node_ids=tuple(n for n in mg.nodes if n.startswith(p)))
              for i, p in enumerate(prefixes)]
    return SimpleNamespace(blocks=blocks, method="name prefix (tests)")


def feeds_for(count: int = 4) -> np.ndarray:
    """Inputs x, (count, TOKENS, WIDTH): even rows exit early (high mean), odd rows run block1;
    each row has a different mix of signs, so the router picks different token counts."""
    rng = np.random.default_rng(7)
    x = rng.normal(0, 1, (count, TOKENS, WIDTH)).astype(np.float32)
    x -= x.mean(axis=(1, 2), keepdims=True)
    x[0::2] += 2.0
    x[1::2] -= 0.5
    return x


def save_profile_files(folder: Path) -> Path:
    """`folder` holding the dynamic model, its dense baseline and two inputs for both
    (dynamic.onnx, dense.onnx, data.npz): the profile tests' files."""
    onnx.save(dynamic_model(), folder / "dynamic.onnx")
    onnx.save(dense_model(), folder / "dense.onnx")
    np.savez(folder / "data.npz", x=feeds_for(2))
    return folder
