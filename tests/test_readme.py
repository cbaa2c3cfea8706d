"""The README's two set-up commands are the ones CI and the scripts run."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Set up and run.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_has_exactly_two_setup_commands():
    commands = readme_commands()
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for command in commands:
        assert (ROOT / command.split()[1]).is_file()


def test_ci_runs_the_readme_test_command_exactly():
    test_command = readme_commands()[1]
    lines = [s.strip() for s in (ROOT / ".ci" / "run").read_text().splitlines()
             if s.strip() and not s.strip().startswith("#")]
    assert lines[-1] == test_command


def test_scripts_share_one_environment_setup_and_pin_torch():
    for script in ("demo.sh", "test.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert 'source "$(dirname "${BASH_SOURCE[0]}")/env.sh"' in text
    assert "torch==2.13.0" in (ROOT / "scripts" / "constraints.txt").read_text().split()
    env = (ROOT / "scripts" / "env.sh").read_text()
    assert "-c \"$root/scripts/constraints.txt\"" in env and "[cpu,exporters,dev,ray]" in env  # the CPU runtime: CI and the demo
    assert "exec graphaudit demo" in (ROOT / "scripts" / "demo.sh").read_text()
    assert "pytest" in (ROOT / "scripts" / "test.sh").read_text()


def test_the_test_command_lints_first_with_the_pinned_tools():
    test = [s.strip() for s in (ROOT / "scripts" / "test.sh").read_text().splitlines()]
    assert test.index("bash scripts/lint.sh") < next(i for i, s in enumerate(test) if "pytest" in s)
    lint = (ROOT / "scripts" / "lint.sh").read_text()
    assert "set -euo pipefail" in lint and "python -m ruff check" in lint and "python -m mypy" in lint
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"ruff==' in pyproject and '"mypy==' in pyproject and "[tool.ruff.lint]" in pyproject
    assert "[tool.mypy]" in pyproject


def test_readme_command_table_lists_every_command():
    from graphaudit.cli import COMMANDS

    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Commands"):].split("\n\n")[1]
    listed = re.findall(r"^\| `graphaudit (\w+)", table, re.M)
    assert sorted(listed) == sorted(COMMANDS)


def test_readme_stays_short_and_points_to_the_docs():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160  # issue 22: about 150 lines; reference material lives in docs/
    for doc in ("docs/reference.md", "docs/models.md", "docs/design.md", "BENCHMARKS.md"):
        assert f"]({doc})" in text and (ROOT / doc).is_file()
