"""A damaged coefficient cache, at random: every outcome is the clean values or one line.

A hypothesis strategy corrupts the files of the tiny gated LM's clean cache (cut, flipped bytes,
another dtype, random JSON, links, FIFOs, folders); capturing again then either reuses or
rebuilds it with the clean capture's values, or refuses in one line (a folder where a file goes),
and nothing outside the cache changes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphaudit.errors import GraphAuditError
from graphaudit.replay.cache_files import LIVE_FILE, MANIFEST
from graphaudit.replay.capture import _CHECK_FILE

from support.cache_files import assert_clean_values, capture_again, clean_capture, files_outside, npy_of, within


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The trace, coefficients and data, and the files and values of their clean cache."""
    return clean_capture(tmp_path_factory.mktemp("clean"))


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)
DESCRS = ["|O", "<f8", ">f4", "<f2", "<i4", "|b1", "|V4", "<U1", "|S4", "<c8", "<M8[s]", [("a", "<f4")]]


@st.composite
def corruption(draw) -> list[tuple]:
    """A few changes to the cache's files: (kind, file, parameters)."""
    files = st.sampled_from(["gate.0", "gate.1", "check", "live", "manifest"])
    kinds = st.sampled_from(["truncate", "flip-header", "flip-data", "descr", "json", "json-field", "link",
                             "link-dangling", "folder", "fifo", "empty"])
    return [(draw(kinds), draw(files), draw(st.integers(0, 2**31)), draw(JSON), draw(st.sampled_from(DESCRS)))
            for _ in range(draw(st.integers(1, 3)))]


def _corrupt(clean, folder: Path, outside: Path, change: tuple) -> None:
    kind, which, seed, value, descr = change
    rng = np.random.default_rng(seed)
    path = {"gate.0": npy_of(clean, folder, 0), "gate.1": npy_of(clean, folder, 1), "check": folder / _CHECK_FILE,
            "live": folder / LIVE_FILE, "manifest": folder / MANIFEST}[which]
    if path.is_symlink() or not path.is_file():
        return  # already replaced by an earlier change
    raw = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(raw[:int(rng.integers(0, len(raw)))])
    elif kind in ("flip-header", "flip-data"):
        data = bytearray(raw)
        low, high = (0, min(128, len(raw))) if kind == "flip-header" else (min(128, len(raw) - 1), len(raw))
        for at in rng.integers(low, high, size=int(rng.integers(1, 4))):
            data[at] ^= int(rng.integers(1, 256))
        path.write_bytes(bytes(data))
    elif kind == "descr" and path.suffix == ".npy":
        with open(path, "rb") as f:
            try:
                np.lib.format.read_magic(f)
                shape, _, _ = np.lib.format.read_array_header_2_0(f)
            except ValueError:  # an earlier change cut or flipped its header: it is damaged already
                return
            offset = f.tell()
        with open(path, "wb") as f:
            np.lib.format.write_array_header_2_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
            f.write(raw[offset:])
    elif kind == "json":
        path.write_text(json.dumps(value))
    elif kind == "json-field" and which == "manifest":
        try:
            manifest = json.loads(raw)
        except ValueError:  # an earlier change cut or flipped it: it is damaged already
            return
        node, keys = manifest, []
        while isinstance(node, dict) and node and rng.random() < 0.7:
            key = sorted(node)[int(rng.integers(0, len(node)))]
            keys.append(key)
            node = node[key]
        if keys:
            parent = manifest
            for key in keys[:-1]:
                parent = parent[key]
            parent[keys[-1]] = value
            path.write_text(json.dumps(manifest))
    elif kind == "link":
        path.unlink()
        path.symlink_to(outside / "mine.npy")
    elif kind == "link-dangling":
        path.unlink()
        path.symlink_to(outside / "not-there")
    elif kind == "folder":
        path.unlink()
        path.mkdir()
    elif kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "empty":
        path.write_bytes(b"")


FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(changes=corruption())
def test_a_randomly_damaged_cache_gives_the_clean_values_or_one_line(clean, tmp_path_factory, changes):
    base = tmp_path_factory.mktemp("fuzz")
    folder = base / "cache" / clean["folder"].name
    shutil.copytree(clean["folder"], folder)
    outside = base / "outside"
    outside.mkdir()
    (outside / "mine.npy").write_bytes(b"the user's own file")
    for change in changes:
        _corrupt(clean, folder, outside, change)
    before = files_outside(folder)
    try:
        with within(30), capture_again(clean, folder.parent) as again:
            assert_clean_values(clean, again)  # reused (the changes undid nothing) or rebuilt: the same values
            assert again.reused or again.rebuilt
    except GraphAuditError as err:
        message = str(err)
        assert message.startswith("expected") and "\n" not in message, message
        assert "found a folder" in message, message  # the only refusal a damaged file gives
    assert files_outside(folder) == before
    assert (outside / "mine.npy").read_bytes() == b"the user's own file"

