"""How often each expert is chosen: the routers found in the graph, and the shares counted from the cache.

The shares are checked against the model itself: the MoE zoo model's TopK indices, exposed as
graph outputs and run in ONNX Runtime on the evaluation inputs, counted per layer, expert and
position. Tiny graphs check which operators between a coefficient and its chooser keep the choice.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.analyses.routing import Choice, router_choices, routing_shares
from graphaudit.load.model import load_for_runtime
from graphaudit.replay.pipeline import replay, resolve
from graphaudit.report import render

from support.report_samples import document, featuregate
from support.zoo import FIXTURES

MOE = FIXTURES / "moe"
E = 4


@pytest.fixture(scope="module")
def moe_replay():
    if not (MOE / "model.onnx").is_file():
        pytest.skip("zoo fixture moe is not built (python -m exporters.build --out fixtures)")
    return replay(MOE / "model.onnx", MOE / "calib.npz", MOE / "eval.npz", resamples=20)


def test_the_moe_routers_are_found_with_their_k_and_the_others_have_none():
    loaded = load_for_runtime(MOE / "model.onnx")
    found = router_choices(loaded.model, resolve(loaded))
    assert {t: (c.k, c.op, c.size) for t, c in found.items()} == {"router.1": (2, "TopK", E),
                                                                   "router.3": (2, "TopK", E)}
    for name in ("featuregate", "mudd", "earlyexit"):
        other = load_for_runtime(FIXTURES / name / "model.onnx")
        assert router_choices(other.model, resolve(other)) == {}


def test_the_shares_are_the_experts_the_model_itself_chose(moe_replay):
    routing = moe_replay.to_json()["routing"]["router"]
    loaded = load_for_runtime(MOE / "model.onnx")
    choices = router_choices(loaded.model, resolve(loaded))
    model = onnx.load(str(MOE / "model.onnx"))
    chooser = {n.name: n for n in model.graph.node}
    indices = [chooser[choices[f"router.{layer}"].node].output[1] for layer in routing["layers"]]
    model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in indices)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.load(MOE / "eval.npz")["input_ids"]
    picked = session.run(indices, {"input_ids": ids})  # (inputs * positions, k) each
    inputs, positions = ids.shape
    for layer, chosen, share, by_position in zip(routing["layers"], picked, routing["share"], routing["by_position"]):
        counts = np.zeros((positions, E))
        for row, experts in enumerate(chosen.reshape(inputs, positions, -1).reshape(-1, chosen.shape[-1])):
            counts[row % positions, experts] += 1
        np.testing.assert_allclose(share, counts.sum(axis=0) / (inputs * positions), atol=1e-6, err_msg=f"layer {layer}")
        np.testing.assert_allclose(by_position, (counts / inputs).T, atol=1e-6, err_msg=f"layer {layer}")
        assert sum(share) == pytest.approx(2.0, abs=1e-5)  # k experts per token


def _graph(*nodes, rank: int = 3, extra=()) -> onnx.ModelProto:
    shape = ["b", "t", E][:rank] if rank != 2 else ["bt", E]
    graph = helper.make_graph(list(nodes), "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              initializer=[helper.make_tensor("k", TensorProto.INT64, [1], [2]), *extra])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _coefficient(rank: int = 3) -> Coefficient:
    return Coefficient("r", "router", 0, ("batch", "token", "expert")[:rank] if rank == 3 else ("batch*token", "expert"))


@pytest.mark.parametrize(("nodes", "extra", "expected"), [
    ([helper.make_node("TopK", ["r", "k"], ["out", "i"])], (), Choice(2, "TopK", "")),
    ([helper.make_node("ArgMax", ["r"], ["out"], axis=-1)], (), Choice(1, "ArgMax", "")),
    ([helper.make_node("Softmax", ["r"], ["p"], axis=-1), helper.make_node("TopK", ["p", "k"], ["out", "i"])], (),
     Choice(2, "TopK", "")),
    ([helper.make_node("Reshape", ["r", "s"], ["v"]), helper.make_node("TopK", ["v", "k"], ["out", "i"])],
     (helper.make_tensor("s", TensorProto.INT64, [2], [-1, E]),), Choice(2, "TopK", "", E)),
    # not a choice among the experts of each token:
    ([helper.make_node("TopK", ["r", "k"], ["out", "i"], largest=0)], (), None),  # the smallest
    ([helper.make_node("TopK", ["r", "k"], ["out", "i"], axis=1)], (), None),  # over the tokens
    ([helper.make_node("Softmax", ["r"], ["p"], axis=1), helper.make_node("TopK", ["p", "k"], ["out", "i"])], (),
     None),  # a softmax over another axis changes the order along the experts
    ([helper.make_node("Reshape", ["r", "s"], ["v"]), helper.make_node("TopK", ["v", "k"], ["out", "i"])],
     (helper.make_tensor("s", TensorProto.INT64, [1], [-1]),), None),  # every value of the input at once
    ([helper.make_node("Relu", ["r"], ["p"]), helper.make_node("TopK", ["p", "k"], ["out", "i"])], (), None),
])
def test_which_operators_keep_the_choice(nodes, extra, expected):
    nodes = [helper.make_node("Identity", ["x"], ["r"]), *nodes]
    for i, node in enumerate(nodes):
        node.name = f"n{i}"
    found = router_choices(_graph(*nodes, extra=extra), [_coefficient()]).get("r")
    if expected is None:
        assert found is None
    else:
        assert (found.k, found.op, found.size) == (expected.k, expected.op, expected.size)


def test_padded_positions_are_not_counted_and_a_reshape_of_another_size_is_not_a_router():
    from graphaudit.replay.shards import merged_cache

    c = _coefficient()
    values = np.zeros((2, 3, E), dtype=np.float32)
    values[:, :, 0] = 1.0  # every token takes expert 0 first
    values[0, :, 1], values[1, :, 2] = 0.5, 0.5  # then input 0 takes expert 1, input 1 expert 2
    cache = merged_cache([c], {"r": values})
    tokens = np.array([[True, True, True], [True, True, False]])
    shares = routing_shares(cache, {"r": Choice(2, "TopK", "n")}, tokens=tokens)["router"]
    assert shares["share"] == [[1.0, 0.6, 0.4, 0.0]]  # 5 tokens: 3 of input 0, 2 of input 1
    # expert 1 at each position: input 0 of both, then of the one input there (input 1 is padded at position 2)
    assert shares["by_position"][0][1] == [0.5, 0.5, 1.0]
    assert shares["by_position"][0][2] == [0.5, 0.5, 0.0]
    assert routing_shares(cache, {"r": Choice(2, "TopK", "n", size=E + 1)}) == {}


def test_the_html_report_draws_how_often_each_expert_is_chosen_not_a_mean_of_one_over_e(moe_replay):
    static, _, profile = featuregate()
    replayed = moe_replay.to_json()
    page = render(document((static, replayed, profile)), "html")
    figure = page[page.index('<figure id="coefficient-means"'):]
    figure = figure[:figure.index("</figure>")]
    assert "router: share of tokens routed to each expert (top-2); an even split is 50.0%" in figure
    assert "router layer 1: share of inputs routing each token position" in figure
    assert "mean coefficient by layer" not in figure  # 0.25 everywhere: what a softmax over 4 experts means to
