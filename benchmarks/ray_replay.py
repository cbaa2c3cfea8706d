"""The replay on 1 and 2 local Ray workers against one process, with Ray's own costs apart.

    python benchmarks/ray_replay.py [--size 70m] [--model featuregate] [--workdir DIR]
                                    [--calib 32] [--eval 32] [--tokens 128] [--repeats 2]

The model is the scale benchmark's (benchmarks/scale.py: the zoo's model at Pythia's 70M shape,
random seeded weights, exported by the project's exporter; random token ids), built into
`--workdir` unless it is there. Then, in one run, each in a process of its own (`os.wait4`:
wall time and peak resident memory of the command's own process, not of Ray's workers),
`--repeats` times in turn:

- **one process**: `graphaudit replay MODEL --calib C --data E --provider cpu --format json`, with
  ONNX Runtime's threads (one per core) and with `--threads 1` (a Ray worker's share here);
- **Ray, 1 worker** and **Ray, 2 workers**: the same with `--ray --workers N` (an embedded Ray
  started and stopped by the command).

Per configuration it prints the medians of the wall time, the replay's phases from the
report's `timing` and, for Ray, what is Ray's: starting it (`ray_start_s`), and over the
slowest worker's own capture and replay (`capture_s − worker_capture_s − worker_load_s`,
`replay_s − worker_replay_s`: starting actors, moving the data and the coefficients), with
the merge (`merge_s`). It checks that every configuration's report gives the same figures as
the one process's (largest relative difference). Downloads nothing; needs the `exporters`
extra to build the model and the `ray` extra. Prints Markdown for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from measured import run_measured
from scale import SIZES, build, token_sets

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"one process": [], "one process, 1 thread": ["--threads", "1"], "Ray, 1 worker": ["--ray", "--workers", "1"],
           "Ray, 2 workers": ["--ray", "--workers", "2"]}
HOW_IT_RAN = {"distributed", "distributed_note", "threads", "threads_note", "cache"}


def replay_once(model: Path, calib: Path, data: Path, extra: list[str], report: Path) -> dict:
    wall, peak, _ = run_measured([sys.executable, "-m", "graphaudit", "replay", str(model), "--calib", str(calib),
                                  "--data", str(data), "--provider", "cpu", "--format", "json", "-o", str(report),
                                  "-q", *extra], ROOT)
    doc = json.loads(report.read_text())
    return {"wall": wall, "peak": peak, "timing": doc["timing"], "doc": doc}


def largest_difference(one, other) -> float:
    """The largest relative difference between two reports' numbers (how they ran left out)."""
    if isinstance(one, dict):
        keys = [k for k in one if k not in HOW_IT_RAN and k != "timing"]
        if sorted(keys) != sorted(k for k in other if k not in HOW_IT_RAN and k != "timing"):
            return math.inf
        return max((largest_difference(one[k], other[k]) for k in keys), default=0.0)
    if isinstance(one, list):
        if len(one) != len(other):
            return math.inf
        return max((largest_difference(a, b) for a, b in zip(one, other)), default=0.0)
    if isinstance(one, float) and isinstance(other, (int, float)):
        if one == other or (math.isnan(one) and math.isnan(other)):
            return 0.0
        return abs(one - other) / max(abs(one), abs(other))
    return 0.0 if one == other else math.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="70m", choices=sorted(SIZES))
    parser.add_argument("--model", default="featuregate")
    parser.add_argument("--workdir", type=Path, help="Keep the exported model here and reuse it.")
    parser.add_argument("--calib", type=int, default=32)
    parser.add_argument("--eval", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="graphaudit-ray-bench-") as tmp:
        folder = (args.workdir or Path(tmp)).resolve() / args.size
        build(folder, args.size, args.model)
        calib, data = token_sets(folder, SIZES[args.size]["vocab"], args.calib, args.eval, args.tokens)
        runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
        for repeat in range(args.repeats):
            for name, extra in CONFIGS.items():  # in turn, so that the machine's load falls on all alike
                result = replay_once(folder / f"{args.model}.onnx", calib, data, extra,
                                     Path(tmp) / f"report-{len(runs[name])}.json")
                runs[name].append(result)
                print(f"{repeat}: {name}: {result['wall']:.1f} s", file=sys.stderr)
    report(runs, args)


def report(runs: dict[str, list[dict]], args) -> None:
    import onnxruntime as ort

    def median(name: str, pick) -> float:
        return statistics.median(pick(r) for r in runs[name])

    def timing(key: str):
        return lambda r: r["timing"].get(key, 0.0)

    alone = median("one process", lambda r: r["wall"])
    print(f"Replay of {args.model} at the {args.size} shape ({args.calib} calibration and {args.eval} evaluation "
          f"inputs of {args.tokens} tokens), {platform.machine()}, {len(__import__('os').sched_getaffinity(0))} "
          f"cores, ONNX Runtime {ort.__version__}, Ray {__import__('ray').__version__}; medians of {args.repeats} "
          "runs each, in turn.\n")
    print("| | wall s | vs one process | capture s | replay s | Ray start s | Ray over the workers s | "
          "merge s | peak MiB (command) | largest rel. difference |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    first = runs["one process"][0]["doc"]
    for name in CONFIGS:
        wall = median(name, lambda r: r["wall"])
        difference = max(largest_difference(first, r["doc"]) for r in runs[name])
        cells = [name, f"{wall:.1f}", f"{alone / wall:.2f}×", f"{median(name, timing('capture_s')):.1f}"]
        if not name.startswith("Ray"):  # its replay_s leaves out the first batch's parity run, which the workers' hold
            cells += [f"{median(name, lambda r: r['timing']['replay_s'] + r['timing']['parity_s']):.1f}", "–", "–",
                      "–"]
        else:
            over = median(name, lambda r: r["timing"]["capture_s"] - r["timing"]["worker_capture_s"]
                          - r["timing"]["worker_load_s"] + r["timing"]["replay_s"] - r["timing"]["worker_replay_s"])
            cells += [f"{median(name, timing('replay_s')):.1f}", f"{median(name, timing('ray_start_s')):.1f}",
                      f"{over:.1f}", f"{median(name, timing('merge_s')):.2f}"]
        cells += [f"{median(name, lambda r: r['peak']):.0f}", f"{difference:.1e}"]
        print("| " + " | ".join(cells) + " |")
    print(f"\n`python benchmarks/ray_replay.py --size {args.size} --model {args.model} --repeats {args.repeats}`")


if __name__ == "__main__":
    main()
