"""The ONNX checker is handed a model's large inline weights as typed inputs, values left out,
where every check it makes of them holds without the values; any other weight it judges itself."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphaudit.errors import GraphAuditError
from graphaudit.load.inference import INFER_WEIGHTS_OVER
from graphaudit.load.model import load_model

ROWS = 4
COLUMNS = INFER_WEIGHTS_OVER // (4 * ROWS) + 8  # float32: a weight just past the limit


def _model(weight: TensorProto) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, COLUMNS])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _weight() -> TensorProto:
    return numpy_helper.from_array(np.arange(ROWS * COLUMNS, dtype=np.float32).reshape(ROWS, COLUMNS), "W")


def _saved(tmp_path, model: onnx.ModelProto):
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_the_checker_is_not_handed_a_large_weights_values(tmp_path, monkeypatch):
    weight = _weight()
    path = _saved(tmp_path, _model(weight))
    handed: list[int] = []
    real = onnx.checker.check_model

    def check(model, *args, **kwargs):
        handed.append(len(model))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(onnx.checker, "check_model", check)
    loaded = load_model(path)
    assert len(handed) == 1 and handed[0] < len(weight.raw_data) // 100, handed
    # the model itself keeps its weight, and its shapes are inferred as before
    assert numpy_helper.to_array(loaded.model.graph.initializer[0]).sum() == numpy_helper.to_array(weight).sum()
    assert loaded.shape_inference_ok


def test_a_large_weight_short_of_bytes_is_refused_in_the_checkers_words(tmp_path):
    weight = _weight()
    weight.raw_data = weight.raw_data[:-4]  # one value short
    with pytest.raises(GraphAuditError, match="too small for the declared shape"):
        load_model(_saved(tmp_path, _model(weight)))


def test_a_large_weight_in_a_typed_field_is_still_the_checkers(tmp_path):
    short = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[ROWS, COLUMNS])
    short.float_data.extend([0.0] * (ROWS * COLUMNS - 1))  # one value short
    with pytest.raises(GraphAuditError, match="too small for the declared shape"):
        load_model(_saved(tmp_path, _model(short)))


def test_a_large_weight_with_two_value_fields_is_refused(tmp_path):
    weight = _weight()
    weight.float_data.append(1.0)  # raw_data and float_data both set
    with pytest.raises(GraphAuditError, match="one and only one value field"):
        load_model(_saved(tmp_path, _model(weight)))


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field: its key byte, the payload's length as a varint, the payload."""
    length, size = bytearray(), len(payload)
    while size > 0x7F:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    length.append(size)
    return bytes([tag]) + bytes(length) + payload


def test_a_weights_size_read_off_the_encoding_is_the_one_protobuf_reads(tmp_path):
    """The size the checker's test reads off the file (`raw_data_spans`, sparing a copy of each
    weight) is that of the raw_data protobuf parses: where the field is given twice, the last one,
    here a value short, so the checker is handed the weight and refuses it."""
    weight = _weight()
    short = weight.raw_data[:-4]
    tensor = weight.SerializeToString() + _field(9 << 3 | 2, short)  # TensorProto.raw_data again
    assert TensorProto.FromString(tensor).raw_data == short
    model = _model(weight)
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    del graph.initializer[:]
    model.ClearField("graph")
    encoded = model.SerializeToString() + _field(7 << 3 | 2, graph.SerializeToString() + _field(5 << 3 | 2, tensor))
    assert onnx.ModelProto.FromString(encoded).graph.initializer[0].raw_data == short
    path = tmp_path / "m.onnx"
    path.write_bytes(encoded)
    with pytest.raises(GraphAuditError, match="too small for the declared shape"):
        load_model(path)
