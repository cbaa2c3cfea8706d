"""Commands that behave alike: every command that prints a report takes --format, -o, -q and -v;
-o's suffix names the format unless --format says; `-o -` is standard output."""

from __future__ import annotations

import importlib
import json

import click
import pytest

from graphaudit.cli import COMMANDS
from graphaudit.runtime import sessions

from support.cli import accepted, invoke, refused
from support.zoo import FIXTURES

MODEL = FIXTURES / "featuregate" / "model.onnx"
REPORTING = sorted(set(COMMANDS) - {"freeze"})  # freeze writes graphs into a folder, not a report


def _command(name):
    module, attr = COMMANDS[name].split(":")
    return getattr(importlib.import_module(module), attr)


@pytest.mark.parametrize("name", REPORTING)
def test_every_reporting_command_takes_format_output_quiet_and_verbose(name):
    opts = {o for p in _command(name).params if isinstance(p, click.Option) for o in p.opts}
    assert {"--format", "-o", "--output", "-q", "--quiet", "-v", "--verbose"} <= opts, name


@pytest.mark.parametrize("name", ["static", "inspect"])
def test_the_suffix_names_the_format_and_dash_is_standard_output(capfd, tmp_path, name):
    as_json = accepted(capfd, [name, MODEL, "--format", "json"], [MODEL])
    as_text = accepted(capfd, [name, MODEL], [MODEL])
    assert json.loads(as_json)["version"] == "1.0" and not as_text.startswith("{")
    accepted(capfd, [name, MODEL, "-o", tmp_path / "r.json", "-q"], [MODEL])
    assert (tmp_path / "r.json").read_text() == as_json
    accepted(capfd, [name, MODEL, "-o", tmp_path / "r.txt", "-q"], [MODEL])
    assert (tmp_path / "r.txt").read_text() == as_text
    accepted(capfd, [name, MODEL, "-o", tmp_path / "r.json", "--format", "text", "-q"], [MODEL])
    assert (tmp_path / "r.json").read_text() == as_text  # --format wins over the suffix
    assert accepted(capfd, [name, MODEL, "-o", "-"], [MODEL]) == as_text


def test_writing_says_where_unless_quiet(capfd, tmp_path):
    assert invoke(["inspect", MODEL, "-o", tmp_path / "r.json"]) == 0
    assert capfd.readouterr().err == f"graphaudit: wrote the json report to {tmp_path / 'r.json'}\n"


def test_a_suffix_naming_a_format_the_command_lacks_is_bad_usage(capfd, tmp_path):
    refused(capfd, ["static", MODEL, "-o", tmp_path / "r.html"], [MODEL],
            match=r"expected -o's suffix to name a format among text, json, found \.html \(html\)", code=2)
    assert not (tmp_path / "r.html").exists()


def test_quiet_and_verbose_together_are_bad_usage(capfd):
    refused(capfd, ["inspect", MODEL, "-q", "-v"], [MODEL], match="at most one of -q and -v", code=2)


def test_an_output_onto_the_model_is_refused(capfd):
    refused(capfd, ["inspect", MODEL, "-o", MODEL], [MODEL], match="not one of the inputs", code=2)


def test_verbose_lets_onnx_runtimes_log_lines_through(capfd, monkeypatch):
    monkeypatch.setattr(sessions, "_severity", [sessions.runtime_log_severity()])
    assert sessions.runtime_log_severity() == 4  # silenced: only fatal errors
    accepted(capfd, ["inspect", MODEL, "-v"], [MODEL])
    assert sessions.runtime_log_severity() == 2  # warnings and errors
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # as it was for the tests that follow


def test_static_and_run_check_a_claim_with_one_option_and_one_name(capfd):
    """`static --claim dynamic-inference` is `run --claim dynamic-inference` read from the graph alone;
    the older `static --expect dynamic` gives the same answer."""
    from graphaudit.verdict.decide import CLAIM_FINDINGS
    from graphaudit.vocabulary import DYNAMIC_INFERENCE, STATIC_CLAIMS

    assert DYNAMIC_INFERENCE in CLAIM_FINDINGS and DYNAMIC_INFERENCE in STATIC_CLAIMS
    for claim in (["--claim", "dynamic-inference"], ["--expect", "dynamic"]):
        assert invoke(["static", MODEL, *claim]) == 3  # FeatureGate's gates skip nothing
        _out, err = capfd.readouterr()
        assert err.startswith("graphaudit: claim refuted: expected dynamic execution")
    assert invoke(["static", MODEL, "--claim", "static-execution"]) == 0
    capfd.readouterr()
