"""`graphaudit run` and `graphaudit.audit` on the zoo: the verdicts DESIGN.md predicts, claims, formats.

Each model is audited once (module fixture) with small settings, as JSON with
`--claim dynamic-inference`; the tests read that document and the exit status. A model
whose fixture is not built is skipped, saying which.
"""

import json
import re
from pathlib import Path

import pytest

import graphaudit
from graphaudit.cli import main

from test_report_json import validate

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
FAST = ["--runs", "3", "--warmup", "1", "--profile-runs", "1", "--limit", "8", "--resamples", "100",
        "--provider", "cpu"]


def zoo(name):
    folder = FIXTURES / name
    for f in ("model.onnx", "calib.npz", "eval.npz"):
        if not (folder / f).is_file():
            pytest.skip(f"zoo fixture {name}/{f} is not built (python -m exporters.build --out fixtures)")
    return folder


def run(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def model_args(name, baseline=True):
    folder = zoo(name)
    args = ["run", folder / "model.onnx", "--calib", folder / "calib.npz", "--data", folder / "eval.npz", *FAST]
    if baseline:
        args += ["--baseline", zoo("dense") / "model.onnx"]
    return args


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """name -> (exit status, JSON document, stderr) of `run --claim dynamic-inference --format json`."""
    cache = {}
    out_dir = tmp_path_factory.mktemp("run")

    def get(name):
        if name not in cache:
            target = out_dir / f"{name}.json"
            args = model_args(name) + ["--format", "json", "-o", target, "--claim", "dynamic-inference", "--quiet"]
            try:
                main([str(a) for a in args])
                code = 0
            except SystemExit as exit_info:
                code = exit_info.code
            cache[name] = (code, json.loads(target.read_text()) if target.is_file() else None)
        return cache[name]

    return get


def answers(doc):
    return {k: v["answer"] for k, v in doc["verdict"].items()}


@pytest.mark.parametrize("name", ["featuregate", "mudd"])
def test_dynamic_parameters_without_dynamic_inference_refute_the_claim(name, audited):
    code, doc = audited(name)
    assert code == 3
    validate(doc)
    got = answers(doc)
    assert got["coefficient_variation"] == "yes"
    assert got["conditional_execution"] == "no"  # every block executed (DESIGN.md, the paper's finding)
    assert got["functional_dependence"] in ("yes", "no")  # measured, whichever way it goes
    assert doc["claims"] == [{"claim": "dynamic-inference", "supported": False,
                              "reason": doc["claims"][0]["reason"]}]
    assert doc["claims"][0]["reason"].startswith("refuted:")
    assert all(b["verdict"] in ("always", "gated") for b in doc["static"]["blocks"])
    blocks = [b for b in doc["profile"]["blocks"] if not b["name"].startswith("(")]
    assert blocks and all(b["executed_fraction"] == 1.0 for b in blocks)
    assert doc["replay"]["parity"]["ok"] and doc["coefficient_means"]


def test_earlyexit_skips_blocks_and_supports_the_claim(audited):
    code, doc = audited("earlyexit")
    assert code == 0, doc and doc["claims"]
    validate(doc)
    assert answers(doc)["conditional_execution"] == "yes"
    assert any(b["verdict"] == "branch" for b in doc["static"]["blocks"])
    assert any((b["executed_fraction"] or 1) < 1 for b in doc["profile"]["blocks"])
    assert doc["claims"][0]["supported"] is True
    # The profile checks each block's static verdict against what ran.
    agreement = {a["block"]: (a["static_verdict"], a["outcome"]) for a in doc["profile"]["static_agreement"]}
    assert agreement["blocks.2"] == ("branch", "confirmed") and agreement["blocks.0"] == ("always", "confirmed")
    # An If decides once per batch: the replay runs one input per batch, and says so.
    assert doc["replay"]["settings"]["batch_size"] == 1
    assert any("one input per batch" in note for note in doc["notes"])


def test_moe_dispatches_tokens_to_a_subset(audited):
    code, doc = audited("moe")
    validate(doc)
    assert any(b["verdict"] == "subset" for b in doc["static"]["blocks"])
    assert answers(doc)["conditional_execution"] == "yes" and code == 0


def test_dense_has_no_replay_and_says_so(audited):
    code, doc = audited("dense")
    validate(doc)
    assert doc["replay"] is None
    assert any("frozen replay did not run" in note for note in doc["notes"])
    assert answers(doc)["coefficient_variation"] == "not measured"
    assert answers(doc)["conditional_execution"] == "no" and code == 3
    assert doc["inputs"].get("is_baseline") is True  # dense against itself is not timed


def test_text_report_on_stdout_and_claim_on_stderr(capsys):
    code, out, err = run(model_args("featuregate") + ["--claim", "dynamic-inference", "--quiet"], capsys)
    assert code == 3
    assert out.startswith("graphaudit run · model ") and "\nVerdict\n" in out
    assert re.search(r"conditional execution\s+no\s+No: every block runs", out)
    assert err.startswith("graphaudit: claim dynamic-inference refuted: ")
    assert "Traceback" not in err


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_formats_written_to_a_file(fmt, tmp_path, capsys):
    target = tmp_path / f"report.{fmt}"
    code, out, err = run(model_args("mudd") + ["--format", fmt, "-o", target], capsys)
    assert code == 0 and out == ""
    assert f"wrote the {fmt} report to {target}" in err
    text = target.read_text()
    if fmt == "markdown":
        assert text.startswith("## graphaudit:") and "| functional dependence |" in text
    else:
        assert text.count("<svg") >= 5 and "<script" not in text


def test_compute_savings_needs_a_baseline(capsys):
    code, out, err = run(model_args("featuregate", baseline=False) + ["--claim", "compute-savings"], capsys)
    assert code == 2 and "expected --baseline with --claim compute-savings" in err


def test_bad_input_is_one_line_and_status_1(tmp_path, capsys):
    bad = tmp_path / "calib.npz"
    bad.write_bytes(b"not an npz")
    folder = zoo("featuregate")
    code, out, err = run(["run", folder / "model.onnx", "--calib", bad, "--quiet"], capsys)
    assert code == 1 and err.startswith("graphaudit: error: ") and err.count("\n") == 1


def test_python_api_mirrors_the_command():
    folder = zoo("featuregate")
    report = graphaudit.audit(folder / "model.onnx", folder / "calib.npz", folder / "eval.npz",
                              provider="cpu", runs=2, warmup=1, profile_runs=1, profile_limit=4, resamples=50)
    assert isinstance(report, graphaudit.AuditReport)
    assert report.verdict.conditional_execution.answer == "no"
    assert not report.check("dynamic-inference").supported
    assert report.replay.coefficients and report.profile is not None and report.static is not None
    assert report.verdict.compute_savings.answer == "not measured"  # no baseline given
    doc = report.to_json()
    validate(doc)
    assert json.loads(report.render("json")) == doc
