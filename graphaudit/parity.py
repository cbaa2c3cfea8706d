"""Parity: does the frozen graph fed each input's own coefficients reproduce the live model?

Checked twice before any figure is trusted. `check_parity`: the whole output of the first
evaluation batch against the live outputs the capture kept (tolerance DEFAULT_TOLERANCE).
TargetCheck: for logits, the log-probability of every target of every evaluation input,
live (kept by the capture through `target_log_probs`) against the `correct` condition of
the replay loop, batch by batch, so a difference confined to later inputs stops the audit
too. Either raises ParityError, naming the largest difference and where it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import onnxruntime as ort

from graphaudit.capture import CoefficientCache, LiveCheck, native
from graphaudit.coefficients import Coefficient
from graphaudit.conditions import Feed
from graphaudit.data import InputData
from graphaudit.errors import GraphAuditError
from graphaudit.metrics import Reference, Task, task_for
from graphaudit.metrics.outputs import Targets, log_probs_at

DEFAULT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class TargetParity:
    """Every evaluation input's log-probability of each target: live against the `correct` replay.

    The tolerance is twice the outputs' one: a log-probability moves by at most the largest
    change of a logit plus that of their log-sum-exp, which is no larger.
    """

    inputs: int
    targets: int
    max_abs_diff: float
    tolerance: float
    input: int  # where the largest difference is: evaluation input and target position
    position: tuple[int, ...]
    live: float
    frozen: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def describe(self) -> str:
        where = f"input {self.input}, target {', '.join(map(str, self.position))}"
        return (f"max |Δ| {self.max_abs_diff:.3g} at {where} (live log-probability {self.live:.6g}, "
                f"frozen {self.frozen:.6g})")

    def to_json(self) -> dict:
        return {"inputs": self.inputs, "targets": self.targets, "max_abs_diff": self.max_abs_diff,
                "tolerance": self.tolerance, "input": self.input, "position": list(self.position),
                "live": self.live, "frozen": self.frozen}


@dataclass(frozen=True)
class Parity:
    """How closely the frozen graph fed `correct` coefficients reproduced the live outputs."""

    ok: bool
    max_abs_diff: float
    tolerance: float
    output: str
    index: tuple[int, ...]
    live: float
    frozen: float
    inputs: int  # evaluation inputs compared (the first batch)
    targets: TargetParity | None = None  # every input's target log-probabilities (logits only)

    def describe(self) -> str:
        where = f"{self.output}[{', '.join(map(str, self.index))}]"
        return f"max |Δ| {self.max_abs_diff:.3g} at {where} (live {self.live:.6g}, frozen {self.frozen:.6g})"

    def to_json(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "ok": self.ok, "tolerance": self.tolerance,
                "output": self.output, "index": list(self.index), "live": self.live, "frozen": self.frozen,
                "inputs": self.inputs, "targets": self.targets.to_json() if self.targets else None}


class ParityError(GraphAuditError):
    """The frozen graph did not reproduce the live model: no replay can be trusted."""

    def __init__(self, parity: Parity):
        if parity.targets is not None and not parity.targets.ok:
            found = (f"reproduce the live log-probability of every target within {parity.targets.tolerance:g}, "
                     f"found {parity.targets.describe()}")
        else:
            found = f"reproduce the live outputs within {parity.tolerance:g}, found {parity.describe()}"
        super().__init__(f"expected the frozen graph fed each input's own coefficients to {found}; refusing to replay")
        self.parity = parity


class TargetCheck:
    """Compares each batch's `correct` log-probabilities of the targets with the live ones the capture kept."""

    def __init__(self, cache: CoefficientCache, parity: Parity):
        self.cache, self.parity = cache, parity
        self.tolerance = 2 * parity.tolerance
        self.inputs = self.targets = 0
        self.worst: tuple[float, int, tuple[int, ...], float, float] | None = None

    def compare(self, rows: slice, reference: Reference) -> None:
        """Check the inputs at `rows`, whose `correct` output is `reference`; raise ParityError past tolerance."""
        truth = reference.targets
        live = self.cache.check_rows(rows)
        frozen = reference.output.reshape(-1)[truth.flat]
        diff = np.abs(frozen - live)
        diff[~truth.mask] = 0.0  # unscored positions hold NaN on the live side
        diff[np.isnan(diff)] = np.inf  # a scored NaN is as far off as it gets
        self.inputs += rows.stop - rows.start
        self.targets += int(truth.count.sum())
        if diff.size and (self.worst is None or diff.max() > self.worst[0]):
            at = np.unravel_index(int(np.argmax(diff)), diff.shape)
            self.worst = (float(diff[at]), rows.start + int(at[0]), tuple(int(i) for i in at[1:]),
                          float(live[at]), float(frozen[at]))
            if self.worst[0] > self.tolerance:
                raise ParityError(replace(self.parity, ok=False, targets=self.result()))

    def result(self) -> TargetParity | None:
        if self.worst is None:
            return None
        return TargetParity(self.inputs, self.targets, self.worst[0], self.tolerance, *self.worst[1:])


def target_log_probs(data: InputData) -> LiveCheck:
    """What the capture keeps of every evaluation input for TargetCheck: the live log-probability of
    each target (NaN where none is scored); nothing for outputs that are not logits."""
    tasks: list[Task] = []  # decided on the first batch, as the replay's own task is

    def summarise(outputs, feeds, rows):
        labels = {k: v[rows] for k, v in data.labels.items()}
        if not tasks:
            tasks.append(task_for(outputs, feeds, labels))
        task = tasks[0]
        truth = Targets.of(task, outputs[task.output].shape, feeds, labels) if task.logits else None
        if truth is None:
            return None
        return np.where(truth.mask, log_probs_at(outputs[task.output], truth.flat), np.nan).astype(np.float32)

    return LiveCheck("target log-probabilities", summarise)


def check_parity(session: ort.InferenceSession, correct: Feed, coefficients: Sequence[Coefficient],
                 cache: CoefficientCache, data: InputData, batch_size: int, tolerance: float) -> Parity:
    """Compare the frozen graph fed `correct` with the live outputs of the first batch; raise on failure."""
    rows, inputs = next(data.batches(batch_size))
    index = np.arange(rows.start, rows.stop)
    names = [o.name for o in session.get_outputs() if o.name in cache.live]
    fed = {c.tensor: native(c, correct(c, index)) for c in coefficients}
    outputs = dict(zip(names, session.run(names, {**inputs, **fed})))
    worst = None
    for name in names:
        live, frozen = np.asarray(cache.live[name], dtype=np.float64), np.asarray(outputs[name], dtype=np.float64)
        if live.shape != frozen.shape:
            raise GraphAuditError(f"expected the frozen output {name!r} shaped like the live one {live.shape}, "
                                  f"found {frozen.shape}")
        diff = np.where(np.isnan(live) & np.isnan(frozen), 0.0, np.abs(live - frozen))
        diff = np.nan_to_num(diff, nan=np.inf)
        at = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
        if diff.size and (worst is None or diff[at] > worst[0]):
            worst = (float(diff[at]), name, tuple(int(i) for i in at), float(live[at]), float(frozen[at]))
    value, name, at, live_v, frozen_v = worst if worst else (0.0, names[0], (), 0.0, 0.0)
    parity = Parity(value <= tolerance, value, tolerance, name, at, live_v, frozen_v, len(index))
    if not parity.ok:
        raise ParityError(parity)
    return parity
