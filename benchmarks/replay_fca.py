"""Frozen-controller replay: overhead over bare ONNX Runtime, ORT vs PyTorch hooks, memory at 4× inputs.

    python benchmarks/replay_fca.py [--models featuregate,mudd] [--repeats 7] [--batch-size 16]
                                    [--torch-batch-sizes 1,4,16] [--threads 1] [--inputs 128]
                                    [--skip overhead,torch,memory] [--widths 256,512 [--vocab V]]
                                    [--shapes 70m,160m]

1. overhead: `run_conditions` (the replay loop: every condition's feeds built from the
   cache, ORT run of the frozen graph plus its log-softmax output, metrics, the parity of
   every target against the live log-probabilities the capture kept; each run scored while
   the next runs in a worker thread when the session leaves a core free, as at --threads 1
   on a machine of 2 cores or more; what no coefficient reaches run once per batch, as
   `replay()` does: graphaudit.replay.prefix, off with --no-cut; masked fills and Einsums rewritten
   as `replay()` does: graphaudit.replay.rewrite, off with --no-rewrite) against the sum of bare
   `session.run` calls of the whole frozen graph alone, as exported, on the same, precomputed
   feeds, and against bare runs of the same graph cut and rewritten as the replay's is (the
   harness's own overhead), in the same process, alternating,
   warm-up discarded; median of the per-pair ratios of wall time (the target) and of CPU
   time (`time.process_time`, all threads: the work, which the overlap does not shrink).
   Then, for as many loops again, where the loop's wall time goes: inside ORT's `run` calls
   (timed around each call, in whichever thread makes it), before the first, between runs,
   after the last; "loop / runs inside" is the harness's own share, which the machine's
   noise inflates far less than the ratio of two loops timed apart.
   At --threads 2 and more, each session's intra-op pool spins after its runs and slows the
   other session's (two sessions alternating ran 40% slower than one alone here), so the
   comparison is only clean at --threads 1.
2. torch: the same loop in ONNX Runtime against PyTorch eager, where forward hooks on the
   controller modules substitute the same coefficients (and the same NLL/KL sums are kept);
   both on the same number of threads and batch size (each of --torch-batch-sizes), the ORT
   loop without its overlap (so that neither side scores on a core of its own; the overlap's
   gain is comparison 1's); the NLL of each condition is checked to agree.
3. memory: `replay()` in a fresh subprocess on N and 4N inputs (windows of the zoo's data,
   rolled), peak RSS (VmHWM) and peak traced Python/NumPy heap (tracemalloc), with the
   cache in memory (default limit) and memory-mapped (limit 0) (`benchmarks/replay_memory.py`).
`--widths` adds, to comparisons 1 and 2, untrained copies of each model at those widths
(exported to a temporary folder, fed the fixture's data): how the overhead and the speed-up
change as the matrix products grow against the scored output and the per-run work. `--shapes`
adds copies at the scale benchmark's whole shapes (depth, width, heads, d_ff, vocabulary).
Prints Markdown tables for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replay_memory import memory  # noqa: E402 - beside this script

from graphaudit.analyses.declared_coefficients import declared_coefficients  # noqa: E402
from graphaudit.load.data import input_specs, load_data  # noqa: E402
from graphaudit.load.model import load_model  # noqa: E402
from graphaudit.metrics import PoissonBootstrap, task_for  # noqa: E402
from graphaudit.replay.capture import capture, native  # noqa: E402
from graphaudit.replay.conditions import conditions  # noqa: E402
from graphaudit.replay.conditions import names as condition_names  # noqa: E402
from graphaudit.replay.loop import run_conditions  # noqa: E402
from graphaudit.replay.parity import EveryInputCheck, check_parity, every_input_summary  # noqa: E402
from graphaudit.replay.prefix import PrefixSession, open_frozen  # noqa: E402
from graphaudit.replay.rewrite import Rewrite  # noqa: E402
from graphaudit.replay.surgery import Freeze, LogProbs, Trace  # noqa: E402
from graphaudit.runtime.sessions import PROVIDERS, create_session, slow_fusions, spare_core  # noqa: E402

FIXTURES = ROOT / "fixtures"
# coefficient family -> the controller module whose output a forward hook replaces
HOOKED_MODULES = {"gate": "blocks.{layer}.gate", "mudd": "blocks.{layer}.mudd"}


class Setup:
    """One zoo model's captured coefficients, condition feeds and frozen session.

    `wider`: an untrained, wider copy of the model (see `Wider`) instead of the trained
    fixture; the data are the fixture's either way.
    """

    def __init__(self, name: str, batch_size: int, threads: int, seed: int = 0, wider: Wider | None = None,
                 flush_denormals: bool = True, cut: bool = True, rewrite: bool = True):
        self.name, self.batch_size, self.wider = name, batch_size, wider
        loaded = load_model(wider.path if wider else FIXTURES / name / "model.onnx")
        self.coefs = declared_coefficients(loaded.model)
        specs = input_specs(loaded.model)
        self.calib, self.eval = (load_data(FIXTURES / name / f"{k}.npz", specs) for k in ("calib", "eval"))
        trace = Trace(self.coefs)(loaded.model).model
        # as in replay(): the evaluation capture keeps what the parity check of every input needs
        self.caches = [capture(trace, self.coefs, d, batch_size=batch_size, check=check)
                       for d, check in ((self.calib, None), (self.eval, every_input_summary(self.eval)))]
        self.feeds = conditions(condition_names(), self.caches[1], self.caches[0], seed)
        self.task = task_for(self.caches[1].live, next(self.eval.batches(batch_size))[1], {})
        exported = frozen = Freeze(self.coefs)(loaded.model).model
        # as in replay(): the sessions leave out the same fusions and flush denormals alike, and the
        # replay's runs what no coefficient reaches once per batch (graphaudit.replay.prefix) unless `cut` is off
        settings = {"disabled_optimizers": slow_fusions(), "flush_denormals": flush_denormals, "threads": threads}
        cpu = [PROVIDERS["cpu"]]
        if rewrite:  # as replay() does on the CPU: its operators rewritten into faster ones (graphaudit.replay.rewrite)
            frozen = Rewrite()(frozen).model
        replayed = LogProbs(self.task.output, self.task.fetch)(frozen).model
        self.session = (open_frozen(replayed, self.coefs, cpu, None, threads, flush_denormals) if cut
                        else create_session(replayed, **settings))
        # the frozen graph alone, whole and as exported: what a user would run without graphaudit
        self.bare_session = create_session(exported, **settings)
        # the same graph cut as the replay's is: its prefix once per batch, the rest per condition
        self.bare_cut = open_frozen(frozen, self.coefs, cpu, None, threads, flush_denormals) if cut else None
        self.parity = check_parity(self.session, self.feeds["correct"], self.coefs, self.caches[1], self.eval,
                                   batch_size, 1e-4)
        self.seed = seed
        self.replayed, self.threads, self.flush_denormals = replayed, threads, flush_denormals

    def replay_loop(self, overlap: bool | None = None, session=None):
        return run_conditions(session or self.session, self.feeds, self.coefs, self.eval, self.batch_size, self.task,
                              PoissonBootstrap(self.seed, 1000), every=EveryInputCheck(self.caches[1], self.parity),
                              overlap=overlap)

    def prepared_feeds(self) -> list[dict]:
        out = []
        for rows, inputs in self.eval.batches(self.batch_size):
            index = np.arange(rows.start, rows.stop)
            for feed in self.feeds.values():
                out.append({**inputs, **{c.tensor: native(c, feed(c, index)) for c in self.coefs}})
        return out


class Wider:
    """An untrained zoo model at another width, exported to `folder` (PyTorch module kept for the hooks);
    `shape`: one of the scale benchmark's (benchmarks/scale.py, SIZES: Pythia's 70M or 160M), whole."""

    def __init__(self, name: str, width: int, vocab: int, folder: Path, shape: str | None = None):
        from exporters.export import export_live
        from exporters.zoo import build_model

        if shape is not None:
            from scale import SIZES

            self.config = dict(SIZES[shape])
            width, vocab = self.config["d_model"], self.config["vocab"]
        else:
            self.config = {"d_model": width, "d_ff": 2 * width, "n_heads": max(1, width // 16), "vocab": vocab}
        self.width, self.vocab, self.shape = width, vocab, shape
        torch_seed()
        self.module = build_model(name, **self.config).eval()
        self.path = folder / f"{name}_{shape or width}_{vocab}.onnx"
        export_live(self.module, self.path)

    @property
    def label(self) -> str:
        if self.shape is not None:
            c = self.config
            return (f"the {self.shape} shape ({c['n_layers']} layers, width {c['d_model']}, d_ff {c['d_ff']}, "
                    f"vocab {c['vocab']}), untrained")
        return f"width {self.width}, vocab {self.vocab}, untrained"


def torch_seed() -> None:
    import torch

    torch.manual_seed(0)


def timed(fn) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e6


def side_by_side(a, b, repeats: int) -> tuple[list[float], list[float]]:
    """Alternate a and b `repeats` times after one discarded warm-up each; wall milliseconds."""
    wall, _ = interleaved([a, b], repeats)
    return wall[0], wall[1]


def interleaved(fns, repeats: int) -> tuple[list[list[float]], list[list[float]]]:
    """Run each of `fns` in turn, `repeats` times, after one discarded warm-up each: wall and
    CPU (`time.process_time`, every thread of the process) milliseconds of each."""
    for fn in fns:
        fn()
    wall: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.process_time()
            wall[i].append(timed(fn))
            cpu[i].append((time.process_time() - start) * 1e3)
    return wall, cpu


def label(setup: Setup) -> str:
    return f"{setup.name} ({setup.wider.label})" if setup.wider else setup.name


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ms (min {min(values):.1f}, max {max(values):.1f})"


def overhead(setup: Setup, repeats: int) -> list[dict]:
    """The replay loop against the bare runs of the whole frozen graph and, where the replay cuts
    it (graphaudit.replay.prefix), against bare runs of the same cut graph; where the session leaves a
    core free (the loop overlaps runs and scoring), also the loop made to run without the
    overlap, in the same rounds."""
    prepared = setup.prepared_feeds()
    output = [setup.task.output]
    bare = lambda: [setup.bare_session.run(output, f) for f in prepared]  # noqa: E731
    contenders = [bare]
    if isinstance(setup.bare_cut, PrefixSession):
        contenders.append(lambda: [setup.bare_cut.run(output, f) for f in prepared])
    modes = [True, False] if spare_core(setup.session) else [False]
    wall, cpu = interleaved([*contenders, *(lambda o=o: setup.replay_loop(overlap=o) for o in modes)], repeats)
    cut = wall[1] if len(contenders) == 2 else None
    rows = []
    for i, mode in enumerate(modes, start=len(contenders)):
        ratios = [r / b for r, b in zip(wall[i], wall[0])]
        rows.append({"model": label(setup), "batch_size": setup.batch_size, "runs_per_loop": len(prepared),
                     "overlap": mode, "replay_ms": wall[i], "bare_ms": wall[0], "ratios": ratios,
                     "ratio_median": statistics.median(ratios),
                     "ratio_of_medians": statistics.median(wall[i]) / statistics.median(wall[0]),
                     "cpu_ratio_median": statistics.median([r / b for r, b in zip(cpu[i], cpu[0])]),
                     "bare_cut_ms": cut,
                     "cut_ratio_median": statistics.median([r / b for r, b in zip(wall[i], cut)]) if cut else None,
                     "breakdown_ms": breakdown(setup, repeats, mode)})
    return rows


class TimedRuns:
    """The replay's session, recording when each `run` starts and ends (whichever thread calls it)."""

    def __init__(self, session):
        self.session, self.spans = session, []

    def run(self, *args, **kwargs):
        start = time.perf_counter_ns()
        out = self.session.run(*args, **kwargs)
        self.spans.append((start, time.perf_counter_ns()))
        return out


