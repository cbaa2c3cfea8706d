"""Per-input sums from one batch of model outputs: NLL, KL from `correct`, accuracy, MSE.

`metrics.tasks.task_for` decides once what the outputs mean (a Task); `score` turns one batch
of outputs into a (inputs × QUANTITIES) array of sums. A distribution over the last axis is
scored by its log-probabilities: the log-softmax of logits, the log of probabilities clipped
at TINY, log-probabilities as they are. The replay graph computes the first two as an extra
output (`tasks.LOG_PROBS`, see `replay.surgery.LogProbs`),
so that the one pass over the vocabulary runs in ONNX Runtime's kernels — nothing per token
survives the batch, so memory does not grow with the number of inputs. Figures are ratios
of those sums (e.g. NLL = Σ nll / Σ targets, token-weighted), computed in `metrics.stats`.

- causal LM (a distribution of shape (batch, seq, vocab) and integer ids (batch, seq)):
  next-token cross-entropy in nats against the ids shifted by one — or against `labels` of
  the same shape, shifted the same way, positions labelled -100 left out; accuracy when
  labels are given.
- classification (a distribution per input (batch, classes) or per frame (batch, frames,
  classes), whatever the output's name): cross-entropy and accuracy against integer `labels`
  shaped like its positions; without labels, KL from `correct` alone.
- bernoulli (a probability per value, a Sigmoid's): binary cross-entropy against `labels` in
  {0, 1} or soft `targets`, KL between the values' Bernoulli distributions.
- regression (`targets`): squared error.
KL(correct ‖ condition) is summed over every position of a distribution; for outputs that
are not one, the squared difference from `correct` takes its place. Where the inputs of a causal
LM carry an `attention_mask`, a position it marks 0 (padding) is neither a target nor a
position of KL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from graphaudit.analyses.output_kinds import LOGITS, LOGPROBS
from graphaudit.errors import GraphAuditError
from graphaudit.load.data import tokens_of
from graphaudit.metrics.tasks import IGNORE_INDEX, Task

QUANTITIES = ("nll", "targets", "divergence", "positions", "hits", "sq_err", "values")
# Probabilities are clipped here before their log is taken (float32's smallest normal number;
# log TINY = -87.3), so that a probability that rounded to 0 costs a large finite NLL, not infinity.
TINY = float(np.finfo(np.float32).tiny)
_COL = {q: i for i, q in enumerate(QUANTITIES)}


def score(task: Task, out: np.ndarray, feeds: Mapping[str, np.ndarray], labels: Mapping[str, np.ndarray],
          reference: Reference | None) -> np.ndarray:
    """Per-input sums of QUANTITIES for one batch (`out`: log-probabilities for logit tasks)."""
    sums = np.zeros((out.shape[0], len(QUANTITIES)))
    if task.bernoulli:
        _score_bernoulli(sums, task, out, labels, reference)
    elif task.logits:
        tokens = reference.tokens if reference is not None else _tokens(task, feeds)
        if reference is not None and reference.output is not out:
            # KL(correct ‖ this) = Σ p log p − Σ p log q per position; ≥ 0 but rounding can dip a hair
            # below. First, as its pass over `out` brings it into the cache for the scattered reads of targets.
            assert reference.probs is not None and reference.neg_entropy is not None, "Reference.of fills both"
            kl = np.maximum(reference.neg_entropy - _expected_log(reference.probs, out), 0.0)
            sums[:, _COL["divergence"]] = _per_input(kl if tokens is None else np.where(tokens, kl, 0.0))
        truth = reference.targets if reference is not None and reference.targets is not None else \
            Targets.of(task, out.shape, feeds, labels)
        if truth is not None:
            picked = out.reshape(-1)[truth.flat]  # log q of each target, (inputs, positions)
            sums[:, _COL["nll"]] = -_per_input(np.where(truth.mask, picked, 0.0))  # a left-out -inf is no NaN
            sums[:, _COL["targets"]] = truth.count
            if task.labels is not None:
                logp = out[:, :-1] if task.kind == "causal_lm" else out
                sums[:, _COL["hits"]] = _per_input((logp.argmax(-1) == truth.ids) & truth.mask)
        sums[:, _COL["positions"]] = out[0].size // out.shape[-1] if tokens is None else _per_input(tokens)
    else:
        if task.labels is not None:
            diff = out - _fitted(labels[task.labels], out)
            sums[:, _COL["sq_err"]] = _per_input(diff * diff)
            sums[:, _COL["values"]] = out[0].size
        if reference is not None and reference.output is not out:
            diff = out - reference.output
            sums[:, _COL["divergence"]] = _per_input(diff * diff)
        sums[:, _COL["positions"]] = out[0].size
    return sums


@dataclass(frozen=True)
class Targets:
    """One batch's targets, checked once for all its conditions: where `score` picks each from the output."""

    ids: np.ndarray  # (inputs, positions), as given (IGNORE_INDEX where left out)
    mask: np.ndarray  # True where scored
    count: np.ndarray  # scored positions per input
    flat: np.ndarray  # index of each target's log-probability in the flattened output (0 where left out)

    @classmethod
    def of(cls, task: Task, shape: tuple[int, ...], feeds: Mapping[str, np.ndarray],
           labels: Mapping[str, np.ndarray]) -> Targets | None:
        """The targets of a batch whose log-probabilities have `shape`; None when the task has none."""
        found = _targets(task, feeds, labels)
        if found is None:
            return None
        targets, mask = found
        classes = shape[-1]
        _check_range(task, targets, mask, classes)
        # target p of input b scores row b·(rows per input) + p of the output's rows of `classes`
        per_input = int(np.prod(shape[1:-1], dtype=np.int64))
        first = np.arange(targets.shape[0]).reshape(-1, *[1] * (targets.ndim - 1)) * per_input
        flat = (first + np.arange(targets[0].size).reshape(targets.shape[1:])) * classes + np.where(mask, targets, 0)
        return cls(targets, mask, _per_input(mask), flat)


