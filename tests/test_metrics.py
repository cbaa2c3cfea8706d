"""Metrics: NLL, KL, accuracy, MSE from per-input sums; bootstrap; the variance decomposition."""

import numpy as np
import pytest

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.metrics import (
    ConditionStats,
    PoissonBootstrap,
    Reference,
    Task,
    difference,
    interval,
    retained_gap,
    score,
    task_for,
)
from graphaudit.metrics.outputs import column, log_softmax
from graphaudit.replay.variance import FamilyVariance


def _log_softmax(x):
    x = x.astype(np.float64)
    return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)


def _batch(b=3, t=5, v=7, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((b, t, v)).astype(np.float32) * 2, rng.integers(0, v, (b, t))


def test_log_softmax_matches_float64_and_the_replay_graph_output_name():
    logits, _ = _batch()
    np.testing.assert_allclose(log_softmax(logits), _log_softmax(logits), atol=1e-5)
    assert Task("causal_lm", "logits", "input_ids").fetch == "graphaudit.log_probs"
    assert Task("regression", "y", labels="targets").fetch == "y"


def test_task_detection():
    logits, ids = _batch()
    assert task_for({"logits": logits}, {"input_ids": ids}, {}) == Task("causal_lm", "logits", "input_ids")
    assert task_for({"logits": logits}, {"input_ids": ids}, {"labels": ids}).labels == "labels"
    assert task_for({"y": logits[:, 0]}, {"x": logits}, {"labels": ids[:, 0]}).kind == "classification"
    assert task_for({"y": logits}, {"x": logits}, {"targets": logits}).kind == "regression"
    # (batch, frames, classes) without token ids is a distribution per frame (a CTC head's), whatever its
    # name; a 4-D map of values is no distribution over its last axis
    assert task_for({"y": logits}, {"x": logits}, {}).kind == "classification"
    assert task_for({"y": logits[..., None]}, {"x": logits}, {}).kind == "outputs"
    # an encoder's hidden states (ids past their width) are compared as outputs, not scored as logits
    hidden = {"last_hidden_state": logits[..., :2]}
    assert task_for(hidden, {"input_ids": ids}, {}).kind == ("outputs" if ids.max() >= 2 else "causal_lm")
    assert ids.max() >= 2
    # an encoder-decoder's logits predict its decoder's tokens, whatever the encoder's length
    for encoder in (ids, np.concatenate([ids, ids], axis=1)):
        feeds = {"input_ids": encoder, "decoder_input_ids": ids}
        assert task_for({"logits": logits}, feeds, {}) == Task("causal_lm", "logits", "decoder_input_ids")


def test_causal_nll_is_next_token_cross_entropy_per_input():
    logits, ids = _batch()
    task = Task("causal_lm", "logits", "input_ids")
    sums = score(task, log_softmax(logits), {"input_ids": ids}, {}, None)
    lp = _log_softmax(logits)
    expected = -np.take_along_axis(lp[:, :-1], ids[:, 1:, None], -1)[..., 0].sum(1)
    np.testing.assert_allclose(sums[:, column("nll")], expected, rtol=1e-5)
    np.testing.assert_array_equal(sums[:, column("targets")], [4, 4, 4])


def test_labels_replace_ids_and_minus_100_is_left_out():
    logits, ids = _batch()
    labels = ids.copy()
    labels[0, 2:] = -100
    task = Task("causal_lm", "logits", "input_ids", "labels")
    sums = score(task, log_softmax(logits), {"input_ids": np.zeros_like(ids)}, {"labels": labels}, None)
    lp = _log_softmax(logits)
    picked = -np.take_along_axis(lp[0, :1], ids[0, 1:2, None], -1).sum()
    assert sums[0, column("targets")] == 1 and sums[0, column("nll")] == pytest.approx(picked, rel=1e-5)
    hits = (logits[:, :-1].argmax(-1) == ids[:, 1:]).sum(1)
    assert sums[1:, column("hits")].tolist() == hits[1:].tolist()


def test_kl_from_correct_is_zero_for_correct_and_matches_the_definition():
    logits, ids = _batch()
    other, _ = _batch(seed=1)
    task = Task("causal_lm", "logits", "input_ids")
    ref = Reference.of(task, log_softmax(logits))
    assert np.all(score(task, ref.output, {"input_ids": ids}, {}, ref)[:, column("divergence")] == 0)
    sums = score(task, log_softmax(other), {"input_ids": ids}, {}, ref)
    p, q = _log_softmax(logits), _log_softmax(other)
    expected = (np.exp(p) * (p - q)).sum(-1).sum(1)
    np.testing.assert_allclose(sums[:, column("divergence")], expected, rtol=1e-4)
    assert sums[0, column("positions")] == 5


def test_a_class_ruled_out_with_minus_inf_gives_no_nan():
    """A -inf logit (a vocabulary entry the model masks) has probability 0: 0·log 0 counts 0 in KL
    and in the entropy, and a left-out (-100) position picking it adds nothing to the NLL."""
    logits, ids = _batch()
    logits[..., 0] = -np.inf
    ids[ids == 0] = 1
    labels = ids.copy()
    labels[0, 2] = -100  # the left-out position's placeholder target is class 0, whose log-probability is -inf
    other, _ = _batch(seed=1)
    other[..., 0] = -np.inf
    task = Task("causal_lm", "logits", "input_ids", "labels")
    feeds = {"input_ids": ids}
    with np.errstate(all="raise"):  # not even a warning on the way
        ref = Reference.of(task, log_softmax(logits), feeds, {"labels": labels})
        sums = score(task, log_softmax(other), feeds, {"labels": labels}, ref)
    p, q = _log_softmax(logits)[..., 1:], _log_softmax(other)[..., 1:]
    np.testing.assert_allclose(sums[:, column("divergence")], (np.exp(p) * (p - q)).sum(-1).sum(1), rtol=1e-4)
    mask = labels[:, 1:] != -100
    nll = -np.where(mask, np.take_along_axis(q[:, :-1], np.where(mask, labels[:, 1:], 1)[..., None] - 1, -1)[..., 0], 0)
    np.testing.assert_allclose(sums[:, column("nll")], nll.sum(1), rtol=1e-5)
    assert np.isfinite(ref.neg_entropy).all()


def test_classification_and_regression():
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((4, 3)).astype(np.float32), np.array([0, 2, 1, 1])
    sums = score(Task("classification", "y", labels="labels"), log_softmax(logits), {}, {"labels": labels}, None)
    np.testing.assert_allclose(sums[:, column("nll")], -_log_softmax(logits)[np.arange(4), labels], rtol=1e-5)
    np.testing.assert_array_equal(sums[:, column("hits")], logits.argmax(1) == labels)
    out, targets = rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    task = Task("regression", "y", labels="targets")
    sums = score(task, out, {}, {"targets": targets}, Reference.of(task, targets))
    np.testing.assert_allclose(sums[:, column("sq_err")], ((out - targets) ** 2).sum(1))
    np.testing.assert_allclose(sums[:, column("divergence")], ((out - targets) ** 2).sum(1))


def test_poisson_weights_depend_on_seed_and_input_only():
    boot = PoissonBootstrap(3, 50)
    a = boot.weights(np.arange(6))
    b = PoissonBootstrap(3, 50).weights(np.array([4, 5]))
    np.testing.assert_array_equal(a[:, 4:], b)
    assert a.shape == (50, 6) and abs(a.mean() - 1) < 0.3
    assert not np.array_equal(PoissonBootstrap(4, 50).weights(np.arange(6)), a)


def _stats(per_input, boot, chunks=1):
    s = ConditionStats.empty(boot.resamples)
    for rows in np.array_split(np.arange(len(per_input)), chunks):
        s.update(per_input[rows], boot.weights(rows))
    return s


def test_condition_stats_merge_and_stream_to_the_same_totals():
    rng = np.random.default_rng(0)
    per_input = np.zeros((40, 7))
    per_input[:, column("nll")] = rng.random(40) * 10
    per_input[:, column("targets")] = 5
    boot = PoissonBootstrap(0, 200)
    one = _stats(per_input, boot)
    streamed = _stats(per_input, boot, chunks=7)
    halves = [ConditionStats.empty(200) for _ in range(2)]
    halves[0].update(per_input[:25], boot.weights(np.arange(25)))
    halves[1].update(per_input[25:], boot.weights(np.arange(25, 40)))
    merged = halves[0].merge(halves[1])
    for s in (streamed, merged):
        np.testing.assert_allclose(s.total, one.total)
        np.testing.assert_allclose(s.resampled, one.resampled)
    value, samples = one.figure("nll")
    assert value == pytest.approx(per_input[:, 0].sum() / 200)
    lo, hi = interval(samples)
    assert lo < value < hi
    assert one.resampled.shape == (200, 7)  # fixed by resamples, not by the number of inputs


def test_paired_difference_and_retained_gap():
    rng = np.random.default_rng(1)
    boot = PoissonBootstrap(0, 300)
    base = np.zeros((50, 7))
    base[:, column("targets")] = 4
    base[:, column("nll")] = 4 * (2 + rng.random(50))
    shifted, floor = base.copy(), base.copy()
    shifted[:, column("nll")] += 4 * 0.1
    floor[:, column("nll")] += 4 * 0.5
    correct, profile, worst = _stats(base, boot), _stats(shifted, boot), _stats(floor, boot)
    delta = difference(profile, correct, "nll", 0.95)
    assert delta.value == pytest.approx(0.1) and delta.ci[0] == pytest.approx(0.1) and delta.ci[1] == pytest.approx(0.1)
    gap = retained_gap(profile, correct, worst, "nll", 0.95)
    assert gap.value == pytest.approx(0.8) and gap.ci == pytest.approx((0.8, 0.8))
    assert retained_gap(profile, correct, correct, "nll", 0.95).value is None


def _direct_shares(values, layers):
    """Nested sums of squares from the full array (cells × inputs × tokens)."""
    grand = values.mean()
    total = ((values - grand) ** 2).sum()
    cell = values.mean(axis=(1, 2), keepdims=True)
    cell_input = values.mean(axis=2, keepdims=True)
    by_layer = {k: values[layers == k] for k in np.unique(layers)}
    eta = sum(v.size * (v.mean() - grand) ** 2 for v in by_layer.values())
    return {"eta2_layer": eta / total,
            "layer_slot_share": (((cell - grand) ** 2) * values.shape[1] * values.shape[2]).sum() / total,
            "input_share": (((cell_input - cell) ** 2) * values.shape[2]).sum() / total,
            "token_share": ((values - cell_input) ** 2).sum() / total}


def test_variance_decomposition_matches_the_direct_computation_and_streams():
    rng = np.random.default_rng(0)
    coefs = [Coefficient(f"g.{i}", "g", i, ("batch", "token", "feature")) for i in range(3)]
    n, t, f = 12, 5, 4
    arrays = {c.tensor: (rng.random(f) * (c.layer + 1) + rng.random((n, 1, f)) * 0.3
                         + rng.random((n, t, f)) * 0.1) for c in coefs}
    shapes = {c.tensor: arrays[c.tensor].shape for c in coefs}
    axes = {c.tensor: 1 for c in coefs}
    boot = PoissonBootstrap(0, 100)
    one = FamilyVariance.empty("g", coefs, shapes, axes, 100)
    one.update(arrays, axes, boot.weights(np.arange(n)))
    parts = [FamilyVariance.empty("g", coefs, shapes, axes, 100) for _ in range(2)]
    for p, rows in zip(parts, (np.arange(5), np.arange(5, n))):
        p.update({k: v[rows] for k, v in arrays.items()}, axes, boot.weights(rows))
    merged = parts[0].merge(parts[1])
    cells = np.concatenate([np.moveaxis(arrays[c.tensor], 2, 0) for c in coefs])  # (cells, inputs, tokens)
    layers = np.repeat([0, 1, 2], f)
    expected = _direct_shares(cells, layers)
    got, again = one.shares(0.95), merged.shares(0.95)
    assert sum(got[k].value for k in ("layer_slot_share", "input_share", "token_share")) == pytest.approx(1)
    for k, v in expected.items():
        assert got[k].value == pytest.approx(v, rel=1e-9)
        assert again[k].value == pytest.approx(v, rel=1e-9)
        assert got[k].ci[0] <= v + 1e-9 and v - 1e-9 <= got[k].ci[1]
    assert one.resampled_cell_sum.shape == (100, 3 * f)


def test_variance_extremes_and_way_first_layouts():
    coefs = [Coefficient("m.0", "m", 0, ("way", "batch", "token", "source"))]
    # batch-first cache layout (batch, way, token, source): token axis 2
    static = np.broadcast_to(np.arange(6.0).reshape(1, 2, 1, 3), (4, 2, 5, 3))
    noise = np.random.default_rng(0).random((4, 2, 5, 3))
    for values, key in ((static, "layer_slot_share"), (noise, "token_share")):
        v = FamilyVariance.empty("m", coefs, {"m.0": values.shape}, {"m.0": 2}, 10)
        v.update({"m.0": values}, {"m.0": 2}, np.ones((10, 4)))
        shares = v.shares(0.95)
        assert shares[key].value > 0.7
    flat = FamilyVariance.empty("m", coefs, {"m.0": static.shape}, {"m.0": 2}, 10)
    flat.update({"m.0": np.ones_like(static)}, {"m.0": 2}, np.ones((10, 4)))
    assert flat.shares(0.95)["token_share"].value is None  # nothing varies: no share to report
