"""`profile_model`: time, profile and read the execution of a model on given inputs.

Two sessions per model, all on the same sample of the inputs (profile/rounds.py). One at the
asked optimisation level runs the profiled rounds, for per-node and per-block shares, then,
its profiler ended, the timed rounds for latency (interleaved with the baseline's, when there
is one), going on until the latency's interval is as tight as asked or the budget is spent;
the profiled rounds' overhead is read against the timed rounds of the same inputs. Unless
that level is already ORT_DISABLE_ALL, a profiled one at ORT_DISABLE_ALL runs once per
sampled input, for the execution evidence (every event one node); the baseline's, whose one
use is its executed FLOPs, only where the static count handed in (`baseline_static`) is not
already them (baseline.counted_flops; at Pythia-160M's shape it took 2 s of a 64 s audit).
Each session reads the model's file once: a session of one job each made three, and at
Pythia-160M's shape the sessions were a third of the profile.
Profiler files and ORT's optimised model go to a fresh folder (`workdir`): a temporary one,
removed after, or one inside `keep_profiles` whose files are moved into it, none onto an input.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from graphaudit.errors import UsageError
from graphaudit.graph.build import build_graph
from graphaudit.load.data import (
    InputData,
    check_batch_size,
    fixed_batch,
    from_arrays,
    input_specs,
    load_data,
    whole_batches,
)
from graphaudit.load.model import LoadedModel, load_for_runtime
from graphaudit.profile.agreement import compare_verdicts
from graphaudit.profile.baseline import COUNTED, MEASURED, check_same_inputs, compare, counted_flops, same_work
from graphaudit.profile.breakdown import breakdown
from graphaudit.profile.events import Profile, Run, parse_profile
from graphaudit.profile.execution import read_execution
from graphaudit.profile.latency import (
    Runner,
    batch_latency_ms,
    first_of_each_shape,
    make_runner,
    per_input_ms,
    time_rounds,
    warm_up,
)
from graphaudit.profile.mapping import OTHER, NodeMap, assign_blocks, one_to_one, through_optimised
from graphaudit.profile.report import ProfileReport
from graphaudit.profile.rounds import (
    DEFAULT_WARMUP,
    FIX_THEM,
    MOST_CHOSEN_RUNS,
    Rounds,
    TimedRounds,
    after_timing_s,
    check_budget,
    check_decide_at,
    check_precision,
    check_rounds,
    plan_sample,
    profiled_rounds,
    sample_rows,
)
from graphaudit.profile.session import (
    ORT_LEVEL_NAMES,
    RunnableModel,
    held_for_profile,
    load_optimised,
    open_session,
    runnable_model,
    session_options,
)
from graphaudit.profile.settings import ProfileSettings
from graphaudit.profile.trace import trace_events, write_trace
from graphaudit.profile.workdir import BASELINE_OPTIMISED, OPTIMISED, input_files, workdir
from graphaudit.progress import Progress
from graphaudit.runtime.handed_weights import weight_bytes
from graphaudit.runtime.sessions import resolve_providers, running, usable_threads

# Past this many bytes of weights no optimised model is saved, and events are mapped by name: where
# the session holds the weights, ORT would copy them beside it; where it maps them, the weights its
# fusions make (concatenated, transposed) would still go into the saved graph, and could pass
# protobuf's 2 GiB limit
OPTIMISED_COPY_LIMIT = 2**30


def profile_model(
    model: str | os.PathLike | LoadedModel,
    data: str | os.PathLike | InputData,
    settings: ProfileSettings | None = None,
    *,
    baseline: str | os.PathLike | LoadedModel | None = None,
    block_map: Any | None = None,
    static: Any | None = None,
    baseline_static: Any | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> ProfileReport:
    """Return the ProfileReport of `model` run on `data` (and `baseline` on the same inputs).

    `settings` (a ProfileSettings) says how; keywords `options` name its fields one by one
    (`profile_model(m, data, runs=5)`), over `settings` when both are given. Blocks come from
    `block_map` if given, else from the static block finder (with the settings' `block_pattern`);
    a StaticReport given as `static` has its block verdicts checked against what ran; the baseline's
    as `baseline_static` stands for its executed FLOPs where it is them (baseline.counted_flops),
    and its evidence runs are left out; where they say every input does the same work
    (baseline.same_work), a chosen sample holds the fewest inputs, and those it leaves out do not
    widen the ratio's interval. `batch_size`
    None: 1, or the model's own batch when its inputs fix their first dimension (another size is
    then a UsageError; inputs past the last whole batch are left out, with a note). `feeding`:
    values fed whole to every run and inputs batched on an axis of their own
    (graphaudit.load.feeding). `sample`, `runs`, `profile_runs` None: chosen from measured times
    to fit `budget` seconds, the timed rounds stopping at `precision` (profile/rounds.py; the
    report says what ran and why); `warmup` None: 2 runs per input shape and session.
    """
    asked = ProfileSettings.of(settings, **options)
    runs, warmup, profile_runs, budget = asked.runs, asked.warmup, asked.profile_runs, asked.budget
    batch_size, provider, opt_level, threads = asked.batch_size, asked.provider, asked.opt_level, asked.threads
    limit, trace, keep_profiles, feeding = asked.limit, asked.trace, asked.keep_profiles, asked.feeding
    block_pattern = asked.block_pattern
    given = {"runs": runs, "profile_runs": profile_runs, "batch_size": batch_size}
    _check_counts(**{k: v for k, v in given.items() if v is not None},
                  **({"warmup": (warmup, 0)} if warmup is not None else {}))
    check_budget(budget)
    check_precision(asked.precision)
    check_decide_at(asked.decide_at)
    check_rounds(1, runs, warmup, profile_runs, asked.sample)  # before the model is read; again once batched
    warmup = DEFAULT_WARMUP if warmup is None else warmup
    session_options(opt_level)  # an unknown level is refused before anything runs
    threads, capped = usable_threads(threads)
    loaded, inputs, base = _load(model, data, baseline, limit, feeding)
    specs = input_specs(loaded.model, feeding=inputs.feeding)
    batch_size = check_batch_size(specs, batch_size) or 1
    inputs, cut = whole_batches(inputs, fixed_batch(specs))
    providers = resolve_providers(provider)
    n = -(-inputs.count // batch_size)
    check_rounds(min(n, asked.sample or n), runs, warmup)
    batches = list(inputs.batches(batch_size))
    feeds = [feed for _, feed in batches]
    feed_shapes = [tuple((k, tuple(v.shape)) for k, v in sorted(feed.items())) for feed in feeds]
    # where every input does the same work in each graph, a sample needs no more than the fewest
    # inputs, and those it leaves out widen nothing
    alike = same_work([static] if base is None else [static, baseline_static], feed_shapes)
    runnable = runnable_model(loaded)
    mg = build_graph(runnable.model)
    blocks = assign_blocks(mg, block_map, block_pattern)
    flop_counter = _flop_counter()

    data_file = [Path(data)] if isinstance(data, (str, os.PathLike)) else []
    with workdir(keep_profiles, [*input_files(loaded, base), *data_file]) as work:
        # one session per model, the profiler on for its profiled rounds and off for its timed
        # ones; ORT's optimised graph saved for the event mapping, unless saving it would have
        # ORT copy gigabytes of weights with it
        spinning = base is None  # sessions timed in alternation must not spin on each other's cores
        weights = _weight_bytes(loaded)
        models = [(runnable, work / "profile", work / OPTIMISED if weights <= OPTIMISED_COPY_LIMIT else None)]
        if base is not None:
            base_runnable = runnable_model(base)
            models.append((base_runnable, work / "baseline-profile",
                           work / BASELINE_OPTIMISED if _weight_bytes(base) <= OPTIMISED_COPY_LIMIT else None))
        saved = [where if opt_level != "disable" else None for _, _, where in models]
        # an optimised model refers to the weights its session maps where they lie (nothing is
        # copied), but a kept one holds its own beside it, to be read where it was moved
        sessions = [open_session(source, providers, session_options(
            opt_level, threads, prefix, where, spinning=spinning,
            side_file=source.holds_weights or keep_profiles is not None))
                    for (source, prefix, _), where in zip(models, saved)]
        # the first input's warm-up runs: where the inputs cannot run, they say so here, and the
        # last one's times plan the sample
        with running(_label(loaded) + (f" and the baseline {_label(base)}" if base is not None else "")):
            probe = [make_runner(s, [feeds[0]]) for s in sessions]
            run_s = [float(t) / 1e9 for t in warm_up(probe, [0], max(warmup, 1))]
            model_s, baseline_s = run_s[0], sum(run_s[1:])
            sample, sample_why = plan_sample(n, model_s, baseline_s, budget_s=budget, sample=asked.sample,
                                             profile_runs=profile_runs, alike=alike)
            del probe  # its runners hold the sessions: they go with the others
            chosen = sample_rows(n, sample)
            picked = [feeds[i] for i in chosen]
            runners = [make_runner(s, picked) for s in sessions]
            shapes = [feed_shapes[i] for i in chosen]
            others = first_of_each_shape(shapes, seen={feed_shapes[0]})
            warm_up(runners, others, warmup)
            warm_runs = max(warmup, 1) + warmup * len(others)  # of each session
            warm_s = warm_runs * (model_s + baseline_s)
            # per-node time: the profiled rounds, then the profiler off for the timed ones
            profile_runs = profiled_rounds(sample, profile_runs)
            profiled_ns = time_rounds(runners, sample, profile_runs, 0,
                                      done=_rounds_done(progress, "profiled rounds", profile_runs))
            files = [session.end_profiling() for session in sessions]
            # the timed rounds' budget: what the warm-up, the profiled rounds and the evidence leave
            spent = warm_s + float(profiled_ns.sum()) / 1e9
            after = after_timing_s(sample, model_s, baseline_s, profile_runs=0)
            stopper = TimedRounds(runs, asked.precision, max(0.0, budget - spent - after),
                                  decide_at=asked.decide_at, inputs=n, alike=alike)
            samples = _timed_rounds(runners, sample, stopper, progress)
        del runners, sessions  # their memory goes before the evidence sessions hold their own
        mine = _profiled(files[0], profiled_ns[0], runnable, mg, opt_level, saved[0], warm_runs, profile_runs,
                         sample)
        profile, timed_runs, node_map, optimised = mine.profile, mine.timed_runs, mine.node_map, mine.optimised
        base_blocks = None
        if base is not None:  # the baseline's blocks, profiled alike, to set beside the model's
            base_mg = build_graph(base_runnable.model)
            base_assigned = assign_blocks(base_mg)
            theirs = _profiled(files[1], profiled_ns[1], base_runnable, base_mg, opt_level, saved[1], warm_runs,
                               profile_runs, sample)
            base_blocks = breakdown(theirs.timed_runs, theirs.node_map, base_assigned, sample).blocks
            del theirs
        rows = [(batches[i][0].start, batches[i][0].stop) for i in chosen]
        # execution evidence: one run per input at ORT_DISABLE_ALL (the profile above when it was)
        if opt_level == "disable":
            evidence_runs = timed_runs[:sample]
        else:
            evidence_runs = _evidence_runs(runnable, providers, picked, threads, work / "evidence")
        execution = read_execution(evidence_runs, rows, shapes, mg, _one_to_one(mg, evidence_runs),
                                   blocks, flop_counter, _selections(static, mg))
        base_flops, base_source = None, None
        if base is not None and flop_counter is not None:
            base_flops, base_source = counted_flops(baseline_static, shapes), COUNTED
            if base_flops is None:  # its graph or the inputs' shapes leave what it executes open
                base_runs = _evidence_runs(base_runnable, providers, picked, threads, work / "baseline")
                base_flops = read_execution(base_runs, rows, shapes, base_mg, _one_to_one(base_mg, base_runs),
                                            base_assigned, flop_counter).mean_flops()
                base_source = MEASURED if base_flops is not None else None
        times = breakdown(timed_runs, node_map, blocks, sample)
        trace_path = None
        if trace is not None:
            events = trace_events(timed_runs, sample, node_map, blocks, f"graphaudit profile: {_label(loaded)}")
            trace_path = str(write_trace(trace, events, {"model": _label(loaded), "opt_level": opt_level}))
    stopper.finish(samples[0], samples[1] if len(samples) > 1 else None)
    rounds = _rounds(stopper, samples.shape[1], warmup, profile_runs, sample, n, sample_why, asked,
                     model_s + baseline_s, budget, base is not None)

    no_optimised = None
    if opt_level != "disable" and optimised is None:
        no_optimised = (f"the optimised model was not saved, as ORT could have written its {weights / 2**30:.1f} GiB "
                        "of weights, or what its fusions make of them, with it" if weights > OPTIMISED_COPY_LIMIT
                        else "ORT saved no optimised model")
    notes = _notes(blocks, execution, runnable.renamed, no_optimised) + tuple(n for n in (cut, capped) if n)
    return ProfileReport(
        model=_label(loaded),
        data=inputs.source,
        provider=providers[0],
        opt_level=ORT_LEVEL_NAMES[opt_level],
        mapping_method=node_map.method,
        mapping=node_map.describe(),
        mapping_counts=node_map.counts(),
        fused_nodes=len(node_map.fused),
        node_time_kind=profile.node_time_kind(),
        profile_layout=profile.layout,
        block_method=blocks.method,
        batch_size=batch_size,
        examples=inputs.count,
        runs=rounds.runs,
        warmup=warmup,
        profile_runs=profile_runs,
        rounds=rounds,
        latency_ms=batch_latency_ms(samples[0]),
        profiled_latency_ms=batch_latency_ms(mine.ns),
        overhead=float(per_input_ms(mine.ns).sum() / per_input_ms(samples[0]).sum()),
        input_latency_ms=tuple(float(x) for x in np.median(samples[0], axis=0) / 1e6),
        breakdown=times,
        execution=execution,
        baseline=compare(_label(base), samples[0], samples[1], base_flops, blocks=base_blocks,
                         flops_source=base_source, inputs=n, alike=alike) if base is not None else None,
        trace=trace_path,
        renamed_nodes=runnable.renamed,
        notes=notes,
        agreements=compare_verdicts(static, execution.blocks) if static is not None else (),
        threads=threads,
    )


@dataclass
class _Profiled:
    """A model's profiled rounds: the parsed profile, their times, the runs after the warm-up, the
    events' map onto the graph's nodes, and ORT's optimised graph where it was saved."""

    profile: Profile
    ns: np.ndarray
    timed_runs: tuple[Run, ...]
    node_map: NodeMap
    optimised: onnx.ModelProto | None


