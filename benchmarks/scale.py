"""The whole `graphaudit run` at Pythia-like sizes, against the bare ONNX Runtime runs it needs.

    python benchmarks/scale.py [--sizes 70m,160m] [--models featuregate,mudd] [--workdir DIR]
                               [--calib 32] [--eval 32] [--inputs 32,128] [--tokens 128]
                               [--profile-budget S]

(`--sizes tiny`: a model of a few thousand parameters, for checking that the script runs.)

Per size and model, the zoo's model is built at that size with random weights (seeded; no
training: the audit's cost does not depend on what the weights learnt) and exported with the
project's own exporter, with a Dense model of the same size as the baseline. Calibration and
evaluation inputs are random token ids (seeded, uniform over the vocabulary). Then, each in a
process of its own whose wall time and peak resident memory are read from the kernel
(`os.wait4`), in one run:

1. **the audit**: `python -m graphaudit run MODEL --calib C --data E --baseline DENSE
   --provider cpu --format json -o REPORT -q`, its phases read from the report's `timing`;
2. **the floor**: what Frozen-Controller Auditing cannot do without, in bare ONNX Runtime
   with default session options: the live model (with its coefficients as outputs) run once
   over the calibration and evaluation inputs (the capture), then the frozen graph (the
   exporter's, coefficients as inputs) run six times over the evaluation inputs, one pass per
   replay condition, each fed the captured coefficients; both sessions stay open, at the
   audit's replay batch size. The evaluation coefficients are held on disk, as the audit holds
   them: each batch's in .npy files of its own, mapped when fed, so the floor's peak is what
   ONNX Runtime needs for the sessions and one batch, not every input's coefficients (until
   session 21 they were held in memory, which grew the floor with the inputs). Its time counts
   these runs only (not writing or reading the coefficients, reading the inputs or opening the
   sessions); its memory is the whole process's peak.

The time ratio is the audit's whole wall time over the floor's runs; the memory ratio is peak
over peak. `--inputs 32,128` measures each size and model at each count (that many calibration
and as many evaluation inputs) in the same run, and prints how the audit's peak and the floor's
grow from the fewest inputs to the most: the audit's memory should stay flat as inputs grow.
Built files are kept in `--workdir` (default: a temporary folder, removed after) and reused
when present. Downloads nothing; needs the `exporters` extra (torch). Prints Markdown for
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
from measured import run_measured

ROOT = Path(__file__).resolve().parents[1]
SIZES = {  # Pythia's shapes at 70M and 160M parameters, with a context of 128 tokens
    "70m": {"vocab": 50304, "d_model": 512, "n_layers": 6, "n_heads": 8, "d_ff": 2048, "context": 128},
    "160m": {"vocab": 50304, "d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 3072, "context": 128},
    "tiny": {"vocab": 256, "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "context": 32},  # a smoke test's
}
CONDITIONS = 6  # the replay's conditions: correct, cross_input, token_shuffle, static_layer, static_position, global_mean

BUILD = """
import json, sys
import onnx, torch
sys.path.insert(0, sys.argv[1])
from exporters.export import export_frozen, export_live
from exporters.zoo import build_model
name, cfg, folder = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
model = build_model(name, **cfg).eval()
out = f"{folder}/{name}"
if name == "dense":
    export_live(model, out + ".onnx")
else:
    live = export_live(model, out + ".onnx")
    names = [c.tensor for c in model.coefficients()]
    live.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    onnx.save_model(live, out + ".floor.onnx")
    export_frozen(model, out + ".frozen.onnx")
    json.dump(names, open(out + ".coefficients.json", "w"))
print(sum(p.numel() for p in model.parameters()))
"""

FLOOR = """
import json, os, sys, tempfile, time
import numpy as np, onnxruntime as ort
live_path, frozen_path, names_path, calib, data, batch, conditions = sys.argv[1:8]
batch, conditions = int(batch), int(conditions)
names = json.load(open(names_path))
calib, data = np.load(calib)["input_ids"], np.load(data)["input_ids"]
live = ort.InferenceSession(live_path, providers=["CPUExecutionProvider"])
frozen = ort.InferenceSession(frozen_path, providers=["CPUExecutionProvider"])
spent = 0.0
def run(session, fetch, feed):
    global spent
    start = time.perf_counter()
    outputs = session.run(fetch, feed)
    spent += time.perf_counter() - start
    return outputs
