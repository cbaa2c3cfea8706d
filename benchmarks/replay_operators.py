"""Where the frozen-controller replay's time goes by operator, against PyTorch eager, and how far
apart the two can be at most while ONNX Runtime runs the model's matrix products.

    python benchmarks/replay_operators.py [--models featuregate,mudd] [--shapes 70m,160m]
                                          [--batch-size 10] [--repeats 3] [--threads 1]

For each zoo model at each of the scale benchmark's shapes (untrained copies, fed the fixture's
data, as `benchmarks/replay_fca.py --shapes` builds them; `zoo`: the trained fixture), in one run:

1. the ONNX Runtime replay loop against PyTorch eager with hooks, side by side, as
   `replay_fca.py`'s torch comparison does (the loop without its overlap, one thread each);
2. the same ONNX Runtime loop once more, its sessions (the prefix run once per batch, and the
   rest, as `replay()` cuts the graph: graphaudit.replay.prefix) opened as `replay()` opens
   them but with ONNX Runtime's profiler on, and every node's kernel time summed by operator;
3. the bound: PyTorch's loop over the kernel time of the ONNX Runtime loop's matrix products
   (MATRIX_PRODUCTS). Were every other operator and all the scoring free, the ONNX Runtime
   loop would still take that long, so no replay that runs these products can be faster
   than PyTorch's by more than this ratio.

Prints Markdown tables for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_fca import FIXTURES, ROOT, Setup, Wider, spread, versus_torch
from scale import SIZES

sys.path.insert(0, str(ROOT))
from graphaudit.profile.events import parse_profile
from graphaudit.replay.prefix import PrefixSession, open_frozen
from graphaudit.runtime.sessions import PROVIDERS

# ONNX Runtime operators that multiply matrices of the model's weights or activations
MATRIX_PRODUCTS = frozenset({"MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "QLinearMatMul", "MatMulNBits",
                             "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})


def profiled_session(setup: Setup, folder: Path):
    """The replay's session of `setup`'s frozen graph, as `replay()` opens it (`open_frozen`),
    with ONNX Runtime's profiler on in each part's session; and those sessions, to end their
    profiles."""
    session = open_frozen(setup.replayed, setup.coefs, [PROVIDERS["cpu"]], None, setup.threads,
                          setup.flush_denormals, profile_prefix=folder / "replay")
    return session, [session.prefix, session.suffix] if isinstance(session, PrefixSession) else [session]


def by_operator(setup: Setup) -> tuple[dict[str, float], int]:
    """Kernel milliseconds by operator type over one profiled replay loop, and its runs."""
    with tempfile.TemporaryDirectory(prefix="graphaudit-operators-") as folder:
        session, parts = profiled_session(setup, Path(folder))
        setup.replay_loop(overlap=False, session=session)
        times: dict[str, float] = defaultdict(float)
        runs = 0
        for part in parts:
            profile = parse_profile(part.end_profiling())
            runs = max(runs, len(profile.runs))
            for run in profile.runs:
                for event in run.events:
                    times[event.op_type or "(no operator)"] += event.dur / 1e3
    return times, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="featuregate,mudd")
    parser.add_argument("--shapes", default="70m,160m",
                        help="comma-separated shapes of benchmarks/scale.py, or zoo: the trained fixture itself")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="loops of each side, timed in turn (default 3)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=6, help="operators listed by name per model (default 6)")
    args = parser.parse_args()
    tokens = max(np.load(FIXTURES / name / "eval.npz")["input_ids"].shape[1] for name in args.models.split(","))
    fit = ["zoo", *(name for name, shape in SIZES.items() if shape["context"] >= tokens)]  # the fixture's data fed
    unknown = [name for name in args.shapes.split(",") if name not in fit]
    if unknown:
        parser.error(f"expected shapes among {', '.join(fit)} (a context of at least the data's {tokens} tokens), "
                     f"found {', '.join(unknown)}")
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, threads {args.threads}, "
          f"batch {args.batch_size}, repeats {args.repeats}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            for name in args.models.split(","):
                wider = Wider(name, 0, 0, Path(tmp), shape) if shape != "zoo" else None
                setup = Setup(name, args.batch_size, args.threads, wider=wider)
                compared = versus_torch(setup, args.repeats, args.threads)
                times, runs = by_operator(setup)
                rows.append((shape, name, compared, times, runs))
                print(f"# {name} at {shape} done", flush=True)
    print("\n| shape | model | ORT loop ms | PyTorch loop ms | speed-up | runs | ORT kernel ms by operator "
          "(share of kernel time) | matrix products ms | at most (PyTorch / products) |")
    print("|---|---|---|---|---:|---:|---|---:|---:|")
    for shape, name, compared, times, runs in rows:
        total = sum(times.values())
        listed = ", ".join(f"{op} {ms:.0f} ({ms / total:.1%})" for op, ms in sorted(times.items(), key=lambda item: -item[1])[: args.top])
        products = sum(ms for op, ms in times.items() if op in MATRIX_PRODUCTS)
        torch_ms = statistics.median(compared["torch_ms"])
        print(f"| {shape} | {name} | {spread(compared['ort_ms'])} | {spread(compared['torch_ms'])} | "
              f"{compared['speedup']:.2f}× | {runs} | {listed}; all {total:.0f} | {products:.0f} | "
              f"{torch_ms / products:.2f}× |")


if __name__ == "__main__":
    main()
