"""The frozen graph's shared prefix (graphaudit.replay.prefix): what no coefficient reaches is cut off,
run once per batch, and the two parts together give what the frozen graph gives."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphaudit.replay.prefix as prefix_module
from graphaudit.analyses.declared_coefficients import Coefficient, declared_coefficients, metadata_entry
from graphaudit.profile.events import parse_profile
from graphaudit.replay.passes import PassResult
from graphaudit.replay.pipeline import replay
from graphaudit.replay.prefix import CutPrefix, PrefixSession
from graphaudit.replay.surgery import Freeze
from graphaudit.runtime.sessions import create_session

from support.models import WIDTH, gated_lm, token_ids
from support.zoo import FIXTURES, ZOO


def _frozen(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    coefs = declared_coefficients(model)
    return Freeze(coefs)(model).model, [c.tensor for c in coefs]


class Counting:
    """A session that counts its runs."""

    def __init__(self, session):
        self.session, self.runs = session, 0

    def run(self, *args):
        self.runs += 1
        return self.session.run(*args)

    def __getattr__(self, name):
        return getattr(self.session, name)


def test_the_nodes_no_coefficient_reaches_are_cut_off_and_run_once_per_batch():
    frozen, coefs = _frozen(gated_lm(layers=2))
    split = CutPrefix(coefs)(frozen).details
    # the embedding and block 0 up to its gate; everything after gate.0 is the rest. The positions
    # (from the input's shape alone) are made again in the rest, not cut: ONNX Runtime folds them
    assert split.cut == ("bt.0", "x0") and split.prefix_inputs == ("input_ids",)
    made_twice = {o for n in split.prefix.graph.node for o in n.output} & {
        o for n in split.suffix.graph.node for o in n.output}
    assert "positions3" in made_twice
    assert {n.name for n in split.prefix.graph.node} >= {"block0/matmul", "block0/tanh"}
    assert "block0/gate" in {n.name for n in split.suffix.graph.node}
    onnx.checker.check_model(split.prefix, full_check=True)
    onnx.checker.check_model(split.suffix, full_check=True)
    whole = create_session(frozen)
    prefix = Counting(create_session(split.prefix))
    session = PrefixSession(split, prefix, create_session(split.suffix))
    assert [o.name for o in session.get_outputs()] == ["logits"]
    assert [i.name for i in session.get_inputs()] == ["input_ids", "gate.0", "gate.1"]
    ids = token_ids(4, seed=3)
    rng = np.random.default_rng(0)
    for _condition in range(3):  # the same input arrays, other coefficients
        gates = {c: rng.random((4, 6, WIDTH)).astype(np.float32) for c in coefs}
        feeds = {"input_ids": ids, **gates}
        np.testing.assert_allclose(session.run(["logits"], feeds)[0], whole.run(["logits"], feeds)[0],
                                   rtol=1e-6, atol=1e-6)
    assert prefix.runs == 1
    session.run(["logits"], {"input_ids": ids.copy(), **gates})  # another array, even of equal values: runs again
    assert prefix.runs == 2


def test_a_graph_output_the_prefix_makes_comes_from_the_prefix():
    model = gated_lm(layers=1)
    model.graph.output.append(helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["batch", "seq", WIDTH]))
    frozen, coefs = _frozen(model)
    split = CutPrefix(coefs)(frozen).details
    assert "x0" in split.cut and split.outputs == ("logits", "x0")
    session = PrefixSession(split, create_session(split.prefix), create_session(split.suffix))
    feeds = {"input_ids": token_ids(2), "gate.0": np.full((2, 6, WIDTH), 0.5, np.float32)}
    whole = create_session(frozen).run(None, feeds)
    ours = session.run(None, feeds)
    assert [o.name for o in session.get_outputs()] == ["logits", "x0"]
    for a, b in zip(ours, whole):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_no_cut_where_the_coefficients_come_before_any_matrix_product():
    # a gate on the input itself: once its controller is gone, nothing comes before it
    rng = np.random.default_rng(0)
    weights = [onnx.numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), n) for n in ("wc", "w")]
    nodes = [helper.make_node("MatMul", ["x", "wc"], ["z"]), helper.make_node("Sigmoid", ["z"], ["gate"]),
             helper.make_node("Mul", ["x", "gate"], ["gated"]), helper.make_node("MatMul", ["gated", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model.metadata_props.append(metadata_entry([Coefficient("gate", "gate", 0, ("batch", "slot"))]))
    frozen, coefs = _frozen(onnx.shape_inference.infer_shapes(model))
    assert [n.op_type for n in frozen.graph.node] == ["Mul", "MatMul"]
    assert CutPrefix(coefs)(frozen).details is None


@pytest.mark.skipif(not ZOO, reason="no zoo fixtures")
@pytest.mark.parametrize("name", ZOO)
def test_the_zoo_replays_alike_with_and_without_the_cut(name, monkeypatch):
    # FeatureGate and MUDD cut after block 0's first computations; MoE's router comes after
    # block 0 (a dense block); EarlyExit's exits decide Ifs: the replay's figures must not move
    folder = FIXTURES / name
    args = (folder / "model.onnx", folder / "calib.npz", folder / "eval.npz")

    def figures():
        doc = replay(*args, threads=1, resamples=50).to_json()
        return {k: v for k, v in doc.items() if k not in ("timing",)}

    made = []
    real = prefix_module.CutPrefix.__call__
    monkeypatch.setattr(prefix_module.CutPrefix, "__call__", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    cut = figures()
    assert made and made[0].modified, "the zoo's frozen graphs all have a prefix worth cutting"
    monkeypatch.setattr(prefix_module.CutPrefix, "__call__", lambda self, model, **k: PassResult(model, False, None))
    whole = figures()
    for condition, values in whole["conditions"].items():
        for key, value in values.items():
            if isinstance(value, float):
                assert cut["conditions"][condition][key] == pytest.approx(value, rel=1e-6, abs=1e-9), (condition, key)
    assert cut["variance"] == whole["variance"]


def test_weights_an_older_ir_lists_among_the_inputs_are_not_asked_of_the_feeds():
    # IR 3 lists every initializer among the graph inputs; the replay feeds no weights
    model = gated_lm(layers=2)
    model.ir_version = 3
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer)
    frozen, coefs = _frozen(model)
    split = CutPrefix(coefs)(frozen).details
    assert split.prefix_inputs == ("input_ids",)
    session = PrefixSession(split, create_session(split.prefix), create_session(split.suffix))
    feeds = {"input_ids": token_ids(2), **{c: np.full((2, 6, WIDTH), 0.5, np.float32) for c in coefs}}
    np.testing.assert_allclose(session.run(["logits"], feeds)[0], create_session(frozen).run(["logits"], feeds)[0],
                               rtol=1e-6, atol=1e-6)


def test_graph_outputs_made_from_shapes_or_passed_through_come_out_of_the_cut_graph():
    # a shape-only output (made again in the rest, never cut) and an input given out as it is
    model = gated_lm(layers=2)
    model.graph.node.append(helper.make_node("Shape", ["input_ids"], ["given_shape"], name="given_shape"))
    model.graph.output.extend([helper.make_tensor_value_info("given_shape", TensorProto.INT64, [2]),
                               helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])])
    frozen, coefs = _frozen(model)
    split = CutPrefix(coefs)(frozen).details
    assert "given_shape" not in split.cut and "input_ids" not in split.cut
    onnx.checker.check_model(split.suffix, full_check=True)
    session = PrefixSession(split, create_session(split.prefix), create_session(split.suffix))
    feeds = {"input_ids": token_ids(3), **{c: np.full((3, 6, WIDTH), 0.25, np.float32) for c in coefs}}
    ours, whole = session.run(None, feeds), create_session(frozen).run(None, feeds)
    assert [o.name for o in session.get_outputs()] == ["logits", "given_shape", "input_ids"]
    for a, b in zip(ours, whole):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_each_part_of_the_cut_graph_is_profiled_where_asked(tmp_path):
    # a benchmark's breakdown by operator (benchmarks/replay_operators.py) profiles the sessions
    # the replay opens: the prefix's file holds its runs only, the rest's one run per call
    model = gated_lm(layers=2)
    coefs = declared_coefficients(model)
    frozen = Freeze(coefs)(model).model
    session = prefix_module.open_frozen(frozen, coefs, ["CPUExecutionProvider"], threads=1,
                                        profile_prefix=tmp_path / "replay")
    assert isinstance(session, PrefixSession)
    ids = token_ids(4, seed=3)
    gates = {c.tensor: np.full((4, 6, WIDTH), 0.5, np.float32) for c in coefs}
    for _condition in range(3):
        session.run(["logits"], {"input_ids": ids, **gates})
    files = {part: Path(getattr(session, part).end_profiling()) for part in ("prefix", "suffix")}
    assert {part: f.name.startswith(f"replay-{part}") for part, f in files.items()} == {"prefix": True, "suffix": True}
    runs = {part: len(parse_profile(f).runs) for part, f in files.items()}
    assert runs == {"prefix": 1, "suffix": 3}
