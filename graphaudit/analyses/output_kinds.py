"""What each graph output is, read from the graph: logits, probabilities, log-probabilities or values.

`read_outputs(model)` follows every graph output back through the operators that do not
change its values (VALUE_PRESERVING) to the operator that made it. A normalising operator
(NORMALISING) says the output holds probabilities (a Softmax over the last axis: one
distribution per position; a Sigmoid: an independent probability per value, as a
multi-label head or a per-pixel map gives) or log-probabilities (LogSoftmax); a feature
normalisation (FEATURES) says it holds features, not logits. Anything else leaves it
unnormalised (`kind` None): `metrics.tasks.task_for` reads it as logits where it is
shaped like a distribution, (batch, classes) or (batch, frames, classes), and as values
otherwise. The first batch checks what the graph says (`confirmed`): probabilities that do
not sum to 1 over the last axis were normalised over another one, and are values.

A pure analysis of the ModelProto (no shape inference, no run), in `analyses` beside the
other readings of the graph; the replay's scoring (`metrics.outputs`) is what uses it. Given the
graph model the caller has built, it looks up the few values it follows there, instead of
indexing every node and declared type of the proto again (38 ms at 18,000 nodes).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import onnx

from graphaudit.analyses.written_out import Constant, InProtos, Producers, origin, written_out, written_out_norm
from graphaudit.errors import UsageError
from graphaudit.graph.model import ModelGraph, TensorInfo, TensorRef

LOGITS, PROBS, LOGPROBS, REGRESSION = "logits", "probs", "logprobs", "regression"
KINDS = (LOGITS, PROBS, LOGPROBS, REGRESSION)
# keyed by OutputKind.kind, None included: looked up with a default for "no normalising operator"
WORDS: Mapping[str | None, str] = {LOGITS: "logits", PROBS: "probabilities", LOGPROBS: "log-probabilities", REGRESSION: "values"}

# Operators whose output holds the values of their first input, rearranged or relabelled.
VALUE_PRESERVING = frozenset({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Cast"})
# Operators whose every output value is a mean, or one, of their first input's values: a probability
# stays one (a voice detector's mean of its per-frame Sigmoids over time), a distribution per position may not.
AVERAGING = frozenset({"ReduceMean", "ReduceMax", "ReduceMin", "AveragePool", "GlobalAveragePool", "MaxPool",
                       "GlobalMaxPool"})
# Operators that join their parts' values, each with the inputs that hold them: a Concat all, a
# scatter its data and its updates (not the indices).
PARTS = {"Concat": range(1 << 16), "ScatterElements": (0, 2), "ScatterND": (0, 2), "Scatter": (0, 2)}
# op -> the constant that leaves the other operand unchanged
_NEUTRAL = {"Add": 0, "Sub": 0, "Mul": 1, "Div": 1}
# How deep in nested If branches and Loop bodies an output is followed.
MAX_BODY_DEPTH = 8
# op -> (kind, one probability per value): the operators that make a distribution of their input.
NORMALISING = {"Softmax": (PROBS, False), "LogSoftmax": (LOGPROBS, False), "Sigmoid": (PROBS, True)}
# Normalisations of features: what follows them is a representation, not logits.
FEATURES = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
                      "SkipSimplifiedLayerNormalization", "RMSNormalization", "LpNormalization"})
_FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                     onnx.TensorProto.BFLOAT16})
# How far from 1 a row of probabilities may sum (from 0, a row's log-sum-exp of log-probabilities)
# and still be one distribution: float16's rounding over a few thousand classes stays within it.
SUM_TOLERANCE = 1e-2


@dataclass(frozen=True)
class OutputKind:
    """What a graph output holds, and the one-line reason."""

    output: str
    kind: str | None  # one of KINDS; None: no normalising operator (logits if shaped like a distribution)
    reason: str
    node: str | None = None  # the operator that decides it
    per_value: bool = False  # probabilities of independent events (a Sigmoid), not one distribution per position
    last_axis: bool | None = True  # a Softmax / LogSoftmax over the last axis (None: the graph does not tell)
    given: bool = False  # the user's --output-kind

    @property
    def bernoulli(self) -> bool:
        """Whether each value is the probability of its own event (a Sigmoid per class or per pixel)."""
        return self.kind == PROBS and self.per_value

    def describe(self) -> str:
        what = "per-value probabilities (Bernoulli)" if self.bernoulli else WORDS.get(
            self.kind, "unnormalised (scored as logits where shaped (batch, classes) or (batch, frames, classes))")
        return f"{self.output!r} read as {what}: {self.reason}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "bernoulli": self.bernoulli, "reason": self.reason, "node": self.node,
                "given": self.given}


def read_outputs(model: onnx.ModelProto, given: Mapping[str, str] | None = None,
                 graph_model: ModelGraph | None = None) -> dict[str, OutputKind]:
    """Return, per graph output of `model`, what it holds; `given` (output -> kind, the user's
    --output-kind) overrides the graph's reading, checked against the outputs and KINDS.
    `graph_model`: `model`'s, when the caller has built it (the same readings, looked up there)."""
    graph = model.graph
    producers: Mapping[str, onnx.NodeProto]
    ranks: Mapping[str, int]
    if graph_model is None:
        producers = {o: n for n in graph.node for o in n.output if o}
        ranks = _declared_ranks(graph)
    else:
        # the node that makes each value, and the rank of each whose shape is known
        producers = Producers(graph_model)
        ranks = _MainValues(graph_model, lambda info: None if info.shape is None else len(info.shape))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    constants = InProtos(graph)
    readings = {o.name: _read(o.name, producers, ranks, opset, constants) for o in graph.output}
    for name, kind in (given or {}).items():
        if name not in readings:
            raise UsageError(f"expected --output-kind to name a graph output ({', '.join(readings) or 'none'}), "
                             f"found {name!r}")
        if kind not in KINDS:
            raise UsageError(f"expected --output-kind {name}=KIND with KIND among {', '.join(KINDS)}, found {kind!r}")
        found = readings[name]
        readings[name] = OutputKind(name, kind, "as given (--output-kind)", found.node,
                                    per_value=kind == PROBS and found.per_value, given=True)
    return readings


