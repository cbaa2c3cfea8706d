"""What an output is, read from the graph, and each scored on its true scale (issue 21, item 1).

The models are `se_cnn` (squeeze-excitation gates, detected as coefficients) with other heads:
a Softmax, a Softmax behind Identity and Reshape, a LogSoftmax, a per-pixel Sigmoid map, a
CTC-shaped (batch, frames, classes) Softmax, logits not named logits, a regression output with
targets. Where a head is the Softmax of another model's logits, both replays must give the same
NLL and KL: that is what scoring on the true scale means.
"""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphaudit.analyses.output_kinds import LOGITS, PROBS, REGRESSION, read_outputs
from graphaudit.errors import UsageError
from graphaudit.metrics import Reference, score, task_for
from graphaudit.metrics.outputs import column
from graphaudit.verdict.decide import functional_dependence
from graphaudit.verdict.findings import NOT_MEASURED, YES

from support.heads import CLASSES, classes, headed, live_outputs, logits_head, replay_head


def softmax_head(name="prob"):
    return headed([helper.make_node("Softmax", ["z"], [name], name="/head/Softmax", axis=-1)], name, ["batch", 3])


def hidden_softmax_head():
    shape = numpy_helper.from_array(np.array([-1, CLASSES], dtype=np.int64), "flat")
    return headed([helper.make_node("Softmax", ["z"], ["p"], name="/head/Softmax", axis=1),
                    helper.make_node("Identity", ["p"], ["p.id"], name="/head/Identity"),
                    helper.make_node("Reshape", ["p.id", "flat"], ["out"], name="/head/Reshape")],
                   "out", ["batch", 3], [shape])


def log_softmax_head():
    return headed([helper.make_node("LogSoftmax", ["z"], ["logp"], name="/head/LogSoftmax", axis=-1)],
                   "logp", ["batch", 3])


