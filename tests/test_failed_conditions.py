"""A frozen graph that ONNX Runtime runs on some conditions' coefficients and not on others
(a traced MoE's dispatch sized for the routings it can meet): the replay leaves those
conditions out, says where they failed, and reports the rest; only when no condition but
`correct` runs does it stop."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from graphaudit.replay.pipeline import replay
from graphaudit.runtime.sessions import FrozenRunError
from graphaudit.verdict.decide import functional_dependence

from support.models import gated_lm, token_ids


def dispatching_lm(threshold: float) -> onnx.ModelProto:
    """gated_lm with one layer whose gate also picks the positions above `threshold` and lays
    them out as (3, -1, picked): a Reshape that fails when nothing is picked, as a traced
    dispatch does on an empty expert. The logits do not depend on it (its sum times 0 is added)."""
    model = gated_lm(layers=1)
    graph = model.graph
    graph.initializer.extend([
        numpy_helper.from_array(np.array(threshold, np.float32), "threshold"),
        numpy_helper.from_array(np.array([3, -1, 0], np.int64), "laid_out"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    logits = next(n for n in graph.node if n.output[0] == "logits")
    logits.output[0] = "head_logits"
    graph.node.extend([
        helper.make_node("Greater", ["gate.0", "threshold"], ["picked"], name="dispatch/greater"),
        helper.make_node("NonZero", ["picked"], ["where"], name="dispatch/nonzero"),
        helper.make_node("Cast", ["where"], ["where_f"], to=onnx.TensorProto.FLOAT, name="dispatch/cast"),
        helper.make_node("Unsqueeze", ["where_f", "axis1"], ["where_u"], name="dispatch/unsqueeze"),
        helper.make_node("Reshape", ["where_u", "laid_out"], ["slots"], name="dispatch/reshape"),
        helper.make_node("ReduceSum", ["slots"], ["slot_sum"], keepdims=0, name="dispatch/sum"),
        helper.make_node("Mul", ["slot_sum", "zero"], ["nothing"], name="dispatch/nothing"),
        helper.make_node("Add", ["head_logits", "nothing"], ["logits"], name="dispatch/add")])
    return model


def _setup(tmp_path, threshold: float):
    onnx.save(dispatching_lm(threshold), tmp_path / "model.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(24, seed=1))
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(20, seed=2))
    return tmp_path / "model.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz"


def _live_gates(paths):
    import onnxruntime as ort

    model = onnx.load(paths[0])
    model.graph.output.append(helper.make_tensor_value_info("gate.0", onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(["gate.0"], {"input_ids": np.load(p)["input_ids"]})[0] for p in paths[1:]])


def test_conditions_the_frozen_graph_refuses_are_left_out_and_said(tmp_path):
    probe = _live_gates(_setup(tmp_path, 0.5))
    # above every static profile (means over inputs and tokens), below the top live values: every
    # batch picks some positions live and when shuffled, none under a profile
    threshold = float(np.quantile(probe, 0.97))
    assert probe.mean(axis=(0, 1)).max() < threshold and probe.mean(axis=0).max() < threshold
    paths = _setup(tmp_path, threshold)
    report = replay(*paths, coefficients=["gate.0"], resamples=50, batch_size=8)
    names = [c.name for c in report.conditions]
    assert names == ["correct", "cross_input", "token_shuffle"]
    failed = report.settings["failed_conditions"]
    assert list(failed) == ["static_layer", "static_position", "global_mean"]
    assert all(at.startswith("evaluation inputs 0..7: ONNX Runtime's error in node 'dispatch/reshape' (Reshape)")
               for at in failed.values())
    assert report.settings["conditions"] == names and not report.retained_gap
    note = dict((about, text) for about, text in report.setting_notes() if "left out" in text)["conditions"]
    assert note.startswith("`static_layer`, `static_position`, `global_mean` left out: ONNX Runtime would not run "
                           "the frozen graph on their coefficients (static_layer on evaluation inputs 0..7: ")
    assert note.endswith("The other conditions ran on every input")
    assert report.condition("cross_input").delta_nll.value != 0 and report.condition("cross_input").delta_nll.ci
    finding = functional_dependence(report.to_json())
    assert any("did not run: ONNX Runtime would not run the frozen graph on their coefficients" in e.text
               for e in finding.evidence)


def test_a_frozen_graph_that_runs_only_its_own_coefficients_stops_the_replay(tmp_path):
    # a threshold no shuffled or averaged gate ever passes at every batch: only `correct` runs
    paths = _setup(tmp_path, 0.5)
    top = float(_live_gates(paths).max())
    paths = _setup(tmp_path, np.nextafter(np.float32(top), np.float32(0)))  # only the single largest passes
    with pytest.raises(FrozenRunError, match="expected the frozen graph to run on the coefficients of some "
                                             "condition besides correct, found that it runs on none"):
        replay(*paths, coefficients=["gate.0"], resamples=20, batch_size=8,
               conditions=["correct", "static_layer", "global_mean"])
