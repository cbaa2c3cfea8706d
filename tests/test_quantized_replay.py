"""A quantized model in QDQ form (ONNX Runtime's own static quantization of the FeatureGate
fixture): ONNX Runtime fuses DequantizeLinear → op → QuantizeLinear groups into integer
kernels only where a group's values stay inside it, so the trace graph (coefficients
exposed) and the frozen graph (coefficients fed, the prefix cut) would round apart. The
replay runs the pairs as written in both, and parity holds exactly."""

import numpy as np
import onnx
import pytest

from graphaudit.errors import GraphAuditError
from graphaudit.replay.pipeline import replay
from graphaudit.runtime.sessions import quantized_pairs

from support.zoo import FIXTURES, quantized_featuregate

FIXTURE = FIXTURES / "featuregate"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qdq")
    quantized_featuregate(folder / "model.onnx", "QDQ")
    ids = np.load(FIXTURE / "calib.npz")["input_ids"]
    np.savez(folder / "calib.npz", input_ids=ids[:8])
    np.savez(folder / "eval.npz", input_ids=np.load(FIXTURE / "eval.npz")["input_ids"][:8])
    return folder


def test_the_replay_of_a_qdq_model_runs_its_pairs_as_written_and_parity_holds(quantized):
    assert quantized_pairs(onnx.load(quantized / "model.onnx")) > 0
    report = replay(quantized / "model.onnx", quantized / "calib.npz", quantized / "eval.npz", resamples=20)
    assert report.parity.ok and report.parity.max_abs_diff == 0.0
    assert "QuantizeLinear / DequantizeLinear pairs as written" in report.settings["quantized_note"]
    assert ("quantization", report.settings["quantized_note"]) in report.setting_notes()
    assert report.condition("cross_input").delta_nll.value > 0


def test_with_the_integer_kernels_the_cut_graphs_round_apart(quantized, monkeypatch):
    # what the pairs as written avoid: fused, the live and frozen graphs differ by far more
    # than the parity tolerance
    import graphaudit.replay.pipeline as replay_module

    monkeypatch.setattr(replay_module, "quantized_pairs", lambda model: 0)
    with pytest.raises(GraphAuditError, match="refusing to replay"):
        replay(quantized / "model.onnx", quantized / "calib.npz", quantized / "eval.npz", resamples=20)


def test_a_float_model_keeps_onnx_runtimes_fusions():
    assert quantized_pairs(onnx.load(FIXTURE / "model.onnx")) == 0


@pytest.mark.parametrize("found", ["metadata", "detected", "user"])
def test_an_operator_form_models_integer_coefficients_replay(tmp_path, found):
    """In ONNX Runtime's operator form a gate stays an integer (`gate.0_quantized`, uint8 out of
    QLinearSigmoid into QLinearMul): declared as `gate.0`, detected or named, it is captured and
    fed as such, one `gate` family over the layers."""
    quantized_featuregate(tmp_path / "model.onnx", "QOperator")
    if found != "metadata":
        model = onnx.load(tmp_path / "model.onnx")
        del model.metadata_props[:]
        onnx.save(model, tmp_path / "model.onnx")
    ids = np.load(FIXTURE / "calib.npz")["input_ids"]
    np.savez(tmp_path / "calib.npz", input_ids=ids[:8])
    np.savez(tmp_path / "eval.npz", input_ids=np.load(FIXTURE / "eval.npz")["input_ids"][:8])
    report = replay(tmp_path / "model.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz",
                    coefficients=["gate.*_quantized"] if found == "user" else (), resamples=20)
    assert [(c.tensor, c.family, c.layer, c.source) for c in report.coefficients] == [
        (f"gate.{i}_quantized", "gate", i, found) for i in range(4)]
    assert report.parity.ok
    assert [family for family, _ in report.variance] == ["gate"]


def test_an_integer_coefficients_profile_is_rounded_to_the_nearest_code():
    from graphaudit.analyses.declared_coefficients import Coefficient
    from graphaudit.replay.conditions import Profiles

    c = Coefficient("g", "gate", 0, ("batch", "slot"))
    profiles = Profiles({}, {}, {}, 1, {"g": np.dtype(np.uint8)})
    filled = profiles.filled("layer", c, (2, 3), lambda: np.array([[127.6, 0.4, 300.0]]))
    assert filled.dtype == np.uint8 and filled.tolist() == [[128, 0, 255]] * 2
