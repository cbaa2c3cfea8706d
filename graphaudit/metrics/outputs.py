"""Per-input sums from one batch of model outputs: NLL, KL from `correct`, accuracy, MSE.

`task_for` decides once what the outputs mean; `score` turns one batch of outputs into a
(inputs × QUANTITIES) array of sums. For logits, `score` takes their log-softmax, which the
replay graph computes as an extra output (`LOG_PROBS`, see `surgery.with_log_softmax`), so
that the one pass over the vocabulary runs in ONNX Runtime's kernels — nothing per token survives the batch, so memory does
not grow with the number of inputs. Figures are ratios of those sums (e.g. NLL = Σ nll /
Σ targets, token-weighted), computed in `metrics.stats`.

- causal LM (`logits` of shape (batch, seq, vocab) and integer ids (batch, seq)): next-token
  cross-entropy in nats against the ids shifted by one — or against `labels` of the same
  shape, shifted the same way, positions labelled -100 left out; accuracy when labels are
  given.
- classification (logits (batch, classes) and integer `labels` (batch,)): cross-entropy and
  accuracy.
- regression (`targets`): squared error.
KL(correct ‖ condition) is summed over every position of logits; for outputs that are not
logits, the squared difference from `correct` takes its place. Where the inputs of a causal
LM carry an `attention_mask`, a position it marks 0 (padding) is neither a target nor a
position of KL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from graphaudit.data import MASK_INPUT, tokens_of
from graphaudit.errors import GraphAuditError

QUANTITIES = ("nll", "targets", "divergence", "positions", "hits", "sq_err", "values")
LOG_PROBS = "graphaudit.log_probs"  # the replay graph's log-softmax of the scored logits
_COL = {q: i for i, q in enumerate(QUANTITIES)}
IGNORE_INDEX = -100


@dataclass(frozen=True)
class Task:
    """What the scored output is and what it is scored against."""

    kind: str  # causal_lm | classification | regression | outputs
    output: str
    ids: str | None = None  # graph input holding the token ids (causal LM)
    labels: str | None = None  # "labels" or "targets" when the data has them
    mask: str | None = None  # graph input marking tokens (1) and padding (0), beside the ids (causal LM)

    @property
    def logits(self) -> bool:
        return self.kind in ("causal_lm", "classification")

    @property
    def fetch(self) -> str:
        """The replay graph output `score` reads: log-probabilities for logits, else the output."""
        return LOG_PROBS if self.logits else self.output

    @property
    def divergence(self) -> str:
        return "kl" if self.logits else "mse_from_correct"

    def to_json(self) -> dict:
        return {"kind": self.kind, "output": self.output, "ids": self.ids, "labels": self.labels, "mask": self.mask}


def task_for(outputs: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray],
             labels: Mapping[str, np.ndarray]) -> Task:
    """Return the Task for a model whose first batch gave `outputs` on `feeds`."""
    name = scored_output(outputs, feeds)
    out = outputs[name]
    ids = _token_ids(feeds)
    if "targets" in labels:
        _same_shape("targets", labels["targets"], out)
        return Task("regression", name, labels="targets")
    label = labels.get("labels")
    if out.ndim == 3 and ids is not None and feeds[ids].shape == out.shape[:2]:
        if label is None and name != "logits" and feeds[ids].size and int(feeds[ids].max()) >= out.shape[-1]:
            return Task("outputs", name)  # token ids past its width: hidden states, not logits over them
        if label is not None:
            _same_shape("labels", label, feeds[ids])
        mask = feeds.get(MASK_INPUT)
        return Task("causal_lm", name, ids, "labels" if label is not None else None,
                    MASK_INPUT if mask is not None and mask.shape == feeds[ids].shape else None)
    if out.ndim == 2 and label is not None and label.ndim == 1 and np.issubdtype(label.dtype, np.integer):
        return Task("classification", name, labels="labels")
    if out.ndim == 2 and label is None and _named_logits(name) and np.issubdtype(out.dtype, np.floating) \
            and out.shape[1] > 1:
        return Task("classification", name)  # class logits without labels: KL from correct, no NLL
    return Task("outputs", name)


def _named_logits(name: str) -> bool:
    """Whether an output's name says it holds logits (`logits`, `class_logits`, `cls.logits`):
    the one sign that a 2-D output is a distribution's when the data has no labels."""
    return name.lower().replace(".", "_").split("_")[-1] == "logits"


def scored_name(names: Sequence[str]) -> str | None:
    """The output the replay scores among the model's outputs `names` (coefficients left out):
    `logits`, else the first; None when there is none."""
    return "logits" if "logits" in names else next(iter(names), None)


