"""The frozen replay end to end: parity first, every condition, the report, the command."""

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from graphaudit.analyses.declared_coefficients import declared_coefficients
from graphaudit.cli import cli, main
from graphaudit.errors import GraphAuditError
from graphaudit.load.data import from_arrays, input_specs, load_data
from graphaudit.load.model import load_model
from graphaudit.replay.batching import default_batch_size
from graphaudit.replay.capture import LiveCheck, capture, native
from graphaudit.replay.conditions import conditions, names
from graphaudit.replay.parity import WHOLE_OUTPUT_LIMIT, ParityError, check_parity
from graphaudit.replay.pipeline import replay
from graphaudit.replay.surgery import Freeze, Trace
from graphaudit.runtime.sessions import create_session

from support.models import gated_lm, mixing_lm, token_ids
from support.zoo import FIXTURES, ZOO

CONDITIONS = names()  # every registered condition, the replay's default

NO_ZOO = "no trained zoo models in fixtures/ (python -m exporters.build writes them)"


@pytest.fixture()
def files(gated_lm_files):
    """A folder holding gated.onnx (`gated_lm`), calib.npz and eval.npz."""
    return gated_lm_files


def _without_timing(doc):
    return {k: v for k, v in doc.items() if k != "timing"}


def test_replay_reports_every_condition_with_parity_first(files):
    report = replay(files / "gated.onnx", files / "calib.npz", files / "eval.npz", batch_size=4, resamples=200)
    doc = report.to_json()
    assert doc["parity"]["ok"] and doc["parity"]["max_abs_diff"] <= 1e-6 and doc["parity"]["inputs"] == 4
    every = doc["parity"]["every_input"]  # all 10 inputs, 5 next-token targets each
    assert every["kind"] == "target log-probabilities" and every["inputs"] == 10 and every["values"] == 50
    assert every["max_abs_diff"] <= 1e-5 and every["tolerance"] == 2e-4
    assert list(doc["conditions"]) == list(CONDITIONS)
    correct = doc["conditions"]["correct"]
    assert correct["delta_nll"] == 0 and correct["kl"] == 0 and correct["ci"] == [0, 0]
    for name in CONDITIONS[1:]:
        c = doc["conditions"][name]
        assert c["nll"] == pytest.approx(correct["nll"] + c["delta_nll"])
        assert c["ci"][0] <= c["delta_nll"] <= c["ci"][1] and c["kl"] > 0
    assert set(doc["retained_gap"]) == {"static_layer", "static_position"}
    shares = doc["variance"]["gate"]
    assert shares["layer_slot_share"] + shares["input_share"] + shares["token_share"] == pytest.approx(1)
    assert doc["seed"] == 0 and doc["data"]["split"] is False and doc["data"]["evaluation_inputs"] == 10
    assert len(doc["coefficient_means"]["gate"]["values"]) == 2
    json.dumps(doc, allow_nan=False)


def test_replay_is_reproducible_for_a_seed(files):
    args = (files / "gated.onnx", files / "calib.npz", files / "eval.npz")
    a = replay(*args, batch_size=4, seed=7, resamples=100).to_json()
    b = replay(*args, batch_size=4, seed=7, resamples=100).to_json()
    c = replay(*args, batch_size=4, seed=8, resamples=100).to_json()
    assert _without_timing(a) == _without_timing(b)
    assert a["conditions"]["cross_input"]["nll"] != c["conditions"]["cross_input"]["nll"]


def test_without_data_the_calibration_inputs_are_split_in_disjoint_halves(files):
    report = replay(files / "gated.onnx", files / "calib.npz", batch_size=4, resamples=50,
                    conditions=["correct", "static_layer"])
    assert report.data.split and report.data.calibration_inputs == 6 and report.data.evaluation_inputs == 6
    assert [c.name for c in report.conditions] == ["correct", "static_layer"]
    assert report.retained_gap == ()


def test_way_first_coefficients_replay(tmp_path):
    onnx.save(mixing_lm(), tmp_path / "mix.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8, seed=1))
    doc = replay(tmp_path / "mix.onnx", tmp_path / "calib.npz", batch_size=3, resamples=50).to_json()
    assert doc["parity"]["ok"] and doc["conditions"]["cross_input"]["kl"] > 0
    assert set(doc["variance"]) == {"mix"}


def test_model_without_a_controller_says_so(tmp_path, files):
    model = gated_lm(layers=0)  # embedding and head only: nothing declared, nothing detected
    onnx.save(model, tmp_path / "plain.onnx")
    report = replay(tmp_path / "plain.onnx", files / "calib.npz")
    assert not report.controller and report.to_json()["conditions"] == {}
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "plain.onnx"), "--calib", str(files / "calib.npz")])
    assert result.exit_code == 0 and "no controller" in result.output


