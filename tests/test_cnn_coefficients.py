"""Coefficients of convolutional networks, detected and replayed: a squeeze-and-excitation
block's channel gates (no token axis) and a dynamic convolution's kernel attention (it mixes
weights, not activations). Nothing here is declared in metadata."""

import numpy as np
import onnx

from graphaudit.replay import replay
from test_replay_models import dynamic_conv, se_cnn


def _replay_images(tmp_path, model: onnx.ModelProto, seed: int):
    """Replay `model` on random (4, 5, 5) images with labels, 12 to calibrate and 10 to evaluate."""
    onnx.save(model, tmp_path / "model.onnx")
    rng = np.random.default_rng(seed)
    for name, count in (("calib", 12), ("eval", 10)):
        np.savez(tmp_path / f"{name}.npz", pixels=rng.standard_normal((count, 4, 5, 5)).astype(np.float32),
                 labels=rng.integers(0, 3, count))
    return replay(tmp_path / "model.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=20)


def test_channel_gates_of_a_cnn_are_detected_and_replayed_without_a_token_shuffle(tmp_path):
    # squeeze-and-excitation gates (batch, channels) scale feature maps (batch, channels, h, w):
    # detected without a token axis to tell the hidden state by; token_shuffle has no positions
    # to move, so it is left out with a note instead of reported as a zero effect;
    report = _replay_images(tmp_path, se_cnn(), seed=0)
    assert [(c.tensor, c.family, c.layer, c.axes, c.source) for c in report.coefficients] == [
        (f"se.{i}", "gate", i, ("batch", "slot"), "detected") for i in range(2)]
    assert report.parity.ok and report.task.kind == "classification"
    # nor has static_position positions to tell apart: it would be static_layer again
    assert [c.name for c in report.conditions] == ["correct", "cross_input", "static_layer", "global_mean"]
    assert "token_shuffle and static_position left out" in report.settings["token_shuffle_note"]
    assert report.condition("cross_input").delta_nll.value != 0.0


def test_a_dynamic_convolutions_kernel_attention_is_detected_and_replayed(tmp_path):
    # π mixes K stacked kernels into one per input (W = Σ_k π_k W_k): it meets only a weight, yet
    # what it makes is applied as weights to the feature map, so it is a coefficient (a BERT
    # pooler's Tanh into a classifier is not: tests/test_static.py)
    report = _replay_images(tmp_path, dynamic_conv(), seed=1)
    assert [(c.tensor, c.family, c.axes, c.source) for c in report.coefficients] == [
        ("pi", "mix", ("batch", "slot"), "detected")]
    assert report.parity.ok and report.condition("cross_input").delta_nll.value != 0.0
