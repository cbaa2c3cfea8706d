"""`graphaudit report audit.json`: a saved JSON report rendered again, the same as when it was made."""

from __future__ import annotations

import json
import os

import pytest

from graphaudit.audit import audit
from graphaudit.cli import output_format
from graphaudit.report import jsondoc

from support.cli import accepted, refused
from support.zoo import FIXTURES

MODEL = FIXTURES / "featuregate"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One audit of FeatureGate, its JSON saved, and its renderings as made from the audit itself."""
    folder = tmp_path_factory.mktemp("saved")
    report = audit(MODEL / "model.onnx", MODEL / "calib.npz", MODEL / "eval.npz", FIXTURES / "dense" / "model.onnx",
                   provider="cpu", runs=1, warmup=0, profile_runs=1, profile_limit=4, resamples=20)
    (folder / "audit.json").write_text(report.render("json"), encoding="utf-8")
    return folder / "audit.json", {fmt: report.render(fmt) for fmt in ("text", "markdown", "html", "json")}


@pytest.mark.parametrize("fmt", ["text", "markdown", "html", "json"])
def test_a_saved_report_renders_as_it_did_when_made(saved, capfd, fmt):
    path, made = saved
    assert accepted(capfd, ["report", path, "--format", fmt], [path]) == made[fmt]


@pytest.mark.parametrize(("name", "fmt"), [("a.html", "html"), ("a.md", "markdown"), ("a.json", "json"),
                                           ("a.txt", "text"), ("a.report", "text")])
def test_the_output_suffix_names_the_format_unless_format_says_otherwise(saved, capfd, tmp_path, name, fmt):
    path, made = saved
    accepted(capfd, ["report", path, "-o", tmp_path / name, "-q"], [path])
    assert (tmp_path / name).read_text(encoding="utf-8") == made[fmt]
    accepted(capfd, ["report", path, "-o", tmp_path / name, "--format", "markdown", "-q"], [path])
    assert (tmp_path / name).read_text(encoding="utf-8") == made["markdown"]


def test_dash_is_standard_output(saved, capfd):
    path, made = saved
    assert accepted(capfd, ["report", path, "-o", "-", "--format", "html"], [path]) == made["html"]
    assert output_format(None, "-") == "text" and output_format(None, None, "json") == "json"


def test_writing_the_report_says_where_it_went_unless_quiet(saved, capfd, tmp_path):
    path, _ = saved
    from support.cli import invoke

    assert invoke(["report", path, "-o", tmp_path / "a.html"]) == 0
    assert capfd.readouterr().err == f"graphaudit: wrote the html report to {tmp_path / 'a.html'}\n"


@pytest.mark.parametrize(("content", "match"), [
    (b"not json", r"expected JSON text in .*, found text that does not parse"),
    (b"\xff\xfe", r"expected JSON text"),
    (b"[1, 2]", r"expected a JSON object in .*, found a list"),
    (b'{"version": "2.0", "verdict": {}}', r"expected an audit report of schema version 1\.x in .*, found version '2\.0'"),
    (b'{"blocks": []}', r"found version None"),
    (b'{"version": "1.0", "static": {}}', r"expected the report of graphaudit run \(with a verdict\) in .*, found a "
                                          r"document with static, version"),
])
def test_a_document_that_is_not_a_saved_audit_is_refused_in_one_line(capfd, tmp_path, content, match):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    refused(capfd, ["report", bad], [bad], match=match)


def test_what_is_not_a_regular_file_is_refused_unread(capfd, tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # opening it would wait for a writer
    refused(capfd, ["report", fifo], [], match=r"expected a saved JSON report at .*, found a FIFO|named pipe|pipe")
    refused(capfd, ["report", tmp_path / "none.json"], [], match=r"expected a saved JSON report at .*none\.json")


def test_a_file_too_large_to_be_a_report_is_refused_before_it_is_read(capfd, tmp_path, monkeypatch):
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"version": "1.0", "verdict": {}, "pad": "x" * 2000}))
    monkeypatch.setattr(jsondoc, "MAX_DOCUMENT_BYTES", 1000)
    refused(capfd, ["report", big], [big], match=r"expected a saved JSON report of at most 1000 bytes at .*, found "
                                                 r"\d+ bytes")


def test_the_output_may_not_be_the_document(saved, capfd):
    path, _ = saved
    refused(capfd, ["report", path, "-o", path], [path], match="not one of the inputs", code=2)
