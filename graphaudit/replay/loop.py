"""The replay loop: every condition's coefficients fed to the frozen graph, batch by batch,
each run scored into streaming statistics (`run_conditions`). The controller never runs here.

Where the session leaves a CPU core free, ONNX Runtime runs in a worker thread (its `run`
lets go of Python's lock) while this thread scores the run before and builds the next
run's feeds; otherwise runs and scoring alternate in this thread. One run is scored at a
time, in the order of the loop either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.load.data import InputData
from graphaudit.metrics import ConditionStats, PoissonBootstrap, Reference, Task, score
from graphaudit.progress import Progress, track
from graphaudit.replay.capture import native
from graphaudit.replay.conditions import CORRECT, Feed
from graphaudit.replay.parity import EveryInputCheck
from graphaudit.runtime.sessions import FrozenRunError, replaying, spare_core


def run_conditions(session: ort.InferenceSession, feeds: Mapping[str, Feed], coefficients: Sequence[Coefficient],
                   data: InputData, batch_size: int, task: Task, boot: PoissonBootstrap,
                   progress: Progress | None = None, every: EveryInputCheck | None = None,
                   overlap: bool | None = None, failures: dict[str, str] | None = None,
                   span: slice | None = None,
                   first: Callable[[], np.ndarray | None] | None = None) -> dict[str, ConditionStats]:
    """Replay every condition on every batch; return each condition's streaming statistics.

    `overlap`: run ONNX Runtime in a worker thread (its `run` lets go of Python's lock) while
    this thread scores the run before and builds the next run's feeds. None: when the
    session leaves a CPU core free (`spare_core`), where it cut the zoo's replay overhead over
    the bare runs by 0-13 points (six runs); with every core given to ONNX Runtime's threads
    it gained nothing (benchmarks/NOTES.md, replay). Either way one run is scored at a time, in the order of
    the loop: a batch's `correct` output, the reference for KL, before its other conditions.
    `every`: checks each batch's `correct` output against the live one (ParityError past tolerance).
    `failures`: when given, a condition other than `correct` whose coefficients ONNX Runtime will
    not run (FrozenRunError: a traced graph holding sizes that fit only the routing it was traced
    with) is left out from then on, its statistics dropped, and where it failed kept here by
    name (the inputs, then ONNX Runtime's objection); without it, that error is raised.
    `span`: replay the evaluation inputs there only (a shard of whole batches: graphaudit.replay.shards);
    rows keep their numbers in the whole data, which the feeds and the bootstrap weights are keyed by.
    `first`: hands over the output `task.fetch` of the first batch's `correct` run, made already
    (the parity check's run, fed the same coefficients), or None: scored as that run, not run
    again. Handed over, not passed: an argument would stay held by the caller through the loop.
    """
    stats = {name: ConditionStats.empty(boot.resamples) for name in feeds}
    failed = failures if failures is not None else {}
    rows_replayed = range(data.count)[span] if span is not None else range(data.count)
    total = -(-len(rows_replayed) // batch_size)
    laid_out: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}  # a profile's array, laid out once
    fetch = [task.fetch]
    ran = first() if first is not None else None

    def finish(run: Future | _Done, batch: _Batch, name: str) -> None:
        try:
            with replaying(name, batch.rows):
                out = run.result()[0]
        except FrozenRunError as err:
            if failures is None or name == CORRECT or batch.reference is None:
                raise
            failed.setdefault(name, f"evaluation inputs {batch.rows.start}..{batch.rows.stop - 1}: {err.cause}")
        else:
            if batch.reference is None:  # `correct` comes first
                batch.reference = Reference.of(task, out, batch.inputs, batch.labels)
                if every is not None:
                    every.compare(batch.rows, batch.reference)
            batch.scored[name] = score(task, out, batch.inputs, batch.labels, batch.reference)
            if name == CORRECT:
                batch.reference = batch.reference.for_the_rest()
        batch.finished += 1
        if batch.finished == len(batch.submitted):
            kept = [n for n in batch.submitted if n not in failed]
            ConditionStats.update_each([stats[n] for n in kept], [batch.scored[n] for n in kept], batch.weights)

    if overlap is None:
        overlap = spare_core(session)
    with ThreadPoolExecutor(1, "graphaudit-replay") if overlap else nullcontext() as runner:
        start = runner.submit if runner is not None else _run_now
        in_flight: tuple[Future | _Done, _Batch, str] | None = None
        for rows, inputs in track(data.batches(batch_size, span), "replay", progress, total):
            batch = _Batch(rows, inputs, {k: v[rows] for k, v in data.labels.items()})
            batch.weights = boot.weights(batch.index)  # here, while the last batch's last run runs
            for name, feed in feeds.items():
                if name in failed:
                    continue
                batch.submitted.append(name)
                fed = dict(inputs)
                for c in coefficients:
                    values, last = feed(c, batch.index), laid_out.get((name, c.tensor))
                    if last is None or last[0] is not values:  # profiles hand back the same array every batch
                        last = laid_out[name, c.tensor] = (values, native(c, values))
                    fed[c.tensor] = last[1]
                if in_flight is not None and runner is None:
                    # nothing runs beside the scoring: the last run is scored before the next holds an
                    # output too (a batch of log-probabilities at a 50k vocabulary is 412 MB)
                    finish(*in_flight)
                    in_flight = None
                run: Future | _Done
                if name == CORRECT and ran is not None:
                    run, ran = _Done([ran]), None
                else:
                    run = start(session.run, fetch, fed)
                submitted = run, batch, name
                if in_flight is not None:
                    finish(*in_flight)
                in_flight = submitted
                del submitted, run  # in_flight alone holds the run, to let it go once scored
        if in_flight is not None:
            finish(*in_flight)
    return {name: s for name, s in stats.items() if name not in failed}


class _Done:
    """A run made in the calling thread, answering `result()` as a Future of the worker's would."""

    __slots__ = ("error", "value")

    def __init__(self, value, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


def _run_now(fn, *args) -> _Done:
    """`fn(*args)` run here (the loop without a worker thread); an error is raised by `result()`,
    as a Future's is."""
    try:
        return _Done(fn(*args))
    except Exception as err:  # noqa: BLE001 - raised again where the run is finished
        return _Done(None, err)


@dataclass
class _Batch:
    """One evaluation batch of the replay loop, and its conditions' scores as they come."""

    rows: slice
    inputs: Mapping[str, np.ndarray]
    labels: Mapping[str, np.ndarray]
    reference: Reference | None = None
    submitted: list[str] = field(default_factory=list)  # the conditions run on it, in order
    scored: dict[str, np.ndarray] = field(default_factory=dict)
    finished: int = 0  # runs scored or failed
    index: np.ndarray = field(init=False)  # the batch's input numbers
    weights: np.ndarray = field(init=False)  # their bootstrap weights, drawn by the loop for `index`

    def __post_init__(self) -> None:
        self.index = np.arange(self.rows.start, self.rows.stop)