def _frames(last, shape=("batch", 25, 6)):
    """(batch, 25 frames, 6 classes) from the feature map, then `last` nodes making `ctc` from `cz`."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(np.array([0, 4, 25], dtype=np.int64), "frames.shape"),
             numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "frames.w")]
    nodes = [helper.make_node("Reshape", ["x.2", "frames.shape"], ["fr"], name="/ctc/Reshape"),
             helper.make_node("Transpose", ["fr"], ["ft"], name="/ctc/Transpose", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["ft", "frames.w"], ["cz"], name="/ctc/MatMul"), *last]
    return headed(nodes, "ctc", list(shape), inits)


def ctc_softmax_head():
    return _frames([helper.make_node("Softmax", ["cz"], ["ctc"], name="/ctc/Softmax", axis=2)])


def ctc_logits_head():
    return _frames([helper.make_node("Identity", ["cz"], ["ctc"], name="/ctc/Identity")])


def sigmoid_map_head():
    w = numpy_helper.from_array(np.random.default_rng(6).standard_normal((1, 4, 1, 1)).astype(np.float32), "mask.w")
    return headed([helper.make_node("Conv", ["x.2", "mask.w"], ["mz"], name="/mask/Conv"),
                    helper.make_node("Sigmoid", ["mz"], ["mask"], name="/mask/Sigmoid")],
                   "mask", ["batch", 1, 5, 5], [w])


# -- the graph's reading ------------------------------------------------------------------

@pytest.mark.parametrize("build, output, kind, reason", [
    (softmax_head, "prob", PROBS, "a Softmax over the last axis at node /head/Softmax"),
    # axis 1 of a value whose rank the file does not declare: the first batch tells (below)
    (hidden_softmax_head, "out", PROBS, "a Softmax over axis 1 at node /head/Softmax (behind Identity, Reshape)"),
    (log_softmax_head, "logp", "logprobs", "a LogSoftmax over the last axis at node /head/LogSoftmax"),
    (sigmoid_map_head, "mask", PROBS, "a Sigmoid, one probability per value, at node /mask/Sigmoid"),
    (ctc_softmax_head, "ctc", PROBS, "a Softmax over the last axis at node /ctc/Softmax"),
    (logits_head, "scores", None, "no Softmax, LogSoftmax or Sigmoid makes it (it comes from MatMul node "
                                  "/head/MatMul (behind Identity))"),
])
def test_the_graph_says_what_an_output_holds(build, output, kind, reason):
    read = read_outputs(build())[output]
    assert (read.kind, read.reason) == (kind, reason)
    assert read.bernoulli == (build is sigmoid_map_head)


def test_a_softmax_whose_axis_a_transpose_moves_and_a_layer_norm_are_not_distributions_over_the_last_axis():
    moved = _frames([helper.make_node("Softmax", ["cz"], ["s"], name="/ctc/Softmax", axis=-1),
                     helper.make_node("Transpose", ["s"], ["ctc"], name="/ctc/T", perm=[0, 2, 1])], ("batch", 6, 25))
    assert read_outputs(moved)["ctc"].last_axis is False
    out = np.full((2, 6, 25), 1 / 6, np.float32)
    task = task_for({"ctc": out}, {"pixels": np.zeros((2, 4), np.float32)}, {}, read_outputs(moved))
    assert task.kind == "outputs" and task.read.kind == REGRESSION and "not over the last axis" in task.read.reason
    scale = numpy_helper.from_array(np.ones(3, np.float32), "ln.scale")
    normed = headed([helper.make_node("LayerNormalization", ["z", "ln.scale"], ["emb"], name="/ln", axis=-1)],
                     "emb", ["batch", 3], [scale])
    assert read_outputs(normed)["emb"].kind == REGRESSION


def test_an_output_kind_is_given_over_the_graph_and_a_wrong_one_is_a_usage_error():
    assert read_outputs(softmax_head(), {"prob": "logits"})["prob"].kind == LOGITS
    assert read_outputs(sigmoid_map_head(), {"mask": "probs"})["mask"].bernoulli
    with pytest.raises(UsageError, match=r"expected --output-kind to name a graph output \(prob\), found 'nope'"):
        read_outputs(softmax_head(), {"nope": "logits"})
    with pytest.raises(UsageError, match="KIND among logits, probs, logprobs, regression, found 'prob'"):
        read_outputs(softmax_head(), {"prob": "prob"})


# -- each scored on its true scale ----------------------------------------------------------

@pytest.mark.parametrize("build", [softmax_head, hidden_softmax_head, log_softmax_head])
def test_a_normalised_head_gives_the_nll_and_kl_of_the_same_models_logits(tmp_path, build):
    truth = replay_head(tmp_path / "a", logits_head(), labels=classes)
    normalised = replay_head(tmp_path / "b", build(), labels=classes)
    assert normalised.task.kind == "classification" and normalised.task.scale != LOGITS
    assert " over the last axis at node /head/" in normalised.task.read.reason
    live = live_outputs(tmp_path / "b")
    probs = np.exp(live) if build is log_softmax_head else live
    labels = np.load(tmp_path / "b" / "eval.npz")["labels"]
    nll = -np.log(probs[np.arange(len(labels)), labels]).mean()  # the NLL on the true scale, in NumPy
    assert normalised.condition("correct").nll.value == pytest.approx(nll, rel=1e-5)
    for name in ("correct", "cross_input", "static_layer", "global_mean"):
        assert normalised.condition(name).nll.value == pytest.approx(truth.condition(name).nll.value, rel=1e-5)
        assert normalised.condition(name).divergence.value == pytest.approx(  # float32 log-probabilities
            truth.condition(name).divergence.value, rel=1e-3, abs=1e-7)
    assert normalised.condition("cross_input").divergence.value > 1e-4


def test_logits_not_named_logits_and_a_ctc_distribution_without_labels_get_their_kl(tmp_path):
    scores = replay_head(tmp_path / "a", logits_head())
    assert scores.task.kind == "classification" and scores.task.labels is None
    assert scores.condition("cross_input").divergence.value > 0 and "kl" in scores.to_json()["conditions"]["correct"]
    softmax, logits = replay_head(tmp_path / "b", ctc_softmax_head()), replay_head(tmp_path / "c", ctc_logits_head())
    assert softmax.task.kind == logits.task.kind == "classification"
    assert softmax.to_json()["task"]["read_as"]["reason"] == "a Softmax over the last axis at node /ctc/Softmax"
    kl = softmax.condition("cross_input").divergence.value
    assert kl > 1e-4 and kl == pytest.approx(logits.condition("cross_input").divergence.value, rel=1e-3)
    finding = functional_dependence(softmax.to_json())
    assert finding.answer != NOT_MEASURED and "KL" in finding.statement


def test_a_sigmoid_map_is_scored_in_bernoulli_form(tmp_path):
    def soft(rng, n):
        return rng.uniform(0, 1, (n, 1, 5, 5)).astype(np.float32)

    report = replay_head(tmp_path, sigmoid_map_head(), targets=soft)
    assert report.task.kind == "bernoulli" and report.task.labels == "targets"
    p, y = live_outputs(tmp_path), np.load(tmp_path / "eval.npz")["targets"].astype(np.float64)
    bce = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()
    correct = report.condition("correct")
    assert correct.nll.value == pytest.approx(bce, rel=1e-5)
    assert correct.mse.value == pytest.approx(((p - y) ** 2).mean(), rel=1e-5)
    assert report.condition("cross_input").divergence.value > 0 and correct.divergence.value == 0
    assert report.parity.every_input.kind == "outputs"


def test_the_bernoulli_kl_is_the_kl_between_each_values_distributions():
    rng = np.random.default_rng(0)
    p, q = rng.uniform(0.01, 0.99, (2, 1, 3, 3)), rng.uniform(0.01, 0.99, (2, 1, 3, 3))
    read = read_outputs(sigmoid_map_head())
    task = task_for({"mask": p.astype(np.float32)}, {"pixels": np.zeros((2, 4), np.float32)}, {}, read)
    reference = Reference.of(task, p)
    sums = score(task, q, {}, {}, reference)
    kl = (p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))).reshape(2, -1).sum(1)
    np.testing.assert_allclose(sums[:, column("divergence")], kl, rtol=1e-9)
    assert sums[0, column("positions")] == 9


def test_targets_of_a_regression_output_give_its_mse_in_the_table_and_the_verdict(tmp_path):
    from graphaudit.report.tables import condition_table

    def targets(rng, n):
        return rng.standard_normal((n, 3)).astype(np.float32)

    report = replay_head(tmp_path, logits_head("value"), targets=targets)
    assert report.task.kind == "regression"
    live, y = live_outputs(tmp_path), np.load(tmp_path / "eval.npz")["targets"]
    assert report.condition("correct").mse.value == pytest.approx(((live - y) ** 2).mean(), rel=1e-5)
    doc = report.to_json()
    cross = doc["conditions"]["cross_input"]
    assert cross["delta_mse"] == pytest.approx(cross["mse"] - doc["conditions"]["correct"]["mse"])
    finding = functional_dependence(doc)
    assert finding.answer != NOT_MEASURED and "MSE against the targets" in finding.statement
    assert any(e.text.startswith("ΔMSE cross_input = ") for e in finding.evidence)
    table = condition_table({"replay": doc})
    assert table.headers[-2:] == ("MSE (targets)", "95% CI of ΔMSE")


def test_the_verdict_answers_from_the_mse_gap():
    def doc(delta, lo, hi):
        return {"parity": {"ok": True, "max_abs_diff": 0.0}, "task": {"kind": "regression", "output": "y"},
                "conditions": {"correct": {"nll": None, "delta_nll": None, "mse": 0.223, "delta_mse": 0.0},
                               "cross_input": {"nll": None, "delta_nll": None, "mse": 0.223 + delta,
                                               "delta_mse": delta, "delta_mse_ci": [lo, hi]}}}
    worse = functional_dependence(doc(0.2, 0.15, 0.25))
    assert worse.answer == YES and "MSE against the targets worse (cross-input +0.2000, from 0.2230" in worse.statement
    assert functional_dependence(doc(0.001, -0.001, 0.003)).answer == "no"


def test_an_output_kind_overrides_the_graph_in_the_replay_and_the_cli(tmp_path):
    from click.testing import CliRunner

    from graphaudit.cli import cli

    given = replay_head(tmp_path, softmax_head(), labels=classes, output_kinds={"prob": "logits"})
    assert given.task.scale == LOGITS and given.task.read.given
    p, labels = live_outputs(tmp_path), np.load(tmp_path / "eval.npz")["labels"]
    log_softmax = p - np.log(np.exp(p).sum(-1, keepdims=True))  # the probabilities taken as logits
    assert given.condition("correct").nll.value == pytest.approx(
        -log_softmax[np.arange(len(labels)), labels].mean(), rel=1e-5)
    args = ["replay", str(tmp_path / "model.onnx"), "--calib", str(tmp_path / "calib.npz"), "--resamples", "20",
            "-q", "--conditions", "correct,cross_input", "--format", "json"]
    result = CliRunner().invoke(cli, [*args, "--output-kind", "prob=probs"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["task"]["read_as"] == {"kind": "probs", "bernoulli": False, "given": True,
                                                            "reason": "as given (--output-kind)",
                                                            "node": "/head/Softmax"}
    text = CliRunner().invoke(cli, args[:-2])
    assert "scored output: 'prob' read as probabilities: a Softmax over the last axis at node /head/Softmax" \
        in text.output
    for wrong, message in (("prob=probabilities", "KIND among logits, probs, logprobs, regression, found "
                                                  "'probabilities'"),
                           ("out=logits", "expected --output-kind to name a graph output (prob), found 'out'"),
                           ("logits", "expected --output-kind NAME=KIND")):
        result = CliRunner().invoke(cli, [*args, "--output-kind", wrong])
        assert isinstance(result.exception, UsageError) and result.exception.exit_code == 2
        assert message in str(result.exception)


# -- outputs behind control flow and averaging; labels beside a size-1 axis ----------------------

def _branch(name: str, nodes, output: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)])


def verified_head():
    """A wake-word cascade: `p` (batch, 1), the Sigmoid of a first score, is passed on as it is when
    below 0.5 and otherwise replaced by a verifier's own Sigmoid; both branches give a probability."""
    w = numpy_helper.from_array(np.random.default_rng(7).standard_normal((CLASSES, 1)).astype(np.float32), "v.w")
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    then = _branch("verify", [helper.make_node("MatMul", ["z", "v.w"], ["vz"], name="/verify/MatMul"),
                              helper.make_node("Sigmoid", ["vz"], ["vp"], name="/verify/Sigmoid")], "vp")
    other = _branch("pass", [helper.make_node("Identity", ["p"], ["pp"], name="/pass/Identity")], "pp")
    return headed([helper.make_node("MatMul", ["z", "v.w"], ["sz"], name="/first/MatMul"),
                    helper.make_node("Sigmoid", ["sz"], ["p"], name="/first/Sigmoid"),
                    helper.make_node("ReduceMax", ["p"], ["top"], name="/first/Max", keepdims=0),
                    helper.make_node("GreaterOrEqual", ["top", "half"], ["sure"], name="/first/Sure"),
                    helper.make_node("If", ["sure"], ["score"], name="/cascade/If", then_branch=then,
                                     else_branch=other)],
                   "score", ["batch", 1], [w, half])