def test_user_named_coefficients_without_metadata(tmp_path, files):
    model = gated_lm()
    del model.metadata_props[:]
    onnx.save(model, tmp_path / "plain.onnx")
    report = replay(tmp_path / "plain.onnx", files / "calib.npz", files / "eval.npz", coefficients=["gate.*"],
                    batch_size=5, resamples=50, conditions=["correct", "cross_input"])
    assert [c.tensor for c in report.coefficients] == ["gate.0", "gate.1"] and report.parity.ok
    assert {c.source for c in report.coefficients} == {"user"}
    declared = replay(files / "gated.onnx", files / "calib.npz", files / "eval.npz", coefficients=["gate.1"],
                      batch_size=5, resamples=50, conditions=["correct"])
    assert [(c.tensor, c.source) for c in declared.coefficients] == [("gate.1", "metadata")]
    with pytest.raises(GraphAuditError, match=r"expected --coefficients 'nothing.*' to name a tensor"):
        replay(tmp_path / "plain.onnx", files / "calib.npz", coefficients=["nothing.*"])


def test_parity_failure_stops_the_audit_naming_the_largest_difference():
    model = gated_lm()
    coefs = declared_coefficients(model)
    data = from_arrays({"input_ids": token_ids(6)}, input_specs(model))
    with capture(Trace(coefs)(model).model, coefs, data, batch_size=3) as cache:
        cache.live = {"logits": cache.live["logits"].copy()}
        cache.live["logits"][1, 2, 3] += 0.5
        feeds = conditions(["correct"], cache, cache, 0)
        session = create_session(Freeze(coefs)(model).model)
        with pytest.raises(ParityError, match=r"within 0.001, found max \|Δ\| 0.5 at logits\[1, 2, 3\]") as err:
            check_parity(session, feeds["correct"], coefs, cache, data, 3, 1e-3)
        assert not err.value.parity.ok and err.value.parity.index == (1, 2, 3)