def parse_output_kinds(entries: Sequence[str]) -> dict[str, str]:
    """Return {output: kind} from `--output-kind NAME=KIND` entries (repeatable, comma-separated)."""
    kinds: dict[str, str] = {}
    for entry in (e.strip() for value in entries for e in value.split(",") if e.strip()):
        name, sep, kind = entry.rpartition("=")
        if not sep or not name.strip():
            raise UsageError(f"expected --output-kind NAME=KIND (KIND among {', '.join(KINDS)}), found {entry!r}")
        kinds[name.strip()] = kind.strip()
    return kinds


def confirmed(reading: OutputKind, out: np.ndarray) -> OutputKind:
    """`reading`, or what it becomes when the first input of the first batch `out` contradicts it:
    probabilities that do not sum to 1 over the last axis (log-probabilities whose exponentials do not) were
    normalised over another axis, and are read as values; a Sigmoid's values outside [0, 1] too.
    The user's word is taken as it is."""
    if reading.given or reading.kind not in (PROBS, LOGPROBS) or not np.issubdtype(out.dtype, np.floating):
        return reading
    # the first input tells the axis: a pass over it alone keeps a large vocabulary's batch uncopied
    values = np.asarray(out[:1], dtype=np.float64)
    finite = values[np.isfinite(values)] if reading.kind == PROBS else values
    if reading.bernoulli:
        if finite.size and (finite.min() < 0 or finite.max() > 1):
            return replace(reading, kind=REGRESSION, per_value=False,
                           reason=f"{reading.reason}, but its values leave [0, 1]: compared as they are")
        return reading
    if reading.last_axis is False or out.ndim < 2 or out.shape[-1] < 2:
        return _values(reading, "not over the last axis" if reading.last_axis is False else
                       "over an axis of one value or none")
    with np.errstate(over="ignore", invalid="ignore"):
        sums = values.sum(axis=-1) if reading.kind == PROBS else np.exp(values).sum(axis=-1)
    if not np.all(np.abs(sums - 1) <= SUM_TOLERANCE) or (reading.kind == PROBS and finite.size and finite.min() < 0):
        return _values(reading, "whose values do not sum to 1 over the last axis")
    return replace(reading, last_axis=True, reason=re.sub(r"over axis -?\d+", "over the last axis", reading.reason))