def _profiled(file: str, ns: np.ndarray, runnable: RunnableModel, mg, opt_level: str, optimised_path: Path | None,
              warm_runs: int, profile_runs: int, sample: int) -> _Profiled:
    """The profiled rounds of `runnable` read from ONNX Runtime's profiler `file`: `warm_runs`
    warm-up runs, then `profile_runs` rounds over `sample` inputs, timed at `ns`; the events
    mapped through ORT's optimised graph (saved at `optimised_path`, None: not saved) onto `mg`'s
    nodes."""
    profile = parse_profile(file)
    _check_run_count(len(profile.runs), warm_runs + profile_runs * sample)
    timed_runs = tuple(profile.runs[warm_runs:])
    names = {ev.name for run in timed_runs for ev in run.events}
    optimised = load_optimised(optimised_path) if optimised_path else None
    node_map = one_to_one(mg, names) if opt_level == "disable" else \
        through_optimised(mg, optimised or runnable.model, ORT_LEVEL_NAMES[opt_level], names)
    return _Profiled(profile, ns, timed_runs, node_map, optimised)


def _timed_rounds(runners: list[Runner], batches: int, stopper: TimedRounds,
                  progress: Progress | None) -> np.ndarray:
    """Nanoseconds per batch, shape (runner, round, batch), of the rounds `stopper` asks for:
    given rounds at once, chosen ones round by round until it says they are enough."""
    if stopper.runs is not None:
        return time_rounds(runners, batches, stopper.runs, 0, done=_rounds_done(progress, "timed rounds", stopper.runs))
    held = np.zeros((len(runners), MOST_CHOSEN_RUNS, batches), dtype=np.int64)
    tick, done = _rounds_done(progress, "timed rounds", None), 0
    while True:
        held[:, done:done + 1] = time_rounds(runners, batches, 1, 0, first=done, done=tick)
        done += 1
        now = held[:, :done]
        if not stopper.more(now[0], now[1] if len(runners) > 1 else None, float(now.sum()) / 1e9):
            return now


