"""benchmarks/gpu_check.sh: refuses in one line where CUDA cannot run, and its steps work (on the CPU here)."""

from __future__ import annotations

import os
import subprocess
import sys

import onnxruntime as ort
import pytest

from support.zoo import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _check(tmp_path, **env):
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "GRAPHAUDIT_PYTHON": sys.executable, "TMPDIR": str(tmp_path), **env})


def test_without_the_gpu_build_it_stops_in_one_line(tmp_path):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine's ONNX Runtime has CUDA")
    done = _check(tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("gpu_check: expected ONNX Runtime's GPU build (onnxruntime-gpu), found providers")
    assert done.stdout == ""


@pytest.mark.slow
def test_its_steps_run_the_audit_and_the_profile_benchmark_and_print_one_table(tmp_path):
    out = tmp_path / "reports"
    done = _check(tmp_path, GPU_CHECK_PROVIDER="cpu", GPU_CHECK_MODELS="featuregate", GPU_CHECK_RUNS="3",
                  GPU_CHECK_OUT=str(out))
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("| featuregate | 0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "CPUExecutionProvider" and cells[4:7] == ["yes", "yes", "no"]
    assert "ratio to Dense (p10–p90)" in done.stdout  # the profile benchmark's table follows
    assert (out / "run-featuregate.json").is_file() and (out / "profile_zoo.json").is_file()
