"""Parity: does the frozen graph fed each input's own coefficients reproduce the live model?

Checked twice before any figure is trusted. `check_parity`: the whole output of the first
evaluation batch against the live outputs the capture kept (tolerance DEFAULT_TOLERANCE).
EveryInputCheck: every evaluation input, live (a summary the capture keeps through
`every_input_summary`: each target's log-probability for logits, the whole output when it
is small, else the same WHOLE_OUTPUT_LIMIT positions of it for every input) against the
`correct` condition of the replay loop, batch by batch, so a
difference confined to later inputs stops the audit too. Either raises ParityError, naming
the largest difference and where it is.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnxruntime as ort

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.analyses.output_kinds import OutputKind
from graphaudit.errors import GraphAuditError
from graphaudit.load.data import InputData
from graphaudit.metrics import Reference, Task, task_for
from graphaudit.metrics.bootstrap import mix64
from graphaudit.metrics.outputs import Targets, log_probs_of
from graphaudit.replay.capture import CoefficientCache, LiveCheck, native
from graphaudit.replay.conditions import CORRECT, Feed
from graphaudit.replay.settings import DEFAULT_TOLERANCE  # defined beside the other settings
from graphaudit.runtime.sessions import replaying

# A model computing in half precision: the tolerance is this share of its largest live output
# (8 units in the last place of float16, whose 10-bit fraction rounds at 2^-11 relative): two
# graphs of the same float16 model, fused differently by ONNX Runtime, round differently.
HALF_RELATIVE = 2.0**-7
_HALF = (np.float16,)
WHOLE_OUTPUT_LIMIT = 4096  # values per input the capture keeps of an output for parity: all, or this many
LOG_PROBS_KIND, OUTPUTS_KIND = "target log-probabilities", "outputs"
SAMPLED_KIND = f"outputs at {WHOLE_OUTPUT_LIMIT} positions"
# logits without targets (a classifier's data without labels): their log-probabilities
ROW_LOG_PROBS_KIND = "log-probabilities"
SAMPLED_LOG_PROBS_KIND = f"log-probabilities at {WHOLE_OUTPUT_LIMIT} positions"
_LOG_PROB_KINDS = (LOG_PROBS_KIND, ROW_LOG_PROBS_KIND, SAMPLED_LOG_PROBS_KIND)


@dataclass(frozen=True)
class EveryInputParity:
    """Every evaluation input, live against the `correct` replay: each target's log-probability
    (`kind` "target log-probabilities", for logits), each value of the output ("outputs"), or
    the values at the same WHOLE_OUTPUT_LIMIT positions of each input's output (SAMPLED_KIND);
    for logits without targets, the log-probability of every class ("log-probabilities") or of
    those positions (SAMPLED_LOG_PROBS_KIND).

    The tolerance on log-probabilities is twice the outputs' one: a log-probability moves by at
    most the largest change of a logit plus that of their log-sum-exp, which is no larger.
    """

    kind: str
    inputs: int
    values: int  # targets or output values compared
    max_abs_diff: float
    tolerance: float
    input: int  # where the largest difference is: evaluation input, and target or value within it
    position: tuple[int, ...]
    live: float
    frozen: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def describe(self) -> str:
        what = "target" if self.kind == LOG_PROBS_KIND else "value"
        return (f"max |Δ| {self.max_abs_diff:.3g} at input {self.input}, {what} {', '.join(map(str, self.position))} "
                f"(live {self.live:.6g}, frozen {self.frozen:.6g})")

    def to_json(self) -> dict:
        return {"kind": self.kind, "inputs": self.inputs, "values": self.values, "max_abs_diff": self.max_abs_diff,
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
    every_input: EveryInputParity | None = None  # all evaluation inputs, when the capture kept their summary

    def describe(self) -> str:
        where = f"{self.output}[{', '.join(map(str, self.index))}]"
        return f"max |Δ| {self.max_abs_diff:.3g} at {where} (live {self.live:.6g}, frozen {self.frozen:.6g})"

    def to_json(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "ok": self.ok, "tolerance": self.tolerance,
                "output": self.output, "index": list(self.index), "live": self.live, "frozen": self.frozen,
                "inputs": self.inputs, "every_input": self.every_input.to_json() if self.every_input else None}


class ParityError(GraphAuditError):
    """The frozen graph did not reproduce the live model: no replay can be trusted."""

    def __init__(self, parity: Parity):
        every = parity.every_input
        if every is not None and not every.ok:
            found = (f"reproduce the live {every.kind} of every input within {every.tolerance:g}, "
                     f"found {every.describe()}")
        else:
            found = f"reproduce the live outputs within {parity.tolerance:g}, found {parity.describe()}"
        super().__init__(f"expected the frozen graph fed each input's own coefficients to {found}; refusing to replay")
        self.parity = parity


class EveryInputCheck:
    """Compares each batch's `correct` output with the live summary the capture kept (`every_input_summary`)."""

    def __init__(self, cache: CoefficientCache, parity: Parity):
        self.cache, self.parity = cache, parity
        self.kind: str | None = None
        self.inputs = self.values = 0
        self.worst: tuple[float, int, tuple[int, ...], float, float] | None = None

    def compare(self, rows: slice, reference: Reference) -> None:
        """Check the inputs at `rows`, whose `correct` output is `reference`; raise ParityError past tolerance."""
        live = self.cache.check_rows(rows)
        truth, output = reference.targets, reference.output
        assert output is not None, "a batch's correct output is checked before the other conditions are scored"
        if truth is not None:  # logits: the log-probability of each target
            self.kind = LOG_PROBS_KIND
            frozen = output.reshape(-1)[truth.flat]
            diff = _difference(frozen, live)
            diff[~truth.mask] = 0.0  # unscored positions hold NaN on the live side
            self.values += int(truth.count.sum())
        else:  # the output's values, or for logits without targets their log-probabilities
            frozen = output.reshape(len(live), -1)
            kept = kept_positions(frozen.shape[1])
            if reference.probs is not None and not reference.per_value:
                self.kind = ROW_LOG_PROBS_KIND if kept is None else SAMPLED_LOG_PROBS_KIND
            else:
                self.kind = OUTPUTS_KIND if kept is None else SAMPLED_KIND
            if kept is not None:
                frozen = frozen[:, kept]
            diff = _difference(frozen, live)
            self.values += diff.size
        diff[np.isnan(diff)] = np.inf  # a NaN where a number was is as far off as it gets
        self.inputs += rows.stop - rows.start
        if diff.size and (self.worst is None or diff.max() > self.worst[0]):
            at = np.unravel_index(int(np.argmax(diff)), diff.shape)
            within = tuple(int(i) for i in at[1:])
            if truth is None and kept is not None:
                within = (int(kept[within[0]]),)  # the value's place in the flattened output
            self.worst = (float(diff[at]), rows.start + int(at[0]), within, float(live[at]), float(frozen[at]))
            if self.worst[0] > self.tolerance:
                raise ParityError(replace(self.parity, ok=False, every_input=self.result()))

    @property
    def tolerance(self) -> float:
        return self.parity.tolerance * (2 if self.kind in _LOG_PROB_KINDS else 1)

    def result(self) -> EveryInputParity | None:
        if self.worst is None:
            return None
        assert self.kind is not None, "compare sets the kind before the worst difference"
        return EveryInputParity(self.kind, self.inputs, self.values, self.worst[0], self.tolerance, *self.worst[1:])


