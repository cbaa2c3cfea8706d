"""Names ONNX Runtime gives the nodes it makes, mapped back to the graph as written.

ORT names a node it creates the same in the main graph and in every If / Loop body (`Gelu`,
`gemm_input_reshape`), and names a layout-converted convolution after the tensor it writes
(`relu_1_nchwc`). The tiny graphs here are profiled for real at ORT_ENABLE_ALL; no test
asserts a time.
"""

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model
from graphaudit.profile.breakdown import breakdown
from graphaudit.profile.events import NodeEvent, group_runs, parse_profile, qualified_name
from graphaudit.profile.mapping import assign_blocks, through_optimised
from graphaudit.profile.session import load_optimised, open_session, runnable_model, session_options

from support.profile_models import prefix_blocks

BLOCK0, BLOCK1 = "block0_", "block1_"  # blocks by name prefix

# block0 always runs; block1, inside the If's then-branch, runs when the input's mean is positive.
# MatMul + Add on 3-D inputs become a Gemm between two Reshapes ORT names alike in both graphs.
GATED = """
<ir_version: 9, opset_import: ["" : 17]>
gated (float[1,4,8] x) => (float[1,4,8] y)
<float zero = {0.0}>
{
  [block0_MatMul] m0 = MatMul(x, w0)
  [block0_Add] h = Add(m0, b0)
  [gate_ReduceMean] mean = ReduceMean<keepdims = 0>(x)
  [gate_Greater] runs = Greater(mean, zero)
  [gate_If] y = If(runs) <
      then_branch = run_block1 () => (float[1,4,8] ran) {
          [block1_Relu] r1 = Relu(h)
          [block1_MatMul] m1 = MatMul(r1, w1)
          [block1_Add] ran = Add(m1, b1)
      },
      else_branch = skip_block1 () => (float[1,4,8] skipped) {
          [block1_skip] skipped = Identity(h)
      }>
}
"""

# Three Conv + Relu, named as the dynamo exporter names them; ORT on x86 runs them as NCHWc
# convolutions named after the Relu's output (`relu_1_nchwc`), between Reorder nodes.
CNN = """
<ir_version: 9, opset_import: ["" : 17]>
cnn (float[1,8,8,8] images) => (float[1,16,8,8] relu_2)
{
  [node_conv] conv = Conv<pads = [1, 1, 1, 1]>(images, w0, b0)
  [node_relu] relu = Relu(conv)
  [node_conv_1] conv_1 = Conv<pads = [1, 1, 1, 1]>(relu, w1, b1)
  [node_relu_1] relu_1 = Relu(conv_1)
  [node_conv_2] conv_2 = Conv<pads = [1, 1, 1, 1]>(relu_1, w2, b2)
  [node_relu_2] relu_2 = Relu(conv_2)
}
"""


def _model(text, weights):
    model = onnx.parser.parse_model(text)  # weights, random but fixed, are added here
    rng = np.random.default_rng(0)
    model.graph.initializer.extend(numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
                                   for name, shape in weights.items())
    onnx.checker.check_model(model, full_check=True)
    return model


def gated_model():
    return _model(GATED, {"w0": (8, 8), "b0": (8,), "w1": (8, 8), "b1": (8,)})


def cnn_model():
    return _model(CNN, {"w0": (16, 8, 3, 3), "b0": (16,), "w1": (16, 16, 3, 3), "b1": (16,),
                        "w2": (16, 16, 3, 3), "b2": (16,)})


def _profiled(model, feeds, folder):
    """The runs of `feeds` profiled at ORT_ENABLE_ALL, the optimised graph ORT saved, and the graph run."""
    runnable = runnable_model(load_model(model))
    options = session_options("all", 1, folder / "profile", folder / "optimised.onnx")
    session = open_session(runnable, ["CPUExecutionProvider"], options)
    reference = ReferenceEvaluator(model)
    for feed in feeds:
        (got,) = session.run(None, feed)
        np.testing.assert_allclose(got, reference.run(None, feed)[0], rtol=1e-4, atol=1e-5)
    return parse_profile(session.end_profiling()).runs, load_optimised(folder / "optimised.onnx"), runnable.model


def _names(runs):
    return {ev.name for run in runs for ev in run.events}


def test_names_ort_repeats_in_a_body_are_mapped_through_their_owner(tmp_path):
    rng = np.random.default_rng(1)
    feeds = [{"x": (rng.normal(0, 0.1, (1, 4, 8)) + sign).astype(np.float32)} for sign in (1, -1, 1, -1)]
    runs, optimised, model = _profiled(gated_model(), feeds, tmp_path)
    main = {n.name for n in optimised.graph.node}
    if_node = next(n for n in optimised.graph.node if n.op_type == "If")
    body = {n.name for a in if_node.attribute if a.name == "then_branch" for n in a.g.node}
    shared = main & body
    assert shared, "expected ORT to give its Gemm's Reshapes one name in both graphs"

    mg = build_graph(model)
    node_map = through_optimised(mg, optimised, "ORT_ENABLE_ALL", _names(runs))
    blocks = assign_blocks(mg, prefix_blocks(mg, (BLOCK0, BLOCK1)))
    times = breakdown(runs, node_map, blocks)
    assert times.unmapped_share == 0
    rows = {t.name: t for t in times.nodes}
    for name in shared:
        assert rows[name].block == BLOCK0 and rows[name].calls == 1  # every input
        inside = rows[qualified_name(["gate_If"], name)]
        assert inside.block == BLOCK1 and inside.calls == 0.5  # the inputs that took the branch
    # a name that only one node has keeps it inside the body, its owner beside it
    skips = [ev for run in runs for ev in run.events if ev.name == "block1_skip"]
    assert len(skips) == 2 and all(ev.owners == ("gate_If",) for ev in skips)
    assert blocks.block_of(node_map.node_of("block1_skip")) == BLOCK1


