"""Models exported without a dynamic batch: their inputs fix the first dimension, and every
command runs that many inputs at a time (replay, profile, `run`) and counts FLOPs at it."""

import json
import re

import numpy as np
import onnx
import onnx.parser
import pytest
from click.testing import CliRunner
from onnx import helper

from graphaudit.analyses.static import audit_static
from graphaudit.cli import cli, main
from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.load.data import check_batch_size, fixed_batch, from_arrays, input_specs, whole_batches
from graphaudit.load.inference import infer_at
from graphaudit.load.model import load_model
from graphaudit.replay.batching import default_batch_size
from graphaudit.replay.pipeline import replay

from support.models import gated_lm, token_ids

CONDITIONS = ("correct", "cross_input", "static_layer")


def with_batch(model: onnx.ModelProto, batch: int, length: int | None = None) -> onnx.ModelProto:
    """`model` with the first dimension of its inputs and outputs fixed to `batch` (and the
    second to `length`), as an export without dynamic shapes writes it (none in between)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    weights = {t.name for t in fixed.graph.initializer}
    for value in (*fixed.graph.input, *fixed.graph.output):
        if value.name not in weights:
            dims = value.type.tensor_type.shape.dim
            dims[0].dim_value = batch  # replaces the dim_param
            if length is not None:
                dims[1].dim_value = length
    del fixed.graph.value_info[:]
    return fixed


@pytest.fixture()
def files(tmp_path):
    model = gated_lm()
    onnx.save(model, tmp_path / "dynamic.onnx")
    onnx.save(with_batch(model, 4), tmp_path / "batch4.onnx")
    onnx.save(with_batch(model, 1), tmp_path / "batch1.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(12, seed=1))
    evaluation = token_ids(10, seed=2)
    np.savez(tmp_path / "eval.npz", input_ids=evaluation)
    np.savez(tmp_path / "eval8.npz", input_ids=evaluation[:8])
    return tmp_path


def specs(shape):
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (int64[{shape}] ids, float[{shape}] mask) => (float[{shape}] y) {{ y = Cast <to = 1> (ids) }}""")
    return input_specs(model)


