"""The matrix products of one forward pass at the scale benchmark's shapes, in ONNX Runtime,
PyTorch and NumPy, one thread each: how fast each library multiplies, and so how far apart a
replay in one and in the other can be when both are mostly products.

    python benchmarks/products.py [--shapes 70m,160m] [--rows 640] [--repeats 7]

Each product is `rows` × k times k × n in float32, `rows` being batch × tokens (640: the
replay comparison's batch of 10 inputs of 64 tokens, `benchmarks/replay_fca.py --shapes`).
A pass's products, per layer: the attention's four projections (k = n = width), the MLP's
two (width × d_ff, d_ff × width); then the vocabulary projection (width × vocabulary). The
attention's score and value products and the gates' small products are left out. ONNX
Runtime runs a MatMul graph whose right-hand side is an initializer (as in an exported
model, where ONNX Runtime packs it once), PyTorch `torch.nn.functional.linear` with the
weight as `nn.Linear` holds it (out × in), NumPy `@`; each result is first checked against
the product in float64. The three are timed in turn, round after round, after one discarded
warm-up each (`replay_fca.interleaved`); each cell is the median of the rounds, and GFLOP/s
counts 2·rows·k·n operations. Prints a Markdown table per shape for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_variable] = "1"  # before NumPy's and PyTorch's BLAS start their pools

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_fca import interleaved  # noqa: E402
from scale import SIZES  # noqa: E402

LIBRARIES = ("ONNX Runtime", "PyTorch", "NumPy")


def products(shape: dict) -> list[tuple[str, int, int, int]]:
    """(name, k, n, times per pass) of each distinct product of a pass at `shape`."""
    width, ff, layers = shape["d_model"], shape["d_ff"], shape["n_layers"]
    return [("attention projections", width, width, 4 * layers), ("MLP up", width, ff, layers),
            ("MLP down", ff, width, layers), ("vocabulary projection", width, shape["vocab"], 1)]


def contenders(rows: int, k: int, n: int, seed: int = 0) -> list:
    """A call per library computing the same `rows` × k by k × n product."""
    import torch

    rng = np.random.default_rng(seed)
    left = rng.standard_normal((rows, k), dtype=np.float32)
    right = rng.standard_normal((k, n), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
        [numpy_helper.from_array(right, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x, weight = torch.from_numpy(left), torch.from_numpy(np.ascontiguousarray(right.T))
    feeds = {"x": left}

    def in_torch():
        with torch.inference_mode():
            return torch.nn.functional.linear(x, weight)

    calls = [lambda: session.run(None, feeds)[0], lambda: in_torch().numpy(), lambda: left @ right]
    reference = left.astype(np.float64) @ right.astype(np.float64)
    for library, call in zip(LIBRARIES, calls):  # each times the same product, or the figure means nothing
        if not np.allclose(call(), reference, rtol=1e-4, atol=1e-3 * np.sqrt(k)):
            raise SystemExit(f"{library}'s {rows} × {k} × {n} product differs from float64's")
    return calls


def shown(ms: float) -> str:
    """Milliseconds to one decimal, or to three significant digits below one."""
    return f"{ms:.1f}" if ms >= 1 else f"{ms:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="70m,160m", help="comma-separated shapes of benchmarks/scale.py")
    parser.add_argument("--rows", type=int, default=640, help="rows of each product: batch × tokens (default 640)")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per product (default 7)")
    args = parser.parse_args()
    unknown = [name for name in args.shapes.split(",") if name not in SIZES]
    if unknown:
        parser.error(f"expected shapes among {', '.join(SIZES)}, found {', '.join(unknown)}")
    import torch

    torch.set_num_threads(1)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, torch {torch.__version__}, "
          f"numpy {np.__version__}, one thread each, {args.rows} rows, {args.repeats} rounds")
    for name in args.shapes.split(","):
        shape = SIZES[name]
        print(f"\n{name}: {shape['n_layers']} layers, width {shape['d_model']}, d_ff {shape['d_ff']}, "
              f"vocabulary {shape['vocab']}\n")
        print("| product | rows × k × n | per pass | " + " | ".join(f"{lib} ms (GFLOP/s)" for lib in LIBRARIES)
              + " | PyTorch / ONNX Runtime |")
        print("|---|---|---:|" + "---:|" * len(LIBRARIES) + "---:|")
        totals = [0.0] * len(LIBRARIES)
        for label, k, n, count in products(shape):
            ms = [statistics.median(wall) for wall in interleaved(contenders(args.rows, k, n), args.repeats)[0]]
            flop = 2 * args.rows * k * n
            totals = [total + count * t for total, t in zip(totals, ms)]
            cells = " | ".join(f"{shown(t)} ({flop / t / 1e6:.0f})" for t in ms)
            print(f"| {label} | {args.rows} × {k} × {n} | {count} | {cells} | {ms[1] / ms[0]:.2f}× |", flush=True)
        cells = " | ".join(shown(t) for t in totals)
        print(f"| **a pass's products** | | | {cells} | {totals[1] / totals[0]:.2f}× |")


if __name__ == "__main__":
    main()
