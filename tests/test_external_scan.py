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
