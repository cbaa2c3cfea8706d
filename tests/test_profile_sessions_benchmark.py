"""benchmarks/profile_sessions.py still runs: the profile's two sessions opened both ways on the
zoo, the same optimised graphs saved each way, a row per way (no figure is asserted, only that
each is there and positive)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_session_opening_benchmark_runs_on_the_zoo():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_sessions.py"),
                           str(ROOT / "fixtures" / "mudd" / "model.onnx"), str(ROOT / "fixtures" / "dense" / "model.onnx"),
                           "--repeats", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the same optimised graphs both ways" in done.stdout
    rows = {m.group(1): [float(x) for x in m.groups()[1:]] for m in re.finditer(
        r"^\| ([a-z ]+) \| ([\d.]+) \([\d.]+–[\d.]+\) \| ([\d.]+)× \| (\d+) \|$", done.stdout, re.MULTILINE)}
    assert set(rows) == {"one after the other", "side by side"}
    assert all(f > 0 for figures in rows.values() for f in figures[1:])
