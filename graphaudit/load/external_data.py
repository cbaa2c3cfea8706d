"""External data: the tensors an ONNX model keeps in files beside it, found and checked unread.

Where the tensors are (`scan`, `external_tensors`, `locations`), that their locations stay in
the model's folder (`check_location`), that their files exist (`require_files`) and hold every
tensor's bytes at its offset, by the files' sizes alone (`check_extents`), and the copy of a
model whose external initializers are graph inputs, for the ONNX checker (`as_inputs`).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import external_data_helper

from graphaudit.errors import GraphAuditError, brief
from graphaudit.files.path_kinds import path_kind
from graphaudit.load.protos import copy_except

# A TensorProto stored outside serialises data_location (field 14) = EXTERNAL (1) as these bytes.
_EXTERNAL_MARK = b"\x70\x01"
# External-data keys onnx accepts without checking their values (offset and length it checks).
_EXTERNAL_KEYS = frozenset({"checksum", "basepath"})
# Element types packed below one byte per value in raw data: type -> bits per value.
_SUB_BYTE = {getattr(onnx.TensorProto, name): bits for name, bits in
             (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
             if hasattr(onnx.TensorProto, name)}


def check_extents(tensors: list[onnx.TensorProto], base: Path, path: Path | None) -> None:
    """Refuse any of `tensors` (external, their files in `base`) whose bytes do not fit its file or
    whose declared length contradicts its type and shape; one `stat` per file, nothing read."""
    sizes: dict[str, int] = {}
    for tensor in tensors:
        _check_extent(tensor, base, path, sizes)


def external_locations(model: onnx.ModelProto) -> list[str]:
    """The distinct locations the model's external tensors name, in onnx's tensor order."""
    return locations(external_tensors(model), None)


def locations(tensors: list[onnx.TensorProto], path: Path | None) -> list[str]:
    """The distinct locations `tensors` name, in their order (`path`: the model, for errors)."""
    found: dict[str, None] = {}
    for tensor in tensors:
        found.setdefault(location(tensor, path), None)
    return list(found)


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The tensors stored outside the model, in the order onnx's own helpers list them."""
    return scan(model)[0]


def scan(model: onnx.ModelProto, payload: bytes | None = None) -> tuple[list[onnx.TensorProto], bool]:
    """The tensors stored outside the model, in onnx's order, and whether any of them lies
    outside the main graph's initializers (in a subgraph, a node attribute or a function).
    `payload`: the model's encoding, when the caller has it (the file it was parsed from)."""
    graph = model.graph
    main = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    # Every external tensor's encoding holds _EXTERNAL_MARK: a file with as many as the main
    # graph's initializers has no other (one count over a file of external references).
    if main and payload is not None and payload.count(_EXTERNAL_MARK) == len(main):
        return main, False
    # Walking every attribute of every node in Python costs about as much as shape inference
    # of the graph. Where the nodes' and functions' bytes hold no _EXTERNAL_MARK (the usual
    # case), only the main graph's initializers can be external; a chance match costs the walk.
    nested = b"".join([n.SerializeToString() for n in graph.node]
                      + [f.SerializeToString() for f in model.functions])
    if _EXTERNAL_MARK not in nested:
        return main, False
    every = [t for t in external_data_helper._get_all_tensors(model) if external_data_helper.uses_external_data(t)]
    return every, len(every) > len(main)


def _info(tensor: onnx.TensorProto, path: Path | None) -> external_data_helper.ExternalDataInfo:
    """onnx's reading of the tensor's external-data keys; a bad offset or length is a one-line error."""
    try:
        with warnings.catch_warnings():
            # onnx warns of keys it does not know, then ignores them; so does graphaudit.
            warnings.simplefilter("ignore", UserWarning)
            return external_data_helper.ExternalDataInfo(tensor)
    except ValueError as err:
        where = f" of {path}" if path else ""
        raise GraphAuditError(
            f"expected a non-negative integer offset and length for the external tensor {tensor.name!r}{where}, "
            f"found {brief(err)}"
        ) from None


def location(tensor: onnx.TensorProto, path: Path | None) -> str:
    """The tensor's external-data location, as onnx's ExternalDataInfo reads it."""
    named = ""
    for entry in tensor.external_data:
        key, value = entry.key, entry.value
        if key == "location":
            named = value
        elif key not in _EXTERNAL_KEYS and not (
            key in ("offset", "length") and value.isascii() and value.isdigit()
        ):
            # An unknown key (onnx warns) or an offset or length to validate (onnx raises).
            return _info(tensor, path).location
    return named


def check_location(location: str, base: Path, path: Path | None) -> None:
    """Refuse an external-data location that is absolute or resolves outside `base`."""
    where = f" (model {path})" if path else ""
    if not location or os.path.isabs(location) or location.startswith(("/", "\\")):
        raise GraphAuditError(
            f"expected external-data locations relative to the model's folder{where}, "
            f"found {location!r}; refusing to read it"
        )
    try:
        target = (base / location).resolve()
    except (OSError, RuntimeError, ValueError) as err:  # a link loop, a NUL byte, a name too long
        raise GraphAuditError(
            f"expected external-data locations that name files in the model's folder{where}, "
            f"found {location!r}, which does not resolve ({brief(err)}); refusing to read it"
        ) from None
    if target != base and base not in target.parents:
        raise GraphAuditError(
            f"expected external-data locations inside the model's folder {base}{where}, "
            f"found {location!r}, which resolves to {target}; refusing to read it"
        )


