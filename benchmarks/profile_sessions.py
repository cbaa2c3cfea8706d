"""Opening the profile's two sessions (the model's and its baseline's, each saving its optimised
model) side by side, on two threads, against one after the other as the profile opens them.

    python benchmarks/profile_sessions.py MODEL BASELINE [--repeats 5]

Each repeat opens the two sessions once each way, in a fresh process per way (the two ways'
order alternating from repeat to repeat), with the options the profile gives them: its
optimisation level, the profiler on, ORT's optimised model saved into a temporary folder.
Reported per way: the median seconds of the opening alone (min–max over repeats) and the
median peak resident memory of the process (its loading of the models included), and the
ratio of the medians. Both ways must save the same optimised graphs (nodes' names, operators,
inputs and outputs). Prints a Markdown table.

Side by side was tried in the profile and not kept: at Pythia-160M's shape it opened the two in
1.59x less time, and raised the whole audit's peak memory from 1.19-1.32x to 1.53-1.71x that of
its bare runs (benchmarks/NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.measured import run_measured  # noqa: E402

WAYS = ("one after the other", "side by side")

CHILD = r"""
import hashlib, json, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import onnx
from graphaudit.load.model import load_for_runtime
from graphaudit.profile.session import open_session, runnable_model, session_options
from graphaudit.runtime.sessions import resolve_providers

way, paths = sys.argv[1], sys.argv[2:]
models = [runnable_model(load_for_runtime(p)) for p in paths]
providers = resolve_providers("cpu")
with tempfile.TemporaryDirectory(prefix="graphaudit-sessions-") as folder:
    folder = Path(folder)
    jobs = [(m, session_options("all", None, folder / f"profile-{i}", folder / f"optimised-{i}.onnx", spinning=False))
            for i, m in enumerate(models)]
    start = time.perf_counter()
    if way == "side by side":  # ONNX Runtime's constructor lets go of the GIL
        with ThreadPoolExecutor(len(jobs)) as pool:
            sessions = [f.result() for f in [pool.submit(open_session, m, providers, o) for m, o in jobs]]
    else:
        sessions = [open_session(m, providers, o) for m, o in jobs]
    seconds = time.perf_counter() - start
    for s in sessions:
        s.end_profiling()
    del sessions
    digest = hashlib.sha256()
    for i in range(len(models)):
        graph = onnx.load(str(folder / f"optimised-{i}.onnx"), load_external_data=False).graph
        for n in graph.node:
            digest.update(repr((n.name, n.domain, n.op_type, list(n.input), list(n.output))).encode())
print(json.dumps({"seconds": seconds, "graphs": digest.hexdigest()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("baseline")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    peaks: dict[str, list[float]] = {way: [] for way in WAYS}
    graphs = set()
    for repeat in range(args.repeats):
        for way in WAYS if repeat % 2 == 0 else reversed(WAYS):
            _, peak, out = run_measured([sys.executable, "-c", CHILD, way, args.model, args.baseline], ROOT)
            found = json.loads(out)
            seconds[way].append(found["seconds"])
            peaks[way].append(peak)
            graphs.add(found["graphs"])
    if len(graphs) != 1:
        raise SystemExit("the two ways saved different optimised graphs")
    print(f"{args.model} and {args.baseline}: {args.repeats} repeats; the same optimised "
          f"graphs both ways (sha256 of their nodes {graphs.pop()[:12]})")
    print("| the two sessions opened | median s (min–max) | vs one after the other | peak MiB (median) |")
    print("|---|---|---|---|")
    base = statistics.median(seconds[WAYS[0]])
    for way in WAYS:
        median = statistics.median(seconds[way])
        print(f"| {way} | {median:.2f} ({min(seconds[way]):.2f}–{max(seconds[way]):.2f}) | {base / median:.2f}× | "
              f"{statistics.median(peaks[way]):.0f} |")


if __name__ == "__main__":
    main()
