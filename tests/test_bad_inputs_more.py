"""More bad inputs from a fuzzing run, held to the one-line contract of tests/support/cli.py.

Metadata whose bytes are not UTF-8 (on a node, in a function, in the model's coefficient
declaration), a coefficient declaration nested too deeply to parse, a `--block-pattern`
whose `index` group matches letters, an .npz whose header declares an array no memory holds,
external-data locations that cannot be resolved (a link to itself, a NUL byte) and an
external-data key onnx does not know, and model paths that are not regular files.
"""

from __future__ import annotations

import os
import struct
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphaudit.analyses.declared_coefficients import METADATA_KEY, declared_coefficients
from graphaudit.errors import GraphAuditError

from support.cli import FAST_PROFILE, FAST_REPLAY, accepted, refused
from support.models import float_data, float_gated

PLACEHOLDER = "@@not-utf8@@"
NOT_UTF8 = b"\xff\xfe" + b"x" * (len(PLACEHOLDER) - 2)


def save_not_utf8(model: onnx.ModelProto, path: Path) -> Path:
    """Save `model` with every PLACEHOLDER in its strings replaced by bytes that are not UTF-8."""
    payload = model.SerializeToString()
    assert PLACEHOLDER.encode() in payload
    path.write_bytes(payload.replace(PLACEHOLDER.encode(), NOT_UTF8))
    return path


def _node_metadata(key: str) -> onnx.ModelProto:
    model = float_gated()
    model.graph.node[3].metadata_props.add(key=key, value=f"{PLACEHOLDER}: blocks.0/MatMul")
    return model


