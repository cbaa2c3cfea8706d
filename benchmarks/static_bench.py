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

`--stages` adds, for the Pythia-shaped graph and the big one, the CPU time
(`time.process_time`, median) of each step of the floor and of the audit, so that the
share of each step (checker, shape inference, graph model, each analysis) can be read.

    python benchmarks/static_bench.py [--repeats 5] [--big-layers 5555] [--stages]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import onnx
from onnx import shape_inference

from graphaudit import load
from graphaudit.analyses.blocks import find_blocks
from graphaudit.analyses.coefficients import resolve_coefficients
from graphaudit.analyses.dependence import analyse_dependence
from graphaudit.analyses.static import audit_static
from graphaudit.analyses.verdicts import execution_verdicts
from graphaudit.graph import build_graph
from graphaudit.graph_build import paused_gc
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


def stages(path: Path, repeats: int) -> dict[str, float]:
    """Median CPU ms of each step of the floor and of `static --graph-only` on `path`.

    The loader's steps are called one by one (private functions, in load_model's order);
    the analyses run as audit_static runs them, with the garbage collector paused.
    """
    times: dict[str, list[float]] = {}

    def step(name, fn, *args, **kwargs):
        start = time.process_time()
        result = fn(*args, **kwargs)
        times.setdefault(name, []).append((time.process_time() - start) * 1e3)
        return result

    for _ in range(repeats + 1):  # the first round is a warm-up, dropped below
        model = step("floor: onnx.load", onnx.load, str(path), load_external_data=False)
        step("floor: infer_shapes", shape_inference.infer_shapes, model)
        model = step("load: parse", load._parse_file, path)
        external = step("load: external locations", load.external_locations, model)
        copy = step("load: checker's copy", load._external_as_inputs, model)
        step("load: checker", load._check, copy, path)
        inferred = step("load: shape inference", load._infer_shapes, model)[0]
        loaded = load.LoadedModel(inferred, path, False, tuple(external), True)
        with paused_gc():
            mg = step("audit: graph model", build_graph, inferred)
            dm = step("audit: dependence", analyse_dependence, mg)
            blocks = step("audit: blocks", find_blocks, mg)
            coefs = step("audit: coefficients", resolve_coefficients, loaded, mg, (), blocks=blocks, dependence=dm)
            step("audit: verdicts", execution_verdicts, mg, blocks, coefs, dm)
        # Freed now, as at the end of audit_static: kept alive into the next round, the
        # graph model's objects would make a garbage collection in the loader's steps slow.
        del model, copy, inferred, loaded, mg, dm, blocks, coefs
    return {name: statistics.median(v[1:]) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--big-layers", type=int, default=5555, help="layers of the ~100k-node graph")
    parser.add_argument("--stages", action="store_true", help="also time each step (CPU) at 24 layers and the big graph")
    args = parser.parse_args()
    rows = []
    steps: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (*DEPTHS, args.big_layers):
            path = Path(tmp) / f"pythia_{layers}.onnx"
            onnx.save(transformer_graph(layers=layers), str(path))
            repeats = args.repeats if layers <= max(DEPTHS) else max(3, args.repeats // 2)
            result = measure(path, repeats)
            rows.append((layers, result))
            if args.stages and layers in (24, args.big_layers):
                steps[layers] = stages(path, repeats)
            print(f"# {layers} layers done", flush=True)
    print("| layers | nodes | floor ms (min–max) | audit ms (min–max) | audit / floor | "
          "analyses ms (min–max) | analyses / floor | audit µs per node |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers, r in rows:
        f, a, s = r["floor"], r["audit"], r["analyses"]
        print(f"| {layers} | {r['nodes']:,} | {f[0]:.1f} ({f[1]:.1f}–{f[2]:.1f}) | {a[0]:.1f} ({a[1]:.1f}–{a[2]:.1f}) "
              f"| {a[0] / f[0]:.2f}× | {s[0]:.1f} ({s[1]:.1f}–{s[2]:.1f}) | {s[0] / f[0]:.2f}× "
              f"| {1000 * a[0] / r['nodes']:.1f} |")
    if steps:
        print()
        print("| step (CPU ms, median) | " + " | ".join(f"{n} layers" for n in steps) + " |")
        print("|---|" + "---:|" * len(steps))
        for name in next(iter(steps.values())):
            print(f"| {name} | " + " | ".join(f"{s[name]:.1f}" for s in steps.values()) + " |")


if __name__ == "__main__":
    main()
