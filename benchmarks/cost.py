"""What an audit costs against what ONNX Runtime itself needs, on an image model given by path.

    python benchmarks/cost.py MODEL.onnx [--size 736] [--images 12] [--before FOLDER] [--old-rounds]

Makes `--images` random images (float32, N(0, 1), as a detector's normalised input) of
`--size` x `--size` pixels for a model whose one input is (batch, channels, height, width),
as calibration and evaluation sets in a temporary folder, then runs, each in a process of
its own whose peak resident memory is read from the kernel (`os.wait4`):

1. `graphaudit run MODEL --calib C --data E --provider cpu` with its default rounds;
2. `graphaudit profile MODEL --data E` with its default rounds (and, with `--old-rounds`,
   with the fixed rounds it had before, on every image: `--runs 20 --warmup 3 --profile-runs 3
   --sample N`);
3. a bare ONNX Runtime script: one session with default options, running the same images
   at the audit's replay batch (read from the audit's report) three times over, and one at
   a time as the profile runs them: what ONNX Runtime needs for the same batch.

`--before FOLDER`: also run 1. with the graphaudit found in FOLDER (e.g. `git archive` of an
older commit unpacked there). Downloads nothing. Prints Markdown for BENCHMARKS.md.
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
import onnx
import onnxruntime as ort
from measured import run_measured

ROOT = Path(__file__).resolve().parents[1]

BARE = """
import sys, time
import numpy as np, onnxruntime as ort
model, data, batch, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
arrays = dict(np.load(data))
count = len(next(iter(arrays.values())))
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
times = []
for _ in range(repeats):
    start = time.perf_counter()
    for i in range(0, count, batch):
        session.run(None, {k: v[i:i + batch] for k, v in arrays.items()})
    times.append(time.perf_counter() - start)
print(min(times))
"""


def images(model: Path, size: int, count: int, folder: Path) -> tuple[Path, Path]:
    """calib.npz and eval.npz of `count` random images each for the model's one input."""
    graph = onnx.load(str(model), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in weights]
    dims = inputs[0].type.tensor_type.shape.dim if len(inputs) == 1 else []
    if len(dims) != 4:
        raise SystemExit(f"expected a model with one input of 4 dimensions (batch, channels, height, width), "
                         f"found {[i.name for i in inputs]}")
    channels = dims[1].dim_value or 3
    rng = np.random.default_rng(0)
    paths = []
    for name in ("calib", "eval"):
        path = folder / f"{name}.npz"
        np.savez(path, **{inputs[0].name: rng.standard_normal((count, channels, size, size)).astype(np.float32)})
        paths.append(path)
    return paths[0], paths[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--size", type=int, default=736)
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--before", type=Path, help="A folder holding an older graphaudit, measured as well.")
    parser.add_argument("--old-rounds", action="store_true",
                        help="Also time the profile with the fixed rounds it had before (20 after 3, 3 profiled).")
    args = parser.parse_args()
    args.model = args.model.resolve()
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="graphaudit-cost-") as tmp:
        folder = Path(tmp)
        calib, data = images(args.model, args.size, args.images, folder)
        audits = [("graphaudit run (this checkout)", ROOT)]
        if args.before is not None:
            audits.append((f"graphaudit run ({args.before})", args.before.resolve()))
        rows, batch = [], None
        for label, path in audits:
            report = folder / "report.json"
            wall, peak, _ = run_measured([python, "-m", "graphaudit", "run", str(args.model), "--calib", str(calib),
                                          "--data", str(data), "--provider", "cpu", "-q", "--format", "json",
                                          "-o", str(report)], path)
            doc = json.loads(report.read_text())
            batch = batch or ((doc.get("replay") or {}).get("settings") or {}).get("batch_size") or 1
            rows.append((label, wall, peak, doc["profile"]))
        floors = []
        for b, repeats in ((min(batch, args.images), 3), (1, 2)):
            wall, peak, out = run_measured([python, "-c", BARE, str(args.model), str(data), str(b), str(repeats)], ROOT)
            floors.append((b, repeats, peak, float(out.strip())))
        profiles = []
        settings = [("default rounds", [])]
        if args.old_rounds:
            settings.append((f"--runs 20 --warmup 3 --profile-runs 3 --sample {args.images}",
                             ["--runs", "20", "--warmup", "3", "--profile-runs", "3", "--sample", str(args.images)]))
        for label, extra in settings:
            wall, peak, out = run_measured([python, "-m", "graphaudit", "profile", str(args.model), "--data",
                                            str(data), "--format", "json", *extra], ROOT)
            doc = json.loads(out)
            profiles.append((label, wall, peak, doc))

    floor, batch = floors[0][2], min(batch, args.images)
    print(f"{args.model.name}: {args.images} random images of {args.size} x {args.size}, ONNX Runtime "
          f"{ort.__version__} CPU, {platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the end\n")
    print(f"| process | peak RSS MiB | over bare ORT at batch {batch} | wall s |")
    print("|---|---|---|---|")
    for b, repeats, peak, best in floors:
        print(f"| bare ORT, batch {b}, {repeats} passes | {peak:.0f} | {peak / floor:.2f}x | {best:.2f} (fastest pass) |")
    for label, wall, peak, _ in rows:
        print(f"| {label} | {peak:.0f} | {peak / floor:.2f}x | {wall:.1f} |")
    for label, wall, peak, _ in profiles:
        print(f"| graphaudit profile, {label} | {peak:.0f} | {peak / floor:.2f}x | {wall:.1f} |")
    print("\n| profile | rounds (timed / warm-up / profiled) | inputs run | a run, s | wall s |")
    print("|---|---|---|---|---|")
    for label, wall, _, doc in profiles:
        rounds = doc.get("rounds") or {}
        one = rounds.get("run_s") or profiles[0][3]["rounds"]["run_s"]  # given rounds: the run measured beside them
        print(f"| {label} | {doc['runs']} / {doc['warmup']} / {doc['profile_runs']} | {rounds.get('sample')} of "
              f"{rounds.get('inputs')} | {one:.3f} | {wall:.1f} |")
    for label, _, _, doc in rows:
        print(f"\n{label}: profile rounds {doc['runs']} / {doc['warmup']} / {doc['profile_runs']}"
              + (f" ({doc['rounds']['reason']})" if doc.get("rounds") else " (fixed)"))
    for label, _, _, doc in profiles:
        if (doc.get("rounds") or {}).get("reason"):
            print(f"\n{label}: {doc['rounds']['reason']}")


if __name__ == "__main__":
    main()
