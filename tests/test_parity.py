"""The parity check of every input, unit by unit: what the capture keeps and how it is compared."""

import numpy as np
import onnx
import pytest

from graphaudit.load.data import InputData
from graphaudit.metrics import Reference, task_for
from graphaudit.metrics.outputs import log_softmax
from graphaudit.replay.capture import CoefficientCache
from graphaudit.replay.parity import (
    DEFAULT_TOLERANCE,
    WHOLE_OUTPUT_LIMIT,
    EveryInputCheck,
    Parity,
    ParityError,
    every_input_summary,
    kept_positions,
)
from graphaudit.replay.pipeline import replay

from support.models import gated_lm, token_ids


def _first_batch_parity():
    return Parity(True, 0.0, DEFAULT_TOLERANCE, "logits", (0, 0), 1.0, 1.0, 4)


def _check(summary, rows_per_batch, outputs, feeds, labels):
    """Keep `summary` of every input as the capture would, then compare the same outputs batch by batch."""
    count = len(next(iter(outputs.values())))
    data = InputData(feeds, labels, count, "test")
    summarise = summary(data).summarise
    kept = np.concatenate([summarise({k: v[s] for k, v in outputs.items()}, {k: v[s] for k, v in feeds.items()}, s)
                           for s in (slice(i, min(i + rows_per_batch, count)) for i in range(0, count, rows_per_batch))])
    cache = CoefficientCache((), {"graphaudit.live_check": kept}, count, {})
    check = EveryInputCheck(cache, _first_batch_parity())
    return kept, check, data


def test_a_classifier_is_checked_on_the_log_probability_of_each_label():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 5)).astype(np.float32)
    labels = {"labels": rng.integers(0, 5, 6)}
    feeds = {"x": rng.standard_normal((6, 3)).astype(np.float32)}
    kept, check, _data = _check(every_input_summary, 4, {"logits": logits}, feeds, labels)
    expected = log_softmax(logits.astype(np.float64))[np.arange(6), labels["labels"]]
    np.testing.assert_allclose(kept, expected, atol=1e-6)
    task = task_for({"logits": logits[:4]}, {k: v[:4] for k, v in feeds.items()}, {"labels": labels["labels"][:4]})
    assert task.kind == "classification"
    for rows in (slice(0, 4), slice(4, 6)):
        batch_labels = {"labels": labels["labels"][rows]}
        reference = Reference.of(task, log_softmax(logits[rows]), {k: v[rows] for k, v in feeds.items()}, batch_labels)
        check.compare(rows, reference)
    result = check.result()
    assert result.kind == "target log-probabilities" and result.inputs == 6 and result.values == 6
    assert result.ok and result.tolerance == 2 * DEFAULT_TOLERANCE


def test_an_output_that_is_not_logits_is_compared_whole_and_a_moved_value_is_named():
    rng = np.random.default_rng(1)
    out = rng.standard_normal((5, 1, 2, 3)).astype(np.float32)  # a map of values, no distribution over its last axis
    feeds = {"x": rng.standard_normal((5, 4)).astype(np.float32)}
    kept, check, _ = _check(every_input_summary, 2, {"y": out}, feeds, {})
    assert kept.shape == (5, 6)
    task = task_for({"y": out[:2]}, {k: v[:2] for k, v in feeds.items()}, {})
    check.compare(slice(0, 2), Reference.of(task, out[0:2]))
    moved = out[2:4].copy()
    moved[1, 0, 1, 2] += 0.5  # input 3, value 5 of its flattened output
    with pytest.raises(ParityError, match=r"live outputs of every input within 0.0001, found max \|Δ\| 0.5 at "
                                          r"input 3, value 5 "):
        check.compare(slice(2, 4), Reference.of(task, moved))


def test_a_large_output_is_checked_at_the_same_positions_of_every_input():
    rng = np.random.default_rng(2)
    out = rng.standard_normal((5, 1, 3, 2000)).astype(np.float32)  # 6000 values per input, past WHOLE_OUTPUT_LIMIT
    feeds = {"x": rng.standard_normal((5, 4)).astype(np.float32)}
    kept, check, _ = _check(every_input_summary, 2, {"y": out}, feeds, {})
    positions = kept_positions(6000)
    assert kept.shape == (5, WHOLE_OUTPUT_LIMIT) and len(np.unique(positions)) == WHOLE_OUTPUT_LIMIT
    np.testing.assert_array_equal(kept, out.reshape(5, -1)[:, positions])
    task = task_for({"y": out[:2]}, {k: v[:2] for k, v in feeds.items()}, {})
    check.compare(slice(0, 2), Reference.of(task, out[0:2]))
    moved = out[2:4].copy()
    moved.reshape(2, -1)[1, positions[7]] += 0.5  # input 3, at a kept position
    moved.reshape(2, -1)[0, np.setdiff1d(np.arange(6000), positions)[0]] += 9.0  # a position no input keeps
    with pytest.raises(ParityError, match=rf"outputs at {WHOLE_OUTPUT_LIMIT} positions of every input within 0.0001, "
                                          rf"found max \|Δ\| 0.5 at input 3, value {positions[7]} "):
        check.compare(slice(2, 4), Reference.of(task, moved))


def test_an_output_that_is_not_floating_point_is_not_kept():
    out = np.zeros((2, 3), dtype=np.int64)
    data = InputData({"x": np.zeros((2, 1), np.float32)}, {}, 2, "test")
    assert every_input_summary(data).summarise({"y": out}, {"x": data.arrays["x"]}, slice(0, 2)) is None


