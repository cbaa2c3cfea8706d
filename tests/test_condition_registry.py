"""A replay condition is one function and one entry in replay/conditions.py's REGISTRY: a
condition registered there alone reaches the command line, the replay, the verdict and the
reports, and no other module spells a condition's name."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from graphaudit.cli import cli
from graphaudit.replay.conditions import OWN, REGISTRY, Condition
from graphaudit.verdict.decide import decide

from support.source import string_literals

PACKAGE = Path(__file__).resolve().parents[1] / "graphaudit"


def zeroed(drawn, c, rows):
    """A toy condition: every coefficient 0."""
    return np.zeros_like(drawn.evaluation.rows(c, rows))


@pytest.fixture
def with_zeroed(monkeypatch):
    monkeypatch.setitem(REGISTRY, "zeroed", Condition("zeroed", zeroed, OWN, "zeros for coefficients",
                                                      reassigns=True))


def _replay(files, *extra):
    args = ["replay", str(files / "gated.onnx"), "--calib", str(files / "calib.npz"), "--data",
            str(files / "eval.npz"), "--batch-size", "5", "--resamples", "20", *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_registered_condition_runs_by_default_and_reaches_the_verdict(gated_lm_files, with_zeroed):
    doc = json.loads(_replay(gated_lm_files, "--format", "json"))
    assert list(doc["conditions"])[-1] == "zeroed" and doc["settings"]["conditions"][-1] == "zeroed"
    assert isinstance(doc["conditions"]["zeroed"]["delta_nll"], float)  # scored against correct
    finding = decide(None, doc, None).functional_dependence.to_json()
    assert any("ΔNLL zeroed" in e["text"] for e in finding["evidence"]), finding


def test_a_registered_condition_is_a_choice_of_the_command_line(gated_lm_files, with_zeroed):
    text = _replay(gated_lm_files, "--conditions", "zeroed")
    assert "zeroed" in text.split("condition", 1)[1]  # its row in the table
    refused = CliRunner().invoke(cli, ["replay", str(gated_lm_files / "gated.onnx"), "--calib",
                                       str(gated_lm_files / "calib.npz"), "--conditions", "sideways"])
    message = str(refused.exception)  # a UsageError: main() makes it one line and status 2
    assert getattr(refused.exception, "exit_code", None) == 2, refused.output
    assert "zeroed" in message and "found sideways" in message


def test_the_verdict_words_a_reassignment_as_its_entry_does(with_zeroed):
    replay = {"parity": {"ok": True, "max_abs_diff": 0.0},
              "conditions": {"correct": {"nll": 1.0, "delta_nll": 0.0},
                             "zeroed": {"nll": 1.0, "delta_nll": 0.0, "ci": [-0.001, 0.001]}}}
    finding = decide(None, replay, None).functional_dependence
    assert finding.answer == "no" and "feeding the frozen model zeros for coefficients" in finding.statement




def test_no_module_but_the_registrys_spells_a_condition_name():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name != "replay/conditions.py" and (spelled := string_literals(path) & set(REGISTRY)):
            found[name] = sorted(spelled)
    assert not found, f"condition names spelled outside replay/conditions.py: {found}"
