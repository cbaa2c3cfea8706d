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


@pytest.mark.slow
def test_the_scale_benchmark_measures_several_input_counts_in_one_run(tmp_path):
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--sizes", "tiny", "--models",
                           "featuregate", "--inputs", "4,2", "--tokens", "16", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    rows = [line for line in lines if line.startswith("| tiny | featuregate |")]
    # the counts in order, fewest first: two rows of figures, one of growth, two of phases
    assert [r.split("|")[4].strip() for r in rows[:2]] == ["2 + 2", "4 + 4"]
    header = next(line for line in lines if "growth" in line)
    assert "2 + 2 → 4 + 4 inputs" in header
    growth = rows[2]
    peaks = re.findall(r"(\d+) → (\d+) \| ([\d.]+)x", growth)
    assert len(peaks) == 2 and all(float(g) > 0 for _, _, g in peaks)  # the audit's peak and the floor's
    assert [r.split("|")[3].strip() for r in rows[3:]] == ["2 + 2", "4 + 4"]


def test_the_scale_benchmark_refuses_input_counts_that_are_not_numbers(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--sizes", "tiny", "--inputs", "32,many",
                           "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1 and done.stderr.strip() == "expected --inputs as counts such as 32,128, found '32,many'"
    assert list(tmp_path.iterdir()) == []  # refused before anything was built