@dataclass(frozen=True)
class Reference:
    """The `correct` output of one batch, with what KL against it needs (and, given the feeds, its targets)."""

    output: np.ndarray | None  # None once only the other conditions are left to score (`for_the_rest`)
    probs: np.ndarray | None = None
    neg_entropy: np.ndarray | None = None  # Σ p log p per position
    targets: Targets | None = None
    tokens: np.ndarray | None = None  # (inputs, positions): False where padded; None: no padding

    per_value: bool = False  # `probs` are the output's own, one per value (a Sigmoid's), not exp(log q)

    def for_the_rest(self) -> Reference:
        """What scoring the other conditions needs of this reference once the `correct` output
        itself is scored and checked: KL reads only `probs` and `neg_entropy`, so a distribution's
        output goes (a batch of log-probabilities at a 50k vocabulary is 412 MB); a regression's,
        which the others' squared difference reads, stays."""
        return replace(self, output=None) if self.probs is not None else self

    @classmethod
    def of(cls, task: Task, out: np.ndarray, feeds: Mapping[str, np.ndarray] | None = None,
           labels: Mapping[str, np.ndarray] | None = None) -> Reference:
        """The reference for `out`, the `correct` condition's scored output (log-probabilities for logits)."""
        if task.bernoulli:
            probs = np.asarray(out, dtype=np.float64)
            log_p, log_q = bernoulli_logs(probs)
            return cls(out, probs, probs * log_p + (1 - probs) * log_q, per_value=True)
        if not task.logits:
            return cls(out)
        probs = np.exp(out)
        targets = Targets.of(task, out.shape, feeds, labels or {}) if feeds is not None else None
        return cls(out, probs, _expected_log(probs, out), targets, _tokens(task, feeds) if feeds is not None else None)