def breakdown(setup: Setup, repeats: int, overlap: bool) -> dict:
    """Where the replay loop's wall time goes, medians over `repeats` loops timed after the
    comparison (alternating with the bare runs): inside ORT's `run` calls, before the first,
    between runs, after the last; milliseconds."""
    prepared = setup.prepared_feeds()
    output = [setup.task.output]
    timed = TimedRuns(setup.session)
    parts: dict[str, list[float]] = {k: [] for k in ("loop", "runs", "before", "between", "after", "bare")}
    setup.replay_loop(overlap, timed)
    for _ in range(repeats):
        timed.spans.clear()
        start = time.perf_counter_ns()
        setup.replay_loop(overlap, timed)
        end = time.perf_counter_ns()
        spans = timed.spans
        parts["loop"].append(end - start)
        parts["runs"].append(sum(b - a for a, b in spans))
        parts["before"].append(spans[0][0] - start)
        parts["between"].append(sum(spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1)))
        parts["after"].append(end - spans[-1][1])
        parts["bare"].append(timed_ns(lambda: [setup.bare_session.run(output, f) for f in prepared]))
    return {k: statistics.median(v) / 1e6 for k, v in parts.items()}


def timed_ns(fn) -> int:
    start = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - start


def torch_replay(setup: Setup, threads: int):
    """A PyTorch eager replay of the same conditions: forward hooks substitute the coefficients."""
    import warnings

    import torch

    from exporters.zoo import load_trained

    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # static feeds are read-only
    torch.set_num_threads(threads)
    # a module of its own each time: the hooks registered below stay on it
    model = copy.deepcopy(setup.wider.module) if setup.wider else load_trained(setup.name, FIXTURES)
    current: dict[str, torch.Tensor] = {}
    for c in setup.coefs:
        module = model.get_submodule(HOOKED_MODULES[c.family].format(layer=c.layer))
        module.register_forward_hook(lambda mod, args, out, key=c.tensor: current[key])

    def loop() -> dict[str, float]:
        totals = {name: [0.0, 0.0] for name in setup.feeds}
        with torch.inference_mode():
            for rows, inputs in setup.eval.batches(setup.batch_size):
                index = np.arange(rows.start, rows.stop)
                ids = torch.from_numpy(inputs["input_ids"])
                reference = None
                for name, feed in setup.feeds.items():
                    current.update({c.tensor: torch.from_numpy(native(c, feed(c, index))) for c in setup.coefs})
                    logits, _ = model(ids)
                    logp = torch.log_softmax(logits.float(), dim=-1)
                    nll = -logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1).sum(-1)
                    reference = logp if reference is None else reference
                    kl = (reference.exp() * (reference - logp)).sum(-1).sum(-1)
                    totals[name][0] += float(nll.sum())
                    totals[name][1] += float(kl.sum())
        targets = setup.eval.count * (setup.eval.arrays["input_ids"].shape[1] - 1)
        return {name: nll / targets for name, (nll, _) in totals.items()}

    return loop