def test_fixed_batch_is_the_size_every_fixing_input_agrees_on():
    assert fixed_batch(specs("batch, 6")) is None
    assert fixed_batch(specs("3, 6")) == 3
    mixed = input_specs(onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (int64[2, 6] ids, float[batch, 6] mask, float[5, 6] other) => (float[2, 6] y) { y = Cast <to = 1> (ids) }"""))
    assert fixed_batch(mixed) is None  # no batch size fits both: the data checks say what is wrong
    assert fixed_batch(mixed[:2]) == 2  # a symbolic batch follows the fixed one
    assert check_batch_size(specs("3, 6"), None) == 3
    assert check_batch_size(specs("batch, 6"), None) is None
    assert check_batch_size(specs("batch, 6"), 5) == 5
    with pytest.raises(UsageError, match=r"expected --batch-size 3 \(the model's inputs fix their first dimension "
                                         r"to 3\), found 5"):
        check_batch_size(specs("3, 6"), 5)


def test_whole_batches_leaves_out_the_inputs_past_the_last_one():
    data = from_arrays({"ids": np.zeros((7, 6), np.int64), "mask": np.zeros((7, 6), np.float32)},
                       specs("batch, 6"), "d.npz")
    assert whole_batches(data, None) == (data, None)
    cut, note = whole_batches(data, 3)
    assert cut.count == 6 and cut.arrays["ids"].shape == (6, 6)
    assert note == "the last 1 of the 7 inputs in d.npz were left out: the model runs exactly 3 at a time"
    assert whole_batches(data, 7)[1] is None
    with pytest.raises(GraphAuditError, match=r"expected at least 8 inputs in d\.npz"):
        whole_batches(data, 8)


def test_replay_runs_a_fixed_batch_and_agrees_with_the_dynamic_export(files):
    dynamic = replay(files / "dynamic.onnx", files / "calib.npz", files / "eval8.npz", conditions=CONDITIONS,
                     resamples=50)
    fixed = replay(files / "batch4.onnx", files / "calib.npz", files / "eval.npz", conditions=CONDITIONS,
                   resamples=50)
    assert fixed.settings["batch_size"] == 4 and dynamic.settings["batch_size"] == 16
    assert fixed.settings["batch_size_note"] == (
        "the model's inputs fix their first dimension to 4: it runs exactly 4 inputs at a time; "
        "the last 2 of the 10 inputs in eval.npz were left out: the model runs exactly 4 at a time")
    assert fixed.data.evaluation_inputs == 8 and fixed.data.calibration_inputs == 12
    assert fixed.parity.ok
    for a, b in zip(dynamic.conditions, fixed.conditions):
        assert a.name == b.name
        assert b.nll.value == pytest.approx(a.nll.value, rel=1e-6)
        assert b.divergence.value == pytest.approx(a.divergence.value, rel=1e-4, abs=1e-9)
    with pytest.raises(UsageError, match="expected --batch-size 4"):
        replay(files / "batch4.onnx", files / "calib.npz", files / "eval.npz", batch_size=2)


def test_a_batch_of_one_is_the_default_of_a_model_exported_with_one(files):
    loaded = load_model(files / "batch1.onnx")
    assert default_batch_size(loaded) == (1, "the model's inputs fix their first dimension to 1: it runs "
                                             "exactly 1 input at a time")
    report = replay(loaded, files / "calib.npz", conditions=CONDITIONS, resamples=20)
    assert report.settings["batch_size"] == 1 and report.parity.ok
    assert report.data.split and report.data.evaluation_inputs == 6


def test_profile_and_static_run_at_the_fixed_batch(files):
    runner = CliRunner()
    done = runner.invoke(cli, ["profile", str(files / "batch4.onnx"), "--data", str(files / "eval.npz"), "--runs", "1",
                               "--warmup", "0", "--profile-runs", "1", "--threads", "1", "--format", "json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert doc["batch_size"] == 4 and doc["examples"] == 8
    assert "the last 2 of the 10 inputs in eval.npz were left out: the model runs exactly 4 at a time" in doc["notes"]
    text = runner.invoke(cli, ["profile", str(files / "batch4.onnx"), "--data", str(files / "eval.npz"), "--runs", "1",
                               "--warmup", "0", "--profile-runs", "1", "--threads", "1"]).output
    assert "inputs: 2 batches of 4 from eval.npz" in text and "latency per batch of 4: median" in text
    assert "batches ran" in text and "FLOPs/batch" in text and "FLOPs/input" not in text

    per_input = audit_static(load_model(files / "dynamic.onnx"), shapes={"input_ids": (1, 6)}).flops.total
    done = runner.invoke(cli, ["static", str(files / "batch4.onnx"), "--data", str(files / "eval.npz"),
                               "--format", "json"])
    assert done.exit_code == 0, done.output
    flops = json.loads(done.output)["flops"]
    assert flops["shapes"] == {"input_ids": [4, 6]} and flops["total"] == 4 * per_input > 0


def test_a_batch_size_the_model_cannot_take_is_a_usage_error(files, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["profile", str(files / "batch4.onnx"), "--data", str(files / "eval.npz"), "--batch-size", "2"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err == ("graphaudit: error: expected --batch-size 4 (the model's inputs fix their first dimension to 4), "
                   "found 2\n")


SHAPES_FROM_SHAPES = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, seq, 8] x, float[8, 4] w) => (float[batch, seq, 4] y) {
    s = Shape (x)
    i0 = Constant <value = int64[1] {0}> ()
    i1 = Constant <value = int64[1] {1}> ()
    b = Gather (s, i0)
    t = Gather (s, i1)
    bt = Mul (b, t)
    minus = Constant <value = int64[1] {-1}> ()
    flat_shape = Concat <axis = 0> (bt, minus)
    flat = Reshape (x, flat_shape)
    h = MatMul (flat, w)
    four = Constant <value = int64[1] {4}> ()
    back = Concat <axis = 0> (b, t, four)
    y = Reshape (h, back)
}"""


def test_flops_behind_a_reshape_to_a_computed_size_are_counted_at_concrete_shapes():
    """Exporters without symbolic shapes (torch.onnx's TorchScript one) compute reshape targets
    from Shape: symbolic inference leaves the MatMul's size unknown, numbers make it known."""
    loaded = load_model(onnx.parser.parse_model(SHAPES_FROM_SHAPES))
    before = loaded.model.SerializeToString()
    assert infer_at(loaded.model, {"x": (2, 3, 8)})["flat"] == (6, 8)
    assert loaded.model.SerializeToString() == before
    report = audit_static(loaded, shapes={"x": (2, 3, 8)})
    assert report.flops.total == 2 * 6 * 8 * 4
    assert report.flops.count.unknown_shape == ()


def test_an_export_without_dynamic_shapes_has_its_coefficients_found_with_their_axes(tmp_path):
    """With no symbolic dimension to follow, the inputs' fixed sizes mark the batch and token axes
    at the leading positions, and detection and replay work as on the dynamic export."""
    dynamic = gated_lm()
    del dynamic.metadata_props[:]  # no declared coefficients: found by detection
    static = with_batch(dynamic, 1, 6)
    onnx.save(dynamic, tmp_path / "dynamic.onnx")
    onnx.save(static, tmp_path / "static.onnx")
    found = {name: audit_static(load_model(tmp_path / name)).coefficients for name in ("dynamic.onnx", "static.onnx")}
    listed = [(c.tensor, c.axes, c.source) for c in found["static.onnx"]]
    assert listed == [(c.tensor, c.axes, c.source) for c in found["dynamic.onnx"]]
    assert ("gate.0", ("batch", "token", "slot"), "detected") in listed
    assert ("gate.1", ("batch", "token", "slot"), "detected") in listed

    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8, seed=1))
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(6, seed=2))
    a, b = (replay(tmp_path / name, tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=20).conditions
            for name in ("dynamic.onnx", "static.onnx"))
    assert [(c.name, round(c.nll.value, 5)) for c in b] == [(c.name, round(c.nll.value, 5)) for c in a]
    assert {c.name for c in b} == set(CONDITIONS) | {"token_shuffle", "static_position", "global_mean"}


