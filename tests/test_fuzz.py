"""Property-based tests: mutated models and data keep the error contract.

Whatever the bytes of a model or the arrays of a data file, graphaudit either accepts them
or answers with one line and exit status 1 — never a traceback — and leaves the file as it
was. The number of examples is bounded so CI stays fast.
"""

import hashlib

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphaudit.cli import main
from graphaudit.errors import GraphAuditError
from graphaudit.load.data import input_specs, load_data
from graphaudit.testing.synthetic import transformer_graph

MODEL_BYTES = transformer_graph(layers=2, hidden=8, heads=2, vocab=13, external=None).SerializeToString()
SPECS = input_specs(onnx.load_from_string(MODEL_BYTES))
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def mutated_model(draw):
    data = bytearray(MODEL_BYTES)
    kind = draw(st.sampled_from(["flip", "truncate", "splice", "delete"]))
    if kind == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if kind == "delete":
        start = draw(st.integers(0, len(data) - 1))
        return bytes(data[:start] + data[start + draw(st.integers(1, 64)):])
    if kind == "splice":
        start = draw(st.integers(0, len(data)))
        return bytes(data[:start]) + draw(st.binary(min_size=1, max_size=32)) + bytes(data[start:])
    for _ in range(draw(st.integers(1, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@FUZZ
@given(content=mutated_model())
def test_mutated_model_bytes_keep_the_contract(tmp_path_factory, capsys, content):
    path = tmp_path_factory.mktemp("fuzz") / "m.onnx"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(path), "--format", "json"])
    _out, err = capsys.readouterr()
    assert info.value.code in (0, 1)
    if info.value.code == 1:
        assert err.startswith("graphaudit: error: expected") and err.count("\n") == 1
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(content).digest()


@FUZZ
@given(content=mutated_model())
def test_mutated_model_bytes_keep_the_contract_in_the_static_audit(tmp_path_factory, capfd, content):
    """The static audit reads more of the graph than inspect: names, scopes, shapes, FLOPs."""
    path = tmp_path_factory.mktemp("fuzz") / "m.onnx"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as info:
        main(["static", str(path), "--format", "json", "--shape", "input_ids=1,4"])
    _out, err = capfd.readouterr()
    assert info.value.code in (0, 1, 2), err
    if info.value.code:
        assert err.startswith("graphaudit: error: expected") and err.count("\n") == 1, err
    assert path.read_bytes() == content


array_strategy = st.one_of(
    st.builds(lambda n, t: np.zeros((n, t), np.int64), st.integers(0, 3), st.integers(0, 4)),
    st.builds(lambda s: np.full(s, np.nan, np.float32), st.lists(st.integers(1, 3), min_size=1, max_size=3)),
    st.builds(lambda v: np.array(v), st.lists(st.integers(-5, 5), max_size=4)),
    st.builds(lambda v: np.array(v, dtype=np.float64), st.lists(st.floats(allow_nan=True), min_size=1, max_size=4)),
    st.builds(lambda s: np.zeros((2,) * s, np.uint8), st.integers(0, 4)),
)


@FUZZ
@given(arrays=st.dictionaries(st.sampled_from(["input_ids", "labels", "extra", "x"]), array_strategy, max_size=3))
def test_arbitrary_npz_contents_keep_the_contract(tmp_path_factory, arrays):
    path = tmp_path_factory.mktemp("fuzz") / "d.npz"
    np.savez(path, **arrays)
    before = path.read_bytes()
    try:
        data = load_data(path, SPECS)
    except GraphAuditError as err:
        assert "\n" not in str(err) and str(err).startswith("expected")
    else:
        ids = data.arrays["input_ids"]
        assert ids.dtype == np.int64 and ids.ndim == 2 and ids.size > 0
    assert path.read_bytes() == before
