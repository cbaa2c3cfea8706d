"""Large inline weights given to ONNX Runtime apart from the graph instead of serialised with it.

`weights_in_file` points each at its own bytes in the model's file, as external data ONNX
Runtime maps, where the file holds them as the proto does (`graph_in_file`: the graph alone, for
a session of the whole model). `weights_apart` takes them out
otherwise, leaving each as a stub of external data at STUB_LOCATION, a file that does not exist,
and gives their arrays, which `runtime.sessions.create_session` hands to ONNX Runtime
(`add_external_initializers`) before it would read one; `without_weights` leaves the stubs and
makes no array, for a graph only read.
"""

from __future__ import annotations

import math
import mmap
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from graphaudit.load.external_data import tensor_bytes
from graphaudit.load.protos import copy_except
from graphaudit.load.raw_offsets import raw_data_spans

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
    return _stubbed(model, _as_stubs(heavy)), [t.name for t in heavy], [numpy_helper.to_array(t) for t in heavy]


def weights_in_file(model: onnx.ModelProto, path: Path, over: int | None = None
                    ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]] | None:
    """`model`, as read from the file at `path`, with the large inline weights `weights_apart` would
    take out (and those already taken out as its stubs) referring instead to their own bytes in that
    file, as external data at their offsets (load.raw_offsets), and read-only views of those bytes
    by name, which copy nothing (a digest may read them). None where none go, or where the file does
    not hold each of them as `model` does (the walk could not read it, or a length differs): then
    `weights_apart`.

    ONNX Runtime maps external data and uses it in place, where it copies arrays it is handed: a
    session of the Pythia-160M-shaped frozen graph opened in 0.23-0.25 s at 1380 MiB this way,
    against 0.74-2.61 s at 2109-2151 MiB handed its weights (benchmarks/NOTES.md)."""
    found = _found_in_file(model, path, over)
    if found is None:
        return None
    graph, mapped, moved = found
    views = {t.name: np.frombuffer(mapped, _little_endian(t.data_type), math.prod(t.dims), offset)
             .reshape(tuple(t.dims)) for t, offset in moved}
    return graph, views


def graph_in_file(model: onnx.ModelProto, path: Path, over: int | None = None) -> onnx.ModelProto | None:
    """`weights_in_file`'s graph alone, no view made: for a session that is to map the weights
    from the model's file itself (None where `weights_in_file` gives None)."""
    found = _found_in_file(model, path, over)
    return None if found is None else found[0]


def _found_in_file(model: onnx.ModelProto, path: Path, over: int | None
                   ) -> tuple[onnx.ModelProto, mmap.mmap, list[tuple[onnx.TensorProto, int]]] | None:
    """`weights_in_file`'s graph, the file mapped, and each weight moved with its offset there."""
    heavy = _heavy(model, over) + [t for t in model.graph.initializer if is_stub(t)]
    if not heavy:
        return None
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # closed once no view of it is left
    except (OSError, ValueError):  # gone, or empty: nothing to point at
        return None
    offsets = raw_data_spans(mapped)
    if not offsets:
        return None
    spans = {}
    for tensor in heavy:
        span = offsets.get(tensor.name)
        if span is None or span[1] != tensor_bytes(tensor):
            return None
        spans[tensor.name] = span
    graph = _stubbed(model, {name: (path.name, *span) for name, span in spans.items()})
    return graph, mapped, [(t, spans[t.name][0]) for t in heavy]


def without_weights(model: onnx.ModelProto, over: int | None = None) -> onnx.ModelProto:
    """`model` with the weights `weights_apart` takes out left as its stubs, and no array made:
    a graph to read, for a model whose sessions read its file (`model` itself when none go)."""
    heavy = _heavy(model, over)
    return _stubbed(model, _as_stubs(heavy)) if heavy else model


def holds_weights(model: onnx.ModelProto, over: int | None = None) -> bool:
    """Whether `model` holds weights `weights_apart` would take out (past `over` bytes), inline or
    already taken out as its stubs."""
    return bool(_heavy(model, over)) or any(is_stub(t) for t in model.graph.initializer)


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


def _stubbed(model: onnx.ModelProto, moved: dict[str, tuple[str, int, int]]) -> onnx.ModelProto:
    """A copy of `model` whose initializers named in `moved` are external data at the (location,
    offset, length) given, their types and shapes kept."""
    skeleton = onnx.ModelProto()
    copy_except(model, skeleton, "graph")
    copy_except(model.graph, skeleton.graph, "initializer")
    for tensor in model.graph.initializer:
        if tensor.name not in moved:
            skeleton.graph.initializer.append(tensor)
            continue
        stub = skeleton.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        location, offset, length = moved[tensor.name]
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
            stub.external_data.add(key=key, value=value)
    return skeleton


def _as_stubs(heavy: list[onnx.TensorProto]) -> dict[str, tuple[str, int, int]]:
    """Where `_stubbed` puts each of `heavy` as a stub: at STUB_LOCATION, a file that does not exist."""
    return {t.name: (STUB_LOCATION, 0, tensor_bytes(t) or 0) for t in heavy}


def _little_endian(data_type: int) -> np.dtype:
    """The NumPy type of raw data of an ONNX element type, which is little-endian on every machine."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).newbyteorder("<")


def is_stub(tensor: onnx.TensorProto) -> bool:
    """Whether `tensor` is a weight `weights_apart` took out (its data handed over as an array)."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == STUB_LOCATION for e in tensor.external_data)
