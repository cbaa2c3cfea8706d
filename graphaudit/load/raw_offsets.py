"""Where an ONNX file keeps the bytes of its inline weights.

A weight stored inline is a TensorProto in the main graph whose `raw_data` field holds its
values: a run of bytes at some offset of the file, in the little-endian layout external data
uses. `raw_data_spans` reads those offsets off the file's protobuf encoding, so that ONNX
Runtime can be pointed at the weights in the file itself (as external data) instead of being
handed a copy of each (runtime.handed_weights). No protobuf library gives a field's offset in
its encoding; the walk reads only the fields' keys and lengths (the weights' bytes are skipped,
never read) and gives up, answering None, on any encoding it does not expect.
"""

from __future__ import annotations

# Field numbers in onnx.proto: ModelProto.graph, GraphProto.initializer, TensorProto.name, .raw_data
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_NAME, _TENSOR_RAW_DATA = 7, 5, 8, 9
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5  # the wire types a message of onnx.proto uses


class _Unexpected(Exception):
    """An encoding the walk does not read (groups, a field past its message, a bad varint)."""


def raw_data_spans(encoded) -> dict[str, tuple[int, int]] | None:
    """Name -> (offset, length) in `encoded` (a model's encoding: bytes, or a mapped file) of each
    main-graph initializer's `raw_data` bytes; None where the walk cannot say (no graph, or one
    split over two fields, which protobuf merges; a name given twice; an encoding it does not read)."""
    try:
        return _offsets(encoded)
    except _Unexpected:
        return None


def _offsets(buf) -> dict[str, tuple[int, int]] | None:
    graphs = [(start, end) for number, start, end in _fields(buf, 0, len(buf)) if number == _MODEL_GRAPH]
    if len(graphs) != 1 or graphs[0][0] is None:
        return None
    found: dict[str, tuple[int, int]] = {}
    for number, start, end in _fields(buf, *graphs[0]):
        if number != _GRAPH_INITIALIZER or start is None:
            continue
        name, raw = None, None
        for field, at, stop in _fields(buf, start, end):
            if field == _TENSOR_NAME and at is not None:
                name = bytes(buf[at:stop]).decode("utf-8", errors="strict")
            elif field == _TENSOR_RAW_DATA and at is not None:
                raw = (at, stop - at)  # a field given twice: the last one counts, as protobuf reads it
        if name is None or name in found:
            return None
        if raw is not None:
            found[name] = raw
    return found


def _fields(buf, start: int, end: int):
    """(field number, start, end) of each field of the message in buf[start:end]: the payload's
    bounds for a length-delimited field, (None, None) for the others."""
    at = start
    while at < end:
        key, at = _varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, at = _varint(buf, at)
            yield number, None, None
        elif wire in (_FIXED64, _FIXED32):
            at += 8 if wire == _FIXED64 else 4
            yield number, None, None
        elif wire == _LENGTH:
            length, at = _varint(buf, at)
            yield number, at, at + length
            at += length
        else:
            raise _Unexpected(f"wire type {wire}")
        if at > end:
            raise _Unexpected("a field past the end of its message")


def _varint(buf, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(buf) or shift > 63:
            raise _Unexpected("a varint past the end of the file, or longer than 10 bytes")
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
