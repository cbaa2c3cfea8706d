"""Large inline weights handed to ONNX Runtime as arrays instead of serialised with the graph.

`weights_apart` takes a model's large inline weights out, leaving each as a stub of external
data at STUB_LOCATION, a file that does not exist, and gives their arrays, which
`runtime.sessions.create_session` hands to ONNX Runtime (`add_external_initializers`) before it
would read one; `without_weights` leaves the stubs and makes no array, for a graph only read.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from graphaudit.load.external_data import tensor_bytes
from graphaudit.load.protos import copy_except

# Inline weights past this many bytes reach ONNX Runtime as arrays, not serialised (weights_apart)
HANDED_OVER = 2**20
_NATIVE_TYPES = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BOOL,
    onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64,
})
STUB_LOCATION = "graphaudit: weights handed over as arrays"  # the location a weight taken out declares


def weights_apart(model: onnx.ModelProto, over: int | None = None) -> tuple[onnx.ModelProto, list[str], list]:
    """`model` with its large inline weights taken out, their names and their arrays.

    A session of a model that holds its weights costs a serialisation of every weight and
    ONNX Runtime's parse of it back (1.3 s for 282 MB); handed over as arrays
    (`add_external_initializers`), they are copied once instead (0.6 s). The weights past
    `over` bytes (HANDED_OVER) of the main graph whose element type NumPy holds natively go;
    the copy declares each as external data of a file that does not exist, which ONNX
    Runtime replaces before it would read one. ONNX Runtime infers shapes before it puts the
    arrays in, so a value inference reads (a Reshape's shape, an Unsqueeze's axes: a few
    integers) must stay, and does at any sensible `over`. `model` itself comes back when none go."""
    heavy = _heavy(model, over)
    if not heavy:
        return model, [], []
    return _stubbed(model, {t.name for t in heavy}), [t.name for t in heavy], [numpy_helper.to_array(t) for t in heavy]


def without_weights(model: onnx.ModelProto, over: int | None = None) -> onnx.ModelProto:
    """`model` with the weights `weights_apart` takes out left as its stubs, and no array made:
    a graph to read, for a model whose sessions read its file (`model` itself when none go)."""
    heavy = _heavy(model, over)
    return _stubbed(model, {t.name for t in heavy}) if heavy else model


def weight_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of an initializer held in the proto, or held apart as a stub (`weights_apart`);
    0 for one stored in an external file, or of a type without a fixed size."""
    held = tensor.data_location != onnx.TensorProto.EXTERNAL or is_stub(tensor)
    return (tensor_bytes(tensor) or 0) if held else 0


def _heavy(model: onnx.ModelProto, over: int | None) -> list[onnx.TensorProto]:
    """The main graph's inline initializers past `over` bytes (None: HANDED_OVER) whose element
    type NumPy holds natively: those `weights_apart` takes out."""
    over = HANDED_OVER if over is None else over
    return [t for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL
            and t.data_type in _NATIVE_TYPES and (tensor_bytes(t) or 0) > over]


def _stubbed(model: onnx.ModelProto, moved: set[str]) -> onnx.ModelProto:
    """A copy of `model` whose initializers named in `moved` are stubs of external data at
    STUB_LOCATION, their types and shapes kept."""
    skeleton = onnx.ModelProto()
    copy_except(model, skeleton, "graph")
    copy_except(model.graph, skeleton.graph, "initializer")
    for tensor in model.graph.initializer:
        if tensor.name not in moved:
            skeleton.graph.initializer.append(tensor)
            continue
        stub = skeleton.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", STUB_LOCATION), ("offset", "0"), ("length", str(tensor_bytes(tensor)))):
            stub.external_data.add(key=key, value=value)
    return skeleton


def is_stub(tensor: onnx.TensorProto) -> bool:
    """Whether `tensor` is a weight `weights_apart` took out (its data handed over as an array)."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == STUB_LOCATION for e in tensor.external_data)
