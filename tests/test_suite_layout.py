"""The test suite's own layout: test modules share helpers through tests/support/ and
tests/conftest.py, never by importing one another (a test module imported by another has
its tests' module-level state, and its fixtures, pulled in twice)."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_test_modules(path: Path) -> list[str]:
    """The `test_*` modules that the Python file at `path` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return [name for name in found if name.startswith(("test_", "tests.test_"))]


def test_no_test_module_imports_another():
    offenders = {str(p.relative_to(TESTS)): names for p in sorted(TESTS.rglob("*.py"))
                 if (names := imported_test_modules(p))}
    assert offenders == {}, "import helpers from tests/support/ instead: " + repr(offenders)


def test_the_check_sees_imports_of_test_modules(tmp_path):
    module = tmp_path / "test_example.py"
    module.write_text("import os\nfrom test_other import helper\n\n\ndef f():\n    import test_third\n"
                      "    from support.models import gated_lm\n")
    assert imported_test_modules(module) == ["test_other", "test_third"]
