"""Coefficients whose batch and token share one axis (`batch*token`, batch-major), as a MoE
router computes them once its input is flattened (`hidden.view(-1, hidden_size)`): detected
when the flattening merged a (batch, token, ...) tensor, split into batch and token for the
cache and the conditions, merged again to be fed. A model that computes its gates that way
replays exactly as the same model computing them per (batch, token)."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from graphaudit.analyses.declared_coefficients import Coefficient, metadata_entry
from graphaudit.analyses.named_coefficients import split_entry
from graphaudit.analyses.static import audit_static
from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.load.model import load_model
from graphaudit.replay.capture import batch_first, native
from graphaudit.replay.pipeline import replay
from graphaudit.vocabulary import MERGED

from support.models import WIDTH, gated_lm, token_ids

CONDITIONS = ("correct", "cross_input", "token_shuffle", "static_layer", "static_position", "global_mean")


def relu_gated_lm(layers: int = 2) -> onnx.ModelProto:
    """gated_lm whose blocks end in Relu instead of Tanh: the gate is the only squashed tensor in
    the model, and with these weights its token shuffle raises the NLL (with Tanh it lowers it)."""
    model = gated_lm(layers)
    for node in model.graph.node:
        if node.op_type == "Tanh":
            node.op_type = "Relu"
    return model


def flat_gated_lm(layers: int = 2, token_major: bool = False) -> onnx.ModelProto:
    """relu_gated_lm with each gate computed on the tokens flattened to rows (batch·token,
    feature), then reshaped back to (batch, token, feature) where it weights the block; no
    metadata. `token_major`: flatten (token, batch, feature) instead, so rows are t·B + b."""
    model = relu_gated_lm(layers)
    del model.metadata_props[:]
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.array([-1, WIDTH], dtype=np.int64), "rows_shape"))
    graph.initializer.append(numpy_helper.from_array(np.array([1, 0, 2], dtype=np.int64), "perm_unused"))
    nodes = list(graph.node)
    for i in range(layers):
        matmul = next(n for n in nodes if n.name == f"gate{i}/matmul")
        mul = next(n for n in nodes if n.name == f"block{i}/gate")
        x = matmul.input[0]
        source = x
        before = [helper.make_node("Shape", [x], [f"xs.{i}"], name=f"gate{i}/shape")]
        if token_major:
            before.append(helper.make_node("Transpose", [x], [f"xt.{i}"], name=f"gate{i}/transpose", perm=[1, 0, 2]))
            source = f"xt.{i}"
        before.append(helper.make_node("Reshape", [source, "rows_shape"], [f"xf.{i}"], name=f"gate{i}/flatten"))
        matmul.input[0] = f"xf.{i}"
        mul.input[0] = f"gate.{i}_tokens"
        after = helper.make_node("Reshape", [f"gate.{i}", f"xs.{i}"], [f"gate.{i}_tokens"], name=f"gate{i}/unflatten")
        if token_major:  # back from (token, batch) rows: reshape to (T, B, W), then transpose
            after = [helper.make_node("Gather", [f"xs.{i}", "perm_unused"], [f"ts.{i}"], name=f"gate{i}/tshape"),
                     helper.make_node("Reshape", [f"gate.{i}", f"ts.{i}"], [f"gt.{i}"], name=f"gate{i}/unflatten"),
                     helper.make_node("Transpose", [f"gt.{i}"], [f"gate.{i}_tokens"], name=f"gate{i}/back",
                                      perm=[1, 0, 2])]
        at = nodes.index(matmul)
        nodes[at:at] = before
        at = nodes.index(mul)
        nodes[at:at] = after if isinstance(after, list) else [after]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("merged")
    np.savez(folder / "calib.npz", input_ids=token_ids(10, seed=1))
    np.savez(folder / "eval.npz", input_ids=token_ids(8, seed=2))
    return folder


def test_merged_rows_split_into_batch_and_token_and_back():
    c = Coefficient("r", "router", 0, (MERGED, "expert"))
    rows = np.arange(3 * 5 * 4).reshape(15, 4)  # 3 inputs of 5 tokens, batch-major
    first = batch_first(c, rows, 3)
    assert first.shape == (3, 5, 4) and (first[1, 2] == rows[1 * 5 + 2]).all()
    assert (native(c, first) == rows).all()
    with pytest.raises(GraphAuditError, match=r"expected coefficient 'r' to hold 4 inputs' tokens on its "
                                              r"'batch\*token' axis 0, found shape \(15, 4\)"):
        batch_first(c, rows, 4)
    assert split_entry("r=batch*token,expert") == ("r", (MERGED, "expert"))
    with pytest.raises(UsageError, match="one 'batch\\*token' axis for both"):
        split_entry("r=batch*token,token")


def test_a_gate_on_flattened_tokens_is_detected_with_a_merged_axis():
    report = audit_static(load_model(flat_gated_lm()))
    assert [(c.tensor, c.family, c.layer, c.axes, c.source) for c in report.coefficients] == [
        (f"gate.{i}", "gate", i, (MERGED, "slot"), "detected") for i in range(2)]


def test_tokens_flattened_sequence_first_are_not_taken_for_batch_major():
    # rows t·B + b: splitting them as b·T + t would hand each input other inputs' coefficients
    assert audit_static(load_model(flat_gated_lm(token_major=True))).coefficients == ()


def test_replay_with_a_merged_axis_equals_the_replay_per_batch_and_token(tmp_path, data):
    onnx.save(relu_gated_lm(), tmp_path / "declared.onnx")
    onnx.save(flat_gated_lm(), tmp_path / "flat.onnx")
    ours, flat = (replay(tmp_path / f"{name}.onnx", data / "calib.npz", data / "eval.npz", conditions=CONDITIONS,
                         resamples=50, batch_size=3) for name in ("declared", "flat"))
    assert flat.parity.ok
    assert [c.axes for c in flat.coefficients] == [(MERGED, "slot")] * 2
    for a, b in zip(ours.conditions, flat.conditions):
        assert (a.name, b.nll.value) == (b.name, pytest.approx(a.nll.value, rel=1e-6)), a.name
    assert flat.conditions[2].delta_nll.value > 0  # the token shuffle moved the gates over tokens
    (_, expected), = ours.variance
    (_, shares), = flat.variance
    for share in ("eta2_layer", "layer_slot_share", "input_share", "token_share"):
        assert shares[share].value == pytest.approx(expected[share].value, rel=1e-6, abs=1e-12), share


def test_declared_merged_axis_in_metadata(tmp_path, data):
    model = flat_gated_lm()
    model.metadata_props.append(metadata_entry([Coefficient(f"gate.{i}", "gate", i, (MERGED, "feature"))
                                                for i in range(2)]))
    onnx.save(model, tmp_path / "m.onnx")
    report = replay(tmp_path / "m.onnx", data / "calib.npz", data / "eval.npz", conditions=("correct", "cross_input"),
                    resamples=10, batch_size=4)
    assert report.parity.ok and [c.source for c in report.coefficients] == ["metadata"] * 2