def _rounds(stopper: TimedRounds, runs: int, warmup: int, profile_runs: int, sample: int, inputs: int,
            sample_why: str, asked: ProfileSettings, run_s: float, budget: float, paired: bool) -> Rounds:
    """What the profile ran, and why, in words (`paired`: a baseline was timed beside the model)."""
    chosen = asked.sample is None or asked.runs is None or asked.profile_runs is None
    profiled = ("as given" if asked.profile_runs is not None else
                f"each node profiled in {profile_runs * sample} run{'s' if profile_runs * sample != 1 else ''}")
    parts = [f"sample: {sample_why}", stopper.describe(runs),
             f"{profile_runs} profiled round{'s' if profile_runs != 1 else ''} ({profiled})"]
    reason = "; ".join(parts) + (f"; chosen from measured times, so another run may choose others ({FIX_THEM})"
                                 if chosen else "")
    return Rounds(runs, warmup, profile_runs, reason, sample, inputs, run_s if chosen else None,
                  budget if chosen else None, asked.precision if asked.runs is None else None, stopper.reached,
                  stopper.stop, asked.decide_at if asked.runs is None and paired else None)


def _selections(static: Any | None, mg) -> dict[str, list[str]]:
    """Block name -> the nodes that pick the rows of activations it runs on, from the static
    verdicts' evidence (not a pick of experts' weights, which are no rows of the input)."""
    found: dict[str, list[str]] = {}
    for block in static.blocks if static is not None else ():
        for ev in block.evidence:
            node = mg.nodes.get(ev.node) if ev.kind == "selection" else None
            data = mg.tensors.get(node.inputs[0]) if node is not None and node.inputs and node.inputs[0] else None
            if data is not None and data.kind != "initializer":
                found.setdefault(block.name, []).append(ev.node)
    return found


