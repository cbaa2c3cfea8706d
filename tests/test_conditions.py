"""Replay conditions: each maps cached coefficients to the values fed, as docs/design.md defines."""

import numpy as np
import pytest

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.replay.capture import CoefficientCache
from graphaudit.replay.conditions import conditions, derangement, names, position_orders, profiles, token_axis

CONDITIONS = names()  # every registered condition, the replay's default

GATE = [Coefficient(f"gate.{i}", "gate", i, ("batch", "token", "feature")) for i in range(2)]
MIX = Coefficient("mix.0", "mix", 0, ("way", "batch", "token", "source"))  # cached batch first: (b, way, t, s)


def _cache(count, length=5, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {c.tensor: rng.random((count, length, 3)).astype(np.float32) for c in GATE}
    arrays[MIX.tensor] = rng.random((count, 2, length, 4)).astype(np.float32)
    return CoefficientCache((*GATE, MIX), arrays, count, {})


def _feeds(names=CONDITIONS, seed=0, count=6):
    evaluation, calibration = _cache(count, seed=1), _cache(8, seed=2)
    return conditions(names, evaluation, calibration, seed), evaluation, calibration


def test_correct_comes_first_and_returns_the_cached_rows():
    feeds, evaluation, _ = _feeds(["global_mean", "cross_input"])
    assert list(feeds) == ["correct", "global_mean", "cross_input"]
    rows = np.array([4, 1])
    for c in evaluation.coefficients:
        np.testing.assert_array_equal(feeds["correct"](c, rows), evaluation.arrays[c.tensor][rows])


def test_derangement_has_no_fixed_point_and_is_seeded():
    for n in (2, 3, 10, 101):
        perm = derangement(n, np.random.default_rng(n))
        assert sorted(perm) == list(range(n)) and not np.any(perm == np.arange(n))
    assert np.array_equal(derangement(50, np.random.default_rng(3)), derangement(50, np.random.default_rng(3)))
    with pytest.raises(GraphAuditError, match="at least 2 evaluation inputs"):
        derangement(1, np.random.default_rng(0))


def test_cross_input_feeds_another_inputs_coefficients_for_every_tensor():
    feeds, evaluation, _ = _feeds()
    rows = np.arange(6)
    gate = feeds["cross_input"](GATE[0], rows)
    partners = [next(j for j in range(6) if np.array_equal(evaluation.arrays["gate.0"][j], gate[b])) for b in rows]
    assert all(p != b for b, p in enumerate(partners)) and sorted(partners) == list(range(6))
    for c in evaluation.coefficients:  # the same partner for every coefficient tensor
        np.testing.assert_array_equal(feeds["cross_input"](c, rows), evaluation.arrays[c.tensor][partners])


def test_token_shuffle_permutes_positions_within_each_input_consistently():
    feeds, evaluation, _ = _feeds()
    rows = np.array([0, 3])
    shuffled = feeds["token_shuffle"](GATE[0], rows)
    own = evaluation.arrays["gate.0"][rows]
    orders = []
    for b in range(2):
        order = [next(t for t in range(5) if np.array_equal(own[b, t], shuffled[b, s])) for s in range(5)]
        assert sorted(order) == list(range(5))
        orders.append(order)
    assert orders[0] != list(range(5)) or orders[1] != list(range(5))
    np.testing.assert_array_equal(feeds["token_shuffle"](GATE[1], rows),
                                  np.stack([evaluation.arrays["gate.1"][r][o] for r, o in zip(rows, orders)]))
    mixed = feeds["token_shuffle"](MIX, rows)  # token axis 2 once the batch is first
    np.testing.assert_array_equal(mixed, np.stack([evaluation.arrays["mix.0"][r][:, o] for r, o in zip(rows, orders)]))


def test_static_profiles_come_from_calibration_only():
    feeds, _evaluation, calibration = _feeds()
    rows = np.arange(3)
    cal = calibration.arrays
    np.testing.assert_allclose(feeds["static_layer"](GATE[0], rows),
                               np.broadcast_to(cal["gate.0"].mean(axis=(0, 1)), (3, 5, 3)), rtol=1e-6)
    np.testing.assert_allclose(feeds["static_position"](GATE[1], rows),
                               np.broadcast_to(cal["gate.1"].mean(axis=0), (3, 5, 3)), rtol=1e-6)
    np.testing.assert_allclose(feeds["static_layer"](MIX, rows),
                               np.broadcast_to(cal["mix.0"].mean(axis=(0, 2), keepdims=True), (3, 2, 5, 4)), rtol=1e-6)
    family = np.concatenate([cal["gate.0"].ravel(), cal["gate.1"].ravel()]).mean()
    np.testing.assert_allclose(feeds["global_mean"](GATE[1], rows), np.full((3, 5, 3), family), rtol=1e-6)
    np.testing.assert_allclose(feeds["global_mean"](MIX, rows), np.full((3, 2, 5, 4), cal["mix.0"].mean()), rtol=1e-6)
    other = conditions(CONDITIONS, _cache(6, seed=9), calibration, 0)
    np.testing.assert_array_equal(other["static_layer"](GATE[0], rows), feeds["static_layer"](GATE[0], rows))


def test_profiles_stream_in_chunks_exactly():
    cache = _cache(10)
    a, b = profiles(cache, chunk=3), profiles(cache, chunk=64)
    for k in a.layer:
        np.testing.assert_allclose(a.layer[k], b.layer[k], rtol=1e-12)
        np.testing.assert_allclose(a.position[k], b.position[k], rtol=1e-12)
    assert a.family == pytest.approx(b.family)


def test_same_seed_same_feeds_other_seed_other_permutations():
    rows = np.arange(6)
    a, _, _ = _feeds(seed=5)
    b, _, _ = _feeds(seed=5)
    c, _, _ = _feeds(seed=6)
    for name in ("cross_input", "token_shuffle"):
        np.testing.assert_array_equal(a[name](GATE[0], rows), b[name](GATE[0], rows))
    assert not np.array_equal(a["token_shuffle"](GATE[0], rows), c["token_shuffle"](GATE[0], rows))


def test_position_orders_are_permutations():
    orders = position_orders(4, 7, np.random.default_rng(0))
    assert orders.shape == (4, 7) and all(sorted(o) == list(range(7)) for o in orders)


def test_unknown_condition_and_short_calibration_are_refused():
    with pytest.raises(UsageError, match=r"expected conditions among .* found bogus"):
        _feeds(["bogus"])
    feeds = conditions(CONDITIONS, _cache(4, length=6), _cache(4, length=5), 0)
    with pytest.raises(GraphAuditError, match="at least as long"):
        feeds["static_position"](GATE[0], np.arange(2))


def test_profiles_keep_each_tensors_own_dtype():
    """Models mix precisions (a float16 backbone, a float32 router): each profile is fed in its tensor's type."""
    evaluation, calibration = _cache(6, seed=1), _cache(8, seed=2)
    for cache in (evaluation, calibration):
        cache.arrays[GATE[0].tensor] = cache.arrays[GATE[0].tensor].astype(np.float16)
    feeds = conditions(CONDITIONS, evaluation, calibration, 0)
    rows = np.arange(3)
    for name in CONDITIONS:
        for c in evaluation.coefficients:
            assert feeds[name](c, rows).dtype == evaluation.arrays[c.tensor].dtype, (name, c.tensor)


def test_token_shuffle_orders_do_not_depend_on_whether_cross_input_runs():
    rows = np.arange(6)
    alone, _, _ = _feeds(["token_shuffle"], seed=5)
    both, _, _ = _feeds(["cross_input", "token_shuffle"], seed=5)
    for c in (*GATE, MIX):
        np.testing.assert_array_equal(alone["token_shuffle"](c, rows), both["token_shuffle"](c, rows))


def test_token_shuffle_of_coefficients_over_fewer_positions_permutes_those_positions():
    # a token pruner's second score covers only the tokens the first step kept (5 of 9): its
    # positions get an order of their own; the full-length ones keep the orders they had
    rng = np.random.default_rng(0)
    full = Coefficient("score.0", "router", 2, ("batch", "token", "slot"))
    kept = Coefficient("score.1", "router", 3, ("batch", "token", "slot"))
    arrays = {"score.0": rng.random((4, 9, 2)).astype(np.float32), "score.1": rng.random((4, 5, 2)).astype(np.float32)}
    evaluation = CoefficientCache((full, kept), arrays, 4, {})
    feeds = conditions(["token_shuffle"], evaluation, evaluation, seed=3)
    rows = np.arange(4)
    for c, length in ((full, 9), (kept, 5)):
        shuffled, own = feeds["token_shuffle"](c, rows), arrays[c.tensor]
        for b in rows:
            order = [next(j for j in range(length) if np.array_equal(own[b, j], shuffled[b, t])) for t in range(length)]
            assert sorted(order) == list(range(length))
        assert not np.array_equal(shuffled, own)
    alone = conditions(["token_shuffle"], CoefficientCache((full,), {"score.0": arrays["score.0"]}, 4, {}),
                       evaluation, seed=3)
    np.testing.assert_array_equal(alone["token_shuffle"](full, rows), feeds["token_shuffle"](full, rows))


def test_token_axis_of_a_coefficient_without_a_batch_axis_is_refused_in_one_line():
    # metadata may declare any axes: the replay asks for the token axis before capture checks the batch axis
    assert token_axis(MIX) == 2 and token_axis(Coefficient("g", "gate", 0, ("feature", "batch"))) is None
    with pytest.raises(GraphAuditError, match="expected coefficient 'g' to name a 'batch' axis"):
        token_axis(Coefficient("g", "gate", 0, ("token", "feature")))
