"""The replay split by input into shards, and their statistics merged (docs/design.md, "Sharded replay").

A shard (`plan_shards`) is a run of whole evaluation batches and a run of whole calibration
batches, so every batch holds the inputs it holds when one process replays them all: each
input's coefficients and outputs are those of the same batch, and its scores are the same
numbers. Every figure is a ratio of sums over inputs, plain and under bootstrap weights that
depend only on the seed and the input's number (graphaudit.metrics.bootstrap), so the shards'
sums add up to the single process's: only the order of the additions differs.

A `ShardWorker` does one shard's part in two steps, in a process of its own (the Ray actors of
graphaudit.replay.cluster; nothing here imports Ray):

1. `capture`: it loads the model, runs the trace graph over its calibration and evaluation
   inputs, and gives back their coefficients and the every-input summaries of the live
   outputs (graphaudit.replay.parity), which are as small as the coefficients. It keeps the
   first evaluation batch's live outputs, for its own parity check.
2. `replay`: given every shard's coefficients merged in input order (`merged_cache`), it makes
   the same conditions one process makes (profiles from all calibration inputs, cross_input's
   partners among all evaluation inputs), opens the frozen graph, checks parity on its first
   batch and on every input it replays, and gives back its conditions' streaming statistics:
   graphaudit.replay.steps.replay_conditions, as one process runs it.

Neither step sends an output back. A refusal of the model or the data (a GraphAuditError) comes
back as a `Refusal`, to be raised as it is; anything else is the worker's failure, retried.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from graphaudit.errors import GraphAuditError
from graphaudit.load.data import InputData
from graphaudit.load.model import LoadedModel, load_for_runtime
from graphaudit.metrics import ConditionStats, Task
from graphaudit.replay.capture import CoefficientCache
from graphaudit.replay.parity import EveryInputParity
from graphaudit.replay.steps import (
    ReplayedConditions,
    ReplayJob,
    captures,
    held_apart,
    open_trace,
    replay_conditions,
    task_of,
)
from graphaudit.replay.surgery import Trace


@dataclass(frozen=True)
class Shard:
    """The inputs of one shard: whole batches of the calibration and the evaluation inputs."""

    index: int
    calibration: slice
    evaluation: slice

    def describe(self) -> str:
        def rows(span: slice, what: str) -> str:
            return f"{what} inputs {span.start}..{span.stop - 1}" if span.stop > span.start else f"no {what} inputs"

        return f"shard {self.index} ({rows(self.evaluation, 'evaluation')}, {rows(self.calibration, 'calibration')})"


def plan_shards(calibration: int, evaluation: int, batch_size: int, workers: int) -> list[Shard]:
    """At most `workers` shards, as many as there are evaluation batches at most, each of whole
    batches, the batches shared out as evenly as they go (the first shards take one more)."""
    def spans(count: int, parts: int) -> list[slice]:
        batches = -(-count // batch_size)
        edges = [min(count, batch_size * -(-batches * i // parts)) for i in range(parts + 1)]
        return [slice(a, b) for a, b in itertools.pairwise(edges)]

    parts = max(1, min(workers, -(-evaluation // batch_size)))
    return [Shard(i, c, e) for i, (c, e) in enumerate(zip(spans(calibration, parts), spans(evaluation, parts)))]


@dataclass(frozen=True)
class ModelFiles:
    """A model's file and its external weight files, by their paths in the model's folder: how
    the model reaches a worker that cannot read the caller's disk (Ray's object store carries it)."""

    name: str
    files: Mapping[str, bytes] = field(repr=False)

    @classmethod
    def of(cls, loaded: LoadedModel) -> ModelFiles:
        if loaded.path is None:  # a model given as a proto: its weights are inline
            return cls("model.onnx", {"model.onnx": loaded.model.SerializeToString()})
        files = {loaded.path.name: loaded.path.read_bytes()}
        folder = loaded.weights_folder
        if folder is not None:
            for location in loaded.external_files:
                files[PurePosixPath(location).as_posix()] = (folder / location).read_bytes()
        return cls(loaded.path.name, files)

    def write(self, folder: Path) -> Path:
        """The files under `folder` (each path checked to stay inside it); the model's path."""
        for name, data in self.files.items():
            path = (folder / name).resolve()
            if not path.is_relative_to(folder.resolve()):
                raise GraphAuditError(f"expected the model's files inside its folder, found {name!r}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return folder / self.name


@dataclass(frozen=True)
class Refusal:
    """A worker's GraphAuditError, sent back as a value: the model's or the data's fault, not the worker's."""

    message: str
    exit_code: int

    def raise_it(self) -> None:
        raise GraphAuditError(self.message, exit_code=self.exit_code)


@dataclass
class Captured:
    """One shard's capture: its inputs' coefficients (and live summaries), batch axis first, and
    what its first evaluation batch says (the task, the parity tolerance: shard 0's are the replay's)."""

    calibration: dict[str, np.ndarray]
    evaluation: dict[str, np.ndarray]
    task: Task
    tolerance: float
    tolerance_settings: dict[str, Any]
    timing: dict[str, float]  # load_s (the model read and checked), capture_s: the worker's own


class ShardWorker:
    """The worker of one shard (see the module's docstring); `close()` removes what it wrote."""

    def __init__(self, model: str | ModelFiles, job: ReplayJob, shard: Shard):
        self.job, self.shard = job, shard
        self._folder: Path | None = None
        self._live: Mapping[str, np.ndarray] | None = None
        self._evaluation: InputData | None = None
        self._model = model
        self._loaded: LoadedModel | None = None  # its large inline weights held apart, in `_weights`
        self._weights: dict[str, np.ndarray] = {}

    def capture(self, calibration: InputData, evaluation: InputData) -> Captured | Refusal:
        try:
            return self._capture(calibration, evaluation)
        except GraphAuditError as err:
            return Refusal(str(err), err.exit_code)

    def replay(self, calibration: Mapping[str, np.ndarray], evaluation: Mapping[str, np.ndarray], task: Task,
               tolerance: float, rewrite: bool, report: Callable[[int], object] | None = None,
               crash_after: int | None = None) -> ReplayedConditions | Refusal:
        """`report(inputs done)` after each batch; `crash_after`: end this process with SIGKILL after
        that many batches (the retry test's worker that dies)."""
        try:
            return self._replay(calibration, evaluation, task, tolerance, rewrite, report, crash_after)
        except GraphAuditError as err:
            return Refusal(str(err), err.exit_code)

    def close(self) -> None:
        self._loaded = self._live = self._evaluation = None
        self._weights = {}
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _model_loaded(self) -> LoadedModel:
        if self._loaded is None:
            model = self._model
            if isinstance(model, ModelFiles):
                self._folder = Path(tempfile.mkdtemp(prefix="graphaudit-model-"))
                model = str(model.write(self._folder))
            self._loaded, self._weights = held_apart(load_for_runtime(model))
        return self._loaded

    def _capture(self, calibration: InputData, evaluation: InputData) -> Captured:
        job, shard = self.job, self.shard
        clock = time.perf_counter()
        loaded = self._model_loaded()
        timing = {"load_s": time.perf_counter() - clock}
        clock = time.perf_counter()
        trace = Trace(job.coefficients)(loaded.model).model
        session = open_trace(trace, loaded, job, self._weights)
        with contextlib.ExitStack() as stack:
            calib_cache, eval_cache = (stack.enter_context(c) for c in captures(
                trace, loaded, job, calibration, evaluation, lambda: session,
                spans=(shard.calibration, shard.evaluation), weights=self._weights))
            kept = [{k: np.array(v) for k, v in c.arrays.items()}  # out of a spilled cache's files
                    for c in (calib_cache, eval_cache)]
            self._live = dict(eval_cache.live)
            task = task_of(eval_cache, evaluation, job.batch_size, job.readings, shard.evaluation)
            tolerance, settings = job.tolerance_for(eval_cache)
        self._evaluation = evaluation
        timing["capture_s"] = time.perf_counter() - clock
        return Captured(kept[0], kept[1], task, tolerance, settings, timing)

    def _replay(self, calibration: Mapping[str, np.ndarray], evaluation: Mapping[str, np.ndarray], task: Task,
                tolerance: float, rewrite: bool, report: Callable[[int], object] | None,
                crash_after: int | None) -> ReplayedConditions:
        job, shard, data = self.job, self.shard, self._evaluation
        if data is None or self._live is None:
            raise RuntimeError(f"{shard.describe()} was asked to replay before it captured")

        def progress(stage: str, done: int, total: int | None) -> None:
            if report is not None:
                report(min(done * job.batch_size, shard.evaluation.stop - shard.evaluation.start))
            if crash_after is not None and done >= crash_after:
                os.kill(os.getpid(), signal.SIGKILL)

        # one run at a time: the worker's threads are its share of the machine's cores
        return replay_conditions(self._model_loaded(), job, merged_cache(job.coefficients, calibration),
                                 merged_cache(job.coefficients, evaluation, live=self._live), data, task, tolerance,
                                 progress, span=shard.evaluation, rewrite=rewrite, overlap=False,
                                 weights=self._weights)


def merged_cache(coefficients: Sequence, arrays: Mapping[str, np.ndarray],
                 live: Mapping[str, np.ndarray] | None = None) -> CoefficientCache:
    """An in-memory CoefficientCache of `arrays` (every shard's, merged by `merge_arrays`)."""
    count = len(next(iter(arrays.values()))) if arrays else 0
    return CoefficientCache(tuple(coefficients), dict(arrays), count, dict(live or {}))


def merge_arrays(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The shards' arrays joined in shard order (shards with no inputs left out)."""
    parts = [p for p in parts if p]
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]} if parts else {}


def merge_stats(shards: Sequence[ReplayedConditions]) -> tuple[dict[str, ConditionStats], dict[str, str]]:
    """Each condition's statistics added up over the shards, and the conditions that failed on any
    shard (left out of every shard, as one process leaves them out from where they fail)."""
    failed: dict[str, str] = {}
    for shard in shards:
        for name, where in shard.failed.items():
            failed.setdefault(name, where)
    stats: dict[str, ConditionStats] = {}
    for shard in shards:
        for name, s in shard.stats.items():
            if name not in failed:
                stats[name] = stats[name].merge(s) if name in stats else s
    return stats, failed


def merge_every(parts: Sequence[EveryInputParity | None]) -> EveryInputParity | None:
    """The every-input parity of all shards: the inputs and values counted, the largest difference
    (the first shard's where two are equal, as one process keeps the first it finds)."""
    found = [p for p in parts if p is not None]
    if not found:
        return None
    worst = found[0]
    for p in found[1:]:
        if p.max_abs_diff > worst.max_abs_diff:
            worst = p
    return EveryInputParity(worst.kind, sum(p.inputs for p in found), sum(p.values for p in found),
                            worst.max_abs_diff, worst.tolerance, worst.input, worst.position, worst.live, worst.frozen)
