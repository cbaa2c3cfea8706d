"""A classifier replayed on data without labels: its class logits are scored by KL from the
`correct` output (docs/design.md: KL needs no labels), every input's parity compares their
log-probabilities, and the verdict answers from the KL instead of saying nothing was measured."""

import numpy as np
import onnx
import pytest

from graphaudit.metrics import task_for
from graphaudit.replay.pipeline import replay
from graphaudit.report.tables import condition_table
from graphaudit.verdict.decide import functional_dependence
from graphaudit.verdict.findings import NO, NOT_MEASURED, YES

from support.models import se_cnn


@pytest.mark.parametrize("name, shape, labels, kind", [
    ("logits", (4, 3), None, "classification"),
    ("class_logits", (4, 3), None, "classification"),
    ("cls.logits", (4, 3), None, "classification"),
    ("output", (4, 3), None, "classification"),  # a distribution's logits, whatever its name
    ("logits", (4, 1), None, "outputs"),  # one class is no distribution
    ("logits", (4, 3), np.array([0, 1, 2, 0]), "classification"),
])
def test_which_two_dimensional_outputs_are_class_logits(name, shape, labels, kind):
    out = np.zeros(shape, np.float32)
    task = task_for({name: out}, {"pixels": np.zeros((4, 2), np.float32)}, {} if labels is None else {"labels": labels})
    assert task.kind == kind
    assert task.labels == (None if labels is None else "labels")


def _images(tmp_path, labels: bool):
    onnx.save(se_cnn(), tmp_path / "model.onnx")
    for seed, (name, count) in enumerate((("calib", 24), ("eval", 20))):
        arrays = {"pixels": np.random.default_rng(seed).standard_normal((count, 4, 5, 5)).astype(np.float32)}
        if labels:
            arrays["labels"] = np.random.default_rng(seed + 10).integers(0, 3, count)
        np.savez(tmp_path / f"{name}.npz", **arrays)
    return replay(tmp_path / "model.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=50)


def test_a_classifier_without_labels_is_scored_by_kl(tmp_path):
    report = _images(tmp_path, labels=False)
    assert report.task.kind == "classification" and report.task.labels is None
    assert report.parity.every_input.kind == "log-probabilities" and report.parity.every_input.values == 60
    cross = report.condition("cross_input")
    assert cross.nll.value is None and cross.delta_nll.value is None
    assert cross.divergence.value > 0 and report.condition("correct").divergence.value == 0
    doc = report.to_json()
    assert "kl" in doc["conditions"]["cross_input"] and "mse_from_correct" not in doc["conditions"]["cross_input"]


def test_labels_give_the_same_kl_and_an_nll(tmp_path):
    without, with_labels = _images(tmp_path, labels=False), _images(tmp_path, labels=True)
    assert with_labels.condition("cross_input").nll.value is not None
    assert with_labels.condition("cross_input").divergence.value == pytest.approx(
        without.condition("cross_input").divergence.value, rel=1e-9)


def _doc(key, cross, shuffle=None, output="logits"):
    conditions = {"correct": {"nll": None, "delta_nll": None, "ci": None, key: 0.0, f"{key}_ci": [0.0, 0.0]}}
    for name, figures in (("cross_input", cross), ("token_shuffle", shuffle)):
        if figures is not None:
            value, lo, hi = figures
            conditions[name] = {"nll": None, "delta_nll": None, "ci": None, key: value, f"{key}_ci": [lo, hi]}
    return {"parity": {"ok": True, "max_abs_diff": 0.0}, "conditions": conditions,
            "task": {"kind": "classification" if key == "kl" else "outputs", "output": output}}


def test_without_an_nll_the_verdict_answers_from_the_kl():
    moved = functional_dependence(_doc("kl", (0.12, 0.09, 0.15), (0.004, 0.001, 0.008)))
    assert moved.answer == YES
    assert "changes its output distribution (KL from correct: cross-input 0.1200 nats)" in moved.statement
    assert "no labels or targets to score 'logits' against" in moved.statement
    assert [e.text for e in moved.evidence if "KL" in e.text] == [
        "KL from correct, cross_input = 0.12 nats (95% CI 0.09 to 0.15)",
        "KL from correct, token_shuffle = 0.004 nats (95% CI 0.001 to 0.008)"]
    still = functional_dependence(_doc("kl", (0.0002, 0.0001, 0.0004)))
    assert still.answer == NO and "by no measurable amount above 0.01 nats of KL" in still.statement
    assert "reported no cross-input" not in still.statement


def test_without_an_nll_or_logits_the_verdict_says_what_moved_but_not_whether_it_hurt():
    finding = functional_dependence(_doc("mse_from_correct", (6.1e-4, 3.5e-4, 9.5e-4), output="embedding"))
    assert finding.answer == NOT_MEASURED
    assert "'embedding' is not a distribution, so no KL either" in finding.statement
    assert "its values moved measurably" in finding.statement
    assert any(e.text == "mean squared difference from the correct output, cross_input = 0.00061 (95% CI 0.00035 "
               "to 0.00095)" for e in finding.evidence)


def test_the_run_reports_replay_table_shows_how_far_each_condition_moved_the_output(tmp_path):
    doc = {"replay": _images(tmp_path, labels=False).to_json()}
    table = condition_table(doc)
    assert table.headers[-1] == "KL from correct (nats)"
    cross = next(row for row in table.rows if row[0] == "cross_input")
    assert cross[1:4] == ("—", "—", "—")  # no NLL, ΔNLL or interval without labels
    assert float(cross[-1].split()[0]) == pytest.approx(doc["replay"]["conditions"]["cross_input"]["kl"], rel=1e-3)
    assert cross[-1].split()[1].startswith("[")


def test_the_html_report_draws_the_kl_where_there_is_no_nll(tmp_path):
    from graphaudit.report.html import delta_nll_figure

    body, missing = delta_nll_figure({"replay": _images(tmp_path, labels=False).to_json()})
    assert missing == "" and "KL from the correct output" in body and "cross_input" in body
    mse = {"replay": {"conditions": _doc("mse_from_correct", (6.1e-4, 3.5e-4, 9.5e-4))["conditions"]}}
    assert delta_nll_figure(mse) == ("", "Not shown: the replay has no NLL (the data has no labels or targets) "
                                         "and its output is not logits.")
    assert delta_nll_figure({"replay": None})[1] == "Not shown: no frozen replay ran."


def test_the_run_of_a_classifier_without_labels_answers_from_the_kl(tmp_path):
    import json

    from click.testing import CliRunner

    from graphaudit.cli import cli

    from support.json_schema import validate

    _images(tmp_path, labels=False)
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "model.onnx"), "--calib", str(tmp_path / "calib.npz"),
                                      "--data", str(tmp_path / "eval.npz"), "--format", "json", "-q", "--runs", "2",
                                      "--warmup", "1", "--profile-runs", "1", "--resamples", "50"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    validate(doc)
    finding = doc["verdict"]["functional_dependence"]
    assert finding["answer"] in ("yes", "no") and "KL" in finding["statement"]
    assert any(e["text"].startswith("KL from correct, cross_input = ") for e in finding["evidence"])