def bernoulli_logs(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log p, log(1 − p)) of per-value probabilities, in float64, each clipped at TINY."""
    p = np.asarray(probs, dtype=np.float64)
    return np.log(np.maximum(p, TINY)), np.log(np.maximum(1.0 - p, TINY))


def _score_bernoulli(sums: np.ndarray, task: Task, out: np.ndarray, labels: Mapping[str, np.ndarray],
                     reference: Reference | None) -> None:
    """Fill `sums` for per-value probabilities `out` (a Sigmoid per class or per pixel): the KL
    between each value's Bernoulli distribution and the correct one's, and against `labels` in
    {0, 1} or soft `targets` in [0, 1] the binary cross-entropy (NLL), with accuracy (labels) or
    squared error (targets); every figure a mean over the values."""
    log_p, log_q = bernoulli_logs(out)
    if reference is not None and reference.output is not out:
        p = reference.probs
        assert p is not None and reference.neg_entropy is not None, "Reference.of fills both for a Bernoulli task"
        kl = np.maximum(reference.neg_entropy - (p * log_p + (1 - p) * log_q), 0.0)  # rounding dips below 0
        sums[:, _COL["divergence"]] = _per_input(kl)
    if task.labels is not None:
        given = _fitted(labels[task.labels], out)
        mask = given != IGNORE_INDEX if task.labels == "labels" else np.ones(given.shape, bool)
        y = np.where(mask, given, 0).astype(np.float64)
        if y.size and (y.min() < 0 or y.max() > 1):
            bad = float(y[(y < 0) | (y > 1)][0])
            raise GraphAuditError(f"expected {task.labels} in 0..1 for {task.output!r} (a probability per value"
                                  f"{', or -100 to leave one out' if task.labels == 'labels' else ''}), found {bad:g}")
        sums[:, _COL["nll"]] = -_per_input(np.where(mask, y * log_p + (1 - y) * log_q, 0.0))
        sums[:, _COL["targets"]] = _per_input(mask)
        if task.labels == "labels":
            sums[:, _COL["hits"]] = _per_input(((out >= 0.5) == (y >= 0.5)) & mask)
        else:
            diff = out - given
            sums[:, _COL["sq_err"]] = _per_input(diff * diff)
            sums[:, _COL["values"]] = out[0].size
    sums[:, _COL["positions"]] = out[0].size


def column(name: str) -> int:
    return _COL[name]


LOG_NORM_ROWS = 2**22  # elements of the logits log_probs_at works on at once (16 MiB of float32)


def log_probs_at(logits: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """log-softmax (last axis) of `logits` at the flat indices `flat`, in float32, one pass over the logits.

    The normaliser is taken a few rows at a time, in one reused buffer: a whole batch's
    logits at a 50k vocabulary (412 MB at 16 x 128 tokens) would otherwise be copied once more."""
    classes = logits.shape[-1]
    rows = np.asarray(logits, dtype=np.float32).reshape(-1, classes)
    step = max(1, LOG_NORM_ROWS // max(classes, 1))
    log_norm = np.empty(rows.shape[0], dtype=np.float32)
    buffer = np.empty((min(step, rows.shape[0]), classes), dtype=np.float32)
    # A -inf logit under a finite top is a class of probability 0 (log-probability -inf); a row
    # whose top is infinite (+inf, or every logit -inf) has no log-softmax: NaN, as the replay
    # graph's LogSoftmax gives it. inf - inf is that NaN, not a mistake.
    with np.errstate(invalid="ignore"):
        for start in range(0, rows.shape[0], step):
            part = rows[start:start + step]
            top = part.max(axis=1)
            shifted = buffer[:len(part)]
            np.subtract(part, top[:, None], out=shifted)
            np.exp(shifted, out=shifted)
            log_norm[start:start + step] = top + np.log(shifted.sum(axis=1))
        return rows.reshape(-1)[flat] - log_norm[flat // classes]


def log_probs_of(scale: str, out: np.ndarray, flat: np.ndarray | None = None) -> np.ndarray:
    """The log-probabilities (float32) of an output holding `scale` (logits, probs or logprobs):
    all of them, or those at the flat indices `flat` — what the replay graph's LOG_PROBS holds."""
    if scale == LOGITS:
        return log_softmax(out.astype(np.float32, copy=False)) if flat is None else log_probs_at(out, flat)
    values = np.asarray(out if flat is None else out.reshape(-1)[flat], dtype=np.float32)
    return values if scale == LOGPROBS else np.log(np.maximum(values, np.float32(TINY)))


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log-softmax over the last axis, in NumPy (what the replay graph's LOG_PROBS output holds)."""
    top = x.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # an infinite top: NaN, as in `log_probs_at`
        shifted = x - top
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _targets(task: Task, feeds, labels) -> tuple[np.ndarray, np.ndarray] | None:
    """(targets, where scored) of a batch; None when the task has no targets."""
    if task.kind == "causal_lm":
        ids = labels[task.labels] if task.labels is not None else feeds[task.ids]
        targets = ids[:, 1:].astype(np.int64, copy=False)
        tokens = _tokens(task, feeds)
        if tokens is not None:  # a padded position is no target, whatever the labels say
            return targets, (targets != IGNORE_INDEX) & tokens[:, 1:]
    elif task.kind == "classification" and task.labels is not None:
        targets = labels[task.labels].astype(np.int64, copy=False)
    else:
        return None
    return targets, targets != IGNORE_INDEX


def _tokens(task: Task, feeds) -> np.ndarray | None:
    """(inputs, positions): where the batch's attention mask marks a token; None when it pads none."""
    mask = feeds.get(task.mask) if task.mask is not None else None
    return tokens_of(mask) if mask is not None else None


def _check_range(task: Task, targets: np.ndarray, mask: np.ndarray, classes: int) -> None:
    """Refuse targets outside the model's classes, which NumPy would wrap or fail on."""
    bad = mask & ((targets < 0) | (targets >= classes))
    if bad.any():
        ignored = f", or {IGNORE_INDEX} to leave a position out" if task.labels else ""
        raise GraphAuditError(
            f"expected {task.labels or task.ids} in 0..{classes - 1} (the classes of the output "
            f"{task.output!r}{ignored}), found {int(targets[bad][0])}"
        )


def _dot_per_position(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ a·b over the last axis: one BLAS dot product per position, each over the classes only,
    so that long sequences of large vocabularies lose no precision (positions add in float64)."""
    return np.matmul(a[..., None, :], b[..., :, None])[..., 0, 0]


def _expected_log(p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """Σ p·log q over the last axis, per position, where 0·log q counts 0 even when log q is -inf
    (a class a model rules out with a -inf logit): one dot product per position, and only the
    positions whose dot product came out NaN summed again over the classes p gives weight."""
    with np.errstate(invalid="ignore"):  # 0·(-inf): NaN, summed again below
        dots = _dot_per_position(p, log_q)
    undefined = np.isnan(dots)
    if undefined.any():
        weights, logs = p[undefined], log_q[undefined]
        dots[undefined] = (weights * np.where(weights > 0, logs, 0.0)).sum(axis=-1)
    return dots


def _per_input(values: np.ndarray) -> np.ndarray:
    return values.reshape(values.shape[0], -1).sum(axis=1, dtype=np.float64)


def _fitted(given: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`given` (checked by `tasks.task_for`: shaped like `out` per input, axes of size 1 aside)
    shaped as `out`, so that it pairs value by value."""
    return given if given.shape == out.shape else given.reshape(out.shape)
