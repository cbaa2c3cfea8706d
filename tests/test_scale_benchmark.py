"""benchmarks/scale.py still runs end to end: exports, the audit, the floor, its tables (at a tiny
size; no figure is asserted, only that each is there and positive)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_scale_benchmark_runs_at_a_tiny_size(tmp_path):
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--sizes", "tiny", "--models",
                           "featuregate", "--calib", "4", "--eval", "4", "--tokens", "16", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| tiny | featuregate |"))
    ratios = [float(x) for x in re.findall(r"\| ([\d.]+)x \|", row)]
    assert len(ratios) == 2 and all(r > 0 for r in ratios)  # time and memory over the floor
    phases = next(line for line in done.stdout.splitlines()[done.stdout.splitlines().index(row) + 1:]
                  if line.startswith("| tiny | featuregate |"))
    assert "timed" in phases and "sample:" in phases
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]  # kept where asked, reused next time
