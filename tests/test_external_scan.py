"""Finding the tensors a model keeps outside it (`external_data.scan`): counted in the file's own
bytes when the caller has them, and every nested one still found."""

import onnx
from onnx import TensorProto, helper

from graphaudit.load import external_data


def _external(name: str, dims: list[int], offset: int) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", str(offset)), ("length", str(4 * dims[0] * dims[1]))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def _model(nested: bool) -> onnx.ModelProto:
    """y = x @ w0 @ w1, and with `nested` + c, c a Constant node whose value lies outside too."""
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("MatMul", ["h", "w1"], ["y"])]
    if nested:
        nodes[-1].output[0] = "m"
        nodes += [helper.make_node("Constant", [], ["c"], value=_external("c", [2, 2], 32)),
                  helper.make_node("Add", ["m", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
                              initializer=[_external("w0", [2, 2], 0), _external("w1", [2, 2], 16)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_file_of_main_graph_references_alone_is_read_by_one_count():
    model = _model(nested=False)
    payload = model.SerializeToString()
    found, nested = external_data.scan(model, payload)
    assert [t.name for t in found] == ["w0", "w1"] and nested is False
    assert ([t.name for t in external_data.scan(model)[0]], external_data.scan(model)[1]) == (["w0", "w1"], False)


def test_a_nested_external_tensor_is_found_with_the_files_bytes_too():
    model = _model(nested=True)
    payload = model.SerializeToString()
    for given in (payload, None):
        found, nested = external_data.scan(model, given)
        assert sorted(t.name for t in found) == ["c", "w0", "w1"] and nested is True


def _declared_through_the_api(model: onnx.ModelProto, moved) -> onnx.ModelProto:
    """What as_inputs gives, built one ValueInfoProto at a time through protobuf's Python API."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.initializer[:]
    declared = {vi.name for vi in model.graph.input}
    for tensor in model.graph.initializer:
        if not moved(tensor):
            copy.graph.initializer.append(tensor)
        elif tensor.name not in declared:
            copy.graph.input.add(name=tensor.name).type.CopyFrom(
                helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims)))
    return copy


def test_weights_made_inputs_are_encoded_as_protobuf_would_write_them():
    """as_inputs writes the inputs' encoding itself: names past 16,383 bytes (a length of three varint
    bytes), names that are not ASCII, types of many dims, a weight already declared as an input
    (IR 3) and one kept as an initializer all come out as the Python API would build them."""
    model = _model(nested=False)
    long_name, accented = "w" * 20_000, "poids_é_重"
    model.graph.initializer.extend([_external(long_name, [3, 5], 32), _external(accented, [1, 1], 92)])
    # lengths of one varint byte and of two, either side of 128, for the name and for the input
    edges = ["e" * n for n in (109, 110, 126, 127, 128)]
    model.graph.initializer.extend([_external(name, [1, 1], 96) for name in edges])
    kept = TensorProto(name="k", data_type=TensorProto.INT64, dims=[2], int64_data=[1, 2])
    model.graph.initializer.append(kept)
    model.graph.initializer.append(TensorProto(name="b", data_type=TensorProto.FLOAT16, dims=[1, 2, 3, 4, 5, 6]))
    model.graph.initializer[-1].data_location = TensorProto.EXTERNAL
    model.graph.input.append(helper.make_tensor_value_info("w1", TensorProto.FLOAT, [2, 2]))

    copy = external_data.as_inputs(model)

    expected = _declared_through_the_api(model, lambda t: t.data_location == TensorProto.EXTERNAL)
    assert copy.SerializeToString() == expected.SerializeToString()
    assert [vi.name for vi in copy.graph.input] == ["x", "w1", "w0", long_name, accented, *edges, "b"]
    assert [t.name for t in copy.graph.initializer] == ["k"]
    assert list(copy.graph.input[-1].type.tensor_type.shape.dim) == [
        onnx.TensorShapeProto.Dimension(dim_value=d) for d in (1, 2, 3, 4, 5, 6)]
    assert len(model.graph.initializer) == 11  # the model itself is left as it was


def test_a_model_with_nothing_to_move_is_copied_as_it_is():
    model = _model(nested=False)
    assert external_data.as_inputs(model, lambda t: False) == model