def test_the_kept_positions_are_fixed_integer_hashes():
    """The positions are part of what a kept cache means: they come from integer arithmetic alone,
    so they are these on every platform and NumPy version (a change here must change the cache key)."""
    positions = kept_positions(1_000_000)
    assert positions[:4].tolist() == [112, 208, 271, 543] and len(np.unique(positions)) == WHOLE_OUTPUT_LIMIT
    assert kept_positions(WHOLE_OUTPUT_LIMIT) is None
    assert sorted(kept_positions(WHOLE_OUTPUT_LIMIT + 1)) == [i for i in range(WHOLE_OUTPUT_LIMIT + 1)
                                                             if i in set(kept_positions(WHOLE_OUTPUT_LIMIT + 1))]


def test_a_class_ruled_out_on_both_sides_is_no_difference():
    """-inf (a masked class) live and frozen is equal, not NaN: the check passes and names a real difference."""
    rng = np.random.default_rng(3)
    out = rng.standard_normal((4, 1, 1, 10)).astype(np.float32)  # values, not a distribution's logits
    out[..., 2] = -np.inf
    feeds = {"x": rng.standard_normal((4, 3)).astype(np.float32)}
    _kept, check, _ = _check(every_input_summary, 2, {"y": out}, feeds, {})
    task = task_for({"y": out[:2]}, {k: v[:2] for k, v in feeds.items()}, {})
    with np.errstate(all="raise"):
        check.compare(slice(0, 2), Reference.of(task, out[0:2]))
    assert check.result().max_abs_diff == 0.0
    moved = out[2:4].copy()
    moved[0, ..., 2] = 0.0  # a class the live model ruled out now has a value: infinitely far
    with pytest.raises(ParityError, match=r"found max \|Δ\| inf at input 2, value 2 "):
        check.compare(slice(2, 4), Reference.of(task, moved))


def test_difference_of_every_kind_of_value():
    from graphaudit.replay.parity import _difference

    inf, nan = np.inf, np.nan
    frozen = np.array([1.0, 2.0, inf, -inf, inf, nan, nan, 3.0, 1e30], dtype=np.float32)
    live = np.array([1.0, 2.5, inf, -inf, -inf, nan, 1.0, nan, -1e30], dtype=np.float32)
    diff = _difference(frozen, live)
    assert diff.dtype == np.float32
    np.testing.assert_array_equal(diff[:5], [0.0, 0.5, 0.0, 0.0, inf])  # equal infinities are no difference
    assert diff[5] == 0.0 and np.isnan(diff[6]) and np.isnan(diff[7])  # NaN on both sides is none; on one, NaN
    assert diff[8] == np.float32(2e30)
    np.testing.assert_array_equal(_difference(frozen, live, nan=inf)[5:8], [0.0, inf, inf])
    assert _difference(np.array([3, 5]), np.array([3, 1])).tolist() == [0.0, 4.0]  # integers, as float64
    assert _difference(np.float32(1.5), np.float32(1.0)).shape == ()  # a scalar output


def test_a_float16_model_gets_a_tolerance_relative_to_its_outputs(tmp_path):
    # two graphs of one float16 model (live and frozen, fused differently) round differently:
    # the default tolerance is then 2^-7 of the largest live output, and the report says so
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(gated_lm(), keep_io_types=True)
    onnx.save(model, tmp_path / "half.onnx")
    onnx.save(gated_lm(), tmp_path / "single.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8, seed=1))
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(6, seed=2))
    half, single = (replay(tmp_path / f"{name}.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz",
                           conditions=("correct", "cross_input"), resamples=10) for name in ("half", "single"))
    assert single.settings["tolerance"] == DEFAULT_TOLERANCE and "tolerance_note" not in single.settings
    assert half.parity.ok and half.settings["tolerance"] > DEFAULT_TOLERANCE
    assert "computes in float16" in half.settings["tolerance_note"]
    assert half.parity.tolerance == half.settings["tolerance"]
    assert half.conditions[1].nll.value == pytest.approx(single.conditions[1].nll.value, rel=1e-2)
    given = replay(tmp_path / "half.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz",
                   conditions=("correct",), resamples=10, tolerance=0.5)
    assert given.parity.tolerance == 0.5 and "tolerance_note" not in given.settings  # a given one stands


def test_the_largest_difference_taken_a_chunk_at_a_time_is_the_whole_arrays(monkeypatch):
    """Chunks (a first batch of logits at a 50k vocabulary is 412 MB) change neither the largest
    difference nor where it is, NaN where a number was counting as infinite."""
    import numpy as np

    import graphaudit.replay.parity as parity

    rng = np.random.default_rng(0)
    live = rng.standard_normal((3, 5, 7)).astype(np.float32)
    frozen = live + rng.standard_normal(live.shape).astype(np.float32) * 1e-3
    frozen[2, 4, 6] += 0.5  # the worst, in the last chunk
    whole = parity._largest_difference(frozen, live)
    monkeypatch.setattr(parity, "DIFFERENCE_CHUNK", 8)
    assert parity._largest_difference(frozen, live) == whole
    assert whole[1] == np.ravel_multi_index((2, 4, 6), live.shape)
    frozen[0, 0, 1] = np.nan
    assert parity._largest_difference(frozen, live) == (float("inf"), 1)
    assert parity._largest_difference(np.zeros(0), np.zeros(0)) is None
