"""Property-based tests: zip members with hostile flags, methods and sizes; shapes negative, zero, huge.

Each .npz is built from numpy's own bytes, then hypothesis rewrites its member's flag bits
(encryption, strong encryption, patch data, data descriptor, UTF-8 names), compression
method (stored, Deflate, Deflate64, bzip2, LZMA, Zstandard, PPMd, AES) and declared sizes
(lying up or down), or its .npy header's shape. Every outcome is either the data read or one
GraphAuditError line starting "expected": through `static --data` (headers only) and through
`load_data`, the path `replay`, `profile` and `run` read data by, which refuses whatever the
headers alone refuse. Shapes given as `--shape` are refused (exit 2, one line) exactly when a
dimension is not in 1..2^31-1 or the array would pass 2^47 bytes.
"""

from __future__ import annotations

import math
import struct
import zipfile

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphaudit.errors import GraphAuditError
from graphaudit.limits import MAX_ARRAY_BYTES, MAX_DIM, check_shape
from graphaudit.load.data import data_shapes, input_specs, load_data

from support.archives import patch_member
from support.cli import invoke, snapshot
from support.models import gated_lm, token_ids

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
IDS = token_ids(6, seed=4)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz_sizes") / "gated.onnx"
    onnx.save(gated_lm(), path)
    return path


@pytest.fixture(scope="module")
def specs(model):
    return input_specs(onnx.load(model))


def _header(shape, descr="<i8") -> bytes:
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    text += " " * ((64 - (len(text) + 11) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


DIMS = st.one_of(st.integers(-8, 8), st.integers(-2**66, 2**66),
                 st.sampled_from([0, -1, MAX_DIM, MAX_DIM + 1, 2**32, 2**63 - 1, 2**63, 2**64]))


@st.composite
def hostile_member(draw) -> dict:
    """How a one-member .npz is made and then patched."""
    return {
        "shape": draw(st.one_of(st.just(IDS.shape), st.lists(DIMS, min_size=0, max_size=3).map(tuple))),
        "method": draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])),
        "flags": draw(st.sampled_from([None, 0x1, 0x41, 0x20, 0x8, 0x800, 0x1 | 0x8])),
        "patched_method": draw(st.sampled_from([None, 0, 8, 9, 12, 14, 93, 98, 99])),
        "file_size": draw(st.sampled_from([None, 0, 1, 100, 10**6, 10**9, 2**32 - 2])),
        "compress_size": draw(st.sampled_from([None, 0, 1, 10, 10**6])),
    }


def _write(path, m: dict):
    with zipfile.ZipFile(path, "w", compression=m["method"]) as archive:
        archive.writestr("input_ids.npy", _header(m["shape"]) + IDS.tobytes())
    patch_member(path, flags=m["flags"], method=m["patched_method"], file_size=m["file_size"],
                 compress_size=m["compress_size"])


def _one_line(err: GraphAuditError) -> None:
    text = str(err)
    assert text.startswith("expected") and "\n" not in text and "Traceback" not in text, text


@FUZZ
@given(m=hostile_member())
def test_hostile_zip_members_are_read_or_refused_in_one_line(model, specs, tmp_path_factory, capfd, m):
    path = tmp_path_factory.mktemp("member") / "data.npz"
    _write(path, m)
    before = snapshot([model, path])
    try:
        shapes = data_shapes(path, specs)
    except GraphAuditError as err:
        _one_line(err)
        shapes = None
    try:
        data = load_data(path, specs)
    except GraphAuditError as err:
        _one_line(err)
        data = None
    if shapes is None:  # one path: what the headers refuse, no command reads
        assert data is None
    if data is not None:
        np.testing.assert_array_equal(data.arrays["input_ids"], IDS)
    status = invoke(["static", model, "--data", path])
    _out, err = capfd.readouterr()
    assert status == (0 if shapes is not None else 1), err
    assert "Traceback" not in err
    if status:
        assert err.startswith("graphaudit: error: expected") and err.count("\n") == 1, err
    assert snapshot([model, path]) == before


@FUZZ
@given(shape=st.lists(DIMS, min_size=0, max_size=3).map(tuple))
def test_header_shapes_are_refused_unless_every_dimension_is_in_bounds(specs, tmp_path_factory, shape):
    path = tmp_path_factory.mktemp("shape") / "data.npz"
    count = math.prod(shape) if all(0 <= d <= 64 for d in shape) else 0
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("input_ids.npy", _header(shape) + bytes(8 * max(count, 0)))
    in_bounds = all(0 <= d <= MAX_DIM for d in shape) and math.prod(shape) * 8 <= MAX_ARRAY_BYTES
    try:
        found = data_shapes(path, specs)
    except GraphAuditError as err:
        _one_line(err)
        found = None
    if not in_bounds:
        assert found is None, (shape, found)
    else:
        assert found is None or found["input_ids"] == (1, *shape[1:])
    if found is None:
        with pytest.raises(GraphAuditError):
            load_data(path, specs)


@FUZZ
@given(shape=st.lists(DIMS, min_size=1, max_size=3))
def test_shapes_given_on_the_command_line_are_refused_unless_in_bounds(model, capfd, shape):
    status = invoke(["static", model, "--shape", "input_ids=" + ",".join(map(str, shape))])
    out, err = capfd.readouterr()
    fits = len(shape) == 2 and all(1 <= d <= MAX_DIM for d in shape) and math.prod(shape) * 8 <= MAX_ARRAY_BYTES
    assert status == (0 if fits else 2), err
    assert "Traceback" not in err
    if not fits:
        assert err.startswith("graphaudit: error: expected") and err.count("\n") == 1, err
    else:
        assert "FLOPs:" in out


def test_check_shape_gives_python_ints_and_names_the_shape_it_was_given():
    dims = check_shape((np.int64(2), 3), "x")
    assert dims == (2, 3) and all(type(d) is int for d in dims)
    with pytest.raises(GraphAuditError, match=r"found True on axis 1 of \(2, True\)"):
        check_shape((2, True), "x")
