"""Property-based tests: the zoo's real data, mutated, through `replay` and `profile`.

Starting from the first rows and tokens of a zoo model's evaluation data, hypothesis
changes the dtype, values (token ids past the vocabulary, negative), sequence length
(including longer than the model's positions), number of rows, rank, keys, adds NaN or
labels — and the command either runs (exit 0) or answers with exactly one line starting
`graphaudit: error: expected` and exit status 1. Never a traceback; the model and both
data files are byte-for-byte unchanged. Examples are bounded and the runs minimal
(one timed round, 5 bootstrap resamples), so the file stays within seconds.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.cli import FAST_PROFILE, FAST_REPLAY, invoke, snapshot
from support.zoo import zoo_subset

# The mutations themselves cast NaN and complex values; graphaudit's own warnings are checked by `invoke`.
pytestmark = pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning",
                                        "ignore:invalid value encountered in cast:RuntimeWarning")
FUZZ = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
MODELS = ("featuregate", "moe", "earlyexit")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    return {name: zoo_subset(root / name, name, rows=4, tokens=16) for name in MODELS}


@st.composite
def mutated(draw, ids: np.ndarray) -> dict:
    """The arrays of a mutated data file, from the token ids `ids` (rows x tokens, int64)."""
    a = ids.copy()
    kinds = draw(st.lists(st.sampled_from(["dtype", "values", "tokens", "rows", "rank", "key", "nan", "labels"]),
                          min_size=1, max_size=3))
    for kind in kinds:
        if kind == "dtype":
            a = a.astype(draw(st.sampled_from([np.int32, np.int16, np.uint8, np.uint64, np.float32, np.float64,
                                               np.bool_, np.complex64])))
        elif kind == "values" and a.size:
            flat = a.reshape(-1).copy()
            for _ in range(draw(st.integers(1, 4))):
                value = draw(st.integers(-300, 600))
                if np.issubdtype(a.dtype, np.integer):  # what the dtype can hold: uint8 takes 0..255
                    value = int(np.clip(value, np.iinfo(a.dtype).min, np.iinfo(a.dtype).max))
                flat[draw(st.integers(0, flat.size - 1))] = value if a.dtype != np.bool_ else True
            a = flat.reshape(a.shape)
        elif kind == "tokens" and a.ndim == 2:
            length = draw(st.integers(0, 80))
            a = np.resize(a, (a.shape[0], length)) if length else a[:, :0]
        elif kind == "rows" and a.ndim >= 1:
            a = np.resize(a, (draw(st.integers(0, 6)), *a.shape[1:]))
        elif kind == "rank":
            a = a[..., None] if draw(st.booleans()) or a.ndim == 0 else a.reshape(-1)
        elif kind == "nan":
            a = a.astype(np.float32)
            if a.size:
                a.reshape(-1)[draw(st.integers(0, a.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    arrays = {"input_ids": a}
    if "key" in kinds:
        arrays = {draw(st.sampled_from(["ids", "input_ids", "attention_mask"])): a}
        if draw(st.booleans()):
            arrays["position_ids"] = np.zeros(a.shape[:1], np.int64)
    if "labels" in kinds:
        shape = draw(st.sampled_from([a.shape, a.shape[:1], (max(a.shape[0] - 1, 0), *a.shape[1:])]))
        dtype = draw(st.sampled_from([np.int64, np.int32, np.float32]))
        arrays["labels"] = np.random.default_rng(draw(st.integers(0, 9))).integers(-200, 300, shape).astype(dtype)
    return arrays


def _ids(paths) -> np.ndarray:
    with np.load(paths["eval"], allow_pickle=False) as archive:
        return archive["input_ids"]


def _check(zoo, tmp_path_factory, capfd, name, arrays, command):
    paths = zoo[name]
    data = tmp_path_factory.mktemp("fuzz") / "data.npz"
    np.savez(data, **arrays)
    files = [paths["model"], paths["calib"], data]
    before = snapshot(files)
    if command == "replay":
        args = ["replay", paths["model"], "--calib", paths["calib"], "--data", data, *FAST_REPLAY, "--batch-size", "4"]
    else:
        args = ["profile", paths["model"], "--data", data, *FAST_PROFILE]
    status = invoke(args)
    out, err = capfd.readouterr()
    assert status in (0, 1), err
    assert "Traceback" not in err
    if status == 1:
        assert err.startswith("graphaudit: error: expected") and err.count("\n") == 1, err
    else:
        assert err == "" and out
    assert snapshot(files) == before


@FUZZ
@given(data=st.data(), name=st.sampled_from(MODELS))
def test_mutated_zoo_data_through_replay(zoo, tmp_path_factory, capfd, data, name):
    _check(zoo, tmp_path_factory, capfd, name, data.draw(mutated(_ids(zoo[name]))), "replay")


@FUZZ
@given(data=st.data(), name=st.sampled_from(MODELS))
def test_mutated_zoo_data_through_profile(zoo, tmp_path_factory, capfd, data, name):
    _check(zoo, tmp_path_factory, capfd, name, data.draw(mutated(_ids(zoo[name]))), "profile")
