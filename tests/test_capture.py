"""Capture: complete coefficient tensors, batch first, in memory or memory-mapped, reusable."""

import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import graphaudit.replay.capture as capture_module
from graphaudit.analyses.declared_coefficients import declared_coefficients
from graphaudit.errors import GraphAuditError
from graphaudit.files import scratch
from graphaudit.load.data import from_arrays, input_specs
from graphaudit.replay.capture import _file as cache_module_file
from graphaudit.replay.capture import batch_first, capture, native
from graphaudit.replay.surgery import Trace

from support.cache_files import temporary_folders
from support.models import float_data, float_gated, gated_lm, mixing_lm, run_ort, traced


def _expected(trace, coefs, data):
    names = [o.name for o in trace.graph.output]
    outputs = dict(zip(names, run_ort(trace, {"input_ids": data.arrays["input_ids"]})))
    return {c.tensor: batch_first(c, outputs[c.tensor], data.count) for c in coefs}, outputs


@pytest.mark.parametrize("build", [gated_lm, mixing_lm])
def test_capture_in_memory_holds_every_input_batch_first(build):
    trace, coefs, data = traced(build)
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
    trace, coefs, data = traced(gated_lm)
    expected, _ = _expected(trace, coefs, data)
    cache = capture(trace, coefs, data, batch_size=3, memory_limit=100)
    folder = cache.location
    assert folder is not None and folder.is_dir() and cache.temporary
    # read through its mappings alone: a temporary cache is never reused, so its files are gone
    # from the folder once mapped (no manifest or key either)
    assert list(folder.iterdir()) == [] and set(cache._maps) == {c.tensor for c in coefs}
    for c in coefs:
        assert isinstance(cache.arrays[c.tensor].base, mmap.mmap)
        np.testing.assert_allclose(cache.arrays[c.tensor], expected[c.tensor], rtol=1e-6, atol=1e-7)
    cache.close()
    assert not folder.exists()


_KILLED_AFTER_CAPTURE = """
import os, signal, sys, tempfile
sys.path.insert(0, sys.argv[2])
tempfile.tempdir = sys.argv[1]
from support.models import gated_lm, traced
from graphaudit.replay.capture import capture
trace, coefs, data = traced(gated_lm)
cache = capture(trace, coefs, data, batch_size=3, memory_limit=0)
print(cache.location, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _run_killed(script: str, *args: str) -> subprocess.CompletedProcess:
    tests = Path(__file__).resolve().parent
    return subprocess.run([sys.executable, "-c", script, *args, str(tests)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])})


def test_a_killed_process_leaves_no_temporary_cache_file(tmp_path):
    """SIGKILL (an out-of-memory kill) runs no cleanup: the files of a temporary cache are gone
    already, their blocks freed by the kernel when the process ends."""
    done = _run_killed(_KILLED_AFTER_CAPTURE, str(tmp_path))
    assert done.returncode == -signal.SIGKILL, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.parent == tmp_path and folder.is_dir()  # the folder itself is left, empty
    assert [p for p in tmp_path.rglob("*") if not p.is_dir()] == []


_KILLED_WHILE_KEEPING = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from support.models import gated_lm, traced
import graphaudit.replay.capture as capture_module
from graphaudit.files import scratch
trace, coefs, data = traced(gated_lm)
real, batches = capture_module._check_finite, []
def killed_at_the_second_batch(*args):
    batches.append(args)
    if len(batches) == 2:  # the cache's files are being written
        print(sorted(p.name for p in (capture_module.Path(sys.argv[1]) / "new" / "deeper").rglob("*")), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    real(*args)
capture_module._check_finite = killed_at_the_second_batch
with scratch.session():  # as every command runs: its reaper outlives it
    capture_module.capture(trace, coefs, data, batch_size=3, cache_dir=sys.argv[1] + "/new/deeper", label="eval")
"""