def _function_node_metadata() -> onnx.ModelProto:
    body = helper.make_node("Relu", ["a"], ["b"], name="inner")
    body.metadata_props.add(key="namespace", value=PLACEHOLDER)
    function = helper.make_function("local", "Act", ["a"], ["b"], [body], [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Act", ["x"], ["y"], name="act", domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, functions=[function], ir_version=8,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])


def _model_metadata_value() -> onnx.ModelProto:
    model = float_gated()
    next(p for p in model.metadata_props if p.key == METADATA_KEY).value = f'[{{"tensor": "{PLACEHOLDER}"}}]'
    return model


NOT_UTF8_MODELS = {
    "node-namespace": lambda: _node_metadata("namespace"),
    "node-name-scopes": lambda: _node_metadata("pkg.torch.onnx.name_scopes"),
    "node-fx-node": lambda: _node_metadata("pkg.torch.onnx.fx_node"),
    "function-node": _function_node_metadata,
    "model-coefficients": _model_metadata_value,
}


@pytest.mark.parametrize("command", ["static", "inspect"])
@pytest.mark.parametrize("case", sorted(NOT_UTF8_MODELS))
def test_metadata_that_is_not_utf8_is_refused(tmp_path, capfd, case, command):
    path = save_not_utf8(NOT_UTF8_MODELS[case](), tmp_path / "model.onnx")
    refused(capfd, [command, path], [path], match=r"expected (model|node) metadata that is UTF-8 text")


def test_runtime_commands_refuse_node_metadata_that_is_not_utf8(tmp_path, capfd):
    path = save_not_utf8(_node_metadata("namespace"), tmp_path / "model.onnx")
    data = tmp_path / "calib.npz"
    np.savez(data, x=float_data())
    refused(capfd, ["replay", path, "--calib", data, *FAST_REPLAY], [path, data], match="UTF-8")
    refused(capfd, ["profile", path, "--data", data, *FAST_PROFILE], [path, data], match="UTF-8")


def test_declared_coefficients_refuse_a_value_that_is_not_utf8():
    payload = _model_metadata_value().SerializeToString().replace(PLACEHOLDER.encode(), NOT_UTF8)
    with pytest.raises(GraphAuditError, match=f"expected UTF-8 text in the model's '{METADATA_KEY}' metadata"):
        declared_coefficients(onnx.ModelProto.FromString(payload))


@pytest.mark.parametrize("value", ["[" * 100_000 + "]" * 100_000,
                                   "[" + '{"a":' * 50_000 + "1" + "}" * 50_000 + "]",
                                   "[" + '{"a":' * 950 + "1" + "}" * 950 + "]"])
def test_coefficients_nested_too_deeply_are_refused(tmp_path, capfd, value):
    model = float_gated()
    next(p for p in model.metadata_props if p.key == METADATA_KEY).value = value
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    refused(capfd, ["inspect", path], [path], match=f"'{METADATA_KEY}' metadata, found JSON nested too deeply")


@pytest.mark.parametrize("pattern", ["(?P<index>[a-z]+)", "(?P<index>[a-z]+)/"])
def test_a_block_pattern_whose_index_group_matches_letters_is_bad_usage(tmp_path, capfd, pattern):
    path = tmp_path / "model.onnx"
    onnx.save(float_gated(), path)
    refused(capfd, ["static", path, "--block-pattern", pattern], [path],
            match=r"expected the `index` group of --block-pattern .* to match digits", code=2)


def test_a_block_pattern_whose_index_is_past_any_block_number_is_bad_usage(tmp_path, capfd):
    model = float_gated()
    model.graph.node[3].name = "block" + "7" * 5000 + "/matmul"  # past int()'s 4300 digits
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    refused(capfd, ["static", path, "--block-pattern", r"block(?P<index>\d+)"], [path],
            match=r"expected the `index` group of --block-pattern .* to match digits", code=2)


def _npy_header(shape, descr="<f4") -> bytes:
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    text += " " * ((64 - (len(text) + 11) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


@pytest.mark.parametrize("command", ["replay", "profile"])
def test_an_npz_declaring_an_array_too_large_for_memory_is_refused(tmp_path, capfd, command):
    path = tmp_path / "model.onnx"
    onnx.save(float_gated(), path)
    data = tmp_path / "huge.npz"
    with zipfile.ZipFile(data, "w") as archive:
        archive.writestr("x.npy", _npy_header((10**6, 10**6, 20)) + b"\0" * 64)  # dims within 2^31-1
    flag, fast = ("--calib", FAST_REPLAY) if command == "replay" else ("--data", FAST_PROFILE)
    refused(capfd, [command, path, flag, data, *fast], [path, data],
            match=r"expected arrays that fit in memory .*found a declared shape .*80000000000000 bytes\) for key 'x'")


def external_model(folder: Path, location: str, extra: dict[str, str] | None = None) -> Path:
    """x (2,) + w, w stored in w.bin but named by `location` (and `extra` keys) in the model."""
    folder.mkdir(parents=True, exist_ok=True)
    w = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w")
    (folder / "w.bin").write_bytes(w.raw_data)
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, **(extra or {})}.items():
        w.external_data.add(key=key, value=value)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="add")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, folder / "model.onnx")
    return folder / "model.onnx"


@pytest.mark.parametrize("graph_only", [[], ["--graph-only"]])
def test_an_external_location_that_links_to_itself_is_refused(tmp_path, capfd, graph_only):
    path = external_model(tmp_path / "m", "loop.bin")
    os.symlink("loop.bin", tmp_path / "m" / "loop.bin")
    refused(capfd, ["static", path, *graph_only], [path, tmp_path / "m" / "w.bin"],
            match=r"expected external-data locations .*found 'loop.bin', which does not resolve")


@pytest.mark.parametrize("graph_only", [[], ["--graph-only"]])
def test_an_external_location_with_a_nul_byte_is_refused(tmp_path, capfd, graph_only):
    path = external_model(tmp_path / "m", "w.bin\x00/../../etc/passwd")
    refused(capfd, ["static", path, *graph_only], [path, tmp_path / "m" / "w.bin"],
            match=r"expected external-data locations .*which does not resolve \(embedded null byte\)")


def test_an_unknown_external_data_key_is_ignored_without_a_warning(tmp_path, capfd):
    path = external_model(tmp_path / "m", "w.bin", {"weird": "zzz"})
    accepted(capfd, ["static", path], [path, tmp_path / "m" / "w.bin"])


@pytest.mark.parametrize("command", ["static", "inspect"])
def test_a_character_device_is_refused_before_it_is_read(capfd, command):
    device = Path("/dev/zero")
    if not device.exists():
        pytest.skip("no /dev/zero")
    refused(capfd, [command, device], [], match=r"expected an ONNX model file, found a character device at /dev/zero")


def test_a_named_pipe_is_refused_before_it_is_opened(tmp_path, capfd):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)  # opening it would wait for a writer for ever
    refused(capfd, ["inspect", fifo], [], match=r"expected an ONNX model file, found a named pipe \(FIFO\) at ")


def test_an_npy_header_past_numpys_limit_is_named(tmp_path, capfd):
    """numpy refuses headers over 10 kB from untrusted files; that is not a pickle, and says so."""
    array = np.zeros((2, 3), np.float32)
    header = {"descr": "<f4", "fortran_order": False, "shape": (2, 3)}
    text = repr(header) + " " * 20_000 + "\n"
    npy = b"\x93NUMPY\x02\x00" + struct.pack("<I", len(text)) + text.encode("latin1") + array.tobytes()
    path = tmp_path / "big_header.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", npy)
    model = tmp_path / "model.onnx"
    onnx.save(float_gated(), model)
    refused(capfd, ["replay", model, "--calib", path, "--resamples", "5", "-q"], [model, path],
            match=r"expected \.npy headers of at most 10 kB in .*big_header\.npz .*found a larger one")


@pytest.mark.parametrize("member", ["x.npy", "x"])
def test_an_npz_member_without_an_npy_header_is_named(tmp_path, capfd, member):
    """numpy hands such a member back as its raw bytes; that is neither an array of the wrong
    dtype nor a pickle, and the error says what it is."""
    path = tmp_path / "junk.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, b"hello, not an array")
    model = tmp_path / "model.onnx"
    onnx.save(float_gated(), model)
    refused(capfd, ["replay", model, "--calib", path, "--resamples", "5", "-q"], [model, path],
            match=r"expected every member of .*junk\.npz to be a NumPy \.npy array, found 'x' holding 19 bytes "
                  r"without the \.npy header")
