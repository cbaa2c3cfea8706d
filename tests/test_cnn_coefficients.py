"""Coefficients of convolutional networks, detected and replayed: a squeeze-and-excitation
block's channel gates (no token axis) and a dynamic convolution's kernel attention (it mixes
weights, not activations). Nothing here is declared in metadata."""

import numpy as np
import onnx

from graphaudit.replay.pipeline import replay

from support.models import blockdrop_cnn, dynamic_conv, se_cnn


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


def test_a_policy_gate_viewed_per_block_is_detected_when_inference_loses_the_batch_name():
    # BlockDrop densified: a policy (batch, blocks) of sigmoids, one column per block, viewed as
    # (-1, 1, 1, 1) to scale the block's feature map. ONNX's inference calls that first axis
    # `unk__N`, where the feature map keeps `batch`: the probe tells both are the batch
    from graphaudit.analyses.static import audit_static
    from graphaudit.graph.build import build_graph
    from graphaudit.load.model import load_model

    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 2, 4, 4] x0) => (float[batch, 2, 4, 4] y) <float[2, 2, 1, 1] "blocks.0.conv.weight" = {
        1.0, 0.0, 0.0, 1.0}, float[2, 2] "policy.weight" = {0.5, -0.5, 0.25, 0.75}, int64 zero = {0},
        int64[4] view = {-1, 1, 1, 1}, int64[2] both = {2, 3}> {
        ["/policy/ReduceMean"] pooled = ReduceMean <keepdims = 0> (x0, both)
        ["/policy/MatMul"] pl = MatMul (pooled, "policy.weight")
        ["/policy/Sigmoid"] keep = Sigmoid (pl)
        ["/Gather"] k0 = Gather <axis = 1> (keep, zero)
        ["/Reshape"] k0v = Reshape (k0, view)
        ["/blocks.0/conv/Conv"] c = Conv (x0, "blocks.0.conv.weight")
        ["/Mul"] m = Mul (k0v, c)
        ["/Add"] y = Add (x0, m)
    }"""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    loaded = load_model(model)
    mg = build_graph(loaded.model)
    assert mg.tensors[mg.find_tensor("k0v")].shape[0] != "batch"  # what inference left: the case at hand
    report = audit_static(loaded)
    assert [(c.tensor, c.family, c.axes) for c in report.coefficients] == [("keep", "gate", ("batch", "slot"))]


def test_a_vision_transformers_per_patch_gate_has_a_token_axis():
    # pixels in, no token axis among the inputs: the patches are the sequence the layer norms run
    # over, (batch, 4 patches, 8 channels), so a per-patch gate (batch, 4, 1) has a token axis,
    # and the replay can shuffle it over the patches (A-ViT's halting scores, a token pruner's)
    from graphaudit.analyses.static import audit_static
    from graphaudit.load.model import load_model

    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 2, 4, 4] x0) => (float[batch, 4, 8] y) <float[8, 2, 2, 2] "patch.weight" = {
        1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.5, 0.25,
        1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.5, 0.25,
        1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.5, 0.25,
        1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.5, 0.25},
        int64[3] patches = {0, 8, 4}, float[8] ones = {1, 1, 1, 1, 1, 1, 1, 1}, float[8] zeros = {0, 0, 0, 0, 0, 0, 0, 0},
        float[8, 1] "blocks.0.halt.weight" = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8},
        float[8, 8] "blocks.0.fc.weight" = {
        1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
        0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1}> {
        ["/patch/Conv"] p = Conv <strides = [2, 2]> (x0, "patch.weight")
        ["/patch/Reshape"] pr = Reshape (p, patches)
        ["/patch/Transpose"] x1 = Transpose <perm = [0, 2, 1]> (pr)
        ["/blocks.0/norm/LayerNormalization"] n = LayerNormalization <axis = -1> (x1, ones, zeros)
        ["/blocks.0/fc/MatMul"] h = MatMul (n, "blocks.0.fc.weight")
        ["/blocks.0/halt/MatMul"] hl = MatMul (n, "blocks.0.halt.weight")
        ["/blocks.0/halt/Sigmoid"] halt = Sigmoid (hl)
        ["/blocks.0/Mul"] m = Mul (halt, h)
        ["/blocks.0/Add"] y = Add (x1, m)
    }"""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    report = audit_static(load_model(model))
    assert [(c.tensor, c.family, c.axes) for c in report.coefficients] == [("halt", "gate", ("batch", "token", "slot"))]
    # named with --axes (or --coefficients), the tensor detection finds keeps its family and
    # layer: the family is not the tensor's name
    named = audit_static(load_model(model), coefficients=["halt=batch,token,way"])
    assert [(c.tensor, c.family, c.layer, c.axes, c.source) for c in named.coefficients] == [
        ("halt", "gate", 0, ("batch", "token", "way"), "user")]