def test_an_output_the_branches_of_an_if_each_make_by_a_sigmoid_is_a_probability():
    read = read_outputs(verified_head())["score"]
    assert read.bernoulli
    assert read.reason.startswith("in every branch of If node /cascade/If: a Sigmoid, one probability per value")
    disagree = verified_head()
    then = next(a for a in disagree.graph.node[-1].attribute if a.name == "then_branch").g
    then.node[1].op_type = "Relu"  # the verifier's branch now gives a score, the other a probability
    assert read_outputs(disagree)["score"].kind is None


def test_a_mean_of_sigmoids_is_a_probability_and_a_mean_of_softmaxes_is_no_distribution_per_position():
    def mean_of(op):
        axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
        return headed([helper.make_node(op, ["z"], ["p"], name=f"/vad/{op}", **({"axis": -1} if op == "Softmax" else {})),
                        helper.make_node("ReduceMean", ["p", "axes"], ["speech"], name="/vad/Mean")],
                       "speech", ["batch", 1], [axes])

    read = read_outputs(mean_of("Sigmoid"))["speech"]
    assert read.bernoulli and read.reason == "a Sigmoid, one probability per value, at node /vad/Sigmoid " \
                                            "(behind ReduceMean)"
    assert read_outputs(mean_of("Softmax"))["speech"].kind is None