def test_only_names_run_under_more_than_one_chain_of_owners_are_qualified():
    def event(name, ts, dur, op="Relu"):
        return NodeEvent(name, op, "CPUExecutionProvider", ts, dur, 1, None, None, None, None)

    events = [event("Gelu", 0, 10), event("/If", 20, 50, "If"), event("Gelu", 25, 10), event("/blocks.1/Add", 40, 5),
              event("/If_1", 80, 50, "If"), event("/Loop", 85, 40, "Loop"), event("Gelu", 90, 10)]
    (run,), _ = group_runs(events, [(0.0, 150.0)])
    assert [(ev.name, ev.owners) for ev in run.events] == [
        ("Gelu", ()), ("/If", ()), ("/If > Gelu", ("/If",)), ("/blocks.1/Add", ("/If",)),
        ("/If_1", ()), ("/Loop", ("/If_1",)), ("/If_1 > /Loop > Gelu", ("/If_1", "/Loop")),
    ]


def _optimised(nodes, *bodies):
    """An 'optimised' graph as ORT saves one: `nodes`, and an If per body (its then-branch)."""
    owners = [helper.make_node("If", ["c"], [f"{name}_out"], name=name,
                               then_branch=helper.make_graph(body, f"{name}_then", [], []),
                               else_branch=helper.make_graph([], f"{name}_else", [], []))
              for name, body in bodies]
    return helper.make_model(helper.make_graph(nodes + owners, "optimised", [], []))


def test_a_bare_name_inside_bodies_is_mapped_only_when_it_names_one_node():
    mg = build_graph(gated_model())
    gelu = helper.make_node("Gelu", ["r1"], ["m1"], name="Gelu", domain="com.microsoft")
    reshape = helper.make_node("Reshape", ["r1", "shape"], ["r"], name="gemm_input_reshape")
    lone = helper.make_node("Reshape", ["h", "shape"], ["r2"], name="lone_reshape")
    other = helper.make_node("Gelu", ["m1"], ["ran"], name="Gelu", domain="com.microsoft")
    optimised = _optimised([], ("gate_If", [gelu, reshape, lone]), ("later_If", [other]))
    node_map = through_optimised(mg, optimised, "ORT_ENABLE_ALL")
    assert node_map.node_of("gate_If > Gelu") == "block1_MatMul"  # writes m1
    assert node_map.node_of("later_If > Gelu") == "block1_Add"  # writes ran
    assert node_map.node_of("Gelu") is None  # two nodes in two bodies: which one ran is unknown
    assert node_map.node_of("lone_reshape") == node_map.node_of("gate_If > lone_reshape") == "block0_Add"
    top = helper.make_node("Reshape", ["m0", "shape"], ["r0"], name="gemm_input_reshape")
    node_map = through_optimised(mg, _optimised([top], ("gate_If", [reshape])), "ORT_ENABLE_ALL")
    assert node_map.node_of("gemm_input_reshape") == "block0_MatMul"  # the main graph's, which always runs
    assert node_map.node_of("gate_If > gemm_input_reshape") == "block1_Relu"


def test_layout_converted_convolutions_are_matched_by_the_tensor_they_are_named_after(tmp_path):
    feeds = [{"images": np.random.default_rng(2).normal(size=(1, 8, 8, 8)).astype(np.float32)}]
    runs, optimised, model = _profiled(cnn_model(), feeds, tmp_path)
    converted = {n.name for n in optimised.graph.node if n.name.endswith("_nchwc")}
    if not converted:
        pytest.skip("this CPU has no NCHWc kernels: ORT kept the convolutions as they were")
    assert {"relu_nchwc", "relu_1_nchwc"} <= converted
    mg = build_graph(model)
    node_map = through_optimised(mg, optimised, "ORT_ENABLE_ALL", _names(runs))
    assert node_map.node_of("relu_nchwc") == "node_relu" and node_map.node_of("relu_1_nchwc") == "node_relu_1"
    assert node_map.how["relu_1_nchwc"] == "renamed" and node_map.fused["relu_1_nchwc"] == "Conv"
    assert all(node_map.node_of(name) is not None for name in _names(runs))


def test_names_made_from_a_tensor_or_node_name_and_a_suffix():
    mg = build_graph(cnn_model())
    optimised = _optimised([
        helper.make_node("Conv", ["t0", "w"], ["t1"], name="relu_1_nchwc_token_7", domain="com.microsoft.nchwc"),
        helper.make_node("Conv", ["t1", "w"], ["t2"], name="conv_2_nhwc", domain="com.microsoft"),
        helper.make_node("Relu", ["t2"], ["t3"], name="node_relu_2_token_3"),
        helper.make_node("Identity", ["t3"], ["t4"], name="unknown_nchwc"),
    ])
    node_map = through_optimised(mg, optimised, "ORT_ENABLE_ALL")
    assert node_map.node_of("relu_1_nchwc_token_7") == "node_relu_1"
    assert node_map.node_of("conv_2_nhwc") == "node_conv_2"
    assert node_map.node_of("node_relu_2_token_3") == "node_relu_2"
    assert node_map.node_of("unknown_nchwc") is None
    assert node_map.counts()["renamed"] == 3
