"""benchmarks/products.py still runs: each library's product checked against float64's, a row
per product and a pass's total (at a tiny shape; no figure is asserted, only that each is there
and positive)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_products_benchmark_runs_at_a_tiny_shape():
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "products.py"), "--shapes", "tiny", "--rows",
                           "8", "--repeats", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if re.match(r"\| [^|]+ \| \d+ × \d+ × \d+ \|", line)]
    assert [row.split(" | ")[0] for row in rows] == ["| attention projections", "| MLP up", "| MLP down",
                                                    "| vocabulary projection"]
    assert [row.split(" | ")[1] for row in rows] == ["8 × 32 × 32", "8 × 32 × 64", "8 × 64 × 32", "8 × 32 × 256"]
    total = next(line for line in done.stdout.splitlines() if line.startswith("| **a pass's products**"))
    figures = [float(x) for x in re.findall(r"\| ([\d.]+)×? ", total + " ")]
    assert len(figures) == 4 and all(f > 0 for f in figures)  # three libraries' totals and their ratio
