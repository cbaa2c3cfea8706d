"""Settings as typed objects built once and passed down whole (issue 22, item 4)."""

import click
import pytest
from click.testing import CliRunner

import graphaudit.analyses.static as static_module
import graphaudit.replay.pipeline as pipeline
from graphaudit import AuditSettings, audit
from graphaudit.analyses.static import audit_static
from graphaudit.cli.options import (
    CoefficientSettings,
    OutputSettings,
    coefficient_options,
    feeding_options,
    output_options,
)
from graphaudit.errors import GraphAuditError
from graphaudit.load.feeding import Feeding
from graphaudit.load.model import load_for_runtime
from graphaudit.profile.settings import DEFAULT_BUDGET_S, SAVINGS_RATIO_MAX, ProfileSettings
from graphaudit.replay.pipeline import replay
from graphaudit.replay.settings import AppliedSettings, ReplaySettings

ALWAYS = ["batch_size", "resamples", "confidence", "tolerance", "conditions", "provider", "threads",
          "flush_denormals", "rewrite"]


def _files(folder):
    return folder / "gated.onnx", folder / "calib.npz", folder / "eval.npz"


def _counted(monkeypatch, found):
    """find_blocks, counted wherever the replay and the static audit call it."""
    real = static_module.find_blocks

    def counting(*args, **kwargs):
        found.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(static_module, "find_blocks", counting)
    monkeypatch.setattr(pipeline, "find_blocks", counting)


def test_the_replay_finds_the_blocks_once(gated_lm_files, monkeypatch):
    found = []
    _counted(monkeypatch, found)
    report = replay(*_files(gated_lm_files), conditions=["correct", "cross_input"], resamples=20)
    assert report.coefficients and report.settings["batch_size"] == 16
    assert len(found) == 1  # the coefficients and the batch size from one static audit


def test_a_static_audit_handed_down_is_not_run_again(gated_lm_files, monkeypatch):
    files = _files(gated_lm_files)
    static = audit_static(load_for_runtime(files[0]))
    found = []
    _counted(monkeypatch, found)
    given = replay(*files, conditions=["correct"], resamples=20, static=static)
    assert found == [] and given.coefficients == static.coefficients
    assert given.settings["batch_size"] == 16 and "batch_size_note" not in given.settings


def test_a_settings_object_and_keywords_give_the_same_report(gated_lm_files):
    files = _files(gated_lm_files)
    settings = ReplaySettings(conditions=("correct", "cross_input"), seed=3, resamples=20)
    by_object = replay(*files, settings).to_json()
    by_keywords = replay(*files, conditions=["correct", "cross_input"], seed=3, resamples=20).to_json()
    by_object.pop("timing"), by_keywords.pop("timing")
    assert by_object == by_keywords
    assert list(by_object["settings"])[:len(ALWAYS)] == ALWAYS and list(by_object["settings"])[-1] == "cache"
    assert replay(*files, settings, seed=4).seed == 4  # a keyword over the object's field


def test_applied_settings_read_as_the_json_object_in_one_fixed_order():
    applied = AppliedSettings(4, 20, 0.95, 1e-4, ("correct",), "cpu", None, True, True, cache_note="damaged",
                              rewrites={}, batch_size_note="why")
    doc = applied.to_json()
    assert list(doc) == [*ALWAYS, "batch_size_note", "rewrites", "cache_note"]
    assert doc["conditions"] == ["correct"] and doc["threads"] is None  # always there, null or not
    assert dict(applied) == doc and "padding" not in applied and applied.get("padding") is None
    assert applied["batch_size_note"] == "why"


def test_replay_settings_are_checked_when_made_and_keep_their_own_copies():
    names = ["gate.*"]
    settings = ReplaySettings(coefficients=names)
    names.append("other")
    assert settings.coefficients == ("gate.*",)
    with pytest.raises(GraphAuditError, match=r"expected resamples in 1\.\.") as err:
        ReplaySettings(resamples=0)
    assert err.value.exit_code == 2
    with pytest.raises(GraphAuditError, match="parity tolerance"):
        ReplaySettings.of(ReplaySettings(), tolerance=float("nan"))


def test_audit_keywords_go_to_the_parts_they_name():
    s = AuditSettings.of(provider="cpu", threads=2, seed=5, runs=3, profile_budget=None, profile_limit=4,
                         block_pattern="blocks\\.(\\d+)", claims=["dynamic-inference"])
    assert (s.replay.provider, s.profile.provider, s.replay.threads, s.profile.threads) == ("cpu", "cpu", 2, 2)
    assert (s.replay.seed, s.profile.runs, s.profile.budget, s.profile.limit) == (5, 3, DEFAULT_BUDGET_S, 4)
    assert s.profile.block_pattern == "blocks\\.(\\d+)" and s.claims == ("dynamic-inference",)
    assert AuditSettings().replay.provider == AuditSettings().profile.provider == "auto"  # audit's default
    assert ProfileSettings.of(ProfileSettings(runs=2), warmup=1) == ProfileSettings(runs=2, warmup=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'budget'"):
        AuditSettings.of(budget=3)


def test_the_audit_asks_the_profile_for_the_savings_answer_and_the_profile_alone_does_not():
    assert AuditSettings().profile.decide_at == SAVINGS_RATIO_MAX  # run's timed rounds stop on the answer
    assert AuditSettings.of(profile_decide_at=None).profile.decide_at is None  # timed on to the precision
    assert AuditSettings.of(profile_decide_at=0.9).profile.decide_at == 0.9
    assert ProfileSettings().decide_at is None  # `graphaudit profile` reports a ratio, to its precision


def test_audit_refuses_a_fifth_argument_that_is_not_settings(gated_lm_files):
    model, calib, data = _files(gated_lm_files)
    with pytest.raises(TypeError, match="expected an AuditSettings as audit\\(\\)'s fifth argument, found tuple"):
        audit(model, calib, data, None, ("gate.*",))


def test_option_groups_hand_the_command_one_object_each():
    seen = {}

    @click.command()
    @feeding_options
    @coefficient_options("Coefficients.", "NAME", split=lambda names: tuple(n for v in names for n in v.split(",")))
    @output_options(["text", "json"], "Output format.")
    def command(feeding, coefficients, out):
        seen.update(feeding=feeding, coefficients=coefficients, out=out)

    ok = CliRunner().invoke(command, ["--coefficients", "a,b", "--axes", "c=batch,token", "--format", "json", "-q",
                                      "-o", "report.json"])
    assert ok.exit_code == 0, ok.output
    assert seen["feeding"] is None and seen["coefficients"] == CoefficientSettings(("a", "b"), ("c=batch,token",))
    assert seen["coefficients"].entries == ("a", "b", "c=batch,token")
    assert seen["out"] == OutputSettings("json", seen["out"].output, True) and seen["out"].output.name == "report.json"
    CliRunner().invoke(command, ["--set", "sr=16000"])
    assert isinstance(seen["feeding"], Feeding)
    bad = CliRunner().invoke(command, ["--axes", "c"])
    assert bad.exit_code != 0 and "expected --axes NAME_OR_GLOB=AXIS" in str(bad.exception)
    help_text = CliRunner().invoke(command, ["--help"]).output
    order = [help_text.index(o) for o in ("--set", "--input-axes", "--coefficients", "--axes", "--format", "--output",
                                          "--quiet")]
    assert order == sorted(order)  # each group's options in the order it declares them
