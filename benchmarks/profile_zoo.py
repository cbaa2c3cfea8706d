"""Profile every zoo model against Dense: latency ratio, profiling overhead, coverage, execution.

    python benchmarks/profile_zoo.py [--runs 20] [--warmup 3] [--threads 1] [--provider cpu]
                                     [--models featuregate,mudd,moe,earlyexit] [--json out.json]

For each model in fixtures/ (and Dense itself), one `profile_model` call on its eval.npz at
batch size 1, with fixtures/dense/model.onnx as the baseline: the un-profiled and the
profiled runs are timed side by side in the same process, so the overhead (profiled over
un-profiled median latency) and the coverage (node time over run time) come from one run.
Prints a Markdown table for BENCHMARKS.md and one for fixtures/README.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphaudit.profile import profile_model  # noqa: E402

MODELS = ("dense", "featuregate", "mudd", "moe", "earlyexit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile-runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--opt-level", default="all")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    dense = ROOT / "fixtures" / "dense" / "model.onnx"
    results = {}
    for name in args.models.split(","):
        model = ROOT / "fixtures" / name / "model.onnx"
        if not model.is_file():
            print(f"skipping {name}: {model} not found", file=sys.stderr)
            continue
        report = profile_model(model, ROOT / "fixtures" / name / "eval.npz", baseline=dense, runs=args.runs,
                               warmup=args.warmup, profile_runs=args.profile_runs, threads=args.threads,
                               provider=args.provider, opt_level=args.opt_level, limit=args.limit)
        results[name] = report.to_json()
        print(f"{name}: done", file=sys.stderr)

    print(f"onnxruntime {ort.__version__}, {platform.processor() or platform.machine()}, "
          f"provider {args.provider}, opt level {args.opt_level}, threads {args.threads}, "
          f"{args.runs} rounds after {args.warmup} warm-up, {args.profile_runs} profiled\n")
    print("| model | latency ms per input, median (p10–p90) | mean | profiled mean | overhead | coverage "
          "| unmapped | node times |")
    print("|---|---|---|---|---|---|---|---|")
    for name, doc in results.items():
        lat, prof = doc["latency_ms"], doc["profiled_latency_ms"]
        print(f"| {name} | {lat['median']:.3f} ({lat['p10']:.3f}–{lat['p90']:.3f}) | {lat['mean']:.3f} | {prof['mean']:.3f} | "
              f"×{doc['profiling_overhead']:.2f} | {doc['coverage']:.1%} | {doc['unmapped_share']:.1%} | "
              f"{doc['node_time_kind']} |")
    print()
    print("| model | ratio to Dense (p10–p90) | blocks executed on every input | blocks executed on some inputs "
          "| nodes at value-dependent shapes | FLOPs/input |")
    print("|---|---|---|---|---|---|")
    for name, doc in results.items():
        ratio = {**doc["baseline"]["ratio_spread"], "median": doc["baseline"]["ratio"]}
        blocks = [b for b in doc["blocks"] if b["name"] not in ("(other)", "(unmapped)")]
        always = [b["name"] for b in blocks if b["executed_fraction"] == 1.0 and b["node_fraction"]["min"] == 1.0]
        some = [f"{b['name']} ({b['executed_fraction']:.0%} of inputs, nodes {b['node_fraction']['min']:.0%}–"
                f"{b['node_fraction']['max']:.0%})" for b in blocks if b["name"] not in always]
        varying = sum(len(b.get("value_dependent_shapes") or []) for b in doc["blocks"])
        flops = doc["flops_executed"]
        print(f"| {name} | {ratio['median']:.3f} ({ratio['p10']:.3f}–{ratio['p90']:.3f}) | "
              f"{len(always)}/{len(blocks)} | {'; '.join(some) or '—'} | {varying} | "
              f"{'—' if flops is None else f'{flops / 1e6:.2f}M'} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
