"""Bad model files through the commands that read them: one line, exit 1, files untouched.

Every malformed model goes through `inspect` and `static` (the commands that take any
model); the ones that are valid graphs ONNX Runtime cannot run — a custom-domain operator —
also go through `replay`, `profile` and `run`, which must name the operator while `static`
still audits the graph. External data: a missing weight file, locations that escape the
model's folder (`../`, an absolute path, a link) — refused before any file is opened, with
and without `--graph-only` — a weight file too short for its tensors or a declared length
its tensor's type contradicts, and a Pythia-shaped graph whose 5.6 GB of weights were never
written, which `static --graph-only` audits and `inspect` refuses cleanly.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphaudit.load.model
from graphaudit.testing.synthetic import WEIGHTS_FILE, transformer_graph

from support.cli import FAST_PROFILE, FAST_REPLAY, FAST_RUN, accepted, refused
from support.models import float_data, float_gated


def tiny(nodes, opset=17, inputs=("x",), outputs=("y",), initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [2]) for i in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2]) for o in outputs], initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def relu():
    return [helper.make_node("Relu", ["x"], ["y"], name="relu")]


def small_lm_bytes() -> bytes:
    return transformer_graph(layers=2, hidden=8, heads=2, vocab=13, external=None).SerializeToString()


def _ir_too_new():
    model = tiny(relu())
    model.ir_version = onnx.IR_VERSION + 3
    return model


# name -> (bytes of the file, what the error line must say)
BAD_MODEL_FILES = {
    "empty": (lambda: b"", r"expected an ONNX model in .*, found an empty file"),
    "truncated": (lambda: small_lm_bytes()[: len(small_lm_bytes()) // 2], r"do not parse .*truncated or not ONNX"),
    "random-bytes": (lambda: np.random.default_rng(8).bytes(4096), r"do not parse|no graph"),
    "text-file": (lambda: b"graph {\n  node: Relu\n}\n" * 20, r"do not parse .*not ONNX"),
    "npz-given-as-model": (lambda: _npz_bytes(), r"do not parse|no graph"),
    "tensor-protobuf": (lambda: helper.make_tensor("t", TensorProto.FLOAT, [3], [1, 2, 3]).SerializeToString(),
                        r"do not parse|no graph"),
    "graph-protobuf": (lambda: tiny(relu()).graph.SerializeToString(),
                       r"expected an ONNX model with a graph .*found a protobuf message with no graph"),
    "cycle": (lambda: tiny([helper.make_node("Relu", ["b"], ["a"], name="ra"),
                            helper.make_node("Relu", ["a"], ["b"], name="rb"),
                            helper.make_node("Add", ["x", "b"], ["y"], name="add")]),
              r"expected an acyclic ONNX graph .*found a cycle through nodes r[ab] -> r[ab]"),
    "dangling-input": (lambda: tiny([helper.make_node("Add", ["x", "nowhere"], ["y"], name="add")]),
                       r"found node add reads 'nowhere', which no node, input or initializer defines"),
    "duplicate-node-output": (lambda: tiny([helper.make_node("Relu", ["x"], ["y"]),
                                            helper.make_node("Neg", ["x"], ["y"])]),
                              r"expected every value name assigned once .*found 'y' assigned by node 'Relu' and by "
                              r"node 'Neg'; ONNX Runtime refuses it too"),
    "duplicate-graph-input": (lambda: tiny(relu(), inputs=("x", "x")),
                              r"'x' has been used as graph input names multiple times"),
    "duplicate-initializer": (lambda: tiny([helper.make_node("Add", ["x", "w"], ["y"])], initializers=[
        helper.make_tensor("w", TensorProto.FLOAT, [2], [1, 2]),
        helper.make_tensor("w", TensorProto.FLOAT, [2], [3, 4])]),
                              r"w initializer name is not unique"),
    "output-nothing-produces": (lambda: tiny([helper.make_node("Relu", ["x"], ["z"])]),
                                r"Graph output 'y' is not an output of any node"),
    "empty-input-name": (lambda: tiny(relu(), inputs=("",)), r"required to be non-empty"),
    "opset-newer-than-onnx": (lambda: tiny(relu(), opset=onnx.defs.onnx_opset_version() + 5),
                              r"expected an ai.onnx opset up to \d+ .*found opset \d+"),
    "ir-newer-than-onnx": (_ir_too_new, r"expected an ONNX IR version up to \d+ .*found \d+"),
    "non-utf8-node-name": (lambda: _non_utf8_name(),
                           r"expected node and value names that are UTF-8 text .*damaged or not ONNX"),
    "unknown-standard-op": (lambda: tiny([helper.make_node("Frobnicate", ["x"], ["y"])]),
                            r"No Op registered for Frobnicate"),
}


def _non_utf8_name() -> bytes:
    """A node name whose bytes are not UTF-8: protobuf hands it back as bytes, not text."""
    return tiny([helper.make_node("Relu", ["x"], ["y"], name="relu_name")]).SerializeToString().replace(
        b"relu_name", b"\x80elu_name")


def _npz_bytes() -> bytes:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, input_ids=np.arange(12).reshape(3, 4))
    return buffer.getvalue()


@pytest.mark.parametrize("command", ["inspect", "static"])
@pytest.mark.parametrize("case", sorted(BAD_MODEL_FILES))
def test_bad_model_file(tmp_path, capfd, case, command):
    make, message = BAD_MODEL_FILES[case]
    content = make()
    path = tmp_path / "model.onnx"
    path.write_bytes(content if isinstance(content, bytes) else content.SerializeToString())
    refused(capfd, [command, path], [path], match=message)


# -- a custom-domain operator: a valid graph ONNX Runtime cannot run --------------------------

@pytest.fixture()
def custom(tmp_path):
    onnx.save(float_gated(custom_op=True), tmp_path / "custom.onnx")
    np.savez(tmp_path / "calib.npz", x=float_data(8, seed=1))
    np.savez(tmp_path / "eval.npz", x=float_data(8, seed=2))
    return tmp_path


def test_custom_operator_static_audit_still_works_and_names_it(custom, capfd):
    files = [custom / "custom.onnx"]
    text = accepted(capfd, ["static", custom / "custom.onnx"], files)
    assert "gate.0" in text and "ONNX Runtime lacks acme.Frob" in text
    doc = json.loads(accepted(capfd, ["static", custom / "custom.onnx", "--format", "json"], files))
    assert doc["runtime_lacks"] == ["acme.Frob"] and doc["coefficients"][0]["tensor"] == "gate.0"
    assert "acme.Frob 1" in accepted(capfd, ["inspect", custom / "custom.onnx"], files)


@pytest.mark.parametrize("command", [
    ["replay", "{m}", "--calib", "{c}", "--data", "{e}", *FAST_REPLAY],
    ["profile", "{m}", "--data", "{e}", *FAST_PROFILE],
    ["run", "{m}", "--calib", "{c}", "--data", "{e}", *FAST_RUN],
], ids=["replay", "profile", "run"])
def test_custom_operator_blocks_the_runtime_parts_by_name(custom, capfd, command):
    paths = {"m": custom / "custom.onnx", "c": custom / "calib.npz", "e": custom / "eval.npz"}
    args = [str(a).format(**paths) for a in command]
    refused(capfd, args, list(paths.values()),
            match=r"expected operators ONNX Runtime implements, found acme\.Frob, which it lacks; "
                  r"the static audit \(graphaudit static\) still works")


# -- external data ---------------------------------------------------------------------------

def _external(folder, location, write_weights=False):
    folder.mkdir(parents=True, exist_ok=True)
    model = transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external=location)
    path = folder / "model.onnx"
    onnx.save(model, path)
    np.savez(folder / "ids.npz", input_ids=np.zeros((4, 5), np.int64))
    return path


def test_missing_external_data_file(tmp_path, capfd):
    path = _external(tmp_path / "m", WEIGHTS_FILE)
    files = [path, path.parent / "ids.npz"]
    for command in (["inspect", path], ["static", path], ["profile", path, "--data", files[1], *FAST_PROFILE],
                    ["replay", path, "--calib", files[1], *FAST_REPLAY]):
        refused(capfd, command, files,
                match=r"expected the external-data file 'weights.bin' beside the model .*found none")
    # the graph alone never needs the file
    assert "weights not read" in accepted(capfd, ["inspect", path, "--graph-only"], files)
    assert "blocks" in accepted(capfd, ["static", path, "--graph-only"], files)


def _weights_end(path) -> int:
    """Where the last external tensor of the model at `path` ends in its file."""
    ends = [int(e["offset"]) + int(e["length"]) for t in onnx.load(str(path), load_external_data=False).graph.initializer
            for e in [{x.key: x.value for x in t.external_data}] if t.data_location == TensorProto.EXTERNAL]
    return max(ends)


def test_weights_are_checked_on_disk_but_never_read(tmp_path, capfd, monkeypatch):
    path = _external(tmp_path / "m", WEIGHTS_FILE)
    weights = path.parent / WEIGHTS_FILE
    weights.write_bytes(bytes(_weights_end(path)))
    files = [path, weights]

    def refuse(*args, **kwargs):
        raise AssertionError("external weights were read")

    monkeypatch.setattr(graphaudit.load.model, "_load_external", refuse)
    assert "weights in their files, sizes checked, not read" in accepted(capfd, ["inspect", path], files)
    assert json.loads(accepted(capfd, ["inspect", path, "--format", "json"], files))["weights"] == "checked"
    assert "blocks" in accepted(capfd, ["static", path], files)


def test_a_truncated_weights_file_is_named(tmp_path, capfd):
    path = _external(tmp_path / "m", WEIGHTS_FILE)
    weights = path.parent / WEIGHTS_FILE
    end = _weights_end(path)
    weights.write_bytes(bytes(end - 4))  # the last float of the last tensor is missing
    files = [path, weights, path.parent / "ids.npz"]
    for command in (["inspect", path], ["static", path], ["profile", path, "--data", files[2], *FAST_PROFILE],
                    ["replay", path, "--calib", files[2], *FAST_REPLAY], ["run", path, "--calib", files[2], *FAST_RUN]):
        refused(capfd, command, files,
                match=rf"expected the external tensor '[^']+' at bytes \d+–{end} of 'weights\.bin' beside "
                      rf".*model\.onnx, found a file of {end - 4} bytes \(truncated\?\)")
    assert "blocks" in accepted(capfd, ["static", path, "--graph-only"], files)  # the graph alone never needs it


def test_a_declared_length_its_tensor_cannot_take_is_refused(tmp_path, capfd):
    folder = tmp_path / "m"
    path = _external(folder, WEIGHTS_FILE)
    model = onnx.load(str(path), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    entry = next(e for e in tensor.external_data if e.key == "length")
    needed = int(entry.value)
    entry.value = str(needed - 4)
    onnx.save(model, str(path))
    (folder / WEIGHTS_FILE).write_bytes(bytes(_weights_end(path) + needed))
    refused(capfd, ["static", path], [path, folder / WEIGHTS_FILE],
            match=rf"expected the external tensor '{tensor.name}' of .*model\.onnx to take {needed} bytes "
                  rf"\(FLOAT \[[\d, ]+\]\), found length {needed - 4}")


def _edit_external(path, key, value, tensor_index=0):
    """Set external-data `key` of the model's `tensor_index`-th external initializer to `value`; return its name."""
    model = onnx.load(str(path), load_external_data=False)
    tensor = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL][tensor_index]
    if key == "dims":
        del tensor.dims[:]
        tensor.dims.extend(value)
    else:
        next(e for e in tensor.external_data if e.key == key).value = value
    onnx.save(model, str(path))
    return tensor.name