def test_a_policy_for_every_block_is_one_coefficient_per_block(tmp_path):
    # BlockDrop: one policy (batch, blocks), each block scaled by its own column policy[:, i];
    # each column is its block's coefficient, in its block's layer, so the replay sees three
    # layers (not one tensor of one layer whose slots are the blocks) and feeds them apart
    report = _replay_images(tmp_path, blockdrop_cnn(), seed=2)
    assert [(c.tensor, c.family, c.layer, c.axes, c.source) for c in report.coefficients] == [
        (f"keep.{i}", "gate", i, ("batch",), "detected") for i in range(3)]
    assert report.parity.ok
    (family, shares), = report.variance
    assert family == "gate" and 0 < shares["eta2_layer"].value < 1
    assert report.condition("cross_input").delta_nll.value != 0.0


def test_a_selective_kernels_attention_is_detected_where_inference_cannot_size_its_paths():
    # timm's SKNet: attention over 2 kernel paths, softmax over paths, viewed (B, 2, C // 2, 1, 1)
    # by a shape computed through a Div (TorchScript's view): ONNX's inference names the channel
    # axis `unk__N` where the paths' feature maps (B, 2, 4, H, W) have 4; still a scaling of them
    import onnx.parser

    from graphaudit.analyses.static import audit_static
    from graphaudit.graph.build import build_graph
    from graphaudit.load.model import load_model

    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 4, 4, 4] x0) => (float[batch, 4, 4, 4] y) <float[8, 4, 1, 1] "blocks.0.paths.weight" = {
        1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0,
        0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.5},
        float[4, 8] "blocks.0.attn.weight" = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.8, 0.7, 0.6, 0.5, 0.4,
        0.3, 0.2, 0.1, 0.1, 0.3, 0.5, 0.7, 0.2, 0.4, 0.6, 0.8, 0.9, 0.1, 0.9, 0.1, 0.5, 0.5, 0.5, 0.5},
        int64[1] zero = {0}, int64[1] one = {1}, int64[1] two = {2}, int64[1] ones = {1}, int64[2] hw = {2, 3},
        int64[5] split_paths = {0, 2, 4, 4, 4}> {
        ["/blocks.0/conv/Conv"] c = Conv (x0, "blocks.0.paths.weight")
        ["/blocks.0/Reshape"] p = Reshape (c, split_paths)
        ["/blocks.0/ReduceSum"] u = ReduceSum <keepdims = 0> (p, one)
        ["/blocks.0/ReduceMean"] s = ReduceMean <keepdims = 0> (u, hw)
        ["/blocks.0/attn/MatMul"] z = MatMul (s, "blocks.0.attn.weight")
        ["/blocks.0/Shape"] shape = Shape (x0)
        ["/blocks.0/Gather"] b = Gather (shape, zero)
        ["/blocks.0/Gather_1"] ch = Gather (shape, one)
        ["/blocks.0/Div"] half = Div (ch, one)
        ["/blocks.0/Concat"] view = Concat <axis = 0> (b, two, half, ones, ones)
        ["/blocks.0/Reshape_1"] zv = Reshape (z, view)
        ["/blocks.0/attn/Softmax"] a = Softmax <axis = 1> (zv)
        ["/blocks.0/Mul"] w = Mul (p, a)
        ["/blocks.0/ReduceSum_1"] v = ReduceSum <keepdims = 0> (w, one)
        ["/blocks.0/Add"] y = Add (x0, v)
    }"""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    loaded = load_model(model)
    mg = build_graph(loaded.model)
    assert str(mg.tensors[mg.find_tensor("a")].shape[2]).startswith("unk__")  # the case at hand
    report = audit_static(loaded)
    assert [(c.tensor, c.family) for c in report.coefficients] == [("a", "mix")]
    assert [b.verdict for b in report.blocks] == ["gated"]
