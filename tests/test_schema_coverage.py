"""Every command's JSON on every zoo model: valid against graphaudit/report/schema.json
(jsonschema, Draft 2020-12), versioned, and with every field path described by the schema.

One `run` and one each of `static`, `replay`, `profile` and `inspect` per model, with the
fewest rounds and resamples (shared by the module); the run document holds the three parts.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json

import pytest

from graphaudit.report.jsondoc import SCHEMA_VERSION, schema

from support.cli import FAST_PROFILE, FAST_REPLAY, FAST_RUN, invoke
from support.json_schema import KINDS, errors, field_paths, undescribed, validate
from support.zoo import FIXTURES

MODELS = [n for n in ("dense", "featuregate", "mudd", "moe", "earlyexit") if (FIXTURES / n / "model.onnx").is_file()]
LIMIT = ["--limit", "4"]  # profile 4 inputs


def _commands(name: str) -> dict[str, list]:
    folder = FIXTURES / name
    model, calib, data = folder / "model.onnx", folder / "calib.npz", folder / "eval.npz"
    baseline = [] if name == "dense" else ["--baseline", FIXTURES / "dense" / "model.onnx"]
    return {
        "run": ["run", model, "--calib", calib, "--data", data, *baseline, *FAST_RUN, *LIMIT],
        "static": ["static", model, "--data", data],
        "replay": ["replay", model, "--calib", calib, "--data", data, *FAST_REPLAY],
        "profile": ["profile", model, "--data", data, *baseline, *FAST_PROFILE, *LIMIT],
        "inspect": ["inspect", model],
    }


@pytest.fixture(scope="module")
def documents():
    """(model, kind) -> the JSON document `graphaudit KIND --format json` printed, run once each."""
    cache = {}

    def get(name: str, kind: str) -> dict:
        if name not in MODELS:
            pytest.skip(f"zoo fixture {name} is not built (python -m exporters.build --out fixtures)")
        if (name, kind) not in cache:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                status = invoke([*_commands(name)[kind], "--format", "json"])
            assert status == 0, f"graphaudit {kind} {name} exited {status}"
            cache[name, kind] = json.loads(out.getvalue())
        return cache[name, kind]

    return get


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", MODELS)
def test_every_command_json_is_valid_and_described(documents, name, kind):
    doc = documents(name, kind)
    validate(doc, kind)
    assert undescribed(doc, kind) == []


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "run"])
def test_each_command_json_has_the_run_documents_version_first(documents, kind):
    for name in MODELS:
        doc = documents(name, kind)
        assert next(iter(doc)) == "version" and doc["version"] == SCHEMA_VERSION == documents(name, "run")["version"]


def test_the_run_document_holds_the_parts_the_commands_write(documents):
    for name in MODELS:
        run = documents(name, "run")
        for part in ("static", "replay", "profile"):
            if run[part] is None:
                continue
            alone = set(documents(name, part)) - {"version", "runtime_lacks"}
            assert set(run[part]) == alone, (name, part)


@pytest.mark.parametrize("kind", KINDS)
def test_a_field_the_schema_does_not_name_fails(documents, kind):
    doc = copy.deepcopy(documents("moe" if "moe" in MODELS else MODELS[0], kind))
    target = {"run": lambda d: d["profile"]["blocks"][0], "static": lambda d: d["blocks"][0],
              "replay": lambda d: d["settings"], "profile": lambda d: d, "inspect": lambda d: d["inputs"][0]}[kind](doc)
    target["brand_new"] = 1
    assert any("'brand_new' was unexpected" in p for p in errors(doc, kind))
    assert any("brand_new: not described" in p for p in undescribed(doc, kind))


def test_the_walk_finds_what_a_permissive_schema_leaves_out(documents):
    doc = documents(MODELS[0], "inspect")
    loose = copy.deepcopy(schema())
    loose["$defs"]["inspect_document"]["additionalProperties"] = True
    del loose["$defs"]["inspect_document"]["properties"]["op_counts"]
    del loose["$defs"]["inspect_document"]["properties"]["inputs"]["items"]
    found = undescribed(doc, "inspect", root=loose)
    assert "$.op_counts: not described" in found and "$.inputs[]: array items not described" in found
    assert "$: an object that admits fields the schema does not name" in found
    assert len(field_paths(doc)) > len(found)


def test_the_schemas_fixed_sets_are_the_codes():
    from graphaudit.analyses import decisions, output_kinds
    from graphaudit.profile.mapping import MATCH_KINDS
    from graphaudit.profile.report import NODE_TIME_KINDS
    from graphaudit.profile.session import ORT_LEVEL_NAMES
    from graphaudit.replay.conditions import gap_profiles, names
    from graphaudit.replay.rewrite import KINDS as REWRITES
    from graphaudit.replay.variance import SHARES
    from graphaudit.verdict.decide import CLAIM_FINDINGS
    from graphaudit.verdict.findings import ANSWERS
    from graphaudit.vocabulary import VERDICTS

    d = schema()["$defs"]
    static, replay, profile = d["static_fields"]["properties"], d["replay_fields"]["properties"], d["profile_fields"]["properties"]
    verdicts = set(VERDICTS)
    assert set(static["blocks"]["items"]["properties"]["verdict"]["enum"]) == verdicts
    assert set(profile["blocks"]["items"]["properties"]["static_verdict"]["enum"]) == verdicts
    assert set(static["decisions"]["items"]["properties"]["decided_by"]["enum"]) == set(decisions.DECIDERS)
    assert set(d["output_reading"]["properties"]["kind"]["enum"]) == {*output_kinds.KINDS, None}
    assert replay["conditions"]["propertyNames"]["enum"] == list(names())
    assert replay["retained_gap"]["propertyNames"]["enum"] == list(gap_profiles())
    assert set(replay["variance"]["additionalProperties"]["properties"]) == {*SHARES, "ci"}
    assert replay["settings"]["properties"]["rewrites"]["propertyNames"]["enum"] == list(REWRITES)
    assert profile["mapping"]["properties"]["matched_by"]["propertyNames"]["enum"] == list(MATCH_KINDS)
    assert profile["node_time_kind"]["enum"] == list(NODE_TIME_KINDS)
    assert set(profile["opt_level"]["enum"]) == set(ORT_LEVEL_NAMES.values())
    assert d["finding"]["properties"]["answer"]["enum"] == list(ANSWERS)
    assert d["run_document"]["properties"]["claims"]["items"]["properties"]["claim"]["enum"] == list(CLAIM_FINDINGS)


def test_the_reference_names_every_top_level_field():
    from support.zoo import ROOT

    text = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8").split("## The JSON report", 1)[1]
    d = schema()["$defs"]
    for part in ("run_document", "static_fields", "replay_fields", "profile_fields", "inspect_document",
                 "static_document"):
        for field in d[part]["properties"]:
            named = f"`{field}`" in text or f"`{field}[]`" in text
            assert named, f"docs/reference.md's JSON section does not name {part}'s `{field}`"