def test_fixed_sizes_mark_the_leading_axes_and_a_transpose_moves_them():
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 6, 4] x) => (float[1, 6, 6] y, float[6, 1] z, float[1, 4, 6] t) {
        x_t = Transpose <perm = [0, 2, 1]> (x)
        y = MatMul (x, x_t)
        minus = Constant <value = int64[2] {-1, 1}> ()
        z = Reshape (y, minus)
        t = Transpose <perm = [0, 2, 1]> (x)
    }""")
    from graphaudit.analyses.axes import axes_of
    from graphaudit.graph.build import build_graph

    mg = build_graph(load_model(model).model)
    axes = {name: axes_of(mg, mg.find_tensor(name)) for name in ("x", "y", "z", "t")}
    # t is x transposed: its last axis is x's token axis (by size alone it was a slot)
    assert axes == {"x": ("batch", "token", "slot"), "y": ("batch", "token", "slot"),
                    "z": ("slot0", "slot1"), "t": ("batch", "slot", "token")}


def test_axes_the_graph_does_not_tell_are_given_with_axes(tmp_path, capsys):
    """mix.0 has its batch on axis 1: with every size fixed, its sizes alone do not say so. The
    Transpose that made it from a (batch, token, way, source) tensor does; made by an Einsum
    instead, nothing in the graph does, and --axes does. The replay then equals the replay of
    the export that declares the axes."""
    from support.models import mixing_lm

    declared = mixing_lm()
    bare = with_batch(declared, 1, 6)
    del bare.metadata_props[:]
    onnx.save(declared, tmp_path / "declared.onnx")
    onnx.save(bare, tmp_path / "transposed.onnx")
    move = next(n for n in bare.graph.node if n.op_type == "Transpose" and n.output[0] == "mix.0")
    move.CopyFrom(helper.make_node("Einsum", list(move.input), list(move.output), name=move.name,
                                   equation="btws->wbts"))
    onnx.save(bare, tmp_path / "bare.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8, seed=1))
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(6, seed=2))
    args = [str(tmp_path / "calib.npz"), "--data", str(tmp_path / "eval.npz"), "--resamples", "20", "--format", "json"]

    runner = CliRunner()
    ours = json.loads(runner.invoke(cli, ["replay", str(tmp_path / "declared.onnx"), "--calib", *args]).output)
    done = runner.invoke(cli, ["replay", str(tmp_path / "bare.onnx"), "--calib", *args,
                               "--axes", "mix.0=way,batch,token,source"])
    assert done.exit_code == 0, done.output
    theirs = json.loads(done.output)
    assert [c["axes"] for c in theirs["coefficients"]] == [["way", "batch", "token", "source"]]
    assert {k: v["nll"] for k, v in theirs["conditions"].items()} == \
        pytest.approx({k: v["nll"] for k, v in ours["conditions"].items()}, rel=1e-6)

    with pytest.raises(SystemExit) as stop:  # named without its axes: the batch axis cannot be told
        main(["replay", str(tmp_path / "bare.onnx"), "--calib", *args, "--coefficients", "mix.0"])
    assert stop.value.code != 0 and "to name a 'batch' axis" in capsys.readouterr().err

    # made by a Transpose, the graph tells its axes: found without --axes, the same replay
    told = runner.invoke(cli, ["replay", str(tmp_path / "transposed.onnx"), "--calib", *args, "--coefficients", "mix.0"])
    assert told.exit_code == 0, told.output
    found = json.loads(told.output)
    assert [c["axes"] for c in found["coefficients"]] == [["slot0", "batch", "token", "slot1"]]
    assert {k: v["nll"] for k, v in found["conditions"].items()} == \
        pytest.approx({k: v["nll"] for k, v in ours["conditions"].items()}, rel=1e-6)


@pytest.mark.parametrize("entry, message", [
    ("mix.0", r"expected --axes NAME_OR_GLOB=AXIS,AXIS,\.\.\., found 'mix.0'"),
    ("mix.0=way,token,source,slot", r"expected axis names for 'mix.0' as mix.0=AXIS,AXIS,\.\.\. with one 'batch' axis"),
    ("mix.0=batch,batch,token,source", r"and no name twice"),
    ("mix.0=way,batch,token", r"expected 4 axis names for the coefficient 'mix.0' of shape \(2, 1, 6, 3\), found 3"),
    ("mixx.0=way,batch,token,source", r"expected --axes 'mixx.0' to name a tensor of the model, found none; closest"),
])
def test_axes_that_cannot_be_right_are_refused(tmp_path, capsys, entry, message):
    from support.models import mixing_lm

    bare = with_batch(mixing_lm(), 1, 6)
    del bare.metadata_props[:]
    onnx.save(bare, tmp_path / "bare.onnx")
    with pytest.raises(SystemExit) as stop:
        main(["static", str(tmp_path / "bare.onnx"), "--axes", entry])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert re.search(message, err), err
