"""One rendering path: every command's text comes from report/, its numbers from wording.py's formatters.

The CLI modules parse options, call the library and hand the result to a renderer; the
renderers and the verdict write each number with the one formatter of its kind, whose
parameters keep each report's spelling; a sentence names a threshold or a level by reading
the constant that defines it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from graphaudit.wording import CONFIDENCE, bracketed, fmt, pct, si, sig, signed

from support.report_samples import document, featuregate, replay_doc

PACKAGE = Path(__file__).resolve().parents[1] / "graphaudit"
FORMATTERS = {"pct", "fmt", "signed", "sig", "si", "num_text", "ci_text", "bracketed"}


def _module_functions(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def _text_echoed(path: Path) -> list[int]:
    """The lines where `path` writes text it composes itself (an f-string) to stdout."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "echo"
                and not any(k.arg == "err" for k in node.keywords)
                and any(isinstance(a, ast.JoinedStr) for arg in node.args for a in ast.walk(arg))):
            found.append(node.lineno)
    return found


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "cli").glob("*.py")), ids=lambda p: p.name)
def test_a_command_module_renders_nothing_itself(path):
    # tables and text are report/'s: a command hands its report object to a renderer there
    assert "tabulate" not in _imports(path)
    assert not {f for f in _module_functions(path) if f.startswith(("render", "_render"))}
    assert _text_echoed(path) == []  # messages to stderr aside


def test_each_number_formatter_is_defined_once():
    defined = {}
    for path in PACKAGE.rglob("*.py"):
        for name in _module_functions(path):
            if name.lstrip("_") in FORMATTERS:
                defined.setdefault(name.lstrip("_"), []).append(str(path.relative_to(PACKAGE)))
    assert defined == {name: ["wording.py"] for name in FORMATTERS}


def test_one_pct_keeps_each_reports_spelling():
    values = (-0.0, 0.0, 4e-16, 0.0004, 0.12345, 1.0, None)
    # the verdict's sentences: float noise is 0%, a small share keeps two significant digits
    assert [pct(v) for v in values] == ["0%", "0%", "0%", "0.04%", "12.3%", "100.0%", "?"]
    # the audit's tables: every share rounded alike, a dash where none was measured
    assert [pct(v, missing="—", small=False) for v in values] == \
        ["0.0%", "0.0%", "0.0%", "0.0%", "12.3%", "100.0%", "—"]
    # the replay's retained gap and variance shares: two decimals
    assert [pct(v, 2, missing="—", small=False) for v in values] == \
        ["0.00%", "0.00%", "0.00%", "0.04%", "12.35%", "100.00%", "—"]
    # the profile's fractions of inputs and nodes: none and all whole, blank where not measured
    assert [pct(v, missing="", small=False, whole=True) for v in values] == \
        ["0%", "0%", "0.0%", "0.0%", "12.3%", "100%", ""]
    # a confidence level: as many digits as it has
    assert [pct(level, None) for level in (0.95, 0.975, 0.9)] == ["95%", "97.5%", "90%"]


def test_the_other_formatters_keep_each_reports_spelling():
    assert [fmt(x) for x in (0.123456, 12.345, None)] == ["0.1235", "12.3", "?"]
    assert [fmt(x, 3, missing="") for x in (0.123456, None, float("nan"))] == ["0.123", "", ""]
    assert [signed(0.01), signed(-0.5, 3, missing="—"), signed(None, missing="—")] == ["+0.0100", "-0.500", "—"]
    assert [sig(0.000123456), sig(None, missing="—")] == ["0.0001235", "—"]
    # `graphaudit static` spells a count with a space and up to T; the profile's table without, up to G
    assert [si(n) for n in (None, 72, 1_250, 3_400_000_000_000)] == ["-", "72", "1.25 k", "3.40 T"]
    assert [si(n, units="GMk", sep="") for n in (72.0, 1_250, 3_400_000_000_000)] == ["72", "1.25k", "3400.00G"]
    assert [bracketed([0.01, -0.02]), bracketed((0.1234, 0.5), 2, percent=True), bracketed(None)] == \
        ["[+0.0100, -0.0200]", "[12.34%, 50.00%]", "—"]


def test_the_tables_name_the_level_the_replay_computed_its_intervals_at():
    from graphaudit.report import render
    from graphaudit.report.tables import condition_table

    doc = document(featuregate())
    assert f"{pct(CONFIDENCE, None)} CI of ΔNLL" in condition_table(doc).headers
    doc["replay"]["settings"] = {"confidence": 0.9}
    assert "90% CI of ΔNLL" in condition_table(doc).headers
    assert "with 90% intervals" in render(doc, "html") and "95%" not in render(doc, "text").split("Frozen")[1]


def test_the_verdict_names_the_confidence_level_it_reads(monkeypatch):
    import graphaudit.verdict.decide as decide_module
    import graphaudit.wording as wording

    doc = replay_doc()
    said = " ".join(e.text for e in decide_module.decide(None, doc, None).functional_dependence.evidence)
    assert "(95% CI +0.0150 to +0.0250)" in said
    monkeypatch.setattr(decide_module, "CONFIDENCE", 0.9)
    monkeypatch.setattr(wording, "CONFIDENCE", 0.9)
    said = " ".join(e.text for e in decide_module.decide(None, doc, None).functional_dependence.evidence)
    assert "(90% CI +0.0150 to +0.0250)" in said and "95%" not in said


def test_the_static_text_says_what_onnx_runtime_lacks():
    from onnx import parser

    from graphaudit.analyses.static import audit_static
    from graphaudit.load.model import load_model
    from graphaudit.report.static_text import render_text

    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) { y = Relu(x) }""")
    report = audit_static(load_model(model))
    assert "ONNX Runtime lacks" not in render_text(report)
    assert render_text(report, ["Foo"]).endswith(
        "\nONNX Runtime lacks Foo: graphaudit replay, profile and run cannot run this model")