def _load(model, data, baseline, limit, feeding=None) -> tuple[LoadedModel, InputData, LoadedModel | None]:
    """The model, its inputs (the first `limit`), and a baseline checked to take the same."""
    loaded = held_for_profile(load_for_runtime(model))
    inputs = data if isinstance(data, InputData) else load_data(data, input_specs(loaded.model, feeding=feeding),
                                                                feeding)
    if limit is not None:
        _check_counts(limit=limit)
        inputs = inputs.subset(slice(0, limit))
    base = None
    if baseline is not None:
        base = held_for_profile(load_for_runtime(baseline))
        check_same_inputs(input_specs(loaded.model), input_specs(base.model), _label(base))
        from_arrays(inputs.arrays, input_specs(base.model, feeding=inputs.feeding), inputs.source, inputs.feeding)
    return loaded, inputs, base


def _evidence_runs(runnable: RunnableModel, providers, feeds, threads, prefix: Path) -> tuple[Run, ...]:
    """One profiled run per input at ORT_DISABLE_ALL, where every event is one graph node."""
    session = open_session(runnable, providers, session_options("disable", threads, prefix))
    run = make_runner(session, feeds)
    for i in range(len(feeds)):
        run(i)
    runs = parse_profile(session.end_profiling()).runs
    _check_run_count(len(runs), len(feeds))
    return runs


