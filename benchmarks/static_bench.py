"""How long the static audit takes, against the floor of reading and shape-inferring the file.

For Pythia-shaped graphs of growing depth (hidden 2048, 16 heads, vocabulary 50,432, weights
as external references to a file that is never written) and a synthetic graph of about
100,000 nodes, each measured side by side in one run:

- floor: `onnx.load(path, load_external_data=False)` + `onnx.shape_inference.infer_shapes`;
- audit: `load_model(path, weights=False)` + `audit_static(loaded)`, what
  `graphaudit static --graph-only MODEL` does (the loader also runs the ONNX checker and
  shape inference with data propagation);
- analyses: `audit_static(loaded)` alone, on an already loaded model.

Each is timed with `time.perf_counter_ns` after one discarded warm-up run; the three are
interleaved in every repetition so that load on the machine hits them alike; medians and
the spread (min–max) are reported, with the ratio of medians to the floor.

    python benchmarks/static_bench.py [--repeats 5] [--big-layers 5555]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import onnx
from onnx import shape_inference

from graphaudit.analyses.static import audit_static
from graphaudit.load import load_model
from graphaudit.testing.synthetic import transformer_graph

DEPTHS = (1, 2, 4, 8, 16, 24)


def floor(path: Path) -> None:
    shape_inference.infer_shapes(onnx.load(str(path), load_external_data=False))


def audit(path: Path) -> None:
    audit_static(load_model(path, weights=False))


def timed(fn, *args) -> float:
    start = time.perf_counter_ns()
    fn(*args)
    return (time.perf_counter_ns() - start) / 1e6


def measure(path: Path, repeats: int) -> dict:
    loaded = load_model(path, weights=False)
    floor(path), audit(path), audit_static(loaded)  # warm-up, discarded
    runs: dict[str, list[float]] = {"floor": [], "audit": [], "analyses": []}
    for _ in range(repeats):
        runs["floor"].append(timed(floor, path))
        runs["audit"].append(timed(audit, path))
        runs["analyses"].append(timed(audit_static, loaded))
    return {k: (statistics.median(v), min(v), max(v)) for k, v in runs.items()} | {
        "nodes": len(loaded.model.graph.node)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--big-layers", type=int, default=5555, help="layers of the ~100k-node graph")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (*DEPTHS, args.big_layers):
            path = Path(tmp) / f"pythia_{layers}.onnx"
            onnx.save(transformer_graph(layers=layers), str(path))
            repeats = args.repeats if layers <= max(DEPTHS) else max(3, args.repeats // 2)
            result = measure(path, repeats)
            rows.append((layers, result))
            print(f"# {layers} layers done", flush=True)
    print("| layers | nodes | floor ms (min–max) | audit ms (min–max) | audit / floor | "
          "analyses ms (min–max) | analyses / floor | audit µs per node |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers, r in rows:
        f, a, s = r["floor"], r["audit"], r["analyses"]
        print(f"| {layers} | {r['nodes']:,} | {f[0]:.1f} ({f[1]:.1f}–{f[2]:.1f}) | {a[0]:.1f} ({a[1]:.1f}–{a[2]:.1f}) "
              f"| {a[0] / f[0]:.2f}× | {s[0]:.1f} ({s[1]:.1f}–{s[2]:.1f}) | {s[0] / f[0]:.2f}× "
              f"| {1000 * a[0] / r['nodes']:.1f} |")


if __name__ == "__main__":
    main()