def _difference(frozen: np.ndarray, live: np.ndarray, nan: float = np.nan) -> np.ndarray:
    """|frozen - live|, 0 where they are equal, equal infinities included (a class a -inf logit
    rules out on both sides), `nan` where either is NaN and they are not both NaN.

    In the wider of the two float types, at least float32: a float32 output's difference is
    exact or within half a unit of its last place, far below any tolerance, and a first batch of
    logits is compared in one pass instead of three in float64. Only where the difference is
    not finite are the two sides looked at again."""
    frozen, live = np.asarray(frozen), np.asarray(live)
    dtype = np.result_type(frozen.dtype, live.dtype, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, mended right below
        diff = np.asarray(np.abs(frozen.astype(dtype, copy=False) - live))  # an array even for a scalar output
    odd = ~np.isfinite(diff)
    if odd.any():
        f, v, d = frozen[odd], live[odd], diff[odd]
        same = (f == v) | (np.isnan(f) & np.isnan(v))
        diff[odd] = np.where(same, 0.0, np.where(np.isnan(d), nan, d))
    return diff


DIFFERENCE_CHUNK = 2**22  # values _largest_difference compares at once (16 MiB of float32)


def _largest_difference(frozen: np.ndarray, live: np.ndarray) -> tuple[float, int] | None:
    """The largest |frozen - live| (`_difference`, a NaN where a number was counting as infinite)
    and its flat index, the first where it is largest; None for empty arrays. Taken a chunk at a
    time: a first batch of logits at a 50k vocabulary is 412 MB, and so would be its difference."""
    a, b = frozen.reshape(-1), live.reshape(-1)
    worst: tuple[float, int] | None = None
    for start in range(0, a.size, DIFFERENCE_CHUNK):
        diff = _difference(a[start:start + DIFFERENCE_CHUNK], b[start:start + DIFFERENCE_CHUNK], nan=np.inf)
        at = int(np.argmax(diff))
        if worst is None or diff[at] > worst[0]:
            worst = (float(diff[at]), start + at)
    return worst


def every_input_summary(data: InputData, readings: Mapping[str, OutputKind] | None = None) -> LiveCheck:
    """What the capture keeps of every evaluation input for EveryInputCheck: for logits, the live
    log-probability of each target (NaN where none is scored), or of every class when there are
    no targets (a classifier's data without labels); for other float outputs of at most
    WHOLE_OUTPUT_LIMIT values per input, the whole output; for larger ones, the values at the
    `kept_positions` of each input's flattened output; for other outputs, nothing. `readings`:
    what the graph says each output holds, as the replay's task reads it."""
    tasks: list[Task] = []  # decided on the first batch, as the replay's own task is

    def summarise(outputs, feeds, rows):
        labels = {k: v[rows] for k, v in data.labels.items()}
        if not tasks:
            tasks.append(task_for(outputs, feeds, labels, readings))
        task = tasks[0]
        out = outputs[task.output]
        truth = Targets.of(task, out.shape, feeds, labels) if task.logits else None
        if truth is not None:
            return np.where(truth.mask, log_probs_of(task.scale, out, truth.flat), np.nan).astype(np.float32)
        if not np.issubdtype(out.dtype, np.floating):
            return None
        if task.logits:  # a distribution without targets: the replay compares its log-probabilities
            out = log_probs_of(task.scale, out)
        flat = out.reshape(len(out), -1)
        kept = kept_positions(flat.shape[1])
        return (flat if kept is None else flat[:, kept]).astype(np.float32)

    return LiveCheck(f"{LOG_PROBS_KIND}, else {OUTPUTS_KIND} up to {WHOLE_OUTPUT_LIMIT} values, "
                     f"else {SAMPLED_KIND} (SplitMix64 positions, seed {_POSITIONS_SEED})", summarise)


_POSITIONS_SEED = 0


@functools.lru_cache(maxsize=8)  # asked once per batch, on the capture's side and the replay's
def kept_positions(per_input: int) -> np.ndarray | None:
    """Which values of each input's flattened output the parity of every input compares: all
    (None) up to WHOLE_OUTPUT_LIMIT, else the first WHOLE_OUTPUT_LIMIT distinct positions of a
    hashed sequence (SplitMix64 of 1, 2, 3, … offset by _POSITIONS_SEED, modulo the size), in
    increasing order: scattered, not a stride that could fall on one channel of every row, and
    pure integer arithmetic, so a cache kept under one NumPy version is read alike by another."""
    if per_input <= WHOLE_OUTPUT_LIMIT:
        return None
    draws = 2 * WHOLE_OUTPUT_LIMIT
    while True:
        counter = np.arange(1, draws + 1, dtype=np.uint64) + np.uint64(_POSITIONS_SEED << 32)  # mix64(0) is 0
        candidates = mix64(counter) % np.uint64(per_input)
        _, first = np.unique(candidates, return_index=True)
        if len(first) >= WHOLE_OUTPUT_LIMIT:
            break
        draws *= 2  # sizes just past the limit need more draws to find enough distinct positions
    kept = np.sort(candidates[np.sort(first)[:WHOLE_OUTPUT_LIMIT]]).astype(np.int64)
    kept.flags.writeable = False
    return kept


def default_tolerance(cache: CoefficientCache) -> tuple[float, str | None]:
    """The parity tolerance when none is given: DEFAULT_TOLERANCE, or for a model whose
    coefficients or outputs are float16, HALF_RELATIVE of the largest live output magnitude of
    the first batch; with a note saying why (None for the default)."""
    arrays = [*(cache.arrays[c.tensor] for c in cache.coefficients), *cache.live.values()]
    if not any(a.dtype in _HALF for a in arrays if isinstance(a, np.ndarray)):
        return DEFAULT_TOLERANCE, None
    scale = max((float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) for a in cache.live.values()
                 if isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.floating)), default=0.0)
    tolerance = max(DEFAULT_TOLERANCE, HALF_RELATIVE * scale)
    return tolerance, (f"the model computes in float16: parity tolerance {tolerance:.3g}, 2^-7 of the largest "
                       f"live output magnitude ({scale:.3g}), since two graphs of it round differently")