def test_a_kept_cache_killed_while_written_leaves_no_file_nor_folder_it_made(tmp_path):
    """SIGKILL in the middle of writing a kept cache: its partial files (their blocks reserved),
    the cache's folder and the folders made for it go, removed by the reaper."""
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    done = _run_killed(_KILLED_WHILE_KEEPING, str(cache_dir))
    assert done.returncode == -signal.SIGKILL, done.stderr
    being_written = done.stdout.strip()
    assert ".partial-" in being_written and ".npy" in being_written, being_written
    deadline = time.monotonic() + 30  # the reaper's work, once the process has ended
    while os.listdir(cache_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.listdir(cache_dir) == []


def test_a_kept_cache_stays_when_its_session_ends(tmp_path, monkeypatch):
    """What a session's reaper is told to forget stays: the sealed cache and the folders made for it."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    trace, coefs, data = traced(gated_lm)
    with scratch.session():
        cache = capture(trace, coefs, data, batch_size=3, cache_dir=tmp_path / "new" / "deeper", label="eval")
        cache.close()
    assert (cache.location / "manifest.json").is_file()
    assert not [p for p in cache.location.iterdir() if p.name.startswith(".partial-")]


def test_cache_dir_is_kept_and_reused_without_running_the_model(tmp_path, monkeypatch):
    trace, coefs, data = traced(gated_lm)
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
    trace, coefs, data = traced(gated_lm)
    _, _, other = traced(gated_lm, seed=1)
    a = capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path)
    b = capture(trace, coefs, other, batch_size=4, cache_dir=tmp_path)
    c = capture(trace, coefs, data, batch_size=5, cache_dir=tmp_path)
    assert not b.reused and not c.reused
    assert len({a.location, b.location, c.location}) == 3


def test_cache_streams_in_chunks():
    trace, coefs, data = traced(gated_lm, count=9)
    with capture(trace, coefs, data, batch_size=4) as cache:
        seen = [rows for rows, _ in cache.chunks(4)]
        assert [list(r) for r in seen] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
        _rows, values = next(cache.chunks(2))
        np.testing.assert_array_equal(values["gate.1"], cache.arrays["gate.1"][:2])


def _failing_later():
    """A model whose controller gives NaN for input 5 only (a Log of a negative entry), and its
    data: a capture in batches of 2 has written batches 0..1 when batch 2 stops it."""
    model = float_gated(log_in_controller=True)
    coefs = declared_coefficients(model)
    x = float_data(8)
    x[5, 2, 1] = -0.5
    return Trace(coefs)(model).model, coefs, from_arrays({"x": x}, input_specs(model))


def test_a_capture_that_fails_in_a_later_batch_leaves_no_folder_it_made(tmp_path):
    trace, coefs, data = _failing_later()
    root = tmp_path / "new" / "cache"  # neither exists yet
    with pytest.raises(GraphAuditError, match=r"NaN/Inf values for data input 5"):
        capture(trace, coefs, data, batch_size=2, cache_dir=root)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("the user's")
    with pytest.raises(GraphAuditError, match="NaN/Inf"):
        capture(trace, coefs, data, batch_size=2, cache_dir=tmp_path / "kept")
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["mine.txt"]  # only the cache's own folder went


def test_a_failed_capture_removes_its_temporary_folder(monkeypatch):
    trace, coefs, data = _failing_later()
    made = temporary_folders(monkeypatch)
    with pytest.raises(GraphAuditError, match="NaN/Inf"):
        capture(trace, coefs, data, batch_size=2, memory_limit=0)
    assert len(made) == 1 and not made[0].exists()


def test_a_rewrite_that_fails_leaves_no_manifest_over_half_written_files(tmp_path, monkeypatch):
    trace, coefs, data = traced(gated_lm)
    first = capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path)
    folder = first.location
    first.close()
    (folder / cache_module_file(coefs[0])).write_bytes(b"truncated")  # the cache can no longer be read
    real, seen = capture_module._check_finite, []

    def stop_at_the_second_batch(coefficients, outputs, rows, label):
        seen.append(rows)
        if len(seen) == 2:
            raise GraphAuditError("stopped")
        real(coefficients, outputs, rows, label)

    monkeypatch.setattr(capture_module, "_check_finite", stop_at_the_second_batch)
    with pytest.raises(GraphAuditError, match="stopped"):
        capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path)
    assert not (folder / "manifest.json").exists()  # half the rows are new, half are not: no cache
    monkeypatch.setattr(capture_module, "_check_finite", real)
    again = capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path)
    assert not again.reused and again.location == folder and (folder / "manifest.json").is_file()
    again.close()
    assert capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path).reused


def test_an_output_is_refused_for_a_nan_and_not_for_infinities():
    """The live outputs' check reads a batch's minimum first: a NaN anywhere makes it NaN, an
    infinity of either sign does not (a log-probability of -inf is a probability of 0)."""
    check = capture_module._check_finite
    logits = np.zeros((2, 3, 5), dtype=np.float32)
    logits[0, 0, :2] = (np.inf, -np.inf)
    check([], {"logits": logits, "empty": np.zeros((0, 5), np.float32)}, slice(4, 6), "data")
    logits[1, 2, 4] = np.nan
    with pytest.raises(GraphAuditError, match=r"expected no NaN in the output 'logits', found 1 NaN values for "
                                              r"data inputs 4\.\.5"):
        check([], {"logits": logits}, slice(4, 6), "data")