def test_command_json_and_text(files):
    args = ["replay", str(files / "gated.onnx"), "--calib", str(files / "calib.npz"), "--data",
            str(files / "eval.npz"), "--batch-size", "5", "--resamples", "50", "--seed", "3"]
    result = CliRunner().invoke(cli, [*args, "--format", "json", "--conditions", "correct,cross_input"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["seed"] == 3 and list(doc["conditions"]) == ["correct", "cross_input"]
    assert {"max_abs_diff", "ok"} <= set(doc["parity"]) and {"nll", "delta_nll", "ci", "kl"} <= set(
        doc["conditions"]["cross_input"])
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0 and "parity: max |Δ|" in text.output and "static_layer" in text.output
    split = CliRunner().invoke(cli, args[:4] + ["--resamples", "20"])
    assert "split into disjoint halves" in split.output


def _main(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code, capsys.readouterr().err


def test_command_errors_are_one_line(files, tmp_path, capsys):
    np.savez(tmp_path / "bad.npz", tokens=token_ids(4))
    code, err = _main(["replay", str(files / "gated.onnx"), "--calib", str(tmp_path / "bad.npz")], capsys)
    assert code == 1 and err.startswith("graphaudit: error: expected bad.npz to hold arrays") and err.count("\n") == 1
    code, err = _main(["replay", str(files / "gated.onnx"), "--calib", str(files / "calib.npz"),
                       "--conditions", "correct,sideways"], capsys)
    assert code == 2 and "found sideways" in err
    np.savez(tmp_path / "three.npz", input_ids=token_ids(3))
    code, err = _main(["replay", str(files / "gated.onnx"), "--calib", str(tmp_path / "three.npz")], capsys)
    assert code == 1 and "expected at least 4 calibration inputs" in err


@pytest.mark.skipif(not ZOO, reason=NO_ZOO)
@pytest.mark.parametrize("name", ZOO)
def test_parity_on_the_zoo(name):
    report = replay(FIXTURES / name / "model.onnx", FIXTURES / name / "calib.npz", FIXTURES / name / "eval.npz",
                    conditions=["correct"], batch_size=16, resamples=20)
    assert report.parity.ok and report.parity.max_abs_diff <= 1e-4
    assert report.parity.every_input.inputs == 32 and report.parity.every_input.max_abs_diff <= 1e-5


@pytest.mark.skipif(not {"earlyexit", "featuregate"} <= set(ZOO), reason=NO_ZOO)
def test_default_batch_size_is_one_input_per_batch_for_value_dependent_control_flow():
    def settings(name, **kw):
        files = [FIXTURES / name / f for f in ("model.onnx", "calib.npz", "eval.npz")]
        return replay(*files, conditions=["correct", "cross_input"], resamples=20, **kw).settings

    chosen = settings("earlyexit")  # its If decides once per batch
    assert chosen["batch_size"] == 1 and "decides once per batch" in chosen["batch_size_note"]
    assert settings("earlyexit", batch_size=8)["batch_size"] == 8 and "batch_size_note" not in settings(
        "earlyexit", batch_size=8)
    assert settings("featuregate")["batch_size"] == 16 and "batch_size_note" not in settings("featuregate")
    folder = FIXTURES / "earlyexit"
    text = CliRunner().invoke(cli, ["replay", str(folder / "model.onnx"), "--calib", str(folder / "calib.npz"),
                                    "--data", str(folder / "eval.npz"), "--conditions", "correct,cross_input",
                                    "--resamples", "20", "-q"])
    assert text.exit_code == 0 and "batch size 1: the graph has value-dependent control flow" in text.output


def test_default_batch_size_keeps_one_batch_of_a_large_vocabulary_output_small():
    from onnx import TensorProto, helper, numpy_helper

    vocab = 50_432  # Pythia's: the scored output is (batch, seq, vocab) float32
    table = numpy_helper.from_array(np.zeros((11, vocab), dtype=np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["logits"])], "lm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])], [table])
    loaded = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))

    def chosen(seq):
        return default_batch_size(loaded, False, {"input_ids": (100, seq)})

    assert chosen(64) == (16, None)  # 12.9 MB per input: 16 of them stay within 256 MiB
    size, why = chosen(256)  # 51.6 MB per input
    assert size == 5 and "'logits' takes 49.2 MiB per input: 5 inputs per batch" in why
    size, why = chosen(2048)  # 413 MB per input: one at a time
    assert size == 1 and "1 input per batch keeps" in why
    assert default_batch_size(loaded, False) == (16, None)  # no data shapes: the sequence length is unknown
    assert default_batch_size(loaded, True, {"input_ids": (100, 64)})[0] == 1


TORCH_TOLERANCE = 1e-4  # absolute, on logits: float32 ONNX Runtime against float32 PyTorch


@pytest.mark.skipif(not {"featuregate", "mudd"} & set(ZOO), reason=NO_ZOO)
@pytest.mark.parametrize("name", [n for n in ("featuregate", "mudd") if n in ZOO])
def test_ort_replay_equals_pytorch_with_the_same_substituted_coefficients(name):
    torch = pytest.importorskip("torch")
    zoo = pytest.importorskip("exporters.zoo")
    loaded = load_model(FIXTURES / name / "model.onnx")
    coefs = declared_coefficients(loaded.model)
    specs = input_specs(loaded.model)
    calib, evaluation = (load_data(FIXTURES / name / f"{k}.npz", specs) for k in ("calib", "eval"))
    trace = Trace(coefs)(loaded.model).model
    session = create_session(Freeze(coefs)(loaded.model).model)
    model = zoo.load_trained(name, FIXTURES)
    ids = evaluation.arrays["input_ids"]
    rows = np.arange(evaluation.count)
    torch_nll = {}
    with capture(trace, coefs, calib, batch_size=16) as cal, capture(trace, coefs, evaluation, batch_size=16) as ev:
        feeds = conditions(["cross_input", "static_layer"], ev, cal, seed=0)
        for condition in ("cross_input", "static_layer"):
            fed = {c.tensor: native(c, feeds[condition](c, rows)) for c in coefs}
            (ours,) = session.run(["logits"], {"input_ids": ids, **fed})
            with torch.no_grad():
                theirs, computed = model(torch.from_numpy(ids),
                                         coefficients={k: torch.tensor(v) for k, v in fed.items()})
            assert computed == {}  # the controller did not run
            torch_nll[condition] = float(torch.nn.functional.cross_entropy(
                theirs[:, :-1].reshape(-1, theirs.shape[-1]), torch.from_numpy(ids[:, 1:]).reshape(-1)))
            np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=TORCH_TOLERANCE)
            if condition == "cross_input":
                assert not np.allclose(ours, session.run(["logits"], {"input_ids": ids, **{
                    c.tensor: native(c, feeds["correct"](c, rows)) for c in coefs}})[0], atol=1e-3)
    report = replay(loaded, calib, evaluation, conditions=["correct", "cross_input", "static_layer"],
                    batch_size=16, seed=0, resamples=20)
    for condition, nll in torch_nll.items():
        assert report.condition(condition).nll.value == pytest.approx(nll, abs=1e-5)