def check_parity(session: ort.InferenceSession, correct: Feed, coefficients: Sequence[Coefficient],
                 cache: CoefficientCache, data: InputData, batch_size: int, tolerance: float,
                 span: slice | None = None) -> Parity:
    """Compare the frozen graph fed `correct` with the live outputs of the first batch (of `span`,
    a shard's inputs, when given); raise on failure."""
    return checked_first_batch(session, correct, coefficients, cache, data, batch_size, tolerance, span)[0]


def checked_first_batch(session: ort.InferenceSession, correct: Feed, coefficients: Sequence[Coefficient],
                        cache: CoefficientCache, data: InputData, batch_size: int, tolerance: float,
                        span: slice | None = None, also: str | None = None) -> tuple[Parity, np.ndarray | None]:
    """`check_parity`, and the output `also` of the same run (None when not asked for): the
    replay loop scores the first batch's `correct` run from it instead of running it again."""
    rows, inputs = next(data.batches(batch_size, span))
    index = np.arange(rows.start, rows.stop)
    names = [o.name for o in session.get_outputs() if o.name in cache.live]
    fetched = [*names, also] if also is not None and also not in names else names
    fed = {c.tensor: native(c, correct(c, index)) for c in coefficients}
    with replaying(CORRECT, rows):
        outputs = dict(zip(fetched, session.run(fetched, {**inputs, **fed})))
    kept = outputs[also] if also is not None else None
    worst = None
    for name in names:
        live, frozen = np.asarray(cache.live[name]), np.asarray(outputs[name])
        if live.shape != frozen.shape:
            raise GraphAuditError(f"expected the frozen output {name!r} shaped like the live one {live.shape}, "
                                  f"found {frozen.shape}")
        found = _largest_difference(frozen, live)
        if found is not None and (worst is None or found[0] > worst[0]):
            at = np.unravel_index(found[1], frozen.shape)
            worst = (found[0], name, tuple(int(i) for i in at), float(live[at]), float(frozen[at]))
    value, name, where, live_v, frozen_v = worst if worst else (0.0, names[0], (), 0.0, 0.0)
    parity = Parity(value <= tolerance, value, tolerance, name, where, live_v, frozen_v, len(index))
    if not parity.ok:
        raise ParityError(parity)
    return parity, kept
