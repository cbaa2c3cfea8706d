"""The docs stay true: every command has help, the README's command lines run as written, and
every relative link points to a file (in the spirit of sqlite-utils' test_docs.py).

README convention: a command is a line of a ```bash block that starts with `graphaudit ` (a
trailing backslash continues it). It must exit 0, or the status its comment states
(`# exits 3: ...`). A ```text block right after a bash block of one command is that command's
output, which the command must print exactly.
"""

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from graphaudit.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINKED = [README, *DOCS, ROOT / "BENCHMARKS.md", ROOT / "benchmarks" / "NOTES.md"]
WRITES = ("-o", "--output", "--trace", "--keep-profiles", "--cache-dir")  # such a line runs in a temp dir


def command_of(name: str) -> click.Command:
    module, attr = COMMANDS[name].split(":")
    return getattr(importlib.import_module(module), attr)


# -- (a) help -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_and_help_exits_0(name, capsys):
    command = command_of(name)
    assert (command.help or "").strip(), f"{name} has no help text"
    for param in command.params:
        if isinstance(param, click.Option):
            assert (param.help or "").strip(), f"{name} {param.opts[0]} has no help text"
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    out, _ = capsys.readouterr()
    assert exit_info.value.code == 0
    assert out.startswith(f"Usage: graphaudit {name} ")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_reference_documents_every_command_and_option(name):
    text = (ROOT / "docs" / "reference.md").read_text()
    assert f"## `graphaudit {name}`" in text
    section = text.split(f"## `graphaudit {name}`", 1)[1].split("\n## ", 1)[0]
    for param in command_of(name).params:
        if isinstance(param, click.Option) and param.name != "help":
            assert any(re.search(rf"[`,] ?{re.escape(opt)}\b", section) for opt in param.opts), \
                f"docs/reference.md, graphaudit {name}: {param.opts[0]} undocumented"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_reference_tables_say_what_each_options_help_says(name):
    """An option's row in a table of docs/reference.md (`| `--opt TYPE` | help |`) is its help
    text as `--help` prints it (click's two spaces before `[default: ...]` read as one): a
    changed default or rule in the help, once left behind in the reference, is caught here."""
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text.split(f"## `graphaudit {name}`", 1)[1].split("\n## ", 1)[0]
    rows = {opts.replace("\\|", "|"): help_text.replace("\\|", "|")
            for opts, help_text in re.findall(r"^\| `(.+?)` \| (.*) \|$", section, flags=re.M)}
    command = command_of(name)
    context = click.Context(command, info_name=name)
    compared = set()
    for param in command.params:
        record = param.get_help_record(context) if isinstance(param, click.Option) else None
        if record is None or record[0] not in rows:
            continue  # documented in prose, not in a table (test_reference_documents_every_command_and_option)
        opts, help_text = record
        assert rows[opts] == re.sub(r"  \[", " [", help_text), f"docs/reference.md, graphaudit {name}: {opts}"
        compared.add(opts)
    assert compared == set(rows), f"docs/reference.md, graphaudit {name}: rows of no option {set(rows) - compared}"


# -- (b) the README's command lines ---------------------------------------------------------

def code_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block of `text`, as (language, body), in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)


def command_lines(body: str) -> list[str]:
    """The `graphaudit ...` lines of a bash block, continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("graphaudit ")]


def readme_commands() -> list[tuple[str, str | None]]:
    """The README's command lines, each with the output block that follows it (or None)."""
    blocks = code_blocks(README.read_text())
    found = []
    for i, (lang, body) in enumerate(blocks):
        if lang != "bash":
            continue
        lines = command_lines(body)
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        output = after[1] if after and after[0] == "text" and len(lines) == 1 else None
        found += [(line, output) for line in lines]
    return found


def expected_status(line: str) -> int:
    comment = line.split("#", 1)[1] if "#" in line else ""
    stated = re.search(r"\bexits? (\d+)", comment)
    return int(stated.group(1)) if stated else 0


def test_readme_has_command_lines_and_one_shown_output():
    found = readme_commands()
    names = {shlex.split(line, comments=True)[1] for line, _ in found}
    assert len(found) >= 4 and {"static", "run"} <= names, found
    assert sum(output is not None for _, output in found) >= 1  # the worked example


@pytest.mark.parametrize("line,output", readme_commands(), ids=[line[:60] for line, _ in readme_commands()])
def test_readme_command_runs_as_written(line, output, tmp_path):
    args = shlex.split(line, comments=True)
    for arg in args:
        if arg.startswith("fixtures/") and not (ROOT / arg).exists():
            pytest.skip(f"{arg} is not built")
    cwd = ROOT
    if any(arg in WRITES or arg.split("=")[0] in WRITES for arg in args):
        (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
        cwd = tmp_path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "graphaudit", *args[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == expected_status(line), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    if output is not None:  # the README shows what this command prints
        assert [s.rstrip() for s in done.stdout.splitlines()] == [s.rstrip() for s in output.splitlines()]


# -- (c) links ------------------------------------------------------------------------------

def relative_links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    targets = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)
    return [t.split("#", 1)[0] for t in targets
            if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files(path):
    assert path.is_file()
    for target in relative_links(path):
        assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links to missing {target}"


def test_readme_and_docs_link_each_other():
    links = {(README.parent / t).resolve() for t in relative_links(README)}
    for doc in (*DOCS, ROOT / "BENCHMARKS.md"):
        assert doc.resolve() in links, f"README.md does not link {doc.relative_to(ROOT)}"
    assert (ROOT / "benchmarks" / "NOTES.md").resolve() in {
        (ROOT / t).resolve() for t in relative_links(ROOT / "BENCHMARKS.md")}


def test_design_has_every_section_the_code_cites():
    titles = set(re.findall(r"^## (.+)$", (ROOT / "docs" / "design.md").read_text(), re.M))
    cited = set()
    for source in [*(ROOT / "graphaudit").rglob("*.py"), *(ROOT / "tests").glob("*.py")]:
        cited |= set(re.findall(r'(?:docs/design\.md|DESIGN\.md),\s+"([^"]+)"', source.read_text()))
    assert cited, "expected the code to cite docs/design.md by section"
    assert cited <= titles, sorted(cited - titles)
