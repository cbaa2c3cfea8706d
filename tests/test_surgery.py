"""Graph surgery: the trace graph exposes coefficients, the frozen graph takes them as inputs."""

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx.reference import ReferenceEvaluator

from graphaudit.analyses.declared_coefficients import Coefficient, declared_coefficients
from graphaudit.cli import cli
from graphaudit.errors import GraphAuditError
from graphaudit.load.model import load_model
from graphaudit.metrics.outputs import log_softmax
from graphaudit.replay.surgery import Freeze, LogProbs, Trace

from support.models import gate_in_branch, gated_lm, mixing_lm, run_ort, token_ids
from support.zoo import FIXTURES, ZOO


def _traced(model):
    coefs = declared_coefficients(model)
    trace = Trace(coefs)(model).model
    names = [o.name for o in trace.graph.output]
    ids = token_ids(3)
    return coefs, ids, dict(zip(names, run_ort(trace, {"input_ids": ids})))


@pytest.mark.parametrize("build", [gated_lm, mixing_lm])
def test_trace_graph_outputs_coefficients_and_leaves_the_argument_alone(build):
    model = build()
    before = model.SerializeToString()
    coefs, ids, outputs = _traced(model)
    assert model.SerializeToString() == before
    onnx.checker.check_model(Trace(coefs)(model).model, full_check=True)
    (live,) = run_ort(model, {"input_ids": ids})
    np.testing.assert_array_equal(outputs["logits"], live)
    for c in coefs:
        assert outputs[c.tensor].shape[c.axes.index("batch")] == 3
        assert outputs[c.tensor].shape[c.axes.index("token")] == 6


@pytest.mark.parametrize("build", [gated_lm, mixing_lm])
def test_frozen_graph_fed_the_traced_coefficients_reproduces_the_live_model(build):
    model = build()
    before = model.SerializeToString()
    coefs, ids, outputs = _traced(model)
    frozen = Freeze(coefs)(model).model
    assert model.SerializeToString() == before
    onnx.checker.check_model(frozen, full_check=True)
    feeds = {"input_ids": ids, **{c.tensor: outputs[c.tensor] for c in coefs}}
    (got,) = run_ort(frozen, feeds, ["logits"])
    np.testing.assert_array_equal(got, outputs["logits"])
    (reference,) = ReferenceEvaluator(frozen).run(["logits"], feeds)
    np.testing.assert_allclose(reference, outputs["logits"], rtol=1e-5, atol=1e-5)


def test_frozen_graph_names_batch_and_token_axes_and_drops_the_controller():
    model = gated_lm(layers=2)
    coefs = declared_coefficients(model)
    frozen = Freeze(coefs)(model).model
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in frozen.graph.input}
    assert inputs == {"input_ids": ["batch", "seq"], "gate.0": ["batch", "seq", 4], "gate.1": ["batch", "seq", 4]}
    names = {n.name for n in frozen.graph.node}
    assert not any(n.startswith("gate") for n in names)
    assert {f"block{i}/{part}" for i in range(2) for part in ("matmul", "gate", "residual")} <= names
    assert not {"wg.0", "bg.0", "wg.1", "bg.1"} & {t.name for t in frozen.graph.initializer}
    removed = Freeze(coefs)(model).details.removed
    assert set(removed) == {f"gate{i}/{p}" for i in range(2) for p in ("matmul", "add", "sigmoid")}


def test_freezing_one_coefficient_keeps_the_other_controller():
    model = gated_lm(layers=2)
    result = Freeze([declared_coefficients(model)[1]])(model)
    onnx.checker.check_model(result.model, full_check=True)
    assert "gate0/sigmoid" in {n.name for n in result.model.graph.node}
    assert result.details.removed == ("gate1/matmul", "gate1/add", "gate1/sigmoid")


def test_coefficient_inside_a_branch_is_refused_with_where_it_is():
    model = gate_in_branch()
    with pytest.raises(GraphAuditError, match=r"expected coefficient 'gate.b' in the main graph, found it inside "
                                              r"the then-branch of If `branch`"):
        Freeze(declared_coefficients(model))(model)
    with pytest.raises(GraphAuditError, match="inside"):
        Trace(declared_coefficients(model))(model)


def test_unknown_constant_and_already_frozen_coefficients_are_refused():
    model = gated_lm()
    with pytest.raises(GraphAuditError, match=r"expected a tensor named 'nope' in the model, found none"):
        Trace([Coefficient("nope", "gate", 0, ("batch", "token", "feature"))])(model)
    with pytest.raises(GraphAuditError, match="found a constant initializer"):
        Freeze([Coefficient("wg.0", "gate", 0, ("batch", "token", "feature"))])(model)
    coefs = declared_coefficients(model)
    with pytest.raises(GraphAuditError, match="already frozen"):
        Trace(coefs)(Freeze(coefs)(model).model)
    with pytest.raises(GraphAuditError, match="at least one coefficient"):
        Freeze([])(model)