def require_files(external: list[str], base: Path | None, path: Path | None) -> None:
    """Refuse external weights that are not where the model says: a ModelProto has no folder to look in."""
    if base is None:
        raise GraphAuditError(
            "expected a model with its weights inline when given a ModelProto, found "
            f"external-data references ({', '.join(external[:3])}); load it from its file"
        )
    for name in external:
        if not (base / name).is_file():
            found = path_kind(base / name).replace("nothing", "none", 1)  # a pipe or a device is there: say so
            raise GraphAuditError(
                f"expected the external-data file {name!r} beside the model {path}, "
                f"found {found}; load with weights=False (--graph-only) to audit the graph alone"
            )


def _check_extent(tensor: onnx.TensorProto, base: Path, path: Path | None, sizes: dict[str, int]) -> None:
    """Refuse an external tensor whose bytes do not fit its file or whose length contradicts its type."""
    info = _info(tensor, path)
    if any(d < 0 for d in tensor.dims):
        raise GraphAuditError(
            f"expected non-negative dims for the external tensor {tensor.name!r} of {path}, found {list(tensor.dims)}"
        )
    needed = tensor_bytes(tensor)
    if info.length and needed is not None and info.length != needed:  # 0 counts as absent, as in ONNX Runtime
        raise GraphAuditError(
            f"expected the external tensor {tensor.name!r} of {path} to take {needed} bytes "
            f"({onnx.TensorProto.DataType.Name(tensor.data_type)} {list(tensor.dims)}), found length {info.length}"
        )
    if info.location not in sizes:
        sizes[info.location] = (base / info.location).stat().st_size
    start, length = info.offset or 0, info.length or needed
    if length is not None and start + length > sizes[info.location]:
        raise GraphAuditError(
            f"expected the external tensor {tensor.name!r} at bytes {start}–{start + length} of "
            f"{info.location!r} beside {path}, found a file of {sizes[info.location]} bytes (truncated?)"
        )


def tensor_bytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes the tensor's values take in raw form, None for types without a fixed size (strings)."""
    if tensor.data_type == onnx.TensorProto.STRING:
        return None
    try:
        bits = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize * 8
    except (KeyError, ValueError, TypeError):
        return None
    if tensor.data_type in _SUB_BYTE:
        bits = _SUB_BYTE[tensor.data_type]
    return (math.prod(tensor.dims) * bits + 7) // 8


def as_inputs(model: onnx.ModelProto, moved: Callable[[onnx.TensorProto], bool] | None = None) -> onnx.ModelProto:
    """A copy whose initializers picked by `moved` (default: those stored outside, so that the
    checker opens no file) are typed graph inputs; the moved tensors' values are never copied.
    One already declared as an input (IR 3) keeps that declaration.

    Where every moved tensor is an external reference (a few bytes), the model is copied whole
    in C++ and its initializers dropped, a third of the time of copying it field by field. The
    inputs are appended as one encoded GraphProto merged into the copy (protobuf appends a
    repeated field's entries on a merge): building each ValueInfoProto through the Python API
    took three times as long. Together, a tenth of the loader's time on 8,000 weights."""
    moved = moved or (lambda t: t.data_location == onnx.TensorProto.EXTERNAL)
    declared = {vi.name for vi in model.graph.input}
    types: dict[tuple, bytes] = {}  # (data type, dims) -> the input's encoded type field: weights repeat shapes
    kept = []
    inputs = []
    inline = False  # whether a moved tensor holds its values
    for tensor in model.graph.initializer:
        if not moved(tensor):
            kept.append(tensor)
            continue
        inline = inline or tensor.data_location != onnx.TensorProto.EXTERNAL
        if tensor.name not in declared:
            key = (tensor.data_type, *tensor.dims)
            typed = types.get(key)
            if typed is None:
                type_proto = onnx.helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))
                typed = types[key] = _field(_VALUE_INFO_TYPE, type_proto.SerializeToString())
            inputs.append(_field(_GRAPH_INPUT, _field(_VALUE_INFO_NAME, tensor.name.encode()) + typed))
    copy = onnx.ModelProto()
    if inline:
        copy_except(model, copy, "graph")
        copy_except(model.graph, copy.graph, "initializer")
    else:
        copy.CopyFrom(model)
        del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    if inputs:
        copy.MergeFromString(_field(_MODEL_GRAPH, b"".join(inputs)))
    return copy


# Tags of the length-delimited fields as_inputs encodes: ModelProto.graph (7), GraphProto.input
# (11), ValueInfoProto.name (1) and ValueInfoProto.type (2); a tag is (field << 3) | 2.
_MODEL_GRAPH, _GRAPH_INPUT, _VALUE_INFO_NAME, _VALUE_INFO_TYPE = b"\x3a", b"\x5a", b"\x0a", b"\x12"
_ONE_BYTE = [bytes((size,)) for size in range(0x80)]  # the varint of each length below 128


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited protobuf field: its tag, the payload's length as a varint, the payload."""
    size = len(payload)
    if size < 0x80:  # one byte of length: a weight's name, its type, the input they make
        return tag + _ONE_BYTE[size] + payload
    length = bytearray()
    while size > 0x7F:
        length.append((size & 0x7F) | 0x80)
        size >>= 7
    length.append(size)
    return tag + bytes(length) + payload