def versus_torch(setup: Setup, repeats: int, threads: int) -> dict:
    loop = torch_replay(setup, threads)
    ours = lambda: setup.replay_loop(overlap=False)  # noqa: E731 - PyTorch's loop scores inline too
    ort_ms, torch_ms = side_by_side(ours, loop, repeats)
    stats, torch_nll = ours(), loop()
    agreement = max(abs(stats[n].figure("nll")[0] - torch_nll[n]) for n in stats)
    return {"model": label(setup), "batch_size": setup.batch_size, "ort_ms": ort_ms, "torch_ms": torch_ms,
            "speedup": statistics.median(torch_ms) / statistics.median(ort_ms), "max_nll_diff": agreement}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="featuregate,mudd")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--torch-batch-sizes", default="1,4,16")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of every session (default 1: at 2 and more, the two sessions of the "
                             "overhead comparison slow each other, see the module doc)")
    parser.add_argument("--inputs", type=int, default=128, help="N for the memory benchmark (also runs 4N)")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: overhead, torch, memory")
    parser.add_argument("--widths", default="",
                        help="comma-separated model widths at which to add untrained copies of each model (d_ff twice "
                             "the width, 16 dimensions per head) to the overhead and torch comparisons")
    parser.add_argument("--vocab", type=int, default=0, help="vocabulary of those copies (default 16 x the width)")
    parser.add_argument("--shapes", default="",
                        help="comma-separated shapes of benchmarks/scale.py (70m, 160m: Pythia's layers, width, heads, "
                             "d_ff and vocabulary) at which to add untrained copies, like --widths")
    parser.add_argument("--keep-denormals", action="store_true",
                        help="run every ONNX Runtime session with its default floating-point mode instead of "
                             "flushing denormals to zero as replay() does (graphaudit.runtime.denormals)")
    parser.add_argument("--no-cut", action="store_true",
                        help="replay the whole frozen graph in every run instead of its prefix once per batch "
                             "(graphaudit.replay.prefix), as replay() did before it cut")
    parser.add_argument("--no-rewrite", action="store_true",
                        help="replay the frozen graph's operators as exported, not rewritten as replay() does on the "
                             "CPU (graphaudit.replay.rewrite)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    names = [n for n in args.models.split(",") if (FIXTURES / n / "model.onnx").is_file()]
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, "
          f"threads {args.threads}, batch {args.batch_size}, repeats {args.repeats}, denormals "
          f"{'kept' if args.keep_denormals else 'flushed to zero'}, {'whole graph' if args.no_cut else 'prefix cut'}, "
          f"{'operators as exported' if args.no_rewrite else 'rewritten (graphaudit.replay.rewrite)'}")
    results: dict[str, list] = {"overhead": [], "torch": [], "memory": []}
    widths = [int(w) for w in args.widths.split(",") if w]
    flush = not args.keep_denormals
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            shapes = [Wider(name, 0, 0, Path(tmp), shape) for shape in args.shapes.split(",") if shape]
            for wider in [None, *(Wider(name, w, args.vocab or 16 * w, Path(tmp)) for w in widths), *shapes]:
                if "overhead" not in skip:
                    results["overhead"] += overhead(Setup(name, args.batch_size, args.threads, wider=wider, flush_denormals=flush,
                                                          cut=not args.no_cut, rewrite=not args.no_rewrite),
                                                    args.repeats)
                if "torch" not in skip:
                    for size in map(int, args.torch_batch_sizes.split(",")):
                        results["torch"].append(versus_torch(Setup(name, size, args.threads, wider=wider,
                                                                   flush_denormals=flush, cut=not args.no_cut,
                                                                   rewrite=not args.no_rewrite),
                                                             args.repeats, args.threads))
            if "memory" not in skip:
                results["memory"] += memory(name, args.inputs)
    if results["overhead"]:
        print("\n| model | batch | ORT runs per loop | overlap | replay loop | bare `run` calls | wall ratio (median of pairs) "
              "| pairs over 1.10 | CPU ratio (median of pairs) | bare runs of the cut graph | wall ratio to those |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in results["overhead"]:
            over = sum(x > 1.10 for x in r["ratios"])
            cut = (f"{spread(r['bare_cut_ms'])} | {r['cut_ratio_median']:.3f}" if r["bare_cut_ms"] else "— | —")
            print(f"| {r['model']} | {r['batch_size']} | {r['runs_per_loop']} | {'yes' if r['overlap'] else 'no'} | "
                  f"{spread(r['replay_ms'])} | {spread(r['bare_ms'])} | "
                  f"{r['ratio_median']:.3f} | {over}/{len(r['ratios'])} | {r['cpu_ratio_median']:.3f} | {cut} |")
        print("\nWhere the loop's time goes (medians over as many loops again, timed after the comparison, "
              "each beside a bare loop; ms):\n")
        print("| model | overlap | loop | inside ORT's runs | before the first run | between runs | after the last run "
              "| bare runs | runs inside / bare | loop / runs inside |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in results["overhead"]:
            b = r["breakdown_ms"]
            print(f"| {r['model']} | {'yes' if r['overlap'] else 'no'} | {b['loop']:.1f} | {b['runs']:.1f} | "
                  f"{b['before']:.2f} | {b['between']:.2f} | {b['after']:.2f} | {b['bare']:.1f} | "
                  f"{b['runs'] / b['bare']:.3f} | {b['loop'] / b['runs']:.3f} |")
    if results["torch"]:
        print("\n| model | batch | ORT frozen replay | PyTorch eager + hooks | speed-up | max abs ΔNLL between them |")
        print("|---|---|---|---|---|---|")
        for r in results["torch"]:
            print(f"| {r['model']} | {r['batch_size']} | {spread(r['ort_ms'])} | {spread(r['torch_ms'])} | {r['speedup']:.2f}× | "
                  f"{r['max_nll_diff']:.1e} |")
    if results["memory"]:
        print("\n| model | coefficient cache | inputs | cache size | peak RSS | peak traced heap |")
        print("|---|---|---|---|---|---|")
        for r in results["memory"]:
            print(f"| {r['model']} | {r['cache']} | {r['inputs']} | {r['cache_mib']:.1f} MiB | {r['rss_mib']:.1f} MiB | "
                  f"{r['heap_mib']:.1f} MiB |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
