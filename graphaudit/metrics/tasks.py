"""What a model's scored output is, decided once from its first batch: `task_for` reads what
the graph says each output holds (`analyses.output_kinds`: logits, probabilities,
log-probabilities or values) and the data (token ids, labels, targets, an attention mask), and
gives the Task that `metrics.outputs.score` scores every batch by: a causal LM, a classifier,
per-value probabilities (bernoulli), a regression, or plain outputs compared with `correct`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from graphaudit.analyses.output_kinds import LOGITS, LOGPROBS, PROBS, REGRESSION, OutputKind, confirmed
from graphaudit.errors import GraphAuditError
from graphaudit.load.data import MASK_INPUT

LOG_PROBS = "graphaudit.log_probs"  # the replay graph's log-probabilities of the scored output
IGNORE_INDEX = -100  # a label that leaves its position out


@dataclass(frozen=True)
class Task:
    """What the scored output is and what it is scored against."""

    kind: str  # causal_lm | classification | bernoulli | regression | outputs
    output: str
    ids: str | None = None  # graph input holding the token ids (causal LM)
    labels: str | None = None  # "labels" or "targets" when the data has them
    mask: str | None = None  # graph input marking tokens (1) and padding (0), beside the ids (causal LM)
    read: OutputKind | None = field(default=None, compare=False)  # what the graph says the output holds

    @property
    def scale(self) -> str:
        """What the output's values are: logits, probs or logprobs (analyses.output_kinds)."""
        return self.read.kind if self.read is not None and self.read.kind in (PROBS, LOGPROBS) else LOGITS

    @property
    def logits(self) -> bool:
        """Whether the output is one distribution per position over its last axis, scored by its
        log-probabilities (logits, probabilities or log-probabilities alike)."""
        return self.kind in ("causal_lm", "classification")

    @property
    def bernoulli(self) -> bool:
        return self.kind == "bernoulli"

    @property
    def fetch(self) -> str:
        """The replay graph output `score` reads: log-probabilities for a distribution (the output
        itself when it holds them), else the output."""
        return LOG_PROBS if self.logits and self.scale != LOGPROBS else self.output

    @property
    def divergence(self) -> str:
        return "kl" if self.logits or self.bernoulli else "mse_from_correct"

    def to_json(self) -> dict:
        return {"kind": self.kind, "output": self.output, "ids": self.ids, "labels": self.labels, "mask": self.mask,
                "read_as": self.read.to_json() if self.read is not None else None}



def no_nll_reason(task: Task, positions: int | None = None) -> str:
    """Why a replay scored by `task` has no NLL, in words: a causal LM's sequences of one token
    (`positions` per input) have no next token; otherwise every target was left out, or the
    data has no labels or targets."""
    if task.kind == "causal_lm" and positions is not None and positions < 2:
        return (f"the sequences of {task.ids!r} hold {positions} token{'' if positions == 1 else 's'} each: there "
                f"is no next token to score {task.output!r} against (next-token NLL needs at least 2)")
    if task.kind == "causal_lm" or task.labels is not None:
        return (f"every position to score {task.output!r} against was left out (labels of {IGNORE_INDEX}, or "
                "padding)")
    return f"the data has no labels or targets to score {task.output!r} against"