def test_cache_dir_is_reused_by_a_second_replay(files, tmp_path):
    args = (files / "gated.onnx", files / "calib.npz", files / "eval.npz")
    first = replay(*args, batch_size=4, resamples=50, cache_dir=tmp_path / "cache")
    second = replay(*args, batch_size=4, resamples=50, cache_dir=tmp_path / "cache")
    assert not first.settings["cache"]["reused"] and second.settings["cache"]["reused"]
    for key in ("conditions", "parity"):  # the live target log-probabilities come back from the cache too
        assert _without_timing(first.to_json())[key] == _without_timing(second.to_json())[key]
    assert second.parity.every_input.inputs == 10


def test_regression_outputs_are_compared_whole_on_every_input(files, tmp_path):
    ids = token_ids(10, seed=2)
    targets = np.random.default_rng(0).standard_normal((10, ids.shape[1], 11)).astype(np.float32)
    np.savez(tmp_path / "regression.npz", input_ids=ids, targets=targets)
    doc = replay(files / "gated.onnx", files / "calib.npz", tmp_path / "regression.npz", batch_size=4,
                 resamples=50, conditions=["correct", "cross_input"]).to_json()
    assert doc["task"]["kind"] == "regression"
    every = doc["parity"]["every_input"]  # each input's whole (6, 11) output
    assert every["kind"] == "outputs" and every["inputs"] == 10 and every["values"] == 10 * 6 * 11
    assert every["max_abs_diff"] <= 1e-5 and every["tolerance"] == 1e-4


def test_a_large_regression_output_is_compared_at_the_same_positions_of_every_input(files, tmp_path):
    ids = token_ids(6, length=400, seed=2)  # (400, 11) = 4400 values per input, past WHOLE_OUTPUT_LIMIT
    targets = np.random.default_rng(0).standard_normal((6, 400, 11)).astype(np.float32)
    np.savez(tmp_path / "long.npz", input_ids=ids, targets=targets)
    np.savez(tmp_path / "long_calib.npz", input_ids=token_ids(6, length=400, seed=3))
    doc = replay(files / "gated.onnx", tmp_path / "long_calib.npz", tmp_path / "long.npz", batch_size=4,
                 resamples=50, conditions=["correct", "cross_input"]).to_json()
    every = doc["parity"]["every_input"]
    assert every["kind"] == f"outputs at {WHOLE_OUTPUT_LIMIT} positions" and every["inputs"] == 6
    assert every["values"] == 6 * WHOLE_OUTPUT_LIMIT
    assert every["max_abs_diff"] <= 1e-5 and every["tolerance"] == 1e-4


def test_evaluation_inputs_that_are_calibration_inputs_are_named(files, tmp_path, capsys):
    ids = token_ids(10, seed=2)  # eval.npz's inputs
    np.savez(tmp_path / "overlapping.npz", input_ids=np.concatenate([ids[:3], token_ids(9, seed=7)]))
    doc = replay(files / "gated.onnx", tmp_path / "overlapping.npz", files / "eval.npz", batch_size=4,
                 resamples=50, conditions=["correct", "static_layer"]).to_json()
    assert doc["data"]["shared_inputs"] == 3
    with pytest.raises(SystemExit) as ended:
        main(["replay", str(files / "gated.onnx"), "--calib", str(tmp_path / "overlapping.npz"), "--data",
              str(files / "eval.npz"), "--conditions", "static_layer"])
    assert ended.value.code == 0
    assert "warning: 3 of the 10 evaluation inputs are also calibration inputs" in capsys.readouterr().out
    with pytest.raises(GraphAuditError, match=r"found all 10 of them among the calibration inputs"):
        replay(files / "gated.onnx", files / "eval.npz", files / "eval.npz", batch_size=4, resamples=50)


