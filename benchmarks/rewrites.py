"""The replay's rewrites (graphaudit.replay.rewrite): the frozen graph's runs with and without each.

    python benchmarks/rewrites.py [--models featuregate,mudd] [--batch-size 16] [--rounds 21] [--threads 1]

For each zoo model with coefficients: its frozen graph as exported, with each kind of rewrite
alone (the attention with the masked fill's, whose Add it matches), and with all of them (what `replay()` runs on the CPU), each an ONNX Runtime session
as the replay opens it (denormals flushed, the same fusions left out), fed the evaluation
data's batches with the `correct` coefficients the capture cached. Rounds of one run per
batch, the variants interleaved in each round, one warm-up round discarded; the median ms
per run (min–max over rounds) and the speed-up over the graph as exported. Each variant's
outputs are compared with the exported graph's, to the bit. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphaudit.analyses.declared_coefficients import declared_coefficients  # noqa: E402
from graphaudit.load.data import input_specs, load_data  # noqa: E402
from graphaudit.load.model import load_model  # noqa: E402
from graphaudit.replay.capture import capture, native  # noqa: E402
from graphaudit.replay.rewrite import KINDS, Rewrite  # noqa: E402
from graphaudit.replay.surgery import Freeze, Trace  # noqa: E402
from graphaudit.runtime.sessions import create_session, slow_fusions  # noqa: E402

FIXTURES = ROOT / "fixtures"


def variants(name: str, batch_size: int, threads: int):
    """(label, session, counts) for each variant, and the feeds of every evaluation batch."""
    loaded = load_model(FIXTURES / name / "model.onnx")
    coefs = declared_coefficients(loaded.model)
    data = load_data(FIXTURES / name / "eval.npz", input_specs(loaded.model))
    cache = capture(Trace(coefs)(loaded.model).model, coefs, data, batch_size=batch_size)
    feeds = [{**inputs, **{c.tensor: native(c, cache.rows(c, rows)) for c in coefs}}
             for rows, inputs in data.batches(batch_size)]
    frozen = Freeze(coefs)(loaded.model).model
    settings = {"disabled_optimizers": slow_fusions(), "flush_denormals": True, "threads": threads}
    out = [("as exported", create_session(frozen, **settings), {})]
    # an attention is matched on its mask's Add, which the masked fill's rewrite makes of a Where
    alone = [((k,), k) for k in KINDS] + [(("masked_fill", "attention"), "masked_fill + attention")]
    for kinds, label in alone + [(KINDS, "all (the replay's)")]:
        result = Rewrite(kinds)(frozen)
        model, made = result.model, result.details
        if made:
            out.append((label, create_session(model, **settings), made))
    return out, feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="featuregate,mudd")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, "
          f"threads {args.threads}, batch {args.batch_size}, rounds {args.rounds}\n")
    print("| model | frozen graph | rewrites made | ms per run (min–max) | speed-up | outputs |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        if not (FIXTURES / name / "model.onnx").is_file():
            continue
        sessions, feeds = variants(name, args.batch_size, args.threads)
        expected = [sessions[0][1].run(None, f) for f in feeds]
        same = {label: all(a.tobytes() == b.tobytes() for e, f in zip(expected, feeds)
                           for a, b in zip(e, session.run(None, f)))
                for label, session, _ in sessions}
        times: dict[str, list[float]] = {label: [] for label, _, _ in sessions}
        for round_ in range(args.rounds + 1):
            for label, session, _ in sessions:
                start = time.perf_counter_ns()
                for f in feeds:
                    session.run(None, f)
                if round_:  # the first round warms up
                    times[label].append((time.perf_counter_ns() - start) / len(feeds) / 1e6)
        base = statistics.median(times["as exported"])
        for label, _, made in sessions:
            t = times[label]
            counts = ", ".join(f"{k} {v}" for k, v in made.items()) or "—"
            print(f"| {name} | {label} | {counts} | {statistics.median(t):.2f} ({min(t):.2f}–{max(t):.2f}) | "
                  f"{base / statistics.median(t):.2f}× | {'identical' if same[label] else 'differ'} |")


if __name__ == "__main__":
    main()