def test_freeze_command_writes_both_graphs(tmp_path):
    path = tmp_path / "gated.onnx"
    onnx.save(gated_lm(), path)
    result = CliRunner().invoke(cli, ["freeze", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "2 coefficient tensors" in result.output and "6 controller nodes removed" in result.output
    trace, frozen = (load_model(tmp_path / "out" / f"gated.{k}.onnx").model for k in ("trace", "frozen"))
    assert [o.name for o in trace.graph.output] == ["logits", "gate.0", "gate.1"]
    assert [i.name for i in frozen.graph.input] == ["input_ids", "gate.0", "gate.1"]
    assert path.read_bytes() == gated_lm().SerializeToString()


def test_freeze_command_on_a_model_without_a_controller(tmp_path):
    model = gated_lm(layers=0)
    onnx.save(model, tmp_path / "plain.onnx")
    result = CliRunner().invoke(cli, ["freeze", str(tmp_path / "plain.onnx"), "-o", str(tmp_path / "out")])
    assert isinstance(result.exception, GraphAuditError)  # main() prints it as one line, exit 1
    assert "expected a model with a controller to freeze, found none" in str(result.exception)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not ZOO, reason="no trained zoo models in fixtures/ (python -m exporters.build writes them)")
@pytest.mark.parametrize("name", ZOO)
def test_zoo_frozen_graph_matches_the_exported_frozen_graph(name):
    loaded = load_model(FIXTURES / name / "model.onnx")
    coefs = declared_coefficients(loaded.model)
    frozen, trace = Freeze(coefs)(loaded.model).model, Trace(coefs)(loaded.model).model
    onnx.checker.check_model(frozen, full_check=True)
    onnx.checker.check_model(trace, full_check=True)
    exported = onnx.load(FIXTURES / name / "model.frozen.onnx")
    assert [i.name for i in frozen.graph.input] == [i.name for i in exported.graph.input]
    ids = np.load(FIXTURES / name / "eval.npz")["input_ids"][:2]
    names = [o.name for o in trace.graph.output]
    outputs = dict(zip(names, run_ort(trace, {"input_ids": ids})))
    feeds = {"input_ids": ids, **{c.tensor: outputs[c.tensor] for c in coefs}}
    (ours,) = run_ort(frozen, feeds, ["logits"])
    (theirs,) = run_ort(exported, feeds, ["logits"])
    np.testing.assert_allclose(ours, outputs["logits"], atol=1e-5)
    np.testing.assert_allclose(theirs, outputs["logits"], atol=1e-4)


def test_with_log_softmax_adds_the_scored_output_and_leaves_the_argument_alone():
    model = gated_lm()
    coefs, ids, outputs = _traced(model)
    frozen = Freeze(coefs)(model).model
    before = frozen.SerializeToString()
    scored = LogProbs("logits", "graphaudit.log_probs")(frozen).model
    assert frozen.SerializeToString() == before
    onnx.checker.check_model(scored, full_check=True)
    feeds = {"input_ids": ids, **{c.tensor: outputs[c.tensor] for c in coefs}}
    logits, logp = run_ort(scored, feeds, ["logits", "graphaudit.log_probs"])
    np.testing.assert_allclose(logp, log_softmax(logits), atol=1e-5)
    with pytest.raises(GraphAuditError, match="expected a graph output named 'nope'"):
        LogProbs("nope", "x")(frozen)
    assert LogProbs("logits", "graphaudit.log_probs")(frozen, owned=True).model is frozen  # its owner's
    assert frozen.SerializeToString() == scored.SerializeToString()


def test_an_older_irs_weights_listed_as_inputs_leave_the_frozen_graph_with_their_controller(tmp_path):
    # IR 3 lists every initializer among the graph inputs: the controller's weights, dead once it
    # is gone, must go from the inputs too, or ONNX Runtime asks the replay to feed them
    import numpy as np
    from onnx import helper

    from graphaudit.replay.pipeline import replay

    from support.models import gated_lm, token_ids

    model = gated_lm(layers=2)
    model.ir_version = 3
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer)
    frozen = Freeze(declared_coefficients(model))(model).model
    names = [i.name for i in frozen.graph.input]
    assert "wg.0" not in names and "bg.1" not in names  # the gates' weights, gone with the gates
    assert {"input_ids", "gate.0", "gate.1", "emb", "head"} <= set(names)  # the rest's weights stay listed
    onnx.save(model, tmp_path / "model.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8, seed=1))
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(6, seed=2))
    report = replay(tmp_path / "model.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=20)
    assert report.parity.ok and report.condition("cross_input").nll.value is not None
