"""Messages that name what is there: a pipe or a device given as data, a header that is no
plain literal, a file where a folder should be, sequences with no next token, a profile that
cannot stand for longer or shorter inputs, and text inputs (string tensors)."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphaudit.files.path_kinds import not_a_folder, path_kind
from graphaudit.metrics.tasks import Task, no_nll_reason

from support.cli import FAST_PROFILE, FAST_REPLAY, FAST_RUN, accepted, refused
from support.models import gated_lm, token_ids

VOCAB = 16


def mixing_map() -> onnx.ModelProto:
    """A causal-LM-shaped model whose coefficient `mix.0` is an attention-like map (batch, token,
    source): its `source` axis is as long as the sequence, like its token axis."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(VOCAB, 8)).astype(np.float32), "E"),
             numpy_helper.from_array(rng.normal(size=(8, VOCAB)).astype(np.float32), "W")]
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["x"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["mix.0"], axis=-1),
             helper.make_node("MatMul", ["mix.0", "x"], ["y"]),
             helper.make_node("MatMul", ["y", "W"], ["logits"])]
    graph = helper.make_graph(
        nodes, "mixing_map", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.metadata_props.add(key="graphaudit.coefficients", value=json.dumps(
        [{"tensor": "mix.0", "family": "mix", "layer": 0, "axes": ["batch", "token", "source"]}]))
    onnx.checker.check_model(model, full_check=True)
    return model


def text_model() -> onnx.ModelProto:
    """A model of one string input, `text` (batch), scoring whether each text is "yes"."""
    nodes = [helper.make_node("Constant", [], ["yes"], value=helper.make_tensor("yes", TensorProto.STRING, [], [b"yes"])),
             helper.make_node("Equal", ["text", "yes"], ["eq"]),
             helper.make_node("Cast", ["eq"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["f", "one"], ["score"])]
    graph = helper.make_graph(nodes, "text", [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
                              [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])],
                              [numpy_helper.from_array(np.array([1], np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("named")
    onnx.save(gated_lm(), folder / "ids.onnx")
    np.savez(folder / "ids.npz", input_ids=token_ids(8, seed=1))
    os.mkfifo(folder / "pipe.npz")
    return folder


# -- what is at a path ---------------------------------------------------------------------

def test_path_kinds_in_words(files):
    assert path_kind(files / "pipe.npz") == "a named pipe (FIFO)"
    assert path_kind("/dev/zero") == "a character device"
    assert path_kind(files / "ids.npz") == "a file" and path_kind(files) == "a directory"
    assert path_kind(files / "none.npz") == "nothing"
    assert not_a_folder(files / "ids.onnx") == f"a file at {files / 'ids.onnx'}, not a folder"
    assert not_a_folder(files / "ids.onnx" / "sub") == f"a file at {files / 'ids.onnx'}, not a folder"
    assert not_a_folder(files / "none") == f"no folder {files / 'none'}"


@pytest.mark.parametrize("command", [["static", "{m}", "--data", "{d}"], ["profile", "{m}", "--data", "{d}", *FAST_PROFILE],
                                     ["replay", "{m}", "--calib", "{d}", *FAST_REPLAY]])
@pytest.mark.parametrize("data, kind", [("pipe.npz", r"a named pipe \(FIFO\)"), ("/dev/zero", "a character device")])
def test_a_pipe_or_a_device_given_as_data_is_named_and_never_read(files, capfd, command, data, kind):
    path = files / data if not data.startswith("/") else data
    args = [a.format(m=files / "ids.onnx", d=path) for a in command]
    err = refused(capfd, args, [files / "ids.onnx"], match=rf"expected a data file \(\.npz\) at {path}, found {kind}$")
    assert "found nothing" not in err


def test_an_output_under_a_file_names_the_file(files, capfd):
    model = files / "ids.onnx"
    for option in (["-o", model / "report.json"], ["--trace", model / "deeper" / "trace.json"]):
        command = ["run", model, "--calib", files / "ids.npz", *FAST_RUN] if option[0] == "-o" else \
            ["profile", model, "--data", files / "ids.npz", *FAST_PROFILE]
        err = refused(capfd, [*command, *option], [model, files / "ids.npz"],
                      match=rf"expected {option[0]} to name a file in an existing folder, found a file at "
                            rf"{model}, not a folder$")
        assert "no folder" not in err


# -- a header numpy reads only as literals -------------------------------------------------

def _npy(header: str) -> bytes:
    text = header.encode("latin1")
    text += b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + b"\x00" * 8


@pytest.mark.parametrize("command", [["static", "{m}", "--data", "{d}"], ["profile", "{m}", "--data", "{d}", *FAST_PROFILE]])
def test_a_header_that_is_no_literal_is_quoted_not_shown_as_a_syntax_node(files, capfd, command, tmp_path):
    data = tmp_path / "call.npz"
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (f(1), 6), }"
    with zipfile.ZipFile(data, "w") as archive:
        archive.writestr("input_ids.npy", _npy(header))
    err = refused(capfd, [a.format(m=files / "ids.onnx", d=data) for a in command], [files / "ids.onnx", data])
    assert "<ast." not in err and "object at 0x" not in err
    assert "a readable .npy header for 'input_ids'" in err
    assert f"found: the header {header!r}, which is not a plain literal" in err


# -- sequences with no next token ----------------------------------------------------------

def test_why_there_is_no_nll_in_words():
    lm = Task("causal_lm", "logits", ids="input_ids")
    assert "hold 1 token each: there is no next token to score 'logits' against" in no_nll_reason(lm, 1)
    assert "left out" in no_nll_reason(lm, 6)  # long enough: every target was left out
    assert no_nll_reason(Task("classification", "probs"), None) == \
        "the data has no labels or targets to score 'probs' against"


def test_one_token_sequences_say_there_is_no_next_token(files, capfd, tmp_path):
    model, calib, data = tmp_path / "lm.onnx", tmp_path / "c.npz", tmp_path / "e.npz"
    onnx.save(gated_lm(), model)
    np.savez(calib, input_ids=token_ids(8, length=1, seed=1))
    np.savez(data, input_ids=token_ids(8, length=1, seed=2))
    out = accepted(capfd, ["replay", model, "--calib", calib, "--data", data, *FAST_REPLAY], [model, calib, data])
    line = next(line for line in out.splitlines() if line.startswith("no NLL"))
    assert "hold 1 token each: there is no next token to score 'logits' against" in line
    assert "no labels or targets" not in line
    out = accepted(capfd, ["run", model, "--calib", calib, "--data", data, "--format", "json", *FAST_RUN],
                   [model, calib, data])
    doc = json.loads(out)
    assert "no next token" in doc["replay"]["settings"]["no_nll"]
    assert "no next token" in doc["verdict"]["functional_dependence"]["statement"]
    assert "no labels or targets" not in doc["verdict"]["functional_dependence"]["statement"]


# -- a profile that cannot stand for the evaluation inputs ---------------------------------

def test_a_profile_over_a_length_dependent_axis_is_refused_in_words(capfd, tmp_path):
    model, calib, data = tmp_path / "mix.onnx", tmp_path / "c.npz", tmp_path / "e.npz"
    onnx.save(mixing_map(), model)
    rng = np.random.default_rng(0)
    np.savez(calib, input_ids=rng.integers(0, VOCAB, (8, 8)))
    np.savez(data, input_ids=rng.integers(0, VOCAB, (8, 4)))
    err = refused(capfd, ["replay", model, "--calib", calib, "--data", data, *FAST_REPLAY], [model, calib, data],
                  match=r"expected static_layer's profile of 'mix\.0' to fit the evaluation inputs' coefficients "
                        r"of shape \(4, 4\) per batch, found one of shape \(1, 8\) from calibration: axis source "
                        r"\(8 in calibration, 4 in evaluation\) changes with the inputs' length")
    assert "broadcast" not in err


# -- text inputs ---------------------------------------------------------------------------

def test_a_string_input_takes_numpy_text_and_refuses_objects_and_bytes(capfd, tmp_path):
    model = tmp_path / "text.onnx"
    onnx.save(text_model(), model)
    good, objects, raw = tmp_path / "text.npz", tmp_path / "objects.npz", tmp_path / "bytes.npz"
    np.savez(good, text=np.array(["yes", "no", "maybe", "yes"]))
    np.savez(objects, text=np.array(["yes", "no"], dtype=object))  # NumPy writes an object array as a pickle
    np.savez(raw, text=np.array([b"yes", b"no"]))
    assert "FLOPs" in accepted(capfd, ["static", model, "--data", good], [model, good])
    doc = json.loads(accepted(capfd, ["profile", model, "--data", good, "--format", "json", *FAST_PROFILE],
                              [model, good]))
    assert doc["inputs"] == 4
    refused(capfd, ["profile", model, "--data", objects, *FAST_PROFILE], [model, objects],
            match="pickled Python objects")
    refused(capfd, ["profile", model, "--data", raw, *FAST_PROFILE], [model, raw],
            match=r"expected text for 'text' in bytes\.npz \(the model's input is a string tensor\) as a NumPy "
                  r"unicode array .*found dtype \|S3$")