for i in range(0, len(calib), batch):
    run(live, None, {"input_ids": calib[i:i + batch]})
starts = range(0, len(data), batch)
with tempfile.TemporaryDirectory(prefix="scale-floor-") as folder:
    # each evaluation batch's coefficients in .npy files of their own, mapped when fed: held on disk
    # as the audit holds them, so that the peak is the sessions' and one batch's, not every input's
    def path(b, k):
        return os.path.join(folder, f"{b}-{k}.npy")
    for b, i in enumerate(starts):
        for k, values in enumerate(run(live, names, {"input_ids": data[i:i + batch]})):
            np.save(path(b, k), values)
    capture = spent
    sizes = [len(data[i:i + batch]) for i in starts]
    for c in range(conditions):
        for b, i in enumerate(starts):
            other = (b + c) % len(sizes)  # another batch's coefficients, as the rearranging conditions feed
            source = other if sizes[other] == sizes[b] else b
            feed = {n: np.load(path(source, k), mmap_mode="r") for k, n in enumerate(names)}
            run(frozen, ["logits"], {"input_ids": data[i:i + batch], **feed})
            del feed
print(json.dumps({"capture_s": capture, "runs_s": spent}))
"""


def build(folder: Path, size: str, name: str) -> int | None:
    """Export `name` at `size` into `folder` unless it is there; its parameter count when built."""
    if (folder / f"{name}.onnx").is_file():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    _, _, out = run_measured([sys.executable, "-c", BUILD, str(ROOT), name, json.dumps(SIZES[size]), str(folder)], ROOT)
    return int(out.strip().splitlines()[-1])


def token_sets(folder: Path, vocab: int, calib: int, evaluation: int, tokens: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    paths = []
    for label, count in (("calib", calib), ("eval", evaluation)):
        path = folder / f"{label}-{count}x{tokens}.npz"
        if not path.is_file():
            np.savez(path, input_ids=rng.integers(0, vocab, (count, tokens), dtype=np.int64))
        paths.append(path)
    return paths[0], paths[1]


def measure(folder: Path, name: str, calib: Path, data: Path, budget: float | None = None) -> dict:
    report = folder / f"{name}.report.json"
    given = ["--profile-budget", str(budget)] if budget is not None else []
    wall, peak, _ = run_measured([sys.executable, "-m", "graphaudit", "run", str(folder / f"{name}.onnx"),
                                  "--calib", str(calib), "--data", str(data), "--baseline", str(folder / "dense.onnx"),
                                  "--provider", "cpu", "--format", "json", "-o", str(report), "-q", *given], ROOT)
    doc = json.loads(report.read_text())
    batch = ((doc.get("replay") or {}).get("settings") or {}).get("batch_size") or 16
    floor_wall, floor_peak, out = run_measured([
        sys.executable, "-c", FLOOR, str(folder / f"{name}.floor.onnx"), str(folder / f"{name}.frozen.onnx"),
        str(folder / f"{name}.coefficients.json"), str(calib), str(data), str(batch), str(CONDITIONS)], ROOT)
    floor = json.loads(out)
    return {"wall": wall, "peak": peak, "doc": doc, "batch": batch, "floor_wall": floor_wall,
            "floor_peak": floor_peak, **floor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="70m,160m")
    parser.add_argument("--models", default="featuregate,mudd")
    parser.add_argument("--workdir", type=Path, help="Keep the exported models here and reuse them.")
    parser.add_argument("--calib", type=int, default=32)
    parser.add_argument("--eval", type=int, default=32)
    parser.add_argument("--inputs", help="Counts measured in one run, each as calibration and as evaluation inputs "
                        "(e.g. 32,128; overrides --calib and --eval); prints the peaks' growth over the counts.")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--profile-budget", type=float, help="Passed to the audit (default: the audit's own, 30 s).")
    args = parser.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"expected sizes among {', '.join(SIZES)}, found {', '.join(unknown)}")
    models = [m for m in args.models.split(",") if m]
    try:
        counts = [(n, n) for n in sorted({int(c) for c in args.inputs.split(",") if c})] if args.inputs else []
    except ValueError:
        raise SystemExit(f"expected --inputs as counts such as 32,128, found {args.inputs!r}") from None
    if any(n < 1 for n, _ in counts):
        raise SystemExit(f"expected --inputs counts of at least 1, found {args.inputs!r}")
    counts = counts or [(args.calib, args.eval)]
    with tempfile.TemporaryDirectory(prefix="graphaudit-scale-") as tmp:
        root = (args.workdir or Path(tmp)).resolve()
        rows = []
        for size in sizes:
            folder = root / size
            params = {n: build(folder, size, n) for n in ["dense", *models]}
            for n_calib, n_eval in counts:
                calib, data = token_sets(folder, SIZES[size]["vocab"], n_calib, n_eval, args.tokens)
                for name in models:
                    result = measure(folder, name, calib, data, args.profile_budget)
                    rows.append((size, name, params.get(name), {**result, "inputs": (n_calib, n_eval)}))
                    print(f"{size} {name} ({n_calib} + {n_eval} inputs): audit {result['wall']:.1f} s, "
                          f"{result['peak']:.0f} MiB; floor {result['runs_s']:.1f} s, {result['floor_peak']:.0f} MiB",
                          file=sys.stderr)
    report(rows, args, counts)


def report(rows: list, args, counts: list[tuple[int, int]]) -> None:
    import onnxruntime as ort

    budget = f"--profile-budget {args.profile_budget:g}" if args.profile_budget is not None else "the default budget"
    given = " or ".join(f"{c} calibration and {e} evaluation" for c, e in counts)
    print(f"{given} inputs of {args.tokens} random tokens; random "
          f"weights; the audit's profile at {budget}; ONNX Runtime {ort.__version__} CPU, {platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the end\n")
    print("| size | model | parameters | inputs | audit s | floor s (capture + 6 conditions) | time over floor | "
          "audit peak MiB | floor peak MiB | memory over floor |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size, name, params, r in rows:
        count = f"{params / 1e6:.0f}M" if params else "(built before)"
        print(f"| {size} | {name} | {count} | {_inputs(r['inputs'])} | {r['wall']:.1f} | {r['runs_s']:.1f} (capture "
              f"{r['capture_s']:.1f}) | {r['wall'] / r['runs_s']:.2f}x | {r['peak']:.0f} | {r['floor_peak']:.0f} | "
              f"{r['peak'] / r['floor_peak']:.2f}x |")
    if len(counts) > 1:
        print(f"\n| size | model | audit peak MiB, {_inputs(counts[0])} → {_inputs(counts[-1])} "
              "inputs | growth | floor peak MiB | growth |")
        print("|---|---|---|---|---|---|")
        for (size, name), by_count in _by_model(rows).items():
            few, many = by_count[counts[0]], by_count[counts[-1]]
            print(f"| {size} | {name} | {few['peak']:.0f} → {many['peak']:.0f} | {many['peak'] / few['peak']:.2f}x | "
                  f"{few['floor_peak']:.0f} → {many['floor_peak']:.0f} | {many['floor_peak'] / few['floor_peak']:.2f}x |")
    print("\n| size | model | inputs | load s | static s | replay s | profile s | replay over floor | profile rounds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size, name, _, r in rows:
        timing, profile = r["doc"].get("timing") or {}, r["doc"].get("profile") or {}
        rounds = profile.get("rounds") or {}
        print(f"| {size} | {name} | {_inputs(r['inputs'])} | {timing.get('load_s', 0):.1f} | {timing.get('static_s', 0):.1f} | "
              f"{timing.get('replay_s', 0):.1f} | {timing.get('profile_s', 0):.1f} | "
              f"{timing.get('replay_s', 0) / r['runs_s']:.2f}x | {profile.get('runs')} timed / "
              f"{profile.get('warmup')} warm-up / {profile.get('profile_runs')} profiled; "
              f"{rounds.get('reason', '')[:120]} |")


def _inputs(counts: tuple[int, int]) -> str:
    """(calibration, evaluation) input counts as the tables write them."""
    calib, evaluation = counts
    return f"{calib} + {evaluation}"


def _by_model(rows: list) -> dict[tuple[str, str], dict[tuple[int, int], dict]]:
    """Each (size, model)'s results by their (calibration, evaluation) counts, in the rows' order."""
    found: dict[tuple[str, str], dict[tuple[int, int], dict]] = {}
    for size, name, _, result in rows:
        found.setdefault((size, name), {})[result["inputs"]] = result
    return found


if __name__ == "__main__":
    main()
