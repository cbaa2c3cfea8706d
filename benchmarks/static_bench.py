"""How long the static audit takes, against the floor of reading, checking and shape-inferring the file.

For Pythia-shaped graphs of growing depth (hidden 2048, 16 heads, vocabulary 50,432, weights
as external references into a sparse file of the right size, so that nothing is written but
every check finds a regular file) and a synthetic graph of about 100,000 nodes, each measured
side by side in one run:

- floor: `onnx.load(path, load_external_data=False)` + `onnx.checker.check_model(path)` +
  `onnx.shape_inference.infer_shapes(model)`: what every correct static audit must do (the
  checker is given the path, as a proto alone cannot find its external weights' file; it
  parses the file again itself, without reading the weights);
- audit: `load_model(path, weights=False)` + `audit_static(loaded)`, what
  `graphaudit static --graph-only MODEL` does (the loader also runs the ONNX checker and
  shape inference with data propagation);
- analyses: `audit_static(loaded)` alone, on an already loaded model.

Each is timed with `time.perf_counter_ns` after one discarded warm-up run; the three are
interleaved in every round so that load on the machine hits them alike. Each graph gets
`--repeats` rounds, and more while its rounds have taken less than `--seconds` (a graph of a
few hundred nodes takes a few hundred rounds). Medians and the spread (min–max) are reported,
with the ratio of medians to the floor, the median of each round's ratio (which a slow
spell on the machine, hitting a few rounds, moves least), and the slope of the audit's time
over the node count, fitted by least squares over every graph measured.

`--stages` adds, for the Pythia-shaped graph and the big one, the CPU time
(`time.process_time`, median) of each step of the floor and of the audit, so that the
share of each step (checker, shape inference, graph model, each analysis) can be read, and
beside the graph model's build a bare loop that makes its objects and nothing else
(`bare_graph_loop`; not part of the audit): how far the build is from the least it could cost.

`--inline` adds Pythia-shaped graphs whose weights lie inline in the file (hidden 512, 8
heads, vocabulary 8192, 1, 4 and 12 layers; zeros), floor and audit as above: the floor's
shape inference encodes and parses every weight, the loader's does not (it gives inference
the large initializers as typed inputs, `graphaudit.load.inference.INFER_WEIGHTS_OVER`).

`--bound` adds, timed side by side with the floor, the least any static audit in Python
does that keeps the loader's two main checks and looks at every node once: the ONNX checker
(C++, on bytes prepared beforehand, so the copy with external weights as inputs is not
counted), shape inference (C++, on the file's bytes, without data propagation), one parse
of its result, and one pass over the nodes that reads each node's op type, inputs and
outputs and carries a constant/shape/value level through dictionaries (the simplest of
the audit's analyses). The loader's other checks (UTF-8 names, versions, external-data
locations) and data propagation are left out, so it is a lower bound. What is left of 2×
the floor is what every other analysis may cost.

    python benchmarks/static_bench.py [--repeats 5] [--seconds 3] [--big-layers 5555] [--stages] [--bound] [--inline]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import onnx
from onnx import shape_inference
from onnx.onnx_cpp2py_export import checker as cpp_checker
from onnx.onnx_cpp2py_export import shape_inference as cpp_inference

from graphaudit.analyses.block_verdicts import execution_verdicts
from graphaudit.analyses.blocks import find_blocks
from graphaudit.analyses.coefficients import resolve_coefficients
from graphaudit.analyses.dependence import analyse_dependence
from graphaudit.analyses.static import audit_static
from graphaudit.graph.build import _Builder, _declared, build_graph, paused_gc
from graphaudit.graph.model import Node, TensorInfo, TensorRef
from graphaudit.load import external_data
from graphaudit.load import model as load
from graphaudit.load.checker import check_model, handed
from graphaudit.load.inference import INFER_WEIGHTS_OVER, with_inferred_shapes
from graphaudit.load.model import load_model
from graphaudit.testing.synthetic import WEIGHTS_FILE, transformer_graph

DEPTHS = (1, 2, 4, 8, 16, 24)
INLINE_DEPTHS = (1, 4, 12)  # --inline: hidden 512, vocabulary 8192, weights in the file


def floor(path: Path) -> None:
    model = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(str(path))  # by path: a proto alone cannot find its external weights' file
    shape_inference.infer_shapes(model)


def save_with_weights(model: onnx.ModelProto, path: Path) -> None:
    """Save `model` at `path`, and beside it a sparse file as long as its external weights run."""
    onnx.save(model, str(path))
    ends = [int(e["offset"]) + int(e["length"]) for t in model.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL
            for e in [{kv.key: kv.value for kv in t.external_data}]]
    if ends:
        with open(path.parent / WEIGHTS_FILE, "wb") as f:
            f.truncate(max(ends))


def audit(path: Path) -> None:
    audit_static(load_model(path, weights=False))


def bound(path: Path, checkable: bytes) -> None:
    """The least a Python static audit does (see the module's doc): checker, inference, one pass."""
    data = path.read_bytes()
    cpp_checker.check_model(checkable, False, False, False)
    graph = onnx.ModelProto.FromString(cpp_inference.infer_shapes(data, False, False, False)).graph
    level = dict.fromkeys([i.name for i in graph.input], 2)  # 0 constant, 1 shape only, 2 values
    level.update(dict.fromkeys([t.name for t in graph.initializer], 0))
    get = level.get
    for node in graph.node:
        reached = max([get(name, 0) for name in node.input], default=0)
        if node.op_type in ("Shape", "Size"):
            reached = min(reached, 1)
        for name in node.output:
            level[name] = reached


def measure_bound(path: Path, repeats: int) -> dict:
    """Floor and bound, interleaved as in `measure`."""
    checkable = external_data.as_inputs(onnx.load(str(path), load_external_data=False)).SerializeToString()
    floor(path), bound(path, checkable)  # warm-up, discarded
    runs: dict[str, list[float]] = {"floor": [], "bound": []}
    for _ in range(repeats):
        runs["floor"].append(timed(floor, path))
        runs["bound"].append(timed(bound, path, checkable))
    return {k: (statistics.median(v), min(v), max(v)) for k, v in runs.items()}


def timed(fn, *args) -> float:
    start = time.perf_counter_ns()
    fn(*args)
    return (time.perf_counter_ns() - start) / 1e6


def measure(path: Path, repeats: int, seconds: float = 0.0) -> dict:
    """Floor, audit and analyses of `path`, interleaved in each round: `repeats` rounds, and more
    while the rounds have taken less than `seconds` (small graphs take many, so that one slow
    moment on a shared machine moves the medians little)."""
    loaded = load_model(path, weights=False)
    floor(path), audit(path), audit_static(loaded)  # warm-up, discarded
    runs: dict[str, list[float]] = {"floor": [], "audit": [], "analyses": []}
    start = time.perf_counter()
    while len(runs["floor"]) < repeats or time.perf_counter() - start < seconds:
        runs["floor"].append(timed(floor, path))
        runs["audit"].append(timed(audit, path))
        runs["analyses"].append(timed(audit_static, loaded))
    rounds = [a / f for a, f in zip(runs["audit"], runs["floor"])]
    return {k: (statistics.median(v), min(v), max(v)) for k, v in runs.items()} | {
        "nodes": len(loaded.model.graph.node), "rounds": len(rounds), "round_ratio": statistics.median(rounds)}


def loader_locations(model: onnx.ModelProto, data: bytes) -> list[str]:
    """The external tensors' locations as the loader reads them: the tensors counted in the
    file's bytes (`data`), then each one's location."""
    return external_data.locations(external_data.scan(model, data)[0], None)


def bare_graph_loop(model: onnx.ModelProto) -> dict:
    """The least a graph model of the main graph makes, for `--stages`: the build's own objects (a
    TensorRef and TensorInfo per value, a Node per node, the types read as the builder reads them),
    without ids decided over the whole model, bodies, functions, metadata or undefined inputs."""
    new = tuple.__new__
    graph = model.graph
    types = _Builder(model)._types(_declared(graph))
    env: dict[str, TensorRef] = {}
    tensors: dict[TensorRef, TensorInfo] = {}
    for t in graph.initializer:
        ref = env[t.name] = new(TensorRef, (t.name, ""))
        tensors[ref] = new(TensorInfo, (ref, "initializer", None, *(types.get(t.name) or (t.data_type, tuple(t.dims)))))
    for vi in graph.input:
        env[vi.name] = new(TensorRef, (vi.name, ""))
    nodes = {}
    get, untyped = env.get, (None, None)
    for proto in graph.node:
        node_id = proto.name
        inputs = tuple(map(get, proto.input[:]))
        outputs = []
        for name in proto.output[:]:
            outputs.append(ref := new(TensorRef, (name, "")))
            tensors[ref] = new(TensorInfo, (ref, "node_output", node_id, *types.get(name, untyped)))
            env[name] = ref
        nodes[node_id] = new(Node, (node_id, node_id, proto.op_type, proto.domain, inputs, tuple(outputs), (), (), proto))
    return nodes


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
        step("floor: check_model", onnx.checker.check_model, str(path))
        step("floor: infer_shapes", shape_inference.infer_shapes, model)
        model, data = step("load: parse", load._parse_file, path)
        external = step("load: external locations", loader_locations, model, data)
        del data
        copy, encoded = step("load: checker's copy, encoded", handed, model, None, INFER_WEIGHTS_OVER)
        step("load: checker", check_model, copy, path, payload=encoded)
        inferred = step("load: shape inference", with_inferred_shapes, model, None, (copy, encoded))[0]
        loaded = load.LoadedModel(inferred, path, False, tuple(external), True)
        with paused_gc():
            mg = step("audit: graph model", build_graph, inferred)
            step("(audit: graph model, bare loop)", bare_graph_loop, inferred)
            dm = step("audit: dependence", analyse_dependence, mg)
            blocks = step("audit: blocks", find_blocks, mg)
            coefs = step("audit: coefficients", resolve_coefficients, loaded, mg, (), blocks=blocks, dependence=dm)
            step("audit: verdicts", execution_verdicts, mg, blocks, coefs, dm)
        # Freed now, as at the end of audit_static: kept alive into the next round, the
        # graph model's objects would make a garbage collection in the loader's steps slow.
        del model, copy, encoded, inferred, loaded, mg, dm, blocks, coefs
    return {name: statistics.median(v[1:]) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--big-layers", type=int, default=5555, help="layers of the ~100k-node graph")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="least time the rounds of each graph take (more rounds than --repeats where they are short)")
    parser.add_argument("--stages", action="store_true", help="also time each step (CPU) at 24 layers and the big graph")
    parser.add_argument("--inline", action="store_true",
                        help="also graphs whose weights are inline (hidden 512, vocabulary 8192, 1, 4 and 12 layers: "
                             "9-185 MB files), where the floor's inference encodes and parses the weights")
    parser.add_argument("--bound", action="store_true",
                        help="also time the least a Python static audit does (checker, inference, one pass) against the floor")
    args = parser.parse_args()
    rows = []
    steps: dict[int, dict[str, float]] = {}
    bounds: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (*DEPTHS, args.big_layers):
            path = Path(tmp) / f"pythia_{layers}.onnx"
            save_with_weights(transformer_graph(layers=layers), path)
            repeats = args.repeats if layers <= max(DEPTHS) else max(3, args.repeats // 2)
            result = measure(path, repeats, args.seconds)
            rows.append((layers, result))
            if args.stages and layers in (24, args.big_layers):
                steps[layers] = stages(path, repeats)
            if args.bound:
                bounds[layers] = measure_bound(path, repeats)
            print(f"# {layers} layers done", flush=True)
        inline = []
        for layers in (INLINE_DEPTHS if args.inline else ()):
            path = Path(tmp) / f"inline_{layers}.onnx"
            onnx.save(transformer_graph(layers=layers, hidden=512, heads=8, vocab=8192, external=None), str(path))
            inline.append((layers, path.stat().st_size, measure(path, args.repeats)))
            path.unlink()
            print(f"# inline {layers} layers done", flush=True)
    print("| layers | nodes | rounds | floor ms (min–max) | audit ms (min–max) | audit / floor | audit / floor, "
          "median round | analyses ms (min–max) | analyses / floor | audit µs per node |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers, r in rows:
        f, a, s = r["floor"], r["audit"], r["analyses"]
        print(f"| {layers} | {r['nodes']:,} | {r['rounds']} | {f[0]:.1f} ({f[1]:.1f}–{f[2]:.1f}) "
              f"| {a[0]:.1f} ({a[1]:.1f}–{a[2]:.1f}) | {a[0] / f[0]:.2f}× | {r['round_ratio']:.2f}× "
              f"| {s[0]:.1f} ({s[1]:.1f}–{s[2]:.1f}) | {s[0] / f[0]:.2f}× | {1000 * a[0] / r['nodes']:.1f} |")
    nodes = [r["nodes"] for _, r in rows]
    times = [r["audit"][0] for _, r in rows]
    slope, intercept = _fit(nodes, times)
    exponent, _ = _fit([math.log(n) for n in nodes], [math.log(t) for t in times])
    print(f"\naudit time over the node count, least squares over the {len(rows)} graphs: {1000 * slope:.1f} µs per "
          f"node ({intercept:+.1f} ms); on log scales, time grows as nodes^{exponent:.2f} (1: linear)")
    if inline:
        print()
        print("| inline weights: layers | file MB | nodes | floor ms (min–max) | audit ms (min–max) | audit / floor |")
        print("|---:|---:|---:|---:|---:|---:|")
        for layers, size, r in inline:
            f, a = r["floor"], r["audit"]
            print(f"| {layers} | {size / 2**20:.0f} | {r['nodes']:,} | {f[0]:.1f} ({f[1]:.1f}–{f[2]:.1f}) "
                  f"| {a[0]:.1f} ({a[1]:.1f}–{a[2]:.1f}) | {a[0] / f[0]:.2f}× |")
    if bounds:
        print()
        print("| layers | floor ms (min–max) | bound ms (min–max) | bound / floor | left of 2× the floor, ms |")
        print("|---:|---:|---:|---:|---:|")
        for layers, b in bounds.items():
            f, lo = b["floor"], b["bound"]
            print(f"| {layers} | {f[0]:.1f} ({f[1]:.1f}–{f[2]:.1f}) | {lo[0]:.1f} ({lo[1]:.1f}–{lo[2]:.1f}) "
                  f"| {lo[0] / f[0]:.2f}× | {2 * f[0] - lo[0]:.1f} |")
    if steps:
        print()
        print("| step (CPU ms, median) | " + " | ".join(f"{n} layers" for n in steps) + " |")
        print("|---|" + "---:|" * len(steps))
        for name in next(iter(steps.values())):
            print(f"| {name} | " + " | ".join(f"{s[name]:.1f}" for s in steps.values()) + " |")


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


if __name__ == "__main__":
    main()