def _one_to_one(mg, runs) -> NodeMap:
    return one_to_one(mg, {ev.name for run in runs for ev in run.events})


def _label(loaded: LoadedModel) -> str:
    return str(loaded.path) if loaded.path is not None else loaded.name


def _flop_counter():
    try:
        from graphaudit.analyses.flops import node_flops
    except ImportError:
        return None
    return node_flops


def _check_counts(**values) -> None:
    for name, value in values.items():
        value, least = value if isinstance(value, tuple) else (value, 1)
        if not isinstance(value, int) or value < least:
            raise UsageError(f"expected {name.replace('_', '-')} to be an integer of at least {least}, found {value!r}")


def _check_run_count(found: int, expected: int) -> None:
    if found != expected:
        # Not the user's doing: the profiler lost or added model_run events.
        raise RuntimeError(f"expected {expected} model_run events in the profile, found {found}")


def _weight_bytes(loaded: LoadedModel) -> int:
    """Bytes of the weights ONNX Runtime would write beside its optimised model of `loaded`: the
    external weight files it maps, and the initializers the proto holds (it writes those to the
    side file too, and those held apart as stubs alike), sized from their types and shapes, unread."""
    inline = sum(weight_bytes(t) for t in loaded.model.graph.initializer)
    if loaded.weights_folder is None:
        return inline
    return inline + sum((loaded.weights_folder / name).stat().st_size for name in loaded.external_files)


def _notes(blocks, execution, renamed: int, no_optimised: str | None) -> tuple[str, ...]:
    notes = []
    if blocks.names == (OTHER,):
        notes.append(f"no blocks: {blocks.method}; every node is reported under {OTHER}")
    if execution.flop_counter is None:
        notes.append("executed FLOPs not counted: graphaudit.analyses.flops is not available")
    if renamed:
        notes.append(f"{renamed} unnamed or repeated node names were replaced by graph ids for profiling")
    if no_optimised:
        notes.append(f"{no_optimised}; events were mapped by node name only")
    return tuple(notes)


def _rounds_done(progress: Progress | None, stage: str, total: int | None) -> Callable[[], None] | None:
    """What `time_rounds` calls after each round: `progress(stage, rounds done, total)`."""
    if progress is None:
        return None
    count = [0]

    def done() -> None:
        count[0] += 1
        progress(stage, count[0], total)

    return done