def _values(reading: OutputKind, why: str) -> OutputKind:
    return replace(reading, kind=REGRESSION, last_axis=False,
                   reason=f"{reading.reason.replace(' over the last axis', '')}, {why}: compared as values")


def _read(output: str, producers: Mapping[str, onnx.NodeProto], ranks: Mapping[str, int], opset: int,
          constants: InProtos, depth: int = 0, carried: str | None = None) -> OutputKind:
    """What graph output `output` holds, from the operators behind it (`producers`: the node that
    makes each value, a body's own over those of the graphs around it; `carried`: in a Loop's
    body, the state whose update is read, which each step writes over in part)."""
    name, through, last_kept, rank_kept, mixed = output, [], True, True, False
    seen = set()
    constant = constants.reader(producers)
    while name in producers and name not in seen:
        seen.add(name)
        node = producers[name]
        label = node.name or f"{node.op_type} -> {name}"
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type in VALUE_PRESERVING and node.input:
            if node.op_type == "Cast" and _attr(node, "to") not in _FLOATS:
                break  # rounded to integers or flags: no longer the values it was given
            if node.op_type == "Transpose":
                perm = _attr(node, "perm")
                last_kept &= bool(perm) and perm[-1] == len(perm) - 1
            rank_kept &= node.op_type in ("Identity", "Cast", "Transpose")
            through.append(node.op_type)
            name = node.input[0]
            continue
        if standard and (kept := _unchanged(node, constant)) is not None:
            rank_kept = False  # the constant may broadcast the value to more axes
            through.append(node.op_type)
            name = kept
            continue
        if standard and node.op_type in AVERAGING and node.input:
            mixed, rank_kept = True, False
            through.append(node.op_type)
            name = node.input[0]
            continue
        behind = f" (behind {', '.join(dict.fromkeys(reversed(through)))})" if through else ""
        if standard and node.op_type in PARTS and depth < MAX_BODY_DEPTH:
            return _read_parts(output, node, producers, ranks, opset, constants, depth, behind, carried)
        if standard and node.op_type == "If" and depth < MAX_BODY_DEPTH:
            return _read_branches(output, node, list(node.output).index(name), producers, ranks, opset, constants,
                                  depth, behind)
        if standard and node.op_type == "Loop" and depth < MAX_BODY_DEPTH:
            return _read_loop(output, node, list(node.output).index(name), producers, ranks, opset, constants,
                              depth, behind)
        spelled = written_out(node, producers, constant) if standard else None
        if spelled is not None or (standard and node.op_type in NORMALISING):
            op = spelled.op if spelled is not None else node.op_type
            what = f"a {op}" if spelled is None else spelled.words()
            kind, per_value = NORMALISING[op]
            if per_value:
                return OutputKind(output, kind, f"{what}, one probability per value, at node {label}{behind}",
                                  label, per_value=True)
            if mixed:  # a distribution averaged or picked over some axis may no longer sum to 1 over the last
                return OutputKind(output, None, f"{what} at node {label}{behind}, averaged or picked over "
                                                "some axis: not one distribution per position", label, last_axis=None)
            data = node.input[0] if spelled is None else spelled.data
            axes: tuple[int, ...] | None = spelled.axes if spelled is not None else None
            if spelled is None:
                axis = _attr(node, "axis")
                axes = ((-1 if opset >= 13 else 1) if axis is None else axis,)
            rank = ranks.get(data) or (ranks.get(output) if rank_kept else None)
            if axes is None or len(axes) > 1:  # summed over every axis, several, or axes the graph computes
                over = "axes the graph does not give" if axes is None else f"axes {', '.join(map(str, axes))}"
                return OutputKind(output, kind, f"{what} over {over} at node {label}{behind}", label,
                                  last_axis=None if axes is None else False)
            axis = axes[0]
            last = axis == -1 or (rank is not None and axis == rank - 1)
            over = "the last axis" if last else f"axis {axis}"
            # over the last axis of the output: unless a Transpose moved it; unknown where the rank is
            last_axis = last_kept if last else (False if rank is not None or not last_kept else None)
            return OutputKind(output, kind, f"{what} over {over} at node {label}{behind}", label,
                              last_axis=last_axis)
        norm = written_out_norm(node, producers, constant, constants.fixed(producers)) \
            if standard and node.op_type not in FEATURES else None
        if node.op_type in FEATURES or norm is not None:
            what = f"a {node.op_type}" if norm is None else norm.words()
            return OutputKind(output, REGRESSION, f"{what} at node {label}{behind}: features, not logits",
                              label, last_axis=None)
        return OutputKind(output, None, f"no Softmax, LogSoftmax or Sigmoid makes it (it comes from {node.op_type} "
                                        f"node {label}{behind})", label, last_axis=None)
    return OutputKind(output, None, "no operator makes it (a graph input or a constant)", None, last_axis=None)


