"""The replay's steps that one process and a shard's worker (graphaudit.replay.shards) run alike.

`ReplayJob` is what both are asked, once the pipeline has read the model, the data and the
settings, and `Replayed` what both give back (graphaudit.replay.cluster merges the shards' into
one); `task_of` reads what the outputs mean from the first evaluation batch; `frozen_run`
builds the frozen graph as the replay runs it, opens its session and checks parity, falling
back to the graph as exported where a rewrite does not reproduce the live outputs;
`captures` runs the trace graph (its session: `open_trace`) over both data sets, and `replay_conditions` makes the
conditions from the caches and replays them through the frozen graph.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.analyses.output_kinds import OutputKind
from graphaudit.errors import GraphAuditError
from graphaudit.load.data import InputData
from graphaudit.load.model import LoadedModel
from graphaudit.metrics import ConditionStats, PoissonBootstrap, Task, task_for
from graphaudit.metrics.tasks import scored_output
from graphaudit.progress import Progress
from graphaudit.replay.capture import CoefficientCache, capture
from graphaudit.replay.conditions import CORRECT
from graphaudit.replay.conditions import conditions as make_conditions
from graphaudit.replay.loop import run_conditions
from graphaudit.replay.parity import (
    EveryInputCheck,
    EveryInputParity,
    Parity,
    checked_first_batch,
    default_tolerance,
    every_input_summary,
)
from graphaudit.replay.passes import GraphPass, run_passes
from graphaudit.replay.prefix import open_frozen
from graphaudit.replay.rewrite import Rewrite
from graphaudit.replay.surgery import Freeze, LogProbs, live_decisions, live_note
from graphaudit.runtime.handed_weights import weights_apart, weights_in_file
from graphaudit.runtime.sessions import create_session, slow_fusions


@dataclass(frozen=True)
class ReplayJob:
    """How to capture and replay, as the pipeline decided it: the same for every shard."""

    coefficients: tuple[Coefficient, ...]
    readings: Mapping[str, OutputKind]  # what each output holds (analyses.output_kinds.read_outputs)
    providers: list[str]
    threads: int | None
    flush_denormals: bool
    quantized: bool  # QDQ pairs: run as written, not fused (runtime.sessions.quantized_pairs)
    batch_size: int
    memory_limit: int
    conditions: tuple[str, ...]
    seed: int
    resamples: int
    tokens: tuple[np.ndarray | None, np.ndarray | None]  # the evaluation and calibration inputs' unpadded positions
    tolerance: float | None  # None: default_tolerance of the evaluation cache
    rewrite: bool  # the frozen graph's operators rewritten (on the CPU only)

    def bootstrap(self) -> PoissonBootstrap:
        return PoissonBootstrap(self.seed, self.resamples)

    def tolerance_for(self, evaluation: CoefficientCache) -> tuple[float, dict[str, Any]]:
        """The parity tolerance, and the settings that say how it was chosen where none was given."""
        if self.tolerance is not None:
            return self.tolerance, {}
        tolerance, why = default_tolerance(evaluation)  # DEFAULT_TOLERANCE, or wider for a model in float16
        return tolerance, {"tolerance": tolerance, "tolerance_note": why or None}


@dataclass
class Replayed:
    """What the capture and the replay loop gave, in one process or merged from shards: each
    condition's streaming statistics, the parity checks, the calibration and evaluation caches
    (the evaluation one read by the variance decomposition), the AppliedSettings fields they
    decided, and notes on the conditions (cross_input's partners where inputs are padded)."""

    caches: tuple[CoefficientCache, CoefficientCache]
    task: Task
    parity: Parity
    stats: dict[str, ConditionStats]
    failed: dict[str, str]
    every: EveryInputParity | None
    settings: dict[str, Any]
    notes: list[str]
    timing: dict[str, float]


def held_apart(loaded: LoadedModel) -> tuple[LoadedModel, dict[str, np.ndarray]]:
    """`loaded` with its large inline weights taken out, and their arrays by name. Where the model's
    file holds them as its proto does, the proto refers to their bytes there, as external data
    ONNX Runtime maps, and the arrays are read-only views of the file (`weights_in_file`); else
    each is a stub and its array a copy, handed to every session (`weights_apart`). Taken out once
    for the whole replay, the trace and frozen graphs cut from it copy no weight: each graph was a
    copy of the model's weights until its session had taken its own, and the frozen graph's was the
    peak of a whole audit at the 160M shape (650 MB beside the model's, the arrays and the session's)."""
    if loaded.path is not None:
        path = loaded.path.resolve()
        in_file = weights_in_file(loaded.model, path)
        if in_file is not None:  # its weights now lie in files ONNX Runtime reads: its own among them
            return replace(loaded, model=in_file[0], weights_loaded=False,
                           external_files=tuple(dict.fromkeys((*loaded.external_files, path.name)))), in_file[1]
    skeleton, names, arrays = weights_apart(loaded.model)
    return (replace(loaded, model=skeleton), dict(zip(names, arrays))) if names else (loaded, {})


def open_trace(trace: onnx.ModelProto, loaded: LoadedModel, job: ReplayJob,
               weights: Mapping[str, np.ndarray] | None = None) -> ort.InferenceSession:
    """The session of the trace graph `trace`, cut from `loaded`, that both captures run;
    `weights`: those `loaded` holds as stubs (`held_apart`)."""
    return create_session(trace, job.providers, disabled_optimizers=slow_fusions(job.providers),
                          weights_folder=loaded.weights_folder, threads=job.threads,
                          flush_denormals=job.flush_denormals, qdq_fusions=not job.quantized, weights=weights)


def captures(trace: onnx.ModelProto, loaded: LoadedModel, job: ReplayJob, calibration: InputData,
             evaluation: InputData, open_session: Callable[[], ort.InferenceSession], *,
             cache_dir: str | os.PathLike | None = None,
             spans: tuple[slice | None, slice | None] = (None, None),
             weights: Mapping[str, np.ndarray] | None = None) -> Iterator[CoefficientCache]:
    """The calibration inputs' capture, then the evaluation inputs' (with the every-input summary
    of the live outputs and the first batch's live outputs, which the parity checks read), each
    run when the caller takes it, so that it can hold the first before the second runs; `spans`:
    a shard's inputs of each (graphaudit.replay.capture.capture); `weights`: those `trace` holds
    as stubs (`held_apart`)."""
    for label, data, span, check in (
            ("calibration", calibration, spans[0], None),
            ("evaluation", evaluation, spans[1], every_input_summary(evaluation, job.readings))):
        yield capture(trace, job.coefficients, data, batch_size=job.batch_size, cache_dir=cache_dir,
                      memory_limit=job.memory_limit, label=label, providers=job.providers,
                      weights_folder=loaded.weights_folder, check=check, validate=scored_output, threads=job.threads,
                      open_session=open_session, keep_live=label == "evaluation", span=span, weights=weights)


def task_of(cache: CoefficientCache, data: InputData, batch_size: int, readings: Mapping[str, OutputKind],
            span: slice | None = None) -> Task:
    """What the outputs mean, read from the graph (`readings`) and the live outputs of the first
    batch (of `span`, where the cache holds a shard's inputs)."""
    rows, inputs = next(data.batches(batch_size, span))
    return task_for(cache.live, inputs, {k: v[rows] for k, v in data.labels.items()}, readings)


@dataclass
class FrozenRun:
    """The frozen graph's session, its parity on the first batch, and the settings that say how
    it was built (its live decisions, the rewrites made, why they were undone)."""

    session: ort.InferenceSession
    parity: Parity
    settings: dict[str, Any]
    first: np.ndarray | None = None  # the check's run's output that the loop scores (its first `correct` run)

    def handed_first(self) -> np.ndarray | None:
        """`first`, handed over once: the loop alone holds it then, to let it go once scored (a batch
        of log-probabilities at a 50k vocabulary)."""
        first, self.first = self.first, None
        return first


def frozen_run(loaded: LoadedModel, job: ReplayJob, task: Task,
               check: Callable[[ort.InferenceSession], tuple[Parity, np.ndarray | None]],
               rewrite: bool | None = None, weights: Mapping[str, np.ndarray] | None = None) -> FrozenRun:
    """The session of `loaded`'s frozen graph as the replay runs it, checked by `check` (the parity
    of the first batch: it raises ParityError; it hands back that run's output the loop scores, or
    None). `rewrite` None: `job.rewrite`. `weights`: those `loaded` holds as stubs (`held_apart`).
    A rewritten graph that ONNX Runtime refuses or that fails `check` is graphaudit's fault, not
    the model's: the graph as exported is checked instead, and decides."""
    coefs = job.coefficients
    frozen = Freeze(coefs)(loaded.model).model
    settings: dict[str, Any] = {}
    live = live_decisions(frozen, coefs)
    if live:
        settings.update(live_decisions=tuple(live), live_decisions_note=live_note(live))
    frozen, rewrites = _replayed(frozen, task, job.rewrite if rewrite is None else rewrite)
    settings["rewrites"] = rewrites

    def opened(model: onnx.ModelProto) -> ort.InferenceSession:
        return open_frozen(model, coefs, job.providers, loaded.weights_folder, job.threads, job.flush_denormals,
                           not job.quantized, weights)

    try:
        session = opened(frozen)
        del frozen  # its session holds what it needs (the weights the proto still holds inline: copied)
        parity, first = check(session)
    except GraphAuditError as err:  # ParityError, FrozenRunError, a session ONNX Runtime refuses
        if not rewrites:
            raise
        session = None  # the rewritten graph's session and weights go before the other's come
        frozen, rewrites = _replayed(Freeze(coefs)(loaded.model).model, task, False)
        settings.update(rewrites=rewrites, rewrite_note=(
            f"the rewritten frozen graph did not run as the live model does, so its operators ran as exported "
            f"({' '.join(str(err).split())[:300]})"))
        session = opened(frozen)
        del frozen
        parity, first = check(session)
    return FrozenRun(session, parity, settings, first)


@dataclass
class ReplayedConditions:
    """Every condition replayed on the evaluation inputs (a shard's, or all): each one's streaming
    statistics, those ONNX Runtime would not run, the parity checks, how the frozen graph was
    built (frozen_run's settings), the conditions' notes, and `parity_s` (the conditions made,
    the frozen graph opened and checked) and `replay_s` (the loop)."""

    stats: dict[str, ConditionStats]
    failed: dict[str, str]
    parity: Parity
    every: EveryInputParity | None
    settings: dict[str, Any]
    notes: list[str]
    timing: dict[str, float]


def replay_conditions(loaded: LoadedModel, job: ReplayJob, calibration: CoefficientCache,
                      evaluation: CoefficientCache, data: InputData, task: Task, tolerance: float,
                      progress: Progress | None = None, *, span: slice | None = None, rewrite: bool | None = None,
                      overlap: bool | None = None, weights: Mapping[str, np.ndarray] | None = None) -> ReplayedConditions:
    """The conditions made from the caches (profiles from `calibration`, rearrangements of
    `evaluation`), the frozen graph opened (`frozen_run`) and checked on the first batch of `data`
    (of `span`, a shard's inputs, when given), and every condition replayed on every input there
    (`run_conditions`, whose `overlap` it is). `weights`: those `loaded` holds as stubs (`held_apart`)."""
    coefs, clock = job.coefficients, time.perf_counter()
    notes: dict[str, str] = {}
    feeds = make_conditions(job.conditions, evaluation, calibration, job.seed, job.tokens, notes)
    frozen = frozen_run(loaded, job, task, lambda session: checked_first_batch(
        session, feeds[CORRECT], coefs, evaluation, data, job.batch_size, tolerance, span, also=task.fetch), rewrite,
        weights)
    timing = {"parity_s": time.perf_counter() - clock}
    evaluation.parity_checked()
    clock = time.perf_counter()
    every = EveryInputCheck(evaluation, frozen.parity) if evaluation.checked else None
    failed: dict[str, str] = {}
    stats = run_conditions(frozen.session, feeds, coefs, data, job.batch_size, task, job.bootstrap(), progress,
                           every, overlap=overlap, failures=failed, span=span, first=frozen.handed_first)
    timing["replay_s"] = time.perf_counter() - clock
    return ReplayedConditions(stats, failed, frozen.parity, every.result() if every is not None else None,
                              frozen.settings, list(notes.values()), timing)


def _replayed(frozen: onnx.ModelProto, task: Task, rewrite: bool) -> tuple[onnx.ModelProto, dict[str, int]]:
    """`frozen` (handed over: the copy is the replay's) as the replay runs it (`replay_passes`),
    and the rewrites made."""
    result = run_passes(frozen, replay_passes(task, rewrite), owned=True)
    return result.model, dict(result.details.of(Rewrite, {}))


def replay_passes(task: Task, rewrite: bool) -> list[GraphPass]:
    """The passes that make a frozen graph the one the replay runs: the log-probabilities of a
    distribution as an output (unless it holds them), and its operators rewritten when `rewrite`."""
    return [LogProbs(task.output, task.fetch, task.scale), *([Rewrite()] if rewrite else [])]
