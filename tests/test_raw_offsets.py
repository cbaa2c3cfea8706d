"""Where an ONNX file keeps its inline weights' bytes (`load.raw_offsets`): the offsets read off
the encoding hold exactly each weight's raw_data, and any encoding the walk does not expect
answers None rather than a guess."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphaudit.load.raw_offsets import raw_data_spans


def _model(names=("a", "b", "c")) -> onnx.ModelProto:
    """Identity-chained weights: raw ones of several sizes, one typed (float_data), one external."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(n * 100 + 3).astype(np.float32), name)
             for n, name in enumerate(names, 1)]
    inits.append(helper.make_tensor("typed", TensorProto.FLOAT, [2], [1.0, 2.0]))  # float_data, no raw_data
    outside = TensorProto(name="outside", data_type=TensorProto.FLOAT, dims=[2], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", "8")):
        outside.external_data.add(key=key, value=value)
    inits.append(outside)
    nodes = [helper.make_node("Identity", [t.name], [f"{t.name}.out"], name=t.name) for t in inits]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(f"{t.name}.out", TensorProto.FLOAT, None)
                                               for t in inits], initializer=inits)
    return helper.make_model(graph)


def test_each_offset_holds_its_weights_raw_data_and_nothing_else_is_listed(tmp_path):
    model = _model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    data = path.read_bytes()
    found = raw_data_spans(data)
    raw = {t.name: t.raw_data for t in model.graph.initializer if t.HasField("raw_data")}
    assert sorted(found) == sorted(raw) == ["a", "b", "c"]
    for name, (start, length) in found.items():
        assert data[start:start + length] == raw[name]


@pytest.mark.parametrize("damage", ["empty", "truncated", "not onnx", "graph twice", "name twice", "group"])
def test_an_encoding_the_walk_does_not_expect_answers_none(damage):
    data = _model().SerializeToString()
    if damage == "empty":
        data = b""
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "not onnx":
        data = b"\xff" * 64
    elif damage == "graph twice":  # protobuf merges a message field given twice: the walk does not
        data += _model(("d",)).SerializeToString()
    elif damage == "name twice":
        data = _model(("a", "b", "a")).SerializeToString()
    elif damage == "group":  # a start-group key (field 15, wire type 3) among the model's fields
        data = bytes([15 << 3 | 3]) + data
    assert raw_data_spans(data) is None
