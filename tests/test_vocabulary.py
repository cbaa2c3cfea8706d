"""The domain words are defined once: the JSON schema and every module read the same ones."""

import ast
from pathlib import Path

from graphaudit.report.jsondoc import schema
from graphaudit.verdict.decide import CLAIM_FINDINGS, FINDINGS
from graphaudit.vocabulary import BRANCH, MERGED, SAVES_COMPUTE, VERDICTS

from support.source import string_literals

PACKAGE = Path(__file__).resolve().parents[1] / "graphaudit"


def test_the_schema_lists_the_verdicts_the_vocabulary_defines():
    verdict = schema()["$defs"]["static_fields"]["properties"]["blocks"]["items"]["properties"]["verdict"]
    assert sorted(verdict["enum"]) == sorted(VERDICTS)
    assert set(VERDICTS) > SAVES_COMPUTE and VERDICTS[-1] == BRANCH  # strongest last


def test_the_schema_lists_the_claims_run_checks():
    claim = schema()["$defs"]["run_document"]["properties"]["claims"]["items"]["properties"]["claim"]
    assert claim["enum"] == list(CLAIM_FINDINGS)
    assert set(CLAIM_FINDINGS.values()) <= set(FINDINGS)




def _assigned(path: Path) -> set[str]:
    """The module-level names `path` assigns."""
    tree = ast.parse(path.read_text())
    return {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) for t in ast.walk(t)
            if isinstance(t, ast.Name)}


def _outside_vocabulary():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "vocabulary.py":
            yield path.relative_to(PACKAGE).as_posix(), path


def test_no_module_spells_a_verdict_or_the_merged_axis_itself():
    """A verdict ("subset") or the merged axis ("batch*token") as a string literal outside
    vocabulary.py is a second definition that can drift. ("batch" and "token" are English words
    too, in column headers and sentences: the next test keeps their constants single.) An
    Evidence.kind "branch" (an If's branches) is a word apart, where evidence is found."""
    words = set(VERDICTS) | {MERGED}
    allowed = {"analyses/controls.py": {BRANCH}, "analyses/block_verdicts.py": {BRANCH}}
    found = {name: sorted(spelled) for name, path in _outside_vocabulary()
             if (spelled := (string_literals(path) & words) - allowed.get(name, set()))}
    assert not found, f"spelled outside graphaudit/vocabulary.py: {found}"


def test_no_module_defines_a_vocabulary_constant_again():
    ours = {"ALWAYS", "GATED", "MASKED", "SUBSET", "BRANCH", "VERDICTS", "SAVES_COMPUTE", "SKIPPABLE",
            "BATCH", "TOKEN", "MERGED", "PER_INPUT", "CLAIMS"}
    found = {name: sorted(again) for name, path in _outside_vocabulary() if (again := _assigned(path) & ours)}
    assert not found, f"defined again outside graphaudit/vocabulary.py: {found}"