@pytest.mark.parametrize("offset", ["abc", "-1"])
def test_an_offset_that_is_not_a_non_negative_integer_is_one_line(tmp_path, capfd, offset):
    path = _external(tmp_path / "m", WEIGHTS_FILE)
    name = _edit_external(path, "offset", offset)
    for command in (["static", path], ["static", path, "--graph-only"], ["inspect", path]):
        refused(capfd, command, [path], match=rf"expected a non-negative integer offset and length for the external "
                                             rf"tensor '{name}' of .*model\.onnx, found ")


def test_a_length_of_zero_counts_as_absent_as_in_onnx_runtime(tmp_path, capfd):
    path = _external(tmp_path / "m", WEIGHTS_FILE)
    weights = path.parent / WEIGHTS_FILE
    weights.write_bytes(np.random.default_rng(0).standard_normal(_weights_end(path) // 4).astype(np.float32).tobytes())
    _edit_external(path, "length", "0")
    files = [path, weights, path.parent / "ids.npz"]
    assert "blocks" in accepted(capfd, ["static", path], files)
    assert "latency" in accepted(capfd, ["profile", path, "--data", files[2], *FAST_PROFILE], files)


def test_negative_dims_of_an_external_tensor_are_refused(tmp_path, capfd):
    path = _external(tmp_path / "m", WEIGHTS_FILE)
    (path.parent / WEIGHTS_FILE).write_bytes(bytes(_weights_end(path)))
    name = _edit_external(path, "dims", [-2, -3])
    refused(capfd, ["static", path], [path], match=rf"expected non-negative dims for the external tensor '{name}' "
                                                  rf"of .*, found \[-2, -3\]")


def test_external_constants_inside_nodes_are_checked_against_their_file(tmp_path, capfd):
    """onnx.save_model(convert_attribute=True) moves a Constant node's value out too: the checker must
    see the file beside the model (or, for --graph-only, no file at all), never the current folder."""
    value = onnx.numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "k")  # raw data: onnx moves it out
    model = tiny([helper.make_node("Constant", [], ["k"], value=value), helper.make_node("Add", ["x", "k"], ["y"], name="add")])
    folder = tmp_path / "m"
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="k.bin", size_threshold=0,
                    convert_attribute=True)
    assert onnx.load(str(path), load_external_data=False).graph.node[0].attribute[0].t.data_location == 1
    files = [path, folder / "k.bin"]
    assert "blocks" in accepted(capfd, ["static", path], files)
    assert "weights in their files" in accepted(capfd, ["inspect", path], files)
    (folder / "k.bin").unlink()
    assert "conditional execution: no" in accepted(capfd, ["static", path, "--graph-only"], [path])
    refused(capfd, ["static", path], [path], match=r"expected the external-data file 'k\.bin' beside the model")


