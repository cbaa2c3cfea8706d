"""The packages import one way, down the flow of the data, and no modules import each other in a cycle.

LAYERS lists graphaudit's packages (and its root modules) from the bottom up, as the README's
layout draws them: a module may import from its own layer and from those below it, never from
one above. Every import counts, those inside functions too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "graphaudit"

LAYERS = (
    ("_version", "errors", "limits", "progress", "vocabulary", "wording"),
    ("files",),
    ("load",),
    ("graph",),
    ("analyses",),
    ("runtime",),
    ("metrics",),
    ("replay",),
    ("profile",),
    ("verdict",),
    ("report",),
    ("audit",),
    ("cli", "__init__", "__main__"),
)
APART = ("testing",)  # imports nothing of graphaudit's, and nothing of graphaudit's imports it
ROOT_MODULES_AT_MOST = 8


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1]) if parts[-1] == "__init__" and len(parts) > 1 else ".".join(parts)
        found[name] = path
    return found


MODULES = _modules()


def _resolve(dotted: str) -> str | None:
    """The module of graphaudit's that `dotted` (graphaudit.x.y, maybe a name in it) is or is in."""
    name = dotted.removeprefix("graphaudit").lstrip(".") or "__init__"
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {_resolve(a.name) for a in node.names if a.name.split(".")[0] == "graphaudit"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "graphaudit":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(_resolve(full) if _resolve(full) in MODULES and full.removeprefix("graphaudit.") in MODULES
                          else _resolve(node.module))
    found.discard(None)
    return found


def _layer(module: str) -> int | None:
    top = module.split(".")[0]
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    return None


IMPORTS = {name: _imports(path) - {name} for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if _layer(m) is None and m.split(".")[0] not in APART)
    assert not unplaced, f"modules in no layer of LAYERS: {unplaced}"


def test_no_relative_imports():
    relative = sorted(name for name, path in MODULES.items()
                      if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(ast.parse(path.read_text()))))
    assert not relative, relative


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m) is not None))
def test_a_module_imports_only_its_own_layer_and_those_below(module):
    upward = sorted(dep for dep in IMPORTS[module] if _layer(dep) is not None and _layer(dep) > _layer(module))
    assert not upward, f"{module} (layer {LAYERS[_layer(module)]}) imports from above: {upward}"


def test_the_packages_set_apart_import_nothing_of_graphaudit_and_nothing_imports_them():
    for module, deps in IMPORTS.items():
        top = module.split(".")[0]
        if top in APART:
            assert not {d for d in deps if d.split(".")[0] not in APART}, (module, deps)
        else:
            assert not {d for d in deps if d.split(".")[0] in APART}, (module, deps)


def test_no_import_cycles():
    graph = nx.DiGraph((m, d) for m, deps in IMPORTS.items() for d in deps if not m.endswith("__init__"))
    # a package's __init__ re-exporting its own modules is not a cycle of meaning: leave those edges out
    graph.remove_edges_from([(m, d) for m, d in list(graph.edges) if "." not in m and d.startswith(m + ".")])
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_few_modules_stay_at_the_package_root():
    root = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in {"__init__", "__main__", "_version"})
    assert len(root) <= ROOT_MODULES_AT_MOST, root


def test_the_layer_test_sees_an_upward_import(tmp_path):
    """The check itself can fail: an import of the CLI from the loader is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from graphaudit.cli import main\ndef f():\n    from graphaudit.report.text import render\n")
    assert _imports(bad) == {"cli", "report.text"}
    assert _layer("cli") > _layer("load.model")


def test_the_command_line_loads_no_runtime_before_a_command_needs_one():
    """`graphaudit --help` stays quick, and ONNX Runtime (which writes a `.ses` file into the temporary
    folder when imported) is first imported inside graphaudit's own temporary folder."""
    import subprocess
    import sys

    code = "import sys, graphaudit.cli; print(sorted({'onnx', 'onnxruntime', 'numpy', 'networkx'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=PACKAGE.parent)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_readme_draws_the_layers_in_their_order():
    """The README's Layout section lists every package and root module, bottom layer first."""
    text = (PACKAGE.parent / "README.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    drawn = []
    for line in section.splitlines():
        if line.startswith("- "):
            head = line[2:].split(":", 1)[0]
            drawn += [name.strip("`/").removesuffix(".py") for name in head.split(", ")]
    expected = [name for layer in LAYERS for name in layer if name not in {"_version", "__init__", "__main__"}]
    assert drawn == expected + list(APART)


def test_a_commands_help_loads_neither_onnx_nor_onnx_runtime():
    """Each command module declares its options from light modules and imports the library when it
    runs: `graphaudit CMD --help` stays well under half a second (benchmarks/cli_help.py)."""
    import subprocess
    import sys

    from graphaudit.cli import COMMANDS

    modules = sorted({target.split(":")[0] for target in COMMANDS.values()})
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "print(sorted({'onnx', 'onnxruntime', 'networkx'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=PACKAGE.parent)
    assert done.stdout.strip() == "[]", done.stdout
