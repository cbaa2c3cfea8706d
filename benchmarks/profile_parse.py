"""Reading ONNX Runtime's profiler files (graphaudit.profile.events.parse_profile), with the
garbage collector paused as `parse_profile` runs it, against the same parse with it running.

    python benchmarks/profile_parse.py [--model mudd] [--rounds 7]

The profile is the one `graphaudit profile` takes of the zoo model on its evaluation data
(default settings, kept with `keep_profiles`): the profiled runs' file and the per-input
evidence file. Each round parses both files once each way, the two ways interleaved, one
warm-up round discarded; the median seconds (min–max over rounds) and the ratio. Both ways
must give the same runs and events. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphaudit.profile import profile_model  # noqa: E402
from graphaudit.profile.events import _parsed, parse_profile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mudd")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    fixture = ROOT / "fixtures" / args.model
    with tempfile.TemporaryDirectory() as kept:
        profile_model(fixture / "model.onnx", fixture / "eval.npz", keep_profiles=kept)
        files = sorted(p for p in Path(kept).glob("*.json"))
        ways = {"GC running": _parsed, "GC paused (parse_profile)": parse_profile}
        first = {name: [way(f) for f in files] for name, way in ways.items()}
        assert first["GC running"] == first["GC paused (parse_profile)"], "the two ways parse differently"
        events = sum(len(run.events) for profile in first["GC running"] for run in profile.runs)
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, way in ways.items():
                start = time.perf_counter()
                for f in files:
                    way(f)
                times[name].append(time.perf_counter() - start)
        size = sum(f.stat().st_size for f in files) / 2**20
    print(f"{args.model}: {len(files)} profiler files, {size:.1f} MiB, {events:,} node events in runs; "
          f"{args.rounds} rounds")
    print("| parse | median s (min–max) | vs GC running |")
    print("|---|---|---|")
    base = statistics.median(times["GC running"])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"| {name} | {median:.3f} ({min(seconds):.3f}–{max(seconds):.3f}) | {base / median:.2f}× |")


if __name__ == "__main__":
    main()
