"""Capture: complete coefficient tensors, batch first, in memory or memory-mapped, reusable."""

import numpy as np
import pytest

import graphaudit.capture as capture_module
from graphaudit.capture import _file as cache_module_file
from graphaudit.capture import batch_first, capture, native
from graphaudit.coefficients import declared_coefficients
from graphaudit.data import from_arrays, input_specs
from graphaudit.surgery import trace_graph
from test_replay_models import gated_lm, mixing_lm, run_ort, token_ids


def _setup(build, count=10, seed=0):
    model = build()
    coefs = declared_coefficients(model)
    trace = trace_graph(model, coefs)
    data = from_arrays({"input_ids": token_ids(count, seed=seed)}, input_specs(model))
    return trace, coefs, data


def _expected(trace, coefs, data):
    names = [o.name for o in trace.graph.output]
    outputs = dict(zip(names, run_ort(trace, {"input_ids": data.arrays["input_ids"]})))
    return {c.tensor: batch_first(c, outputs[c.tensor]) for c in coefs}, outputs


@pytest.mark.parametrize("build", [gated_lm, mixing_lm])
def test_capture_in_memory_holds_every_input_batch_first(build):
    trace, coefs, data = _setup(build)
    expected, outputs = _expected(trace, coefs, data)
    with capture(trace, coefs, data, batch_size=4) as cache:
        assert cache.location is None and cache.count == 10
        for c in coefs:
            np.testing.assert_allclose(cache.arrays[c.tensor], expected[c.tensor], rtol=1e-6, atol=1e-7)
            rows = np.array([7, 2])
            np.testing.assert_array_equal(cache.rows(c, rows), cache.arrays[c.tensor][rows])
            back = native(c, cache.rows(c, slice(0, 10)))
            assert back.flags.c_contiguous and back.shape == outputs[c.tensor].shape
        np.testing.assert_allclose(cache.live["logits"], outputs["logits"][:4], rtol=1e-6, atol=1e-6)
        assert set(cache.live) == {"logits"}


def test_capture_past_the_memory_limit_is_memory_mapped_and_removed_on_close():
    trace, coefs, data = _setup(gated_lm)
    expected, _ = _expected(trace, coefs, data)
    cache = capture(trace, coefs, data, batch_size=3, memory_limit=100)
    folder = cache.location
    assert folder is not None and folder.is_dir() and cache.temporary
    assert sorted(p.suffix for p in folder.iterdir()) == [".json", ".npy", ".npy", ".npz"]
    for c in coefs:  # the files are plain .npy arrays
        np.testing.assert_array_equal(np.load(folder / cache_module_file(c)), cache.arrays[c.tensor])
    for c in coefs:
        np.testing.assert_allclose(cache.arrays[c.tensor], expected[c.tensor], rtol=1e-6, atol=1e-7)
    cache.close()
    assert not folder.exists()


def test_cache_dir_is_kept_and_reused_without_running_the_model(tmp_path, monkeypatch):
    trace, coefs, data = _setup(gated_lm)
    first = capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path, label="eval")
    values = {k: np.array(v) for k, v in first.arrays.items()}
    first.close()
    assert first.location.parent == tmp_path and (first.location / "manifest.json").is_file()

    def no_session(*args, **kwargs):
        raise AssertionError("the model ran although the cache matched")

    monkeypatch.setattr(capture_module, "create_session", no_session)
    second = capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path, label="eval")
    assert second.reused and second.location == first.location
    for k, v in values.items():
        np.testing.assert_array_equal(second.arrays[k], v)
    np.testing.assert_array_equal(second.live["logits"], first.live["logits"])


def test_cache_is_not_reused_for_other_data_or_batches(tmp_path):
    trace, coefs, data = _setup(gated_lm)
    _, _, other = _setup(gated_lm, seed=1)
    a = capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path)
    b = capture(trace, coefs, other, batch_size=4, cache_dir=tmp_path)
    c = capture(trace, coefs, data, batch_size=5, cache_dir=tmp_path)
    assert not b.reused and not c.reused
    assert len({a.location, b.location, c.location}) == 3


def test_cache_streams_in_chunks():
    trace, coefs, data = _setup(gated_lm, count=9)
    with capture(trace, coefs, data, batch_size=4) as cache:
        seen = [rows for rows, _ in cache.chunks(4)]
        assert [list(r) for r in seen] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
        rows, values = next(cache.chunks(2))
        np.testing.assert_array_equal(values["gate.1"], cache.arrays["gate.1"][:2])
