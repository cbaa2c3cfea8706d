"""The replay's peak memory in a fresh process, on N and 4N inputs, the coefficient cache in
memory and memory-mapped: part 3 of `benchmarks/replay_fca.py` (`--skip` leaves it out; `--inputs`
sets N). Each run is `replay()` of a zoo model on windows of its data (rows drawn and rolled,
seeded), peak RSS read from the kernel (VmHWM) and the peak traced Python/NumPy heap from
tracemalloc.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"

MEMORY_CHILD = r"""
import json, resource, sys, tracemalloc
import numpy as np
sys.path.insert(0, sys.argv[1])
from graphaudit.load.data import from_arrays, input_specs
from graphaudit.load.model import load_model
from graphaudit.replay.pipeline import replay
model, count, limit = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
loaded = load_model(model)
specs = input_specs(loaded.model)
rng = np.random.default_rng(0)
base = np.concatenate([np.load(p)["input_ids"] for p in sys.argv[5:]])
def windows(n, seed):
    rows = np.random.default_rng(seed).integers(0, len(base), n)
    shifts = np.random.default_rng(seed + 1).integers(0, base.shape[1], n)
    return np.stack([np.roll(base[r], s) for r, s in zip(rows, shifts)])
calib = from_arrays({"input_ids": windows(64, 1)}, specs, "calib")
data = from_arrays({"input_ids": windows(count, 2)}, specs, "eval")
tracemalloc.start()
report = replay(loaded, calib, data, batch_size=16, memory_limit=limit, resamples=1000)
_, heap = tracemalloc.get_traced_memory()
# VmHWM: this process's own peak; ru_maxrss would also count the parent's RSS at fork
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
rss = int(status["VmHWM"].split()[0]) if "VmHWM" in status else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"rss_mib": rss / 1024, "heap_mib": heap / 2**20,
                  "cache_mib": report.settings["cache"]["bytes"] / 2**20, "nll": report.condition("correct").nll.value}))
"""


def memory(name: str, inputs: int) -> list[dict]:
    model = FIXTURES / name / "model.onnx"
    sources = [str(FIXTURES / name / f"{k}.npz") for k in ("calib", "eval")]
    rows = []
    for label, limit in (("in memory (default limit)", 256 * 2**20), ("memory-mapped (limit 0)", 0)):
        for count in (inputs, 4 * inputs):
            out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(ROOT), str(model), str(count), str(limit),
                                  *sources], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"memory benchmark of {name} at {count} inputs failed:\n{out.stderr[-2000:]}")
            rows.append({"model": name, "cache": label, "inputs": count, **json.loads(out.stdout.splitlines()[-1])})
    return rows
