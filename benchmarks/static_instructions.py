"""Instructions a static audit executes, counted under callgrind: a change of a few percent,
which the timings of a shared machine cannot show, compared between source trees.

    python benchmarks/static_instructions.py [--layers 24] [--audits 20] [--tree PATH ...] [--floor]

Each tree (a checkout of this repository, e.g. `git worktree add /tmp/before HEAD~1`; default:
this one) runs `load_model(path, weights=False)` + `audit_static`, what `static --graph-only`
does, `--audits` times in one process under `valgrind --tool=callgrind`, and once more with no
audit: the difference over `--audits` is one audit's instructions, the process's start and
imports left out. `--floor` counts the floor of `static_bench.py` (`onnx.load` + the checker +
shape inference) the same way. The graph is static_bench.py's Pythia-shaped one at `--layers`
(24: the Pythia-1.4B shape, 437 nodes; 1000: about 18,000 nodes); valgrind runs some fifty
times slower than the machine, so each tree takes minutes at 1000 layers.

Counts repeat within about 0.2% from run to run (PYTHONHASHSEED is fixed; addresses are not), where
times on a shared machine move by 10-20%; the model's path and the environment's packages move
them by 1-2%, so compare trees counted in one run, on one file. They are not time:
the floor's C++ executes about 2.6-2.8 instructions per instruction of the audit's Python in
the time it takes, so the audit's ratio to the floor in instructions (2.6-2.8×) is no reading of
its ratio in time (about 2×).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

AUDIT = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import graphaudit
if Path(sys.argv[1]).resolve() not in Path(graphaudit.__file__).resolve().parents:
    raise SystemExit(f"expected graphaudit imported from {sys.argv[1]}, found {graphaudit.__file__}")
from graphaudit.analyses.static import audit_static
from graphaudit.load.model import load_model
for _ in range(int(sys.argv[3])):
    audit_static(load_model(Path(sys.argv[2]), weights=False))
"""
FLOOR = """
import sys
from pathlib import Path
sys.path.insert(0, str(Path(sys.argv[1]) / "benchmarks"))
from static_bench import floor  # the floor static_bench.py times, defined there alone
for _ in range(int(sys.argv[3])):
    floor(Path(sys.argv[2]))
"""


def collected(script: Path, tree: Path, model: Path, runs: int) -> int:
    """Instructions of one process running `script` `runs` times, as callgrind counts them."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                           str(script), str(tree), str(model), str(runs)],
                          capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"expected callgrind's count in its output, found:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_run(script: Path, tree: Path, model: Path, runs: int) -> int:
    return (collected(script, tree, model, runs) - collected(script, tree, model, 0)) // runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24, help="layers of static_bench.py's graph")
    parser.add_argument("--audits", type=int, default=20, help="audits counted in one process")
    parser.add_argument("--tree", type=Path, action="append", help="a checkout to count (repeatable; default: this one)")
    parser.add_argument("--floor", action="store_true", help="also count the floor (onnx.load + checker + inference)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("expected valgrind on PATH (Debian: apt-get install valgrind), found none")
    from static_bench import save_with_weights  # the benchmark's graph and its sparse weights file

    from graphaudit.testing.synthetic import transformer_graph
    trees = [t.resolve() for t in args.tree or [ROOT]]
    for tree in trees:  # else the installed graphaudit would be counted under the tree's name
        if not (tree / "graphaudit" / "__init__.py").is_file():
            raise SystemExit(f"expected a checkout of this repository at {tree}, found no graphaudit/__init__.py")
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        model = Path(tmp) / f"pythia_{args.layers}.onnx"
        save_with_weights(transformer_graph(layers=args.layers), model)
        audit, floor = Path(tmp) / "audit.py", Path(tmp) / "floor.py"
        audit.write_text(AUDIT)
        floor.write_text(FLOOR)
        rows = [(str(tree), per_run(audit, tree, model, args.audits)) for tree in trees]
        if args.floor:
            rows.append(("floor", per_run(floor, ROOT, model, args.audits)))
    first = rows[0][1]
    print(f"{args.layers} layers; instructions per audit, {args.audits} audits against none, under callgrind\n")
    print("| tree | instructions | over the first |")
    print("|---|---:|---:|")
    for name, count in rows:
        print(f"| {name} | {count:,} | {count / first:.4f} |")


if __name__ == "__main__":
    main()