def _read_parts(output: str, node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto],
               ranks: Mapping[str, int], opset: int, constants: InProtos, depth: int, behind: str,
               carried: str | None = None) -> OutputKind:
    """What the Concat or scatter `node` makes: what its parts hold where they agree; values where
    they do not (a detector's boxes beside its Sigmoid scores is no distribution, nor logits).
    A Loop's state `carried`, grown or written into at each step, holds what the steps add to it."""
    label, op = node.name or f"{node.op_type} -> {node.output[0]}", node.op_type
    names = [name for i, name in enumerate(node.input) if name and i in PARTS[node.op_type]]
    written = [name for name in names if origin(name, producers) != carried] if carried is not None else names
    if written and len(written) < len(names):  # the state holds what the steps wrote into it
        names, behind = written, f"{behind} (into the Loop's state)"
    parts = [_read(name, producers, ranks, opset, constants, depth + 1, carried) for name in names]
    kinds = {(r.kind, r.per_value) for r in parts}
    if len(kinds) == 1:
        first = parts[0]
        # the joined axis may be the one a Softmax normalised: only per-value probabilities stay what they were,
        # and distributions over the last axis where the Concat joins another (a decoder's steps, one by one)
        if first.kind is None or first.per_value or first.kind == REGRESSION or (
                all(r.last_axis for r in parts) and _joins_before_last(node, ranks)):
            return replace(first, output=output, node=label,
                           reason=f"a {op} at node {label}{behind} of parts that each hold it: {first.reason}")
        return OutputKind(output, None, f"a {op} at node {label}{behind} of {WORDS[first.kind]}", label,
                          last_axis=None)
    held = ", ".join(dict.fromkeys("per-value probabilities" if r.per_value else WORDS.get(r.kind, "unnormalised values")
                                   for r in parts))
    return OutputKind(output, REGRESSION, f"a {op} at node {label}{behind} of parts that hold different things "
                                          f"({held}): compared as values", label, last_axis=None)


def _joins_before_last(node: onnx.NodeProto, ranks: Mapping[str, int]) -> bool:
    """Whether `node` is a Concat along an axis before its parts' last (all of one rank)."""
    axis = _attr(node, "axis") if node.op_type == "Concat" else None
    if axis is None:
        return False
    rank = next((ranks[name] for name in (*node.output, *node.input) if name in ranks), None)
    return axis < -1 if axis < 0 else rank is not None and axis < rank - 1


def _read_branches(output: str, node: onnx.NodeProto, index: int, producers: Mapping[str, onnx.NodeProto],
                   ranks: Mapping[str, int], opset: int, constants: InProtos, depth: int,
                   behind: str) -> OutputKind:
    """What output `index` of the If `node` holds: what each branch gives back there, when the
    branches agree (a model whose cheap branch passes on the same Sigmoid its costly one makes)."""
    label = node.name or f"If -> {node.output[index]}"
    found = []
    for attr in node.attribute:
        if attr.type != onnx.AttributeProto.GRAPH or index >= len(attr.g.output):
            continue
        inner = {o: n for n in attr.g.node for o in n.output if o}
        found.append(_read(attr.g.output[index].name, _Within(inner, producers),
                           _Within(_declared_ranks(attr.g), ranks), opset, constants, depth + 1))
    same = {(r.kind, r.per_value, r.last_axis) for r in found}
    if len(found) < 2 or len(same) != 1:
        return OutputKind(output, None, f"its branches of If node {label}{behind} do not agree on what it holds",
                          label, last_axis=None)
    first = found[0]
    return replace(first, output=output, node=label,
                   reason=f"in every branch of If node {label}{behind}: {first.reason}")