ESCAPES = {
    "dot-dot": ("../outside.bin", r"found '\.\./outside\.bin', which resolves to .*outside\.bin; refusing to read it"),
    "absolute": (None, r"expected external-data locations relative to the model's folder .*; refusing to read it"),
    "symlink": ("link.bin", r"found 'link\.bin', which resolves to .*secret\.bin; refusing to read it"),
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_external_data_escaping_the_model_folder_is_refused(tmp_path, capfd, case):
    location, message = ESCAPES[case]
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.random.default_rng(1).bytes(200_000))  # enough for every weight: it would load
    (tmp_path / "outside.bin").write_bytes(secret.read_bytes())
    folder = tmp_path / "model"
    folder.mkdir()
    if case == "symlink":
        (folder / "link.bin").symlink_to(secret)
    path = _external(folder, location or str(secret))
    data = folder / "ids.npz"
    files = [path, data, secret, tmp_path / "outside.bin"] + ([folder / "link.bin"] if case == "symlink" else [])
    for command in (["inspect", path], ["static", path], ["inspect", path, "--graph-only"],
                    ["static", path, "--graph-only"], ["profile", path, "--data", data, *FAST_PROFILE],
                    ["replay", path, "--calib", data, *FAST_REPLAY], ["run", path, "--calib", data, *FAST_RUN]):
        refused(capfd, command, files, match=message)


def test_a_model_past_2gb_is_audited_from_its_graph_alone(tmp_path, capfd):
    """Pythia-shaped: 24 layers, 5.6 GB of external weights that were never written."""
    path = tmp_path / "pythia.onnx"
    onnx.save(transformer_graph(), path)
    assert not (tmp_path / WEIGHTS_FILE).exists()
    doc = json.loads(accepted(capfd, ["static", path, "--graph-only", "--format", "json"], [path]))
    assert len(doc["blocks"]) == 24 and doc["blocks"][0]["name"] == "gpt_neox.layers.0"
    refused(capfd, ["inspect", path], [path], match=r"expected the external-data file 'weights\.bin' .*--graph-only")
    assert not (tmp_path / WEIGHTS_FILE).exists()