def task_for(outputs: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray],
             labels: Mapping[str, np.ndarray], readings: Mapping[str, OutputKind] | None = None) -> Task:
    """Return the Task for a model whose first batch gave `outputs` on `feeds`; `readings`: what
    the graph says each output holds (`analyses.output_kinds.read_outputs`; none: unnormalised)."""
    name = scored_output(outputs, feeds)
    out = outputs[name]
    read = _read_as((readings or {}).get(name) or OutputKind(name, None, "the graph was not read", None,
                                                            last_axis=None), out)
    ids = _token_ids(feeds)
    label = labels.get("labels")
    if "targets" in labels:
        _same_shape("targets", labels["targets"], out)
        return Task("bernoulli" if read.bernoulli else "regression", name, labels="targets", read=read)
    if read.bernoulli:
        if label is not None:
            _same_shape("labels", label, out)
        return Task("bernoulli", name, labels="labels" if label is not None else None, read=read)
    if read.kind == REGRESSION:
        return Task("outputs", name, read=read)
    if out.ndim == 3 and ids is not None and feeds[ids].shape == out.shape[:2]:
        if label is None and read.kind is None and name != "logits" and feeds[ids].size and \
                int(feeds[ids].max()) >= out.shape[-1]:  # token ids past its width: hidden states, not logits
            return Task("outputs", name, read=replace(read, kind=REGRESSION, reason=(
                f"{read.reason}; token ids past its width {out.shape[-1]}: hidden states, not logits over them")))
        if label is not None:
            _same_shape("labels", label, feeds[ids])
        mask = feeds.get(MASK_INPUT)
        return Task("causal_lm", name, ids, "labels" if label is not None else None,
                    MASK_INPUT if mask is not None and mask.shape == feeds[ids].shape else None, read=_settled(read))
    if read.kind is not None or _distribution_shaped(out):  # one distribution per position
        if label is None:
            return Task("classification", name, read=_settled(read))  # KL from correct, no NLL
        if not np.issubdtype(label.dtype, np.integer) or label.shape[1:] != out.shape[1:-1]:
            raise GraphAuditError(f"expected labels of {name!r} to be integer classes shaped like its positions "
                                  f"per input {tuple(out.shape[1:-1])}, found {label.dtype} of shape "
                                  f"{tuple(label.shape[1:])}")
        return Task("classification", name, labels="labels", read=_settled(read))
    return Task("outputs", name, read=replace(read, kind=REGRESSION, reason=(
        f"{read.reason}; shaped {tuple(out.shape)}, not (batch, classes) or (batch, frames, classes)")))


def _read_as(read: OutputKind, out: np.ndarray) -> OutputKind:
    """`read` checked on the first batch's `out`; an output given as a distribution must have
    classes on a last axis past the batch."""
    distribution = read.given and (read.kind in (LOGITS, LOGPROBS) or (read.kind == PROBS and not read.per_value))
    if distribution and (out.ndim < 2 or not np.issubdtype(out.dtype, np.floating)):
        raise GraphAuditError(f"expected the output {read.output!r} given as {read.kind} (--output-kind) to be "
                              f"floats with classes on an axis after the batch, found {out.dtype} of shape "
                              f"{tuple(out.shape)}")
    return confirmed(read, out)


def _settled(read: OutputKind) -> OutputKind:
    """`read` scored as one distribution per position: unnormalised values are logits."""
    return replace(read, kind=LOGITS) if read.kind is None else read


def _distribution_shaped(out: np.ndarray) -> bool:
    """Whether unnormalised `out` is shaped like logits: (batch, classes) or (batch, frames,
    classes), floats, more than one class."""
    return out.ndim in (2, 3) and out.shape[-1] > 1 and np.issubdtype(out.dtype, np.floating)


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


def _token_ids(feeds: Mapping[str, np.ndarray]) -> str | None:
    """The input whose tokens the logits predict: an encoder-decoder's logits are the decoder's."""
    for name in ("decoder_input_ids", "input_ids"):
        if name in feeds:
            return name
    ints = [k for k, v in feeds.items() if v.ndim == 2 and np.issubdtype(v.dtype, np.integer)]
    return ints[0] if len(ints) == 1 else None


def _same_shape(key: str, given: np.ndarray, expected: np.ndarray) -> None:
    """Refuse `given` (labels or targets) unless shaped like `expected` per input, axes of size 1
    aside: a binary classifier's (batch, 1) probabilities are scored against labels (batch,)."""
    if _squeezed(given.shape[1:]) != _squeezed(expected.shape[1:]):
        raise GraphAuditError(
            f"expected {key} shaped like the model's output per input {tuple(expected.shape[1:])}, "
            f"found {tuple(given.shape[1:])}"
        )


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)
