"""benchmarks/profile_rounds.py still runs: the simulated stopping rule's table (how often the
interval at the stop holds the true ratio, rounds run) and the measured one on the zoo's
FeatureGate against Dense (a few rounds; no time is asserted, only what each table holds)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_profile_rounds_benchmark_simulates_and_measures():
    zoo = ROOT / "fixtures"
    pair = f"{zoo / 'featuregate' / 'model.onnx'},{zoo / 'dense' / 'model.onnx'},{zoo / 'featuregate' / 'eval.npz'}"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_rounds.py"), "--simulate", "10",
                           "--pair", pair, "--rounds", "6", "--sample", "2"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    simulated = [line for line in out.splitlines() if line.startswith("| ") and "holds" in line]
    assert [row.split(" | ")[0] for row in simulated] == ["| quiet", "| noisy calls (3%)",
                                                         "| load drifting (10% a round)",
                                                         "| calls preempted (8%, up to 2x)"]
    for row in simulated:
        cells = re.findall(r"holds (\d+)%, ([\d.]+) rounds", row)
        assert len(cells) == 4 and all(0 <= int(held) <= 100 for held, _ in cells)
        rounds = [float(r) for _, r in cells]  # at least 3, at least 5, for each statistic
        assert min(rounds[0], rounds[2]) >= 3 and min(rounds[1], rounds[3]) >= 5
    assert "### featuregate/model.onnx against dense/model.onnx: 6 rounds of 2 inputs" in out
    widths = re.findall(r"^\| (\d+) \| ±([\d.]+)% \| ±([\d.]+)% \|$", out, flags=re.M)
    assert [int(k) for k, _, _ in widths] == [5, 6]
    stops = re.findall(r"^\| (\d+) \| (\d+|not within the rounds) \| (\d+|not within the rounds) \|$", out, flags=re.M)
    assert stops and stops[0][0] == "0"


def test_the_profile_rounds_benchmark_refuses_too_few_rounds():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_rounds.py"), "--simulate", "0",
                           "--rounds", "3"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "expected --rounds of at least 5" in done.stderr


def test_the_profile_rounds_benchmark_counts_the_answers_timed_on_and_stopped_once_decided():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_rounds.py"), "--simulate", "0",
                           "--answers", "4"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^\| ([^|]+) \| ([\d.]+) \| (\d+) / (\d+) / (\d+), \*\*(\d+) wrong\*\*, ([\d.]+) rounds "
                      r"\| (\d+) / (\d+) / (\d+), \*\*(\d+) wrong\*\*, ([\d.]+) rounds \|$", done.stdout, flags=re.M)
    assert [(setting, ratio) for setting, ratio, *_ in rows] == [
        (setting, ratio) for setting in ("calls preempted (8%, up to 2x)", "noisy calls (10%)")
        for ratio in ("0.900", "0.945", "0.951", "0.955", "1.090")]
    for _, ratio, *counts in rows:
        on, decided = [int(c) for c in counts[:4]], [int(c) for c in counts[5:9]]
        for yes, no, undecided, wrong in (on, decided):
            assert yes + no + undecided == 4  # each profile answers once
            assert wrong == (yes if float(ratio) > 0.95 else no)
        assert 5 <= float(counts[9]) <= float(counts[4]) <= 40  # stopping on the answer runs no more rounds


def test_the_profile_rounds_benchmark_simulates_inputs_that_do_the_same_work_on_samples_of_4_2_and_1():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_rounds.py"), "--simulate", "0",
                           "--alike", "20"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| setting | on 4 inputs: holds, half-width | on 2 inputs: holds, half-width | on 1 input: holds, " \
           "half-width |" in done.stdout
    rows = re.findall(r"^\| ([^|]+) \| (\d+) / 20, ±([\d.]+)% \| (\d+) / 20, ±([\d.]+)% \| (\d+) / 20, ±([\d.]+)% \|$",
                      done.stdout, flags=re.M)
    assert [row[0] for row in rows] == ["quiet runs, a busy machine (1%, 20% a round)", "noisy calls (3%)",
                                        "load drifting (10% a round)", "calls preempted (8%, up to 2x)"]
    for _, *cells in rows:
        held, widths = [int(c) for c in cells[::2]], [float(c) for c in cells[1::2]]
        assert all(0 <= h <= 20 for h in held)
        assert widths[0] < widths[1] < widths[2]  # fewer inputs, a wider interval
