"""What a command pays before it reads a model: importing onnx, whose import loads ml_dtypes.

    python benchmarks/startup.py [--repeats 9] [--against 0.7.0] [--model fixtures/mudd/model.onnx]

Each is timed as its own process, `--repeats` times, median wall time:

- `python -c "import ml_dtypes"` and `python -c "import onnx"`;
- `python -m graphaudit static MODEL`, a whole command on a small model (the MUDD fixture: its
  audit takes milliseconds, so the rest is the command's start);
- `python -c "import click"`, the floor any click program pays.

`--against VERSION` runs each of them also with that ml_dtypes release first on the module path
(installed, without dependencies, into a temporary folder with this environment's pip: the only
download, from the package index, and only when asked), in turn with the environment's own, so
that the two are measured side by side in one run. The project's environment holds ml_dtypes
below 0.7 (scripts/constraints.txt): 0.7.0's import took 0.7-0.9 s where 0.6.0's took 0.1-0.15 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wall(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT, env=env)
    return time.perf_counter() - start


def version(env: dict[str, str]) -> str:
    found = subprocess.run([sys.executable, "-c", "import ml_dtypes; print(ml_dtypes.__version__)"],
                           check=True, capture_output=True, text=True, cwd=ROOT, env=env)
    return found.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--model", type=Path, default=ROOT / "fixtures" / "mudd" / "model.onnx")
    parser.add_argument("--against", metavar="VERSION", help="also time with this ml_dtypes release, side by side")
    args = parser.parse_args()
    commands = {
        "python -c 'import click' (floor)": [sys.executable, "-c", "import click"],
        "python -c 'import ml_dtypes'": [sys.executable, "-c", "import ml_dtypes"],
        "python -c 'import onnx'": [sys.executable, "-c", "import onnx"],
        f"graphaudit static {args.model.relative_to(ROOT) if args.model.is_relative_to(ROOT) else args.model}":
            [sys.executable, "-m", "graphaudit", "static", str(args.model)],
    }
    with tempfile.TemporaryDirectory(prefix="startup-") as other:
        envs = {"here": dict(os.environ)}
        if args.against:
            installed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                                        other, f"ml_dtypes=={args.against}"], capture_output=True, text=True)
            if installed.returncode != 0:
                raise SystemExit(f"expected pip to install ml_dtypes=={args.against} into a temporary folder, found "
                                 f"exit status {installed.returncode}: {' '.join(installed.stderr.split())[-300:]}")
            envs["against"] = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [other, *filter(None, [os.environ.get("PYTHONPATH")])]))
        versions = {name: version(env) for name, env in envs.items()}
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):  # each round runs every command in every environment, in turn
            for label, command in commands.items():
                for name, env in envs.items():
                    times.setdefault((label, name), []).append(wall(command, env))
    print(f"median wall time of {args.repeats} runs each, in seconds; Python {sys.version.split()[0]}\n")
    heads = [f"ml_dtypes {versions[name]}" for name in envs]
    print("| command | " + " | ".join(heads) + (" | ratio |" if len(envs) == 2 else " |"))
    print("|---|" + "---:|" * (len(envs) + (len(envs) == 2)))
    for label in commands:
        medians = [statistics.median(times[(label, name)]) for name in envs]
        ratio = f" {medians[1] / medians[0]:.2f}× |" if len(medians) == 2 else ""
        print(f"| {label} | " + " | ".join(f"{m:.3f}" for m in medians) + " |" + ratio)


if __name__ == "__main__":
    main()
