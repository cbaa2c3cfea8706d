"""benchmarks/startup.py still runs: a row per command, each with a positive time, under the
ml_dtypes version this environment imports (no figure is asserted; `--against` downloads, so it
is not run here)."""

import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes

ROOT = Path(__file__).resolve().parents[1]


def test_the_startup_benchmark_times_each_command_once():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--repeats", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert f"| command | ml_dtypes {ml_dtypes.__version__} |" in lines
    rows = [line for line in lines if re.match(r"\| (python|graphaudit) ", line)]
    assert [row.split(" | ")[0] for row in rows] == [
        "| python -c 'import click' (floor)", "| python -c 'import ml_dtypes'", "| python -c 'import onnx'",
        "| graphaudit static fixtures/mudd/model.onnx"]
    assert all(float(row.split(" | ")[1].rstrip(" |")) > 0 for row in rows)
