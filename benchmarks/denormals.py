"""Denormals flushed to zero: what it does to ONNX Runtime's CPU runs that graphaudit makes.

    python benchmarks/denormals.py [--rounds 21] [--runs 20] [--threads 1]

Side by side in one process, alternating round by round, one warm-up round discarded:
the same session run with denormals kept (ONNX Runtime's default mode) and flushed to zero
(`create_session(..., flush_denormals=True)`, as capture and replay make them):

1. one Softmax over (16, 4, 64, 64) float32 scores, unmasked, and causally masked with
   -inf, with the float minimum and with -100 (the masked exponentials underflow);
2. the zoo's frozen graphs (FeatureGate, MUDD) with their log-softmax output, on a batch of
   16 evaluation inputs fed their own captured coefficients, as the replay runs them.

Reports the median ms per run of each and the ratio kept / flushed, and whether the
outputs are the same to the bit. Prints Markdown for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphaudit import denormals  # noqa: E402
from graphaudit.analyses.declared_coefficients import declared_coefficients  # noqa: E402
from graphaudit.load.data import input_specs, load_data  # noqa: E402
from graphaudit.load.model import load_model  # noqa: E402
from graphaudit.metrics import task_for  # noqa: E402
from graphaudit.replay.capture import capture, native  # noqa: E402
from graphaudit.replay.surgery import Freeze, LogProbs, Trace  # noqa: E402
from graphaudit.runtime.sessions import create_session, slow_fusions  # noqa: E402

FIXTURES = ROOT / "fixtures"


def softmax_case(fill: float | None) -> tuple:
    """A one-node Softmax model and its scores, the upper triangle of each row set to `fill`."""
    node = helper.make_node("Softmax", ["s"], ["p"], axis=-1)
    graph = helper.make_graph([node], "softmax", [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    scores = np.random.default_rng(0).standard_normal((16, 4, 64, 64)).astype(np.float32)
    if fill is not None:
        rows, cols = np.triu_indices(64, 1)
        scores[..., rows, cols] = fill
    return model, ["p"], {"s": scores}


def zoo_case(name: str, batch: int) -> tuple:
    """The frozen graph of a zoo model with its log-softmax output, and one batch of feeds."""
    loaded = load_model(FIXTURES / name / "model.onnx")
    coefs = declared_coefficients(loaded.model)
    data = load_data(FIXTURES / name / "eval.npz", input_specs(loaded.model))
    cache = capture(Trace(coefs)(loaded.model).model, coefs, data, batch_size=batch)
    rows, inputs = next(data.batches(batch))
    task = task_for(cache.live, inputs, {})
    index = np.arange(rows.start, rows.stop)
    feeds = {**inputs, **{c.tensor: native(c, cache.rows(c, index)) for c in coefs}}
    return LogProbs(task.output, task.fetch)(Freeze(coefs)(loaded.model).model).model, [task.fetch], feeds


def timed(session, fetch, feeds, runs: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(runs):
        session.run(fetch, feeds)
    return (time.perf_counter_ns() - start) / runs / 1e6


def compare(label: str, case: tuple, rounds: int, runs: int, threads: int) -> dict:
    model, fetch, feeds = case
    sessions = [create_session(model, threads=threads, disabled_optimizers=slow_fusions(), flush_denormals=flush)
                for flush in (False, True)]
    outputs = [s.run(fetch, feeds)[0] for s in sessions]
    times: list[list[float]] = [[], []]
    for r in range(rounds + 1):
        for i, s in enumerate(sessions):
            ms = timed(s, fetch, feeds, runs)
            if r:  # round 0 is the warm-up
                times[i].append(ms)
    kept, flushed = (statistics.median(t) for t in times)
    return {"case": label, "kept": kept, "flushed": flushed, "ratio": kept / flushed,
            "same": bool(np.array_equal(outputs[0], outputs[1], equal_nan=True)),
            "max_diff": float(np.nanmax(np.abs(outputs[0] - outputs[1]))) if outputs[0].size else 0.0,
            "ranges": [(min(t), max(t)) for t in times]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--runs", type=int, default=20, help="runs per round and session")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, threads {args.threads}, "
          f"FTZ/DAZ settable here: {denormals.supported()}")
    cases = [("softmax (16, 4, 64, 64), unmasked", softmax_case(None)),
             ("softmax, upper triangle -inf", softmax_case(-np.inf)),
             ("softmax, upper triangle float32 minimum", softmax_case(float(np.finfo(np.float32).min))),
             ("softmax, upper triangle -100", softmax_case(-100.0))]
    cases += [(f"{name} frozen graph, batch {args.batch_size}", zoo_case(name, args.batch_size))
              for name in ("featuregate", "mudd") if (FIXTURES / name / "model.onnx").is_file()]
    print("\n| run | kept ms (min–max) | flushed ms (min–max) | kept / flushed | outputs |")
    print("|---|---|---|---|---|")
    for label, case in cases:
        r = compare(label, case, args.rounds, args.runs, args.threads)
        (kl, kh), (fl, fh) = r["ranges"]
        same = "identical" if r["same"] else f"max abs diff {r['max_diff']:.1e}"
        print(f"| {label} | {r['kept']:.3f} ({kl:.3f}–{kh:.3f}) | {r['flushed']:.3f} ({fl:.3f}–{fh:.3f}) | "
              f"{r['ratio']:.2f}× | {same} |")


if __name__ == "__main__":
    main()
