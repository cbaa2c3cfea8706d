"""The coefficient cache of the tiny gated LM, captured clean, and what the tests of a damaged one
(tests/test_cache_files*.py) compare with it."""

from __future__ import annotations

import contextlib
import hashlib
import signal
from pathlib import Path

import numpy as np

import graphaudit.replay.capture as capture_module
from graphaudit.replay.capture import LiveCheck, capture
from graphaudit.replay.capture import _file as file_of

from support.models import gated_lm, traced

CHECK = LiveCheck("logit sums", lambda outputs, feeds, rows: outputs["logits"].sum(axis=(1, 2)).astype(np.float32))


def clean_capture(root: Path) -> dict:
    """The trace, coefficients and data, and the files and values of their clean cache under `root`."""
    trace, coefs, data = traced(gated_lm, count=6)
    with capture(trace, coefs, data, batch_size=4, cache_dir=root, check=CHECK) as cache:
        values = {k: np.array(v) for k, v in cache.arrays.items()}
        live = {k: np.array(v) for k, v in cache.live.items()}
        folder = cache.location
    return {"trace": trace, "coefs": coefs, "data": data, "folder": folder, "values": values, "live": live}


def capture_again(clean, root, **kwargs):
    """The clean capture's trace, coefficients and data captured again under `root`."""
    return capture(clean["trace"], clean["coefs"], clean["data"], batch_size=4, cache_dir=root, check=CHECK, **kwargs)


def files_outside(folder: Path) -> dict:
    """Every file under tmp_path except those in the cache's folder, with its digest."""
    base = folder.parent.parent
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else "entry"
            for p in sorted(base.rglob("*")) if folder not in p.parents and p != folder}


def assert_clean_values(clean, cache, reused: bool | None = None) -> None:
    """The cache holds the clean capture's values, as regular files when it is kept."""
    assert set(cache.arrays) == set(clean["values"])
    for k, v in clean["values"].items():
        np.testing.assert_array_equal(cache.arrays[k], v)
        assert cache.arrays[k].dtype == v.dtype
    assert set(cache.live) == set(clean["live"])
    for k, v in clean["live"].items():
        np.testing.assert_array_equal(cache.live[k], v)
    if reused is not None:
        assert cache.reused is reused



def npy_of(clean, folder, k: int = 0) -> Path:
    """The cached array of the clean capture's `k`-th coefficient in `folder`."""
    return folder / file_of(clean["coefs"][k])


@contextlib.contextmanager
def within(seconds: int):
    """Fail instead of hanging when the block waits on a FIFO."""
    def stop(*_):
        raise AssertionError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def temporary_folders(monkeypatch) -> list[Path]:
    """The temporary folders the capture makes from here on (its spilled caches), in order."""
    made: list[Path] = []
    real = capture_module.tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        made.append(Path(real(*args, **kwargs)))
        return str(made[-1])

    monkeypatch.setattr(capture_module.tempfile, "mkdtemp", mkdtemp)
    return made
