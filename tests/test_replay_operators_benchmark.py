"""benchmarks/replay_operators.py still runs: the replay against PyTorch, its profile by operator
and the bound, on the trained zoo model (no figure is asserted but the count of runs, which the
data fix: 32 inputs in batches of 10 under six conditions)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_replay_operators_benchmark_runs_on_the_zoo():
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "replay_operators.py"), "--shapes", "zoo",
                           "--models", "featuregate", "--repeats", "1"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| zoo | featuregate |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[4].rstrip("×")) > 0  # the speed-up
    assert cells[5] == "24"  # the rest of the graph ran once per batch and condition: 4 batches × 6
    listed = dict(re.findall(r"(\w+) ([\d.]+) \(", cells[6]))
    products, total = float(cells[7]), float(cells[6].rsplit("all ", 1)[1])
    assert "Gemm" in listed or "MatMul" in listed
    assert 0 < products < total  # the products are part of the kernel time, not all of it
    assert float(cells[8].rstrip("×")) > 0