def _read_loop(output: str, node: onnx.NodeProto, index: int, producers: Mapping[str, onnx.NodeProto],
               ranks: Mapping[str, int], opset: int, constants: InProtos, depth: int, behind: str) -> OutputKind:
    """What output `index` of the Loop `node` holds: what its body gives back there, a step's
    value of a scan output (stacked over the steps on a new first axis) or the last update of a
    state (a decoder's buffer of boxes, written a step at a time), read in the body."""
    label = node.name or f"Loop -> {node.output[index]}"
    body = next((a.g for a in node.attribute if a.name == "body" and a.type == onnx.AttributeProto.GRAPH), None)
    states = len(node.input) - 2
    if body is None or index + 1 >= len(body.output) or (index < states and index + 2 >= len(body.input)):
        return OutputKind(output, None, f"Loop node {label}{behind} gives back no body value there", label,
                          last_axis=None)
    state = body.input[index + 2].name if index < states else None
    inner = {o: n for n in body.node for o in n.output if o}
    within = _Within(inner, producers)
    if state is not None and origin(body.output[index + 1].name, within) == state:  # never updated
        found = _read(node.input[index + 2], producers, ranks, opset, constants, depth + 1)
        return replace(found, output=output, node=label,
                       reason=f"the state of Loop node {label}{behind}, which its body passes on: {found.reason}")
    found = _read(body.output[index + 1].name, within, _Within(_declared_ranks(body), ranks), opset, constants,
                  depth + 1, carried=state)
    what = "each step's value" if state is None else "the state"
    return replace(found, output=output, node=label,
                   reason=f"{what} that the body of Loop node {label}{behind} gives back: {found.reason}")


def _unchanged(node: onnx.NodeProto, constant: Constant) -> str | None:
    """The input `node` passes on unchanged: x + 0, x − 0, x · 1, x / 1 with a constant 0 or 1 (an
    exporter's assignment, Paddle2ONNX's `Add(x, 0)`), or the data an Expand broadcasts; else None."""
    op, inputs = node.op_type, node.input
    if op == "Expand" and inputs:
        return inputs[0]
    if len(inputs) != 2 or op not in _NEUTRAL:
        return None
    neutral = _NEUTRAL[op]
    for kept, other in ((0, 1), (1, 0)) if op in ("Add", "Mul") else ((0, 1),):
        value = constant(inputs[other])
        if value is not None and value.size and np.all(value == neutral):
            return inputs[kept]
    return None


def _attr(node: onnx.NodeProto, name: str):
    found = next((a for a in node.attribute if a.name == name), None)
    return None if found is None else onnx.helper.get_attribute_value(found)


_V = TypeVar("_V")


class _Within(Mapping[str, _V]):
    """A body's own names over those of the graphs around it (read, never copied)."""

    def __init__(self, inner: Mapping[str, _V], outer: Mapping[str, _V]) -> None:
        self.inner, self.outer = inner, outer

    def __getitem__(self, name: str) -> _V:
        return self.inner[name] if name in self.inner else self.outer[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self.outer), **dict.fromkeys(self.inner)})

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _MainValues(Mapping[str, _V]):
    """What `of` reads of each main-graph value in the graph model (None: nothing), by name."""

    def __init__(self, mg: ModelGraph, of: Callable[[TensorInfo], _V | None]) -> None:
        self.mg, self.of = mg, of

    def __getitem__(self, name: str) -> _V:
        info = self.mg.tensors.get(TensorRef(name))
        found = None if info is None else self.of(info)
        if found is None:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[str]:
        return (ref.name for ref, info in self.mg.tensors.items() if not ref.scope and self.of(info) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _declared_ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """The rank of every value whose type the file declares with a shape."""
    ranks = {}
    for vi in (*graph.value_info, *graph.input, *graph.output):
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape"):
            ranks[vi.name] = len(t.shape.dim)
    return ranks
