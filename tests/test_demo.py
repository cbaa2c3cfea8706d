"""`graphaudit demo`: the zoo side by side, the README's excerpt of it, and the Python example of docs/reference.md."""

import os
from pathlib import Path

import pytest

from graphaudit.cli import main
from graphaudit.replay.conditions import CROSS_INPUT
from graphaudit.report.tables import COMPARISON_ROWS, comparison_column

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"


def run(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def built(name):
    return all((FIXTURES / name / f).is_file() for f in ("model.onnx", "calib.npz", "eval.npz"))


def test_demo_prints_the_models_side_by_side(tmp_path, capsys):
    # Two models keep the test short; the README's command runs all five.
    if not (built("dense") and built("featuregate")):
        pytest.skip("zoo fixtures dense and featuregate are not built")
    for name in ("dense", "featuregate"):
        os.symlink(FIXTURES / name, tmp_path / name)
    code, out, err = run(["demo", "--fixtures", tmp_path, "--quiet", "--provider", "cpu"], capsys)
    assert code == 0, err
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("graphaudit demo: 2 models from ")
    header = next(line for line in lines if line.split()[:2] == ["dense", "featuregate"])
    assert header
    for label in COMPARISON_ROWS[:-3]:
        assert any(line.startswith(label) for line in lines), label
    verdict = next(line for line in lines if line.startswith("verdict "))
    assert verdict.split()[1:] == ["static", "dynamic", "parameters", "only"]
    assert next(line for line in lines if line.startswith("dynamic inference")).split()[2:] == ["no", "no"]
    assert "not found, left out: mudd, moe, earlyexit" in out


def test_demo_without_a_zoo_says_where_it_looked(tmp_path, capsys):
    code, _out, err = run(["demo", "--fixtures", tmp_path, "--quiet"], capsys)
    assert code == 1 and f"expected the zoo's models under {tmp_path}" in err


def test_readme_shows_the_demo_and_the_python_api():
    text = (ROOT / "README.md").read_text()
    excerpt = text.split("graphaudit demo:", 1)[1].split("```", 1)[0]
    assert excerpt.startswith(" 5 models from fixtures ")  # the demo's own first line, once
    for label in ("coefficients vary with input", "dynamic inference", "verdict"):
        assert label in excerpt
    for name in ("dense", "featuregate", "mudd", "moe", "earlyexit"):
        assert name in excerpt
    assert "graphaudit.audit(" in text and "graphaudit run " in text
    reference = (ROOT / "docs" / "reference.md").read_text()  # the Python API and the browser test moved there
    assert "graphaudit.audit(" in reference
    assert "apt-get install" in reference and "chromium" in reference.lower()


def test_readme_python_example_runs(monkeypatch):
    import graphaudit

    if not (built("dense") and built("mudd")):
        pytest.skip("zoo fixtures dense and mudd are not built")
    text = (ROOT / "docs" / "reference.md").read_text()
    code = text.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    real = graphaudit.audit
    fast = dict(provider="cpu", runs=2, warmup=1, profile_runs=1, profile_limit=4, resamples=50)
    monkeypatch.setattr(graphaudit, "audit", lambda *a, **k: real(*a, **{**fast, **k}))
    monkeypatch.chdir(ROOT)
    namespace = {}
    exec(compile(code, "docs/reference.md", "exec"), namespace)
    assert namespace["report"].check("dynamic-inference").supported is False
    assert namespace["document"]["version"] and namespace["page"].startswith("<!DOCTYPE html>")


def test_a_change_whose_interval_lacks_an_end_is_shown_without_a_spread():
    """A saved report whose ΔNLL interval has one end only shows the change alone, as with no interval."""
    row = COMPARISON_ROWS.index("ΔNLL cross-input")

    def cell(ci):
        return comparison_column({"replay": {"conditions": {CROSS_INPUT: {"delta_nll": 0.25, "ci": ci}}}})[row]

    assert cell([0.1, 0.4]) == "+0.250 ±0.150"
    assert cell(None) == cell([0.1, None]) == cell([None, 0.4]) == "+0.250"