def scored_output(outputs: Mapping[str, object], feeds: Mapping[str, np.ndarray]) -> str:
    """The name of the output the replay scores among one batch's live `outputs` (coefficients
    left out), checked to be a tensor holding values with the batch of `feeds` on its first axis."""
    name = scored_name(list(outputs))
    if name is None:
        raise GraphAuditError("expected the model to have an output besides its coefficients for the replay to "
                              "score, found none")
    out = outputs[name]
    if not isinstance(out, np.ndarray):
        raise GraphAuditError(f"expected the scored output {name!r} to be a tensor, found a {type(out).__name__}")
    batch = next((len(v) for v in feeds.values() if np.ndim(v) > 0), None)
    if out.ndim == 0 or (batch is not None and out.shape[0] != batch):
        found = "a scalar" if out.ndim == 0 else f"shape {tuple(out.shape)}"
        raise GraphAuditError(f"expected the scored output {name!r} to have the batch ({batch} inputs) on its "
                              f"first axis, found {found}")
    if out.size == 0:
        raise GraphAuditError(f"expected the scored output {name!r} to hold values, found shape {tuple(out.shape)}")
    return name


def score(task: Task, out: np.ndarray, feeds: Mapping[str, np.ndarray], labels: Mapping[str, np.ndarray],
          reference: "Reference | None") -> np.ndarray:
    """Per-input sums of QUANTITIES for one batch (`out`: log-probabilities for logit tasks)."""
    sums = np.zeros((out.shape[0], len(QUANTITIES)))
    if task.logits:
        tokens = reference.tokens if reference is not None else _tokens(task, feeds)
        if reference is not None and reference.output is not out:
            # KL(correct ‖ this) = Σ p log p − Σ p log q per position; ≥ 0 but rounding can dip a hair
            # below. First, as its pass over `out` brings it into the cache for the scattered reads of targets.
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
            diff = out - labels[task.labels]
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
           labels: Mapping[str, np.ndarray]) -> "Targets | None":
        """The targets of a batch whose log-probabilities have `shape`; None when the task has none."""
        targets, mask = _targets(task, feeds, labels)
        if targets is None:
            return None
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

    output: np.ndarray
    probs: np.ndarray | None = None
    neg_entropy: np.ndarray | None = None  # Σ p log p per position
    targets: Targets | None = None
    tokens: np.ndarray | None = None  # (inputs, positions): False where padded; None: no padding

    @classmethod
    def of(cls, task: Task, out: np.ndarray, feeds: Mapping[str, np.ndarray] | None = None,
           labels: Mapping[str, np.ndarray] | None = None) -> "Reference":
        """The reference for `out`, the `correct` condition's scored output (log-probabilities for logits)."""
        if not task.logits:
            return cls(out)
        probs = np.exp(out)
        targets = Targets.of(task, out.shape, feeds, labels or {}) if feeds is not None else None
        return cls(out, probs, _expected_log(probs, out), targets, _tokens(task, feeds) if feeds is not None else None)


def column(name: str) -> int:
    return _COL[name]


def log_probs_at(logits: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """log-softmax (last axis) of `logits` at the flat indices `flat`, in float32, one pass over the logits."""
    classes = logits.shape[-1]
    rows = np.asarray(logits, dtype=np.float32).reshape(-1, classes)
    top = rows.max(axis=1)
    # A -inf logit under a finite top is a class of probability 0 (log-probability -inf); a row
    # whose top is infinite (+inf, or every logit -inf) has no log-softmax: NaN, as the replay
    # graph's LogSoftmax gives it. inf - inf is that NaN, not a mistake.
    with np.errstate(invalid="ignore"):
        shifted = rows - top[:, None]
        np.exp(shifted, out=shifted)
        log_norm = top + np.log(shifted.sum(axis=1))
        return rows.reshape(-1)[flat] - log_norm[flat // classes]


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log-softmax over the last axis, in NumPy (what the replay graph's LOG_PROBS output holds)."""
    top = x.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # an infinite top: NaN, as in `log_probs_at`
        shifted = x - top
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _targets(task: Task, feeds, labels) -> tuple[np.ndarray | None, np.ndarray | None]:
    if task.kind == "causal_lm":
        ids = labels[task.labels] if task.labels is not None else feeds[task.ids]
        targets = ids[:, 1:].astype(np.int64, copy=False)
        tokens = _tokens(task, feeds)
        if tokens is not None:  # a padded position is no target, whatever the labels say
            return targets, (targets != IGNORE_INDEX) & tokens[:, 1:]
    elif task.kind == "classification" and task.labels is not None:
        targets = labels[task.labels].astype(np.int64, copy=False)
    else:
        return None, None
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


def _token_ids(feeds: Mapping[str, np.ndarray]) -> str | None:
    """The input whose tokens the logits predict: an encoder-decoder's logits are the decoder's."""
    for name in ("decoder_input_ids", "input_ids"):
        if name in feeds:
            return name
    ints = [k for k, v in feeds.items() if v.ndim == 2 and np.issubdtype(v.dtype, np.integer)]
    return ints[0] if len(ints) == 1 else None


def _same_shape(key: str, given: np.ndarray, expected: np.ndarray) -> None:
    if given.shape[1:] != expected.shape[1:]:
        raise GraphAuditError(
            f"expected {key} shaped like the model's output per input {tuple(expected.shape[1:])}, "
            f"found {tuple(given.shape[1:])}"
        )
