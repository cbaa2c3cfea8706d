"""How long `graphaudit --help` and each command's `--help` take, as a user waits for them.

    python benchmarks/cli_help.py [--repeats 5]

Each is run as its own process (`python -m graphaudit CMD --help`), `--repeats` times, and the
median wall time is printed beside a bare `python -c "import click"`, measured the same way in
the same run: the floor any click program pays. Target (issue 23): under 0.5 s each.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphaudit.cli import COMMANDS  # noqa: E402


def wall(command: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    floor = wall([sys.executable, "-c", "import click"], args.repeats)
    print(f"median of {args.repeats} runs each; floor (python -c 'import click'): {floor:.3f} s\n")
    print("| command | --help, s | over the floor |")
    print("|---|---|---|")
    for name in ["", *sorted(COMMANDS)]:
        took = wall([sys.executable, "-m", "graphaudit", *([name] if name else []), "--help"], args.repeats)
        print(f"| graphaudit {name} | {took:.3f} | {took / floor:.1f}× |")


if __name__ == "__main__":
    main()