@pytest.mark.parametrize("threads", [None, 1])  # 1: scored while the next run runs, where a core is free
def test_a_difference_on_a_later_input_stops_the_replay(files, monkeypatch, threads):
    """Fault injection: the kept live log-probability of input 9's third target (batch 3 of 3) is
    moved by 0.01, as a frozen graph that departs from the live model on that input alone would be."""
    import graphaudit.replay.steps as module

    original = module.every_input_summary

    def shifted(data, readings=None):
        check = original(data, readings)

        def summarise(outputs, feeds, rows):
            values = check.summarise(outputs, feeds, rows)
            if rows.start <= 9 < rows.stop:
                values[9 - rows.start, 2] += 0.01
            return values

        return LiveCheck(check.name + ", input 9 moved", summarise)

    monkeypatch.setattr(module, "every_input_summary", shifted)
    args = (files / "gated.onnx", files / "calib.npz", files / "eval.npz")
    with pytest.raises(ParityError, match=r"live target log-probabilities of every input within 0.0002, found max "
                                          r"\|Δ\| 0.01 at input 9, target 2 ") as err:
        replay(*args, batch_size=4, resamples=50, threads=threads)
    assert err.value.parity.max_abs_diff <= 1e-6  # the first batch alone would have passed
    assert err.value.parity.every_input.inputs == 10 and not err.value.parity.ok


def test_labels_add_accuracy(files, tmp_path):
    ids = token_ids(10, seed=2)
    np.savez(tmp_path / "labelled.npz", input_ids=ids, labels=ids)
    doc = replay(files / "gated.onnx", files / "calib.npz", tmp_path / "labelled.npz", batch_size=5,
                 resamples=50, conditions=["correct", "global_mean"]).to_json()
    assert doc["task"]["labels"] == "labels"
    plain = replay(files / "gated.onnx", files / "calib.npz", files / "eval.npz", batch_size=5, resamples=50,
                   conditions=["correct"]).to_json()
    assert doc["conditions"]["correct"]["nll"] == pytest.approx(plain["conditions"]["correct"]["nll"])
    assert 0 <= doc["conditions"]["correct"]["accuracy"] <= 1 and "accuracy" not in plain["conditions"]["correct"]


def test_replay_threads_reach_the_report_and_bad_counts_are_usage_errors(files, tmp_path):
    args = (files / "gated.onnx", files / "calib.npz", files / "eval.npz")
    one = replay(*args, batch_size=4, resamples=50, threads=1).to_json()
    default = replay(*args, batch_size=4, resamples=50).to_json()
    assert one["settings"]["threads"] == 1 and default["settings"]["threads"] is None
    for name, figures in default["conditions"].items():  # the same figures on one thread, up to rounding
        assert one["conditions"][name]["nll"] == pytest.approx(figures["nll"], rel=1e-6)
    with pytest.raises(GraphAuditError, match=r"expected threads in 1\.\.1024, found 0") as err:
        replay(*args, threads=0)
    assert err.value.exit_code == 2
    result = CliRunner().invoke(cli, ["replay", str(args[0]), "--calib", str(args[1]), "--threads", "0"])
    assert result.exit_code == 2 and "--threads" in result.output


def test_one_trace_session_serves_both_captures_and_no_key_is_made_without_a_cache_dir(files, monkeypatch):
    """A model's weights are serialised for every session made and every cache key digested:
    the replay makes one session of the trace graph and one of each part of the frozen graph
    (what no coefficient reaches, run once per batch, and the rest: graphaudit.replay.prefix), and
    digests nothing unless it keeps the cache for reuse."""
    import graphaudit.replay.capture as capture_module
    import graphaudit.replay.prefix as prefix_module
    import graphaudit.replay.steps as steps_module

    made = []
    real = steps_module.create_session
    for module in (steps_module, prefix_module):  # the trace graph's session, the frozen graph's
        monkeypatch.setattr(module, "create_session", lambda model, *a, **k: made.append(model) or real(model, *a, **k))
    monkeypatch.setattr(capture_module, "create_session", lambda *a, **k: pytest.fail("capture made its own session"))
    monkeypatch.setattr(capture_module, "_key", lambda *a, **k: pytest.fail("a cache key was digested"))
    report = replay(files / "gated.onnx", files / "calib.npz", files / "eval.npz", batch_size=4, resamples=20)
    assert report.parity.ok and len(made) == 3
    assert [sorted(o.name for o in m.graph.output) for m in made] == [["gate.0", "gate.1", "logits"],  # the trace
                                                                      ["bt.0", "x0"],  # prefix: block 0 before its gate
                                                                      ["graphaudit.log_probs", "logits"]]  # the rest
