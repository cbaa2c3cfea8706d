"""Inputs as ONNX Runtime takes them: free dimensions however written, values fed whole to
every batch (a scalar sample rate, --set), and inputs whose examples lie on another axis (a
recurrent state, --input-axes)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphaudit.analyses.static import audit_static
from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.load.data import input_specs, load_data
from graphaudit.load.feeding import Feeding
from graphaudit.load.model import load_model
from graphaudit.replay.pipeline import replay

from support.cli import FAST_PROFILE, FAST_REPLAY, invoke, refused
from support.models import se_cnn

FREE = {  # how exporters write "any size" (Paddle2ONNX: [-1, 3, '?', '?'])
    "minus-one-and-question-marks": lambda d, axis: setattr(d, "dim_value", -1) if axis == 0
    else setattr(d, "dim_param", "?"),
    "empty-names": lambda d, axis: setattr(d, "dim_param", ""),
    "missing": lambda d, axis: None,
}


def free_se_cnn(spelling: str) -> onnx.ModelProto:
    """`se_cnn` whose pixels are (free, 4, free, free) and logits (free, 3), free as `spelling` writes it."""
    model = se_cnn()
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        for axis in ((0, 2, 3) if value.name == "pixels" else (0,)):
            dims[axis].Clear()
            FREE[spelling](dims[axis], axis)
    return model


def images(count: int, seed: int, height: int = 5, width: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    return {"pixels": rng.standard_normal((count, 4, height, width)).astype(np.float32),
            "labels": rng.integers(0, 3, count)}


@pytest.mark.parametrize("spelling", list(FREE))
def test_free_dimensions_however_written_are_free_and_independent(tmp_path, capfd, spelling):
    model = free_se_cnn(spelling)
    onnx.save(model, tmp_path / "model.onnx")
    assert input_specs(model)[0].shape == (None, 4, None, None)  # no name, no fixed size -1
    # the gates are found: shape inference carries the free batch to them, as it carries `batch`
    report = audit_static(load_model(tmp_path / "model.onnx"))
    assert [(c.tensor, c.axes) for c in report.coefficients] == [(f"se.{i}", ("batch", "slot")) for i in range(2)]
    # a height unlike the width (the two '?' are no one size), batch 1 for the FLOP count
    np.savez(tmp_path / "eval.npz", **images(6, seed=1))
    assert invoke(["static", tmp_path / "model.onnx", "--data", tmp_path / "eval.npz", "--format", "json"]) == 0
    static = json.loads(capfd.readouterr().out)
    assert [c["tensor"] for c in static["coefficients"]] == ["se.0", "se.1"] and static["flops"]["total"] > 0


def test_a_model_with_minus_one_dimensions_replays(tmp_path):
    onnx.save(free_se_cnn("minus-one-and-question-marks"), tmp_path / "model.onnx")
    np.savez(tmp_path / "calib.npz", **images(8, seed=0))
    np.savez(tmp_path / "eval.npz", **images(6, seed=1))
    report = replay(tmp_path / "model.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=10)
    assert [c.tensor for c in report.coefficients] == ["se.0", "se.1"] and report.parity.ok
    assert report.condition("global_mean").nll.value is not None


# a gated layer whose head is chosen by a scalar sample rate, as Silero VAD's 16 kHz / 8 kHz branches
SAMPLE_RATE = """
<ir_version: 8, opset_import: ["" : 18]>
vad (float[batch, 4] x, int64 sr) => (float[batch, 3] logits)
<float[4, 4] wg = {0.5, -0.2, 0.1, 0.3, -0.4, 0.2, 0.6, -0.1, 0.3, 0.1, -0.5, 0.2, 0.1, 0.4, 0.2, -0.3},
 float[4, 3] w16 = {1.0, -1.0, 0.5, 0.2, 0.3, -0.4, -0.6, 0.1, 0.9, 0.4, -0.2, 0.3},
 float[4, 3] w8 = {-0.3, 0.8, 0.1, 0.5, -0.6, 0.2, 0.2, 0.2, -0.9, -0.4, 0.7, 0.1},
 int64 rate = {16000}> {
    z = MatMul (x, wg)
    gate = Sigmoid (z)
    h = Mul (x, gate)
    is16 = Equal (sr, rate)
    logits = If (is16) <then_branch = g16 () => (float[batch, 3] a) { a = MatMul (h, w16) },
                        else_branch = g8 () => (float[batch, 3] b) { b = MatMul (h, w8) }>
}"""


@pytest.fixture()
def vad(tmp_path):
    onnx.save(onnx.parser.parse_model(SAMPLE_RATE), tmp_path / "vad.onnx")
    rng = np.random.default_rng(3)
    for name, count in (("calib", 8), ("eval", 6)):
        x, labels = rng.standard_normal((count, 4)).astype(np.float32), rng.integers(0, 3, count)
        np.savez(tmp_path / f"{name}.npz", x=x, labels=labels)
        np.savez(tmp_path / f"{name}_sr.npz", x=x, labels=labels, sr=np.array(16000))
    return tmp_path


def test_a_scalar_input_is_fed_whole_from_a_0d_array_or_set(vad, capfd):
    model = onnx.load(vad / "vad.onnx")
    data = load_data(vad / "eval_sr.npz", input_specs(model))
    assert data.count == 6 and [feeds["sr"].shape for _, feeds in data.batches(4)] == [(), ()]
    by_set = load_data(vad / "eval.npz", input_specs(model, feeding=Feeding({"sr": "8000"})), Feeding({"sr": "8000"}))
    assert by_set.fixed["sr"].dtype == np.int64 and int(by_set.fixed["sr"]) == 8000
    # the replay runs the If's branch the sample rate chooses: the same figures from the file's
    # 16000 and from --set sr=16000, others from --set sr=8000
    figures = {}
    for label, calib, evaluation, extra in (("file", "calib_sr", "eval_sr", []),
                                             ("set", "calib", "eval", ["--set", "sr=16000"]),
                                             ("other", "calib", "eval", ["--set", "sr=8000"])):
        assert invoke(["replay", vad / "vad.onnx", "--calib", vad / f"{calib}.npz", "--data",
                       vad / f"{evaluation}.npz", "--coefficients", "gate", *extra, *FAST_REPLAY,
                       "--format", "json"]) == 0, capfd.readouterr().err
        figures[label] = json.loads(capfd.readouterr().out)["conditions"]["correct"]["nll"]
    assert figures["file"] == figures["set"] != figures["other"]
    assert invoke(["profile", vad / "vad.onnx", "--data", vad / "eval.npz", "--set", "sr=16000", *FAST_PROFILE]) == 0
    assert "latency per input" in capfd.readouterr().out


def test_a_scalar_input_without_a_value_says_how_to_give_one(vad, capfd):
    refused(capfd, ["profile", vad / "vad.onnx", "--data", vad / "eval.npz", *FAST_PROFILE], [vad / "eval.npz"],
            match=r"expected a value for the model's input sr: int64 \(\), fed whole to every batch, found none in "
                  r"eval.npz: give it as --set sr=VALUE or as a 0-d array 'sr' in the .npz")


def recurrent(state_dims: list, batch="batch") -> onnx.ModelProto:
    """x (batch, 4) and a recurrent state (2, batch, 8) -> logits (batch, 3), through a gate."""
    rng = np.random.default_rng(5)
    weights = {"wx": (4, 8), "ws": (8, 8), "wg": (8, 8), "wo": (8, 3)}
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.5, n) for n, s in weights.items()]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "layers"))
    nodes = [helper.make_node("ReduceSum", ["state", "layers"], ["s"], keepdims=0),
             helper.make_node("MatMul", ["x", "wx"], ["a"]), helper.make_node("MatMul", ["s", "ws"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["ab"]), helper.make_node("Tanh", ["ab"], ["h"]),
             helper.make_node("MatMul", ["h", "wg"], ["z"]), helper.make_node("Sigmoid", ["z"], ["gate"]),
             helper.make_node("Mul", ["h", "gate"], ["hg"]), helper.make_node("MatMul", ["hg", "wo"], ["logits"])]
    graph = helper.make_graph(nodes, "recurrent", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4]),
        helper.make_tensor_value_info("state", TensorProto.FLOAT, state_dims)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.checker.check_model(model)
    return model


STATES = {  # how the graph tells (or does not tell) where the state's examples lie
    "symbol": (recurrent([2, "batch", 8]), None),
    "only-free-axis": (recurrent([2, -1, 8], batch=-1), None),
    "flag": (recurrent(["layers", "n", 8]), "_,batch,_"),  # nor the gate's batch: --axes tells it
}


@pytest.mark.parametrize("case", list(STATES))
def test_a_state_is_batched_along_its_own_axis(tmp_path, capfd, case):
    model, axes = STATES[case]
    onnx.save(model, tmp_path / "model.onnx")
    rng = np.random.default_rng(7)
    x, state = rng.standard_normal((7, 4)).astype(np.float32), rng.standard_normal((2, 7, 8)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x, state=state, labels=rng.integers(0, 3, 7))
    feeding = Feeding(axes={"state": axes}) if axes else None
    loaded = load_model(tmp_path / "model.onnx")
    specs = input_specs(loaded.model, feeding=feeding)
    assert [s.axis for s in specs] == [0, 1]
    data = load_data(tmp_path / "data.npz", specs, feeding)
    assert data.count == 7
    # each batch as ONNX Runtime runs it gives each example's own output, run alone
    session = ort.InferenceSession(loaded.model.SerializeToString(), providers=["CPUExecutionProvider"])
    alone = np.concatenate([session.run(["logits"], {"x": x[i:i + 1], "state": state[:, i:i + 1]})[0]
                            for i in range(7)])
    batched = np.concatenate([session.run(["logits"], feeds)[0] for _, feeds in data.batches(3)])
    np.testing.assert_allclose(batched, alone, rtol=1e-5, atol=1e-6)
    assert np.array_equal(data.subset([5, 1]).feeds(slice(0, 2))["state"], state[:, [5, 1]])
    flag = ["--input-axes", f"state={axes}", "--axes", "gate=batch,slot"] if axes else []
    assert invoke(["replay", tmp_path / "model.onnx", "--calib", tmp_path / "data.npz", "--coefficients", "gate",
                   *flag, *FAST_REPLAY, "--format", "json"]) == 0, capfd.readouterr().err
    assert json.loads(capfd.readouterr().out)["parity"]["ok"]
    assert invoke(["profile", tmp_path / "model.onnx", "--data", tmp_path / "data.npz", *flag[:2], *FAST_PROFILE,
                   "--batch-size", "3"]) == 0, capfd.readouterr().err
    assert "inputs: 3 batches of 3" in capfd.readouterr().out


def test_a_state_the_graph_does_not_place_needs_input_axes(tmp_path, capfd):
    onnx.save(STATES["flag"][0], tmp_path / "model.onnx")
    np.savez(tmp_path / "data.npz", x=np.ones((7, 4), np.float32), state=np.ones((2, 7, 8), np.float32))
    refused(capfd, ["profile", tmp_path / "model.onnx", "--data", tmp_path / "data.npz", *FAST_PROFILE],
            [tmp_path / "data.npz"], match=r"same number of examples on axis 0, found x: 7, state: 2")


@pytest.mark.parametrize("option, match", [
    (["--set", "sr"], r"expected --set NAME=VALUE \(e.g. sr=16000\), found 'sr'"),
    (["--set", "sr=sixteen"], r"expected --set sr= an integer, as the input's type int64 holds, found 'sixteen'"),
    (["--set", "sr=1e30"], r"expected --set sr= an integer"),
    (["--set", "sr=99999999999999999999"], r"an integer that int64 holds"),
    (["--set", "rate=16000"], r"expected --set to name a graph input \(x, sr\), found 'rate'"),
    (["--set", "sr=1", "--set", "sr=2"], r"expected --set to give 'sr' one value, found '1' and '2'"),
    (["--input-axes", "x=_,_"], r"exactly one 'batch' .* found 0 'batch' in _,_"),
    (["--input-axes", "x=batch,batch"], r"found 2 'batch' in batch,batch"),
    (["--input-axes", "x=_,batch,_"], r"expected --input-axes x to name 2 axes \(the input's shape is \(batch, 4\)\), "
                                      r"found 3 \(_,batch,_\)"),
    (["--input-axes", "sr=batch"], r"expected --input-axes to name an input with axes, found 'sr', a scalar"),
    (["--input-axes", "state=batch"], r"expected --input-axes to name a graph input \(x, sr\), found 'state'"),
    (["--input-axes", "x"], r"expected --input-axes NAME=AXES with exactly one 'batch'"),
    (["--set", "sr=1", "--input-axes", "sr=batch"], r"either set to one value .* or batched on an axis"),
], ids=lambda v: v if isinstance(v, str) and not v.startswith("expected") else None)
@pytest.mark.parametrize("command", ["static", "replay", "profile", "run"])
def test_bad_set_and_input_axes_are_bad_usage(vad, capfd, option, match, command):
    calib = ["--calib", vad / "calib.npz", "--resamples", "5", "-q"]
    args = {"static": ["static", vad / "vad.onnx", "--data", vad / "eval.npz"],
            "replay": ["replay", vad / "vad.onnx", *calib, "--coefficients", "gate"],
            "profile": ["profile", vad / "vad.onnx", "--data", vad / "eval.npz", *FAST_PROFILE],
            "run": ["run", vad / "vad.onnx", *calib, "--runs", "1", "--warmup", "0", "--profile-runs", "1"]}[command]
    refused(capfd, [*args, *option], [vad / "vad.onnx", vad / "eval.npz"], match=match, code=2)


def test_a_value_given_both_in_the_data_and_set_is_bad_usage(vad):
    model = onnx.load(vad / "vad.onnx")
    feeding = Feeding({"sr": 16000})
    with pytest.raises(UsageError, match=r"expected each input given once, found 'sr' both in eval_sr.npz and in --set"):
        load_data(vad / "eval_sr.npz", input_specs(model, feeding=feeding), feeding)
    with pytest.raises(GraphAuditError, match=r"expected --set sr to have dtype int64, found float64"):
        feeding = Feeding({"sr": np.array(1.5)})
        load_data(vad / "eval.npz", input_specs(model, feeding=feeding), feeding)


def test_a_flag_of_shape_one_is_fed_whole_from_a_0d_array_or_set(tmp_path):
    # a merged decoder's use_cache_branch [1]: one value per example (batch 1, tests/test_switches.py),
    # or one value for every batch, broadcast to [1], from a 0-d array or --set
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    m (float[batch, 4] x, bool[1] use_cache_branch) => (float[batch, 4] y) { y = Identity (x) }""")
    assert [s.axis for s in input_specs(model)] == [0, 0]
    np.savez(tmp_path / "d.npz", x=np.ones((5, 4), np.float32), use_cache_branch=np.array(True))
    data = load_data(tmp_path / "d.npz", input_specs(model))
    assert data.count == 5 and data.fixed["use_cache_branch"].tolist() == [True]
    np.savez(tmp_path / "x.npz", x=np.ones((5, 4), np.float32))
    feeding = Feeding({"use_cache_branch": "false"})
    data = load_data(tmp_path / "x.npz", input_specs(model, feeding=feeding), feeding)
    assert [feeds["use_cache_branch"].tolist() for _, feeds in data.batches(4)] == [[False], [False]]


def test_audit_takes_one_feeding_for_every_part(vad):
    from graphaudit import audit

    report = audit(vad / "vad.onnx", vad / "calib.npz", vad / "eval.npz", coefficients=("gate",), provider="cpu",
                   feeding=Feeding({"sr": 16000}), runs=1, warmup=0, profile_runs=1, resamples=5)
    doc = report.to_json()
    assert doc["inputs"]["feeding"] == {"values": {"sr": 16000}, "axes": {}}
    assert doc["replay"]["parity"]["ok"] and doc["profile"] is not None
