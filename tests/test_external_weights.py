"""Models whose weights lie in external files: the runtime parts leave them on disk for ORT.

Replay, profile and `graphaudit run` hand ONNX Runtime the graph without its weights and the
folder they lie in (`LoadedModel.weights_folder`), so a model past protobuf's 2 GiB limit
runs too. Here the trained FeatureGate is re-saved with every weight in an external file;
the loader's weight reading is made to fail, proving the weights never pass through the
proto, and the results must equal those of the inline model bit for bit.
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

import graphaudit.load.model
from graphaudit.analyses.declared_coefficients import declared_coefficients
from graphaudit.cli import main
from graphaudit.load.data import input_specs, load_data
from graphaudit.load.model import load_for_runtime, load_model
from graphaudit.profile.profiler import profile_model
from graphaudit.replay.capture import capture
from graphaudit.replay.pipeline import replay
from graphaudit.replay.surgery import Trace

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "fixtures" / "featuregate"
DATA_FILE = "model.onnx.data"


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """A copy of FeatureGate with its weights in `model.onnx.data` beside it (onnx's default 1 KiB threshold:
    smaller constants stay inline, which ONNX Runtime's own shape inference needs)."""
    if not (ZOO / "model.onnx").is_file():
        pytest.skip("zoo fixture featuregate is not built (python -m exporters.build --out fixtures)")
    folder = tmp_path_factory.mktemp("external")
    onnx.save_model(onnx.load(str(ZOO / "model.onnx")), str(folder / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=DATA_FILE)
    for name in ("calib.npz", "eval.npz"):
        shutil.copy(ZOO / name, folder / name)
    assert (folder / DATA_FILE).stat().st_size > 100_000
    return folder


@pytest.fixture
def weights_never_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("external weights were read into the proto")

    monkeypatch.setattr(graphaudit.load.model, "_load_external", refuse)


def test_loaded_for_runtime_with_weights_left_on_disk(external, weights_never_read):
    loaded = load_for_runtime(external / "model.onnx")
    assert not loaded.weights_loaded and loaded.external_files == (DATA_FILE,)
    assert loaded.weights_folder == external.resolve()
    assert loaded.model.ByteSize() < (external / DATA_FILE).stat().st_size / 3  # the graph alone
    inline = load_model(ZOO / "model.onnx")
    assert inline.weights_folder is None


def test_replay_equals_the_inline_model(external, weights_never_read):
    settings = dict(resamples=50, batch_size=16)
    got = replay(external / "model.onnx", external / "calib.npz", external / "eval.npz", **settings).to_json()
    want = replay(ZOO / "model.onnx", ZOO / "calib.npz", ZOO / "eval.npz", **settings).to_json()
    for key in ("parity", "conditions", "retained_gap", "variance", "coefficient_means"):
        assert got[key] == want[key], key


def test_profile_runs_the_model_from_its_folder(external, weights_never_read):
    settings = dict(runs=2, warmup=1, profile_runs=1, limit=4, threads=1)
    got = profile_model(external / "model.onnx", external / "eval.npz", **settings)
    want = profile_model(ZOO / "model.onnx", ZOO / "eval.npz", **settings)
    def ran(report):
        return [(b.name, b.nodes, b.inputs, b.inputs_executed, b.node_fraction) for b in report.execution.blocks]

    assert got.execution.blocks and ran(got) == ran(want)
    assert all(b.inputs_executed == b.inputs == 4 for b in got.execution.blocks)  # FeatureGate skips nothing


def test_run_command_on_an_external_weights_model(external, weights_never_read, tmp_path):
    target = tmp_path / "report.json"
    args = ["run", external / "model.onnx", "--calib", external / "calib.npz", "--data", external / "eval.npz",
            "--runs", "2", "--warmup", "1", "--profile-runs", "1", "--limit", "4", "--resamples", "50",
            "--provider", "cpu", "--quiet", "--format", "json", "-o", target]
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    assert exit_info.value.code == 0
    doc = json.loads(target.read_text())
    assert doc["replay"]["parity"]["ok"] is True


def test_missing_weights_file_is_a_one_line_error(external, tmp_path, capsys):
    folder = tmp_path / "no-weights"
    folder.mkdir()
    shutil.copy(external / "model.onnx", folder / "model.onnx")
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", str(folder / "model.onnx"), "--calib", str(external / "calib.npz")])
    _, err = capsys.readouterr()
    assert exit_info.value.code == 1 and err.count("\n") == 1
    assert f"expected the external-data file '{DATA_FILE}' beside the model" in err and "found none" in err


def test_a_rewritten_weights_file_is_not_served_from_the_cache(external, tmp_path):
    loaded = load_for_runtime(external / "model.onnx")
    coefs = declared_coefficients(loaded.model)
    data = load_data(external / "eval.npz", input_specs(loaded.model))
    trace = Trace(coefs)(loaded.model).model
    args = dict(batch_size=16, cache_dir=tmp_path / "cache", weights_folder=loaded.weights_folder)
    with capture(trace, coefs, data, **args) as first:
        values = np.array(first.arrays[coefs[0].tensor])
    with capture(trace, coefs, data, **args) as again:
        assert again.reused
    weights = external / DATA_FILE
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # as if written anew
    with capture(trace, coefs, data, **args) as after:
        assert not after.reused
        np.testing.assert_array_equal(after.arrays[coefs[0].tensor], values)


def _frozen_logits(path, weights_folder, feeds):
    from graphaudit.runtime.sessions import create_session

    session = create_session(onnx.load(str(path), load_external_data=False), weights_folder=weights_folder)
    return session.run(["logits"], feeds)[0]


def test_freeze_keeps_the_weights_in_their_file(external, weights_never_read, tmp_path):
    from click.testing import CliRunner

    from graphaudit.cli import cli

    out = tmp_path / "frozen"
    result = CliRunner().invoke(cli, ["freeze", str(external / "model.onnx"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"weights: {DATA_FILE} beside them" in result.output
    assert (out / DATA_FILE).samefile(external / DATA_FILE) or \
        (out / DATA_FILE).read_bytes() == (external / DATA_FILE).read_bytes()
    assert (out / "model.frozen.onnx").stat().st_size < (external / DATA_FILE).stat().st_size / 3  # graph only
    # the frozen graph written beside its weights equals the one frozen from the inline model
    inline = tmp_path / "inline"
    assert CliRunner().invoke(cli, ["freeze", str(ZOO / "model.onnx"), "-o", str(inline)]).exit_code == 0
    frozen = load_for_runtime(out / "model.frozen.onnx")
    ids = np.load(external / "eval.npz")["input_ids"][:2]
    feeds = {"input_ids": ids, **{i.name: np.full((2, ids.shape[1], 64), 0.5, dtype=np.float32)
                                  for i in frozen.model.graph.input if i.name != "input_ids"}}
    np.testing.assert_array_equal(_frozen_logits(out / "model.frozen.onnx", out.resolve(), feeds),
                                  _frozen_logits(inline / "model.frozen.onnx", None, feeds))


def test_freeze_never_overwrites_another_weights_file(external, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / DATA_FILE).write_bytes(b"someone else's weights")
    with pytest.raises(SystemExit) as exit_info:
        main(["freeze", str(external / "model.onnx"), "-o", str(out)])
    _, err = capsys.readouterr()
    assert exit_info.value.code == 1 and err.count("\n") == 1 and "choose another output folder" in err
    assert (out / DATA_FILE).read_bytes() == b"someone else's weights"


def test_profile_leaves_large_external_weights_out_of_the_optimised_model(external, monkeypatch):
    import graphaudit.profile.profiler as profiler

    monkeypatch.setattr(profiler, "OPTIMISED_COPY_LIMIT", 0)  # as if the weights were past the limit
    report = profile_model(external / "model.onnx", external / "eval.npz", runs=2, warmup=1, profile_runs=1,
                           limit=4, threads=1)
    assert any(note.startswith("the optimised model was not saved, as ORT could have written its 0.0 GiB of "
                               "weights") and note.endswith("events were mapped by node name only")
               for note in report.notes)
    assert report.execution.blocks and all(b.inputs_executed == 4 for b in report.execution.blocks)


@pytest.mark.parametrize("limit, saved", [(2**30, True), (2**10, False)])
def test_inline_weights_count_against_the_optimised_models_limit(limit, saved, monkeypatch):
    """ONNX Runtime writes a model's inline weights beside its optimised graph as well: they count."""
    import graphaudit.profile.profiler as profiler

    monkeypatch.setattr(profiler, "OPTIMISED_COPY_LIMIT", limit)  # the zoo model's weights: tens of KiB
    report = profile_model(ZOO / "model.onnx", ZOO / "eval.npz", runs=2, warmup=1, profile_runs=1, limit=4, threads=1)
    skipped = [n for n in report.notes if n.startswith("the optimised model was not saved")]
    assert bool(skipped) is not saved, skipped
    assert report.execution.blocks and all(b.inputs_executed == 4 for b in report.execution.blocks)


def test_freeze_into_the_model_folder_shares_its_weights_file(external, tmp_path):
    from click.testing import CliRunner

    from graphaudit.cli import cli

    folder = tmp_path / "same"
    folder.mkdir()
    for name in ("model.onnx", DATA_FILE):
        shutil.copy(external / name, folder / name)
    before = (folder / DATA_FILE).stat()
    result = CliRunner().invoke(cli, ["freeze", str(folder / "model.onnx"), "-o", str(folder)])
    assert result.exit_code == 0, result.output
    assert "weights:" not in result.output  # nothing to place: the graphs sit beside the weights
    after = (folder / DATA_FILE).stat()
    assert (after.st_ino, after.st_nlink, after.st_mtime_ns) == (before.st_ino, before.st_nlink, before.st_mtime_ns)
    assert load_for_runtime(folder / "model.frozen.onnx").external_files == (DATA_FILE,)


def test_a_model_proto_with_external_weights_is_refused_for_running(external):
    proto = onnx.load(str(external / "model.onnx"), load_external_data=False)
    with pytest.raises(graphaudit.load.model.GraphAuditError, match="expected a model with its weights inline when given "
                                                              "a ModelProto, found external-data references"):
        load_for_runtime(proto)


def test_freeze_copies_the_weights_so_that_onnx_still_loads_both_models(external, tmp_path):
    # onnx's loader refuses a weights file with several links (a hard-link attack, to it): a link
    # placed by freeze would make onnx.load refuse the user's own model as well as the frozen one
    from click.testing import CliRunner

    from graphaudit.cli import cli

    folder = tmp_path / "model"
    shutil.copytree(external, folder)
    for flag, links in (((), 1), (("--link",), 2)):
        out = tmp_path / f"frozen{len(flag)}"
        result = CliRunner().invoke(cli, ["freeze", str(folder / "model.onnx"), "-o", str(out), *flag])
        assert result.exit_code == 0, result.output
        assert (folder / DATA_FILE).stat().st_nlink == links
        assert (out / DATA_FILE).read_bytes() == (folder / DATA_FILE).read_bytes()
        if not flag:
            onnx.load(str(folder / "model.onnx"))  # weights read: one link, nothing refused
            onnx.load(str(out / "model.frozen.onnx"))
            again = CliRunner().invoke(cli, ["freeze", str(folder / "model.onnx"), "-o", str(out)])
            assert again.exit_code == 0, again.output  # the copy made before is kept, not taken for another file
        else:
            with pytest.raises(Exception, match=r"hard ?link"):
                onnx.load(str(folder / "model.onnx"))
