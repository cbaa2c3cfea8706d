"""Input data files: checked against the model's inputs, pickles refused."""

import numpy as np
import onnx.parser
import pytest

from graphaudit.errors import GraphAuditError
from graphaudit.load.data import input_specs, load_data

MODEL = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
m (int64[batch, seq] input_ids, float[batch, 4] extra) => (float[batch, seq] y) {
    f = Cast <to = 1> (input_ids)
    s = ReduceSum <keepdims = 1> (extra, axes)
    y = Add (f, s)
}
""".replace("(extra, axes)", "(extra)"))
SPECS = input_specs(MODEL)


def save(tmp_path, **arrays):
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    return path


def good(n=3):
    return {"input_ids": np.arange(n * 5).reshape(n, 5), "extra": np.ones((n, 4), np.float32)}


def test_specs_come_from_graph_inputs():
    assert [s.name for s in SPECS] == ["input_ids", "extra"]
    assert SPECS[0].shape == ("batch", "seq") and SPECS[0].dtype == np.int64


def test_good_file_loads_and_batches(tmp_path):
    data = load_data(save(tmp_path, **good(5), labels=np.zeros((5, 5), np.int64)), SPECS)
    assert data.count == 5 and "labels" in data.labels
    sizes = [feeds["input_ids"].shape[0] for _, feeds in data.batches(2)]
    assert sizes == [2, 2, 1]


def test_int32_ids_are_widened_losslessly(tmp_path):
    arrays = good()
    arrays["input_ids"] = arrays["input_ids"].astype(np.int32)
    data = load_data(save(tmp_path, **arrays), SPECS)
    assert data.arrays["input_ids"].dtype == np.int64


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.pop("extra"), "missing extra"),
        (lambda a: a.update(bogus=np.ones(3)), r"unexpected keys \['bogus'\]"),
        (lambda a: a.update(extra=a["extra"].astype(np.float64)), "dtype float32, found float64"),
        (lambda a: a.update(input_ids=a["input_ids"].astype(np.float32)), "dtype int64, found float32"),
        (lambda a: a.update(input_ids=a["input_ids"][0]), "rank 2 .* found rank 1"),
        (lambda a: a.update(extra=np.ones((3, 5), np.float32)), "size 4 on axis 1, found 5"),
        (lambda a: a.update(extra=np.ones((2, 4), np.float32)), "same number of examples"),
        (lambda a: a.update(input_ids=np.zeros((0, 5), np.int64), extra=np.zeros((0, 4), np.float32)), "empty array"),
        (lambda a: a["extra"].__setitem__((0, 0), np.nan), "NaN/Inf"),
    ],
    ids=["missing", "extra-key", "float64", "float-ids", "rank", "fixed-dim", "batch-mismatch", "empty", "nan"],
)
def test_bad_arrays_are_refused(tmp_path, change, message):
    arrays = good()
    change(arrays)
    path = save(tmp_path, **arrays)
    before = path.read_bytes()
    with pytest.raises(GraphAuditError, match=message) as info:
        load_data(path, SPECS)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == before


def test_pickled_objects_are_refused(tmp_path):
    arrays = good()
    arrays["input_ids"] = np.array([object(), 1], dtype=object)
    path = save(tmp_path, **arrays)
    with pytest.raises(GraphAuditError, match="pickled Python objects"):
        load_data(path, SPECS)


def test_not_an_npz(tmp_path):
    path = tmp_path / "d.npz"
    path.write_bytes(b"hello")
    with pytest.raises(GraphAuditError, match="not a zip archive"):
        load_data(path, SPECS)


def test_an_empty_axis_the_model_leaves_open_is_data(tmp_path):
    # a decoder's past keys on its first step: (batch, heads, 0 positions, head size)
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    m (int64[batch, seq] input_ids, float[batch, 2, past, 4] past_key) => (float[batch, 2, total, 4] y) {
        y = Concat <axis = 2> (past_key, past_key)
    }""")
    specs = input_specs(model)
    ids = np.arange(15).reshape(3, 5)
    data = load_data(save(tmp_path, input_ids=ids, past_key=np.zeros((3, 2, 0, 4), np.float32)), specs)
    assert data.count == 3 and data.arrays["past_key"].shape == (3, 2, 0, 4)
    past = np.zeros((3, 2, 1, 4), np.float32)
    for arrays, message in (
        ({"input_ids": ids[:0], "past_key": past[:0]}, "'input_ids' .* to hold data, found an empty array"),  # batch
        ({"input_ids": ids[:, :0], "past_key": past}, "'input_ids' .* to hold data, found an empty array"),  # tokens
        ({"input_ids": ids, "past_key": np.zeros((3, 0, 1, 4), np.float32)}, "size 2 on axis 1, found 0"),
    ):
        with pytest.raises(GraphAuditError, match=message):
            load_data(save(tmp_path, **arrays), specs)


SCALAR_FLAG = """
<ir_version: 8, opset_import: ["" : 17]>
m (float[batch, 4] x, bool use_cache_branch) => (float[batch, 4] y) {
    y = Identity (x)
}"""


def test_a_scalar_graph_input_is_fed_whole_to_every_batch(tmp_path):
    # a merged decoder exported with a scalar `use_cache_branch`: a 0-d array in the .npz is
    # given to every batch as it is, neither sliced by rows nor counted as examples
    specs = input_specs(onnx.parser.parse_model(SCALAR_FLAG))
    assert [s.axis for s in specs] == [0, None]
    data = load_data(save(tmp_path, x=np.ones((3, 4), np.float32), use_cache_branch=np.array(True)), specs)
    assert data.count == 3 and set(data.arrays) == {"x"}
    assert [(feeds["x"].shape, feeds["use_cache_branch"]) for _, feeds in data.batches(2)] == [((2, 4), True),
                                                                                              ((1, 4), True)]


@pytest.mark.parametrize("flag", [np.zeros((3,), bool), np.zeros((3, 1), bool)], ids=["one-per-example", "one-by-one"])
def test_a_scalar_graph_input_given_per_example_is_refused(tmp_path, flag):
    path = save(tmp_path, x=np.ones((3, 4), np.float32), use_cache_branch=flag)
    with pytest.raises(GraphAuditError, match=r"expected 'use_cache_branch' in d.npz to be one value for every batch, "
                                              r"a 0-d array \(the model's input is a scalar, shape \[\]\), found shape"):
        load_data(path, input_specs(onnx.parser.parse_model(SCALAR_FLAG)))


def test_a_scalar_graph_input_without_a_value_says_how_to_give_one(tmp_path):
    with pytest.raises(GraphAuditError, match=r"expected a value for the model's input use_cache_branch: bool \(\), "
                                              r"fed whole to every batch, found none in d.npz: give it as --set "
                                              r"use_cache_branch=VALUE or as a 0-d array 'use_cache_branch' in the .npz"):
        load_data(save(tmp_path, x=np.ones((3, 4), np.float32)), input_specs(onnx.parser.parse_model(SCALAR_FLAG)))