def test_a_binary_probability_per_input_is_scored_against_labels_of_one_value_per_input(tmp_path):
    def binary(rng, n):
        return rng.integers(0, 2, n)

    report = replay_head(tmp_path, verified_head(), labels=binary, batch_size=1)
    assert report.task.kind == "bernoulli" and report.task.labels == "labels"
    p, y = live_outputs(tmp_path)[:, 0], np.load(tmp_path / "eval.npz")["labels"]
    bce = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()
    assert report.condition("correct").nll.value == pytest.approx(bce, rel=1e-5)
    with pytest.raises(Exception, match=r"expected labels shaped like the model's output per input \(1,\), "
                                        r"found \(2,\)"):
        replay_head(tmp_path / "wrong", verified_head(), labels=lambda rng, n: rng.integers(0, 2, (n, 2)), batch_size=1)


def test_the_static_report_says_what_every_output_was_read_as(tmp_path):
    from click.testing import CliRunner

    from graphaudit.cli import cli

    onnx.save(verified_head(), tmp_path / "m.onnx")
    text = CliRunner().invoke(cli, ["static", str(tmp_path / "m.onnx")]).output
    assert "output 'score' read as per-value probabilities (Bernoulli): in every branch of If node /cascade/If" in text
    doc = json.loads(CliRunner().invoke(cli, ["static", str(tmp_path / "m.onnx"), "--format", "json"]).output)
    assert [(o["output"], o["kind"], o["bernoulli"]) for o in doc["outputs"]] == [("score", "probs", True)]


def test_a_concat_of_box_values_beside_sigmoid_scores_is_values_and_of_sigmoids_a_probability():
    w = numpy_helper.from_array(np.random.default_rng(8).standard_normal((2, 4, 1, 1)).astype(np.float32), "box.w")
    def head(second: str):
        return headed([helper.make_node("Conv", ["x.2", "box.w"], ["box"], name="/det/Conv"),
                        helper.make_node("Sigmoid", ["box"], ["score"], name="/det/Sigmoid"),
                        helper.make_node("Concat", [second, "score"], ["det"], name="/det/Concat", axis=1)],
                       "det", ["batch", 4, 5, 5], [w])

    read = read_outputs(head("box"))["det"]
    assert read.kind == REGRESSION and read.reason == (
        "a Concat at node /det/Concat of parts that hold different things (unnormalised values, per-value "
        "probabilities): compared as values")
    out = np.zeros((2, 4, 3), np.float32)  # shaped as (batch, frames, classes) would be: values all the same
    assert task_for({"det": out}, {"pixels": np.zeros((2, 4), np.float32)}, {}, {"det": read}).kind == "outputs"
    assert read_outputs(head("score"))["det"].bernoulli
