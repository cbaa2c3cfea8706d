"""The JSON report: versioned, plain JSON, valid against graphaudit/report/schema.json.

The schema is checked with jsonschema (tests/support/json_schema.py); tests/test_schema_coverage.py
checks every command's JSON on the zoo.
"""

import json

import pytest

from graphaudit.report import render
from graphaudit.report.jsondoc import SCHEMA_VERSION, plain, schema

from support.json_schema import KINDS, errors, validate
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
    assert s["$defs"]["version"]["const"] == SCHEMA_VERSION
    assert [o["$ref"] for o in s["oneOf"]] == [f"#/$defs/{k}_document" for k in KINDS]
    run = s["$defs"]["run_document"]
    for key in ("version", "static", "replay", "profile", "verdict"):
        assert key in run["required"]
    for kind in KINDS:
        assert "version" in s["$defs"][f"{kind}_document"]["required"]


def test_validator_catches_what_the_schema_forbids():
    doc = json.loads(render(document(featuregate()), "json"))
    doc["verdict"]["compute_savings"]["answer"] = "probably"
    del doc["version"]
    doc["static"]["blocks"][0]["new_field"] = 1
    problems = errors(doc)
    assert any("'version' is a required property" in p for p in problems)
    assert any("compute_savings.answer" in p and "'probably' is not one of" in p for p in problems)
    assert any("blocks[0]" in p and "'new_field' was unexpected" in p for p in problems)


def test_nan_and_numpy_become_plain_json():
    np = pytest.importorskip("numpy")
    out = plain({"a": float("nan"), "b": np.float32(1.5), "c": np.arange(3), "d": (1, float("inf"))})
    assert out == {"a": None, "b": 1.5, "c": [0, 1, 2], "d": [1, None]}
    json.dumps(out, allow_nan=False)
