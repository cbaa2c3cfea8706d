"""The JSON report: versioned, plain JSON, valid against graphaudit/report/schema.json.

The schema is checked by the small validator of tests/support/json_schema.py.
"""

import json

import pytest

from graphaudit.report import render
from graphaudit.report.jsondoc import SCHEMA_VERSION, plain, schema

from support.json_schema import errors, validate
from support.report_samples import dense, document, earlyexit, featuregate, mudd


@pytest.mark.parametrize("parts", [featuregate(), mudd(), earlyexit(), dense()],
                         ids=["featuregate", "mudd", "earlyexit", "dense"])
def test_json_report_is_versioned_and_valid(parts):
    doc = json.loads(render(document(parts), "json"))
    assert doc["version"] == SCHEMA_VERSION
    assert set(doc["verdict"]) == {"coefficient_variation", "functional_dependence",
                                   "conditional_execution", "compute_savings"}
    validate(doc)


def test_schema_is_the_documented_shape():
    s = schema()
    assert s["properties"]["version"]["const"] == SCHEMA_VERSION
    for key in ("version", "static", "replay", "profile", "verdict"):
        assert key in s["required"]


def test_validator_catches_what_the_schema_forbids():
    doc = json.loads(render(document(featuregate()), "json"))
    doc["verdict"]["compute_savings"]["answer"] = "probably"
    del doc["version"]
    problems = errors(doc, schema(), schema())
    assert any("missing 'version'" in p for p in problems)
    assert any("compute_savings.answer" in p for p in problems)


def test_nan_and_numpy_become_plain_json():
    np = pytest.importorskip("numpy")
    out = plain({"a": float("nan"), "b": np.float32(1.5), "c": np.arange(3), "d": (1, float("inf"))})
    assert out == {"a": None, "b": 1.5, "c": [0, 1, 2], "d": [1, None]}
    json.dumps(out, allow_nan=False)
