"""What the benchmarks that compare processes share: one command's wall time and peak memory."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path


def run_measured(command: list[str], pythonpath: Path, tail: int = 1500) -> tuple[float, float, str]:
    """(wall seconds, peak resident MiB, stdout) of `command`, run from `pythonpath` with it on
    PYTHONPATH (`python -m` puts the working folder first on the path, so the graphaudit found
    there is the one measured), its peak read from the kernel by `os.wait4`. A failure exits
    with the command and the last `tail` characters of its stderr."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=pythonpath)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if code:
            raise SystemExit(f"{' '.join(command)} failed ({code}): {err.read().strip()[-tail:]}")
        return wall, usage.ru_maxrss / 1024, out.read()
