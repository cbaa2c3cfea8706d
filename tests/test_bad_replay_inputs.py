"""Bad replay inputs: graph outputs the replay cannot score, infinite outputs, out-of-range counts.

Each model is the tiny gated LM of test_replay_models with its outputs changed through
`onnx.helper`: no output besides the coefficients, none at all, a scalar, a sequence, an
empty output, one whose first axis is not the batch. Those refuse in one line before any
figure; an unscored scalar or sequence beside `logits` is left alone and the replay runs.
An output holding infinities replays without a warning. `--resamples` and `--threads` past
their range, and a `--cache-dir` below a file, are refused in one line too.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphaudit.analyses.declared_coefficients import Coefficient, metadata_entry
from graphaudit.metrics.outputs import log_probs_at, log_softmax

from support.cli import FAST_PROFILE, FAST_REPLAY, FAST_RUN, accepted, refused
from support.models import VOCAB, gated_lm, run_ort, token_ids

LOGITS = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])


def _with_outputs(outputs, nodes=(), inits=(), coefficients=None) -> onnx.ModelProto:
    """The gated LM with graph outputs `outputs`, computed from `logits` by `nodes`."""
    model = gated_lm()
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(inits)
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    if coefficients is not None:
        del model.metadata_props[:]
        model.metadata_props.append(metadata_entry(coefficients))
    onnx.checker.check_model(model, full_check=True)
    return model


def _gates(*extra: str) -> list[Coefficient]:
    return [Coefficient(name, "gate", i, ("batch", "token", "feature"))
            for i, name in enumerate(("gate.0", "gate.1", *extra))]


SCALAR = helper.make_node("ReduceSum", ["logits"], ["s"], name="sum", keepdims=0)
SEQUENCE = helper.make_node("SequenceConstruct", ["logits"], ["sq"], name="sequence")
SCALAR_OUT = helper.make_tensor_value_info("s", TensorProto.FLOAT, [])
SEQUENCE_OUT = helper.make_tensor_sequence_value_info("sq", TensorProto.FLOAT, ["batch", "seq", VOCAB])


def _empty(shape, live: bool = False) -> tuple:
    """An output `ze` slicing `logits` down to nothing on its last axis, declared with `shape`;
    `live`: the slice ends at a value computed from the input ids (always 0), so no shape
    inference finds the output empty before it runs."""
    ends = "z0"
    nodes = []
    if live:
        ends = "end"
        nodes += [helper.make_node("Mul", ["input_ids", "zero_id"], ["zeroed"], name="zeroed"),
                  helper.make_node("ReduceMin", ["zeroed"], ["least"], name="least", keepdims=1),
                  helper.make_node("Reshape", ["least", "one_long"], ["end"], name="end")]
    nodes.append(helper.make_node("Slice", ["logits", "z0", ends, "z2"], ["ze"], name="empty"))
    inits = [numpy_helper.from_array(np.array([0], dtype=np.int64), "z0"),
             numpy_helper.from_array(np.array([2], dtype=np.int64), "z2"),
             numpy_helper.from_array(np.array(0, dtype=np.int64), "zero_id"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "one_long")]
    return [helper.make_tensor_value_info("ze", TensorProto.FLOAT, shape)], nodes, inits


def _double_batch() -> tuple:
    node = helper.make_node("Concat", ["logits", "logits"], ["cc"], name="twice", axis=0)
    return [helper.make_tensor_value_info("cc", TensorProto.FLOAT, ["b2", "seq", VOCAB])], [node], []


REFUSED = {
    "coefficients-only": (([LOGITS], [], [], _gates("logits")),
                          r"expected the model to have an output besides its coefficients for the replay to score, "
                          r"found only the coefficients \['logits'\]"),
    "no-outputs": (([], [], [], None),
                   r"expected the model to have an output besides its coefficients .*, found no graph outputs"),
    "scalar": (([SCALAR_OUT], [SCALAR], [], None),
               r"expected the scored output 's' to have the batch on its first axis, found a scalar"),
    "sequence-first": (([SEQUENCE_OUT], [SEQUENCE], [], None),
                       r"expected the scored output 'sq' to be a tensor, found a sequence"),
    "empty-declared": ((*_empty(["batch", "seq", 0]), None),
                       r"expected the scored output 'ze' to hold values, found shape \('batch', 'seq', 0\)"),
    "empty-live": ((*_empty(["batch", "seq", "classes"], live=True), None),
                   r"expected the scored output 'ze' to hold values, found shape \(4, 6, 0\)"),
    "double-batch": ((*_double_batch(), None),
                     r"expected the scored output 'cc' to have the batch \(4 inputs\) on its first axis, "
                     r"found shape \(8, 6, 11\)"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("replay_inputs")
    np.savez(folder / "calib.npz", input_ids=token_ids(8, seed=1))
    onnx.save(gated_lm(), folder / "gated.onnx")
    for name, ((outputs, nodes, inits, coefficients), _) in REFUSED.items():
        onnx.save(_with_outputs(outputs, nodes, inits, coefficients), folder / f"{name}.onnx")
    onnx.save(_with_outputs([SCALAR_OUT, LOGITS], [SCALAR]), folder / "scalar-beside.onnx")
    onnx.save(_with_outputs([SEQUENCE_OUT, LOGITS], [SEQUENCE]), folder / "sequence-beside.onnx")
    infinite = helper.make_node("Mul", ["logits", "inf"], ["linf"], name="times_inf")
    onnx.save(_with_outputs([helper.make_tensor_value_info("linf", TensorProto.FLOAT, ["batch", "seq", VOCAB])],
                            [infinite], [numpy_helper.from_array(np.array(np.inf, dtype=np.float32), "inf")]),
              folder / "infinite.onnx")
    (folder / "afile").write_bytes(b"not a folder")
    return folder


@pytest.mark.parametrize("command", [["replay", *FAST_REPLAY], ["run", *FAST_RUN]], ids=["replay", "run"])
@pytest.mark.parametrize("name", list(REFUSED))
def test_an_output_the_replay_cannot_score_is_refused(files, capfd, command, name):
    model = files / f"{name}.onnx"
    refused(capfd, [command[0], model, "--calib", files / "calib.npz", *command[1:]], [model, files / "calib.npz"],
            match=REFUSED[name][1])


def test_coefficients_naming_the_only_output_are_refused(files, capfd):
    model = files / "gated.onnx"
    refused(capfd, ["replay", model, "--calib", files / "calib.npz", "--coefficients", "logits", *FAST_REPLAY],
            [model, files / "calib.npz"], match=REFUSED["coefficients-only"][1])


@pytest.mark.parametrize("name", ["scalar-beside", "sequence-beside"])
def test_an_unscored_scalar_or_sequence_output_beside_logits_is_left_alone(files, capfd, name):
    model = files / f"{name}.onnx"
    out = accepted(capfd, ["replay", model, "--calib", files / "calib.npz", *FAST_REPLAY],
                   [model, files / "calib.npz"])
    assert "causal_lm, output 'logits'" in out


def test_an_output_holding_infinities_replays_without_a_warning(files, capfd):
    model = files / "infinite.onnx"
    (values,) = run_ort(onnx.load(model), {"input_ids": token_ids(2)})
    assert np.isposinf(values).any() and np.isneginf(values).any() and not np.isnan(values).any()
    accepted(capfd, ["replay", model, "--calib", files / "calib.npz", *FAST_REPLAY], [model, files / "calib.npz"])


def test_log_probs_at_gives_a_minus_inf_logit_probability_zero_without_a_warning():
    rows = np.array([[1.0, -np.inf, 2.0, 0.5],  # a class ruled out
                     [np.inf, 1.0, -np.inf, 0.0],  # no log-softmax: NaN, as ONNX Runtime's LogSoftmax gives
                     [-np.inf] * 4], dtype=np.float32)
    flat = np.arange(rows.size)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = log_probs_at(rows, flat).reshape(rows.shape)
        whole = log_softmax(rows)
    finite = np.array([1.0, 2.0, 0.5])
    expected = finite - np.log(np.exp(finite).sum())
    np.testing.assert_allclose(got[0, [0, 2, 3]], expected, rtol=1e-6)
    assert got[0, 1] == -np.inf and np.exp(got[0]).sum() == pytest.approx(1.0)
    assert np.isnan(got[1:]).all()
    np.testing.assert_allclose(whole, got, rtol=1e-6)  # NaN where NaN, -inf where -inf


@pytest.mark.parametrize("command, option, value", [
    (["replay", "{m}", "--calib", "{c}", "--quiet"], "--resamples", 10**12),
    (["replay", "{m}", "--calib", "{c}", "--quiet"], "--resamples", 100_001),
    (["run", "{m}", "--calib", "{c}", *FAST_RUN], "--resamples", 10**12),
    (["profile", "{m}", "--data", "{c}", *FAST_PROFILE], "--threads", 2**40),
    (["profile", "{m}", "--data", "{c}", *FAST_PROFILE], "--threads", 1_000_000),
], ids=["replay-resamples", "replay-resamples-past", "run-resamples", "profile-threads", "profile-threads-million"])
def test_counts_past_their_range_are_bad_usage(files, capfd, command, option, value):
    args = [a.format(m=files / "gated.onnx", c=files / "calib.npz") for a in command]
    refused(capfd, [*args, option, str(value)], [files / "gated.onnx", files / "calib.npz"], code=2,
            match=rf"expected a valid value for '{option}', found {value} is not in the range 1<=x<=\d+")


def test_library_counts_past_their_range_are_refused(files):
    from graphaudit.errors import GraphAuditError
    from graphaudit.profile.session import session_options
    from graphaudit.replay.pipeline import replay

    with pytest.raises(GraphAuditError, match=r"expected resamples in 1\.\.100000, found 1000000000000"):
        replay(files / "gated.onnx", files / "calib.npz", resamples=10**12)
    with pytest.raises(GraphAuditError, match=r"expected threads in 1\.\.1024, found 1099511627776"):
        session_options("all", threads=2**40)


def test_a_cache_dir_below_a_file_is_refused(files, capfd):
    model = files / "gated.onnx"
    refused(capfd, ["replay", model, "--calib", files / "calib.npz", "--cache-dir", files / "afile" / "sub",
                    *FAST_REPLAY], [model, files / "calib.npz", files / "afile"],
            match=r"expected a folder for the coefficient cache at .*afile/sub, found .*afile is not a folder")


@pytest.mark.parametrize("tolerance", ["nan", "inf"])
def test_a_parity_tolerance_that_is_not_a_finite_number_is_refused(files, capfd, tolerance):
    model, calib = files / "gated.onnx", files / "calib.npz"
    refused(capfd, ["replay", model, "--calib", calib, "--tolerance", tolerance, *FAST_REPLAY], [model, calib],
            code=2, match=rf"expected a parity tolerance that is a number of at least 0, found {tolerance}")


def test_log_probs_at_a_few_rows_at_a_time_gives_what_the_whole_array_gives(monkeypatch):
    """The normaliser is taken in chunks of rows (a batch's logits at a 50k vocabulary are
    412 MB); chunks, a last short one included, change no value."""
    import graphaudit.metrics.outputs as outputs

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 7, 11), dtype=np.float32) * 5
    flat = np.arange(21) * 11 + rng.integers(0, 11, 21)
    whole = log_probs_at(logits, flat)
    monkeypatch.setattr(outputs, "LOG_NORM_ROWS", 4 * 11)  # 4 rows at a time: 5 chunks of 4 and one of 1
    np.testing.assert_array_equal(outputs.log_probs_at(logits, flat), whole)
    np.testing.assert_allclose(whole, log_softmax(logits).reshape(-1)[flat], rtol=1e-5)
