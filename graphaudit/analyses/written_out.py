"""Normalisations written out in elementary operators, read as the operator they compute.

ONNX defines Softmax and LogSoftmax by function bodies (ReduceMax, Sub, Exp, ReduceSum, Div;
then Log and Sub), and what expands them writes those nodes instead of the operator: ONNX's
own expanded test models, jax2tf through tf2onnx (a Magika classifier's `target_label` is
`Exp(z - max) / Expand(Reshape(ReduceSum(Exp(z - max))))`), hand-written softmaxes and sigmoids
in PyTorch code. Read by operator name alone, such an output is no distribution, and its
probabilities are scored as if they were logits. `written_out(node, ...)` says which
normalisation a node computes by the arithmetic it does:

- softmax: `Div(E, S)` or `Mul(E, Reciprocal(S))`, E an `Exp` and S a `ReduceSum` of that same E;
- log-softmax: `Sub(z, Log(S))`, S a `ReduceSum` of `Exp(z)`, or `Sub(z, ReduceLogSumExp(z))`;
- sigmoid: `Reciprocal(1 + Exp(-x))` or `Div(1, 1 + Exp(-x))`, -x a `Neg` or a product by -1;

and `written_out_norm(node, ...)` which feature normalisation (a layer norm, an RMS norm: what
follows is a representation, not logits), as torch's exporter writes LayerNorm below opset 17:

- `(x - mean(x)) / Sqrt(mean((x - mean(x))^2) + eps)`, the square a `Pow` by 2 or a product of
  the value by itself, the division a `Div` or a product by the reciprocal (`Reciprocal`, or
  `Div(1, ...)` as torch writes `rsqrt`), then any scale and shift by weights; the variance
  also as ONNX's own LayerNormalization body writes it, `mean(x^2) - mean(x)^2`; without the
  centring, an RMS norm.

Between an Exp and what reads it only Identity and float Casts may stand (the same values in
the same places); the sums may be reshaped, unsqueezed or expanded to be broadcast back (as
jax2tf writes them, reduced without their axis). The first batch still checks the reading
(`output_kinds.confirmed`): values that do not sum to 1 over the last axis are values.

The constants a recogniser compares (a 1, an epsilon, the axes) are read from a graph model
(`InGraph`, for detection) or from the protos (`InProtos`, for the output kinds, which also
read models without a graph model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from graphaudit.graph.model import ModelGraph, Node, TensorRef

# The same values in the same places: what may stand between an Exp and what reads it.
SAME = frozenset({"Identity", "Cast"})
# A sum brought back to the shape it divides: its values repeated, not changed.
_BROADCAST = SAME | {"Reshape", "Unsqueeze", "Squeeze", "Expand", "Flatten"}
_FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                     onnx.TensorProto.BFLOAT16})
# The operators whose output completes a written-out normalisation: a test before the recogniser runs.
COMPLETING = frozenset({"Div", "Mul", "Reciprocal", "Sub"})

Constant = Callable[[str], "np.ndarray | None"]
# The most values a constant read for a written-out normalisation holds (its axes, a 1 or a -1).
_SMALL = 64
_NAMES = {"Softmax": "a softmax", "LogSoftmax": "a log-softmax", "Sigmoid": "a sigmoid",
          "LayerNormalization": "a layer norm", "RMSNormalization": "an RMS norm"}


@dataclass(frozen=True)
class WrittenOut:
    """A normalisation spelled in elementary operators."""

    op: str  # what the nodes compute: "Softmax", "LogSoftmax", "Sigmoid" (`written_out`), "LayerNormalization"
    # or "RMSNormalization" (`written_out_norm`)
    data: str  # the value normalised: the Exp's input (a sigmoid's x)
    summed: str | None  # the value whose sum divides (a softmax's Exp output); None for a sigmoid
    axes: tuple[int, ...] | None  # the axes summed over; None: every axis, or the graph does not tell
    spelling: str  # the operators, in words ("Exp, ReduceSum and Div")

    def words(self) -> str:
        """What the nodes compute, in a report's words: "a softmax written out as Exp, ReduceSum and Div"."""
        return f"{_NAMES[self.op]} written out as {self.spelling}"

    @property
    def axis(self) -> int | None:
        """The one axis summed over; None where it sums over several, every one, or axes the graph computes."""
        return self.axes[0] if self.axes is not None and len(self.axes) == 1 else None


class InGraph:
    """`written_out` over a graph model's main graph: each node's proto by the values it makes,
    and the constants of its Constant nodes and small initializers (read from `model` the first
    time one is asked for: a written-out normalisation is rare, a large model's initializers many)."""

    def __init__(self, mg: ModelGraph, model: onnx.ModelProto | None) -> None:
        self.mg, self.model = mg, model
        self.producers = Producers(mg)
        self._value: Callable[[TensorRef | None], np.ndarray | None] | None = None

    def __call__(self, node: Node) -> WrittenOut | None:
        """The normalisation `node` (of the main graph) completes, written out; None if none."""
        if node.op_type not in COMPLETING or node.domain or node.scopes:
            return None
        return written_out(node.proto, self.producers, self.constant)

    def constant(self, name: str) -> np.ndarray | None:
        if self._value is None:
            from graphaudit.analyses.loop_trips import constant_values
            from graphaudit.analyses.static_flops import small_initializers

            self._value = constant_values(self.mg, small_initializers(self.model) if self.model is not None else {})
        return self._value(TensorRef(name))


class Producers(Mapping[str, onnx.NodeProto]):
    """The proto of the node that makes each main-graph value of a graph model, by name (what
    `written_out` and the output kinds read a model by, looked up in the graph model's tables)."""

    def __init__(self, mg: ModelGraph) -> None:
        self.mg = mg

    def __getitem__(self, name: str) -> onnx.NodeProto:
        node = self.mg.producer(TensorRef(name))
        if node is None:
            raise KeyError(name)
        return node.proto

    def __iter__(self) -> Iterator[str]:
        return (ref.name for ref, info in self.mg.tensors.items() if not ref.scope and info.kind == "node_output")

    def __len__(self) -> int:
        return sum(1 for _ in self)


class InProtos:
    """Small constant values by name, for the normalisations written out, read from a model's
    protos (as `InGraph` reads them from a graph model): a Constant node's, found among the
    producers of the graph or body read, else a main-graph initializer's. The initializers are
    listed on the first look (a written-out normalisation is rare)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self._initializers: dict[str, onnx.TensorProto] | None = None

    def reader(self, producers: Mapping[str, onnx.NodeProto]) -> Constant:
        return lambda name: self.value(name, producers)

    def fixed(self, producers: Mapping[str, onnx.NodeProto]) -> Callable[[str], bool]:
        """Whether a value is a weight: a Constant's output or a main-graph initializer, of any
        size, or one cast, reshaped or flattened (ONNX's LayerNormalization body flattens its scale)."""
        def weight(name: str) -> bool:
            name = origin(name, producers, _RESHAPED)
            node = producers.get(name)
            if node is not None:
                return node.op_type == "Constant" and node.domain in ("", "ai.onnx")
            return name in self._listed()
        return weight

    def _listed(self) -> dict[str, onnx.TensorProto]:
        if self._initializers is None:
            self._initializers = {t.name: t for t in self.graph.initializer}
        return self._initializers

    def value(self, name: str, producers: Mapping[str, onnx.NodeProto]) -> np.ndarray | None:
        """The values of the constant `name`, behind any Identity or Cast (the values it was
        given: what the recogniser compares, a 1, a 2, an epsilon, is kept by a float cast)."""
        name = origin(name, producers)
        node = producers.get(name)
        if node is not None:
            if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
                return None
            found = onnx.helper.get_attribute_value(node.attribute[0])
            if isinstance(found, onnx.TensorProto):
                return _small(found)
            return np.asarray(found) if isinstance(found, (int, float, list)) else None
        tensor = self._listed().get(name)
        return None if tensor is None else _small(tensor)


# A weight cast, reshaped or flattened is still a weight.
_RESHAPED = SAME | {"Reshape", "Flatten", "Unsqueeze", "Squeeze"}


def _small(tensor: onnx.TensorProto) -> np.ndarray | None:
    """The values of a tensor of a few numbers held in the file (axes, a 1, a -1); None for any other."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL or math.prod(tensor.dims) > _SMALL:
        return None
    return numpy_helper.to_array(tensor)


def written_out(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto],
                constant: Constant) -> WrittenOut | None:
    """The normalisation `node` completes, written out (see the module's doc); None if none.
    `producers`: the node that makes each value; `constant`: a constant value by name (None if not one)."""
    if node.domain not in ("", "ai.onnx") or not node.input:
        return None
    ins = list(node.input)
    op = node.op_type
    if op == "Div" and len(ins) == 2:
        if _is(constant(ins[0]), 1.0):
            return _sigmoid(ins[1], producers, constant, "Exp, Add and Div")
        return _softmax(ins[0], ins[1], producers, constant, "Exp, ReduceSum and Div")
    if op == "Mul" and len(ins) == 2:
        for e, r in ((ins[0], ins[1]), (ins[1], ins[0])):
            reciprocal = _made(r, producers, _BROADCAST)
            if reciprocal is not None and reciprocal.op_type == "Reciprocal":
                found = _softmax(e, reciprocal.input[0], producers, constant, "Exp, ReduceSum, Reciprocal and Mul")
                if found is not None:
                    return found
        return None
    if op == "Reciprocal":
        return _sigmoid(ins[0], producers, constant, "Exp, Add and Reciprocal")
    if op == "Sub" and len(ins) == 2:
        return _log_softmax(ins[0], ins[1], producers, constant)
    return None


def written_out_norm(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto], constant: Constant,
                     fixed: Callable[[str], bool]) -> WrittenOut | None:
    """The feature normalisation `node` completes, written out, as torch's exporter writes a
    LayerNorm below opset 17 (`(x - mean(x)) / Sqrt(mean((x - mean(x))^2) + eps) * w + b`) and an
    RMSNorm (`x * Reciprocal(Sqrt(mean(x^2) + eps)) * w`): op "LayerNormalization" or
    "RMSNormalization"; None if none. `fixed`: whether a value is a weight (an initializer or a
    Constant's), which the scale and shift after the normalisation multiply and add."""
    if node.domain not in ("", "ai.onnx"):
        return None
    core: onnx.NodeProto | None = node
    while core is not None and core.op_type in ("Add", "Mul") and len(core.input) == 2:
        a, b = core.input
        if not (fixed(a) or fixed(b)):
            break
        core = _made(a if fixed(b) else b, producers, SAME)  # past the scale or the shift
    if core is None or len(core.input) != 2:
        return None
    pairs: list[tuple[str, str]] = []  # (the value normalised, what it is divided by)
    if core.op_type == "Div" and core.domain in ("", "ai.onnx"):
        pairs.append((core.input[0], core.input[1]))
    elif core.op_type == "Mul" and core.domain in ("", "ai.onnx"):
        for value, inverse in ((core.input[0], core.input[1]), (core.input[1], core.input[0])):
            made = _made(inverse, producers, _BROADCAST)  # 1 / d: a Reciprocal, or a Div of the constant 1 (rsqrt)
            if made is not None and made.op_type == "Reciprocal" and made.input:
                pairs.append((value, made.input[0]))
            elif made is not None and made.op_type == "Div" and len(made.input) == 2 and _is(constant(made.input[0]), 1.0):
                pairs.append((value, made.input[1]))
    last = ["Div"] if core.op_type == "Div" else ["a reciprocal", "Mul"]
    for value, divisor in pairs:
        found = _root_mean_square(value, divisor, producers, constant, last)
        if found is not None:
            return found
    return None


def _root_mean_square(value: str, divisor: str, producers, constant, last: list[str]) -> WrittenOut | None:
    """`value / divisor` as a normalisation, the divisor Sqrt(variance [+ eps]): the mean square of
    `value` itself (centred, value = x - mean(x), a LayerNorm; else an RMSNorm), or, as ONNX's own
    LayerNormalization body writes it, mean(x^2) - mean(x)^2 of the x that `value` centres."""
    root = _made(divisor, producers, _BROADCAST)
    if root is None or root.op_type != "Sqrt" or not root.input:
        return None
    variance = _made(root.input[0], producers, SAME)
    if variance is not None and variance.op_type == "Add" and len(variance.input) == 2:  # + eps
        eps = [i for i in variance.input if constant(i) is not None]
        if len(eps) != 1:
            return None
        variance = _made(next(i for i in variance.input if i != eps[0]), producers, SAME)
    if variance is None or len(variance.input) < 1:
        return None
    centred = _centred(value, producers)  # x, where value = x - mean(x)
    if variance.op_type == "ReduceMean":
        square = _squared(variance.input[0], producers, constant)
        if square is None or square[0] != origin(value, producers):
            return None
        words = (["ReduceMean", "Sub"] if centred is not None else []) + [square[1], "ReduceMean", "Sqrt", *last]
        reduced = variance
    elif variance.op_type == "Sub" and len(variance.input) == 2 and centred is not None:
        means = _made(variance.input[0], producers, SAME)
        square = _squared(means.input[0], producers, constant) if means is not None and \
            means.op_type == "ReduceMean" and means.input else None
        mean_squared = _squared(variance.input[1], producers, constant)
        mean = _made(mean_squared[0], producers, _BROADCAST) if mean_squared is not None else None
        if means is None or square is None or square[0] != centred or mean is None or mean.op_type != "ReduceMean" \
                or not mean.input or origin(mean.input[0], producers) != centred:
            return None
        words = ["ReduceMean", square[1], "Sub", "Sqrt", *last]
        reduced = means
    else:
        return None
    axes = _axes(reduced, constant)
    if axes == ():
        return None
    if centred is not None:
        return WrittenOut("LayerNormalization", centred, None, axes, _listed(words))
    return WrittenOut("RMSNormalization", value, None, axes, _listed(words))


def _centred(value: str, producers) -> str | None:
    """x where `value` is x - ReduceMean(x) (behind Identity and float Casts); None otherwise."""
    sub = _made(value, producers, SAME)
    if sub is None or sub.op_type != "Sub" or len(sub.input) != 2:
        return None
    mean = _made(sub.input[1], producers, _BROADCAST)
    if mean is None or mean.op_type != "ReduceMean" or not mean.input \
            or origin(mean.input[0], producers) != origin(sub.input[0], producers):
        return None
    return origin(sub.input[0], producers)


def _squared(name: str, producers, constant) -> tuple[str, str] | None:
    """(the origin of v, the operator) where `name` is v squared: Pow(v, 2) or Mul(v, v); None otherwise."""
    node = _made(name, producers, SAME)
    if node is None or len(node.input) != 2:
        return None
    if node.op_type == "Pow" and _is(constant(node.input[1]), 2.0):
        return origin(node.input[0], producers), "Pow"
    if node.op_type == "Mul" and origin(node.input[0], producers) == origin(node.input[1], producers):
        return origin(node.input[0], producers), "Mul"
    return None


def _listed(words: list[str]) -> str:
    """"a, b and c"."""
    return ", ".join(words[:-1]) + " and " + words[-1]


def _softmax(numerator: str, divisor: str, producers, constant, spelling: str) -> WrittenOut | None:
    exp = _made(numerator, producers, SAME)
    if exp is None or exp.op_type != "Exp" or not exp.input:
        return None
    reduced = _made(divisor, producers, _BROADCAST)
    if reduced is None or reduced.op_type != "ReduceSum" or not reduced.input:
        return None
    if origin(reduced.input[0], producers) != origin(numerator, producers):
        return None  # a sum of other values than those it divides
    axes = _axes(reduced, constant)
    if axes == ():
        return None
    return WrittenOut("Softmax", exp.input[0], exp.output[0], axes, spelling)


def _log_softmax(z: str, subtracted: str, producers, constant) -> WrittenOut | None:
    made = _made(subtracted, producers, _BROADCAST)
    if made is None or not made.input:
        return None
    reduced, summed = made, None
    if made.op_type == "ReduceLogSumExp":
        spelling = "ReduceLogSumExp and Sub"
        if origin(made.input[0], producers) != origin(z, producers):
            return None
    elif made.op_type == "Log":
        sums = _made(made.input[0], producers, _BROADCAST)
        if sums is None or sums.op_type != "ReduceSum" or not sums.input:
            return None
        exp = _made(sums.input[0], producers, SAME)
        if exp is None or exp.op_type != "Exp" or not exp.input or origin(exp.input[0], producers) != origin(z, producers):
            return None
        reduced, summed, spelling = sums, exp.output[0], "Exp, ReduceSum, Log and Sub"
    else:
        return None
    axes = _axes(reduced, constant)
    if axes == ():
        return None
    return WrittenOut("LogSoftmax", z, summed, axes, spelling)


def _sigmoid(denominator: str, producers, constant, spelling: str) -> WrittenOut | None:
    add = _made(denominator, producers, SAME)
    if add is None or add.op_type != "Add" or len(add.input) != 2:
        return None
    for one, other in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
        if not _is(constant(one), 1.0):
            continue
        exp = _made(other, producers, SAME)
        if exp is None or exp.op_type != "Exp" or not exp.input:
            continue
        x = _negated(exp.input[0], producers, constant)
        if x is not None:
            return WrittenOut("Sigmoid", x, None, None, spelling)
    return None


def _negated(name: str, producers, constant) -> str | None:
    """x where `name` is -x: a Neg, a product by -1 or 0 - x; None otherwise."""
    node = _made(name, producers, SAME)
    if node is None or not node.input:
        return None
    if node.op_type == "Neg":
        return node.input[0]
    if node.op_type == "Mul" and len(node.input) == 2:
        for factor, x in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            if _is(constant(factor), -1.0):
                return x
    if node.op_type == "Sub" and len(node.input) == 2 and _is(constant(node.input[0]), 0.0):
        return node.input[1]
    return None


def origin(name: str, producers: Mapping[str, onnx.NodeProto], through: frozenset[str] = SAME) -> str:
    """`name` behind the standard operators `through` (their first input; a Cast only to a float
    type): where its values come from. Two names with one origin behind `SAME` hold the same values."""
    seen = set()
    while name not in seen and (node := producers.get(name)) is not None and node.op_type in through \
            and node.domain in ("", "ai.onnx") and node.input and (node.op_type != "Cast" or _cast_to_float(node)):
        seen.add(name)
        name = node.input[0]
    return name


def _made(name: str, producers: Mapping[str, onnx.NodeProto], through: frozenset[str]) -> onnx.NodeProto | None:
    """The standard node that makes `name`, looked for behind the operators `through`; None for a
    graph input, a constant or a node of another domain."""
    node = producers.get(origin(name, producers, through))
    return node if node is not None and node.domain in ("", "ai.onnx") else None


def _axes(reduce: onnx.NodeProto, constant: Constant) -> tuple[int, ...] | None:
    """The axes `reduce` sums over: a tuple, None for every axis (or axes the graph computes), ()
    where it sums over none (noop_with_empty_axes: the values themselves, no normalisation)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in reduce.attribute}
    if "axes" in attrs:  # the attribute, before opset 13 (ReduceSum) or 18 (the other reductions)
        return tuple(int(a) for a in attrs["axes"]) or None
    if len(reduce.input) > 1 and reduce.input[1]:
        found = constant(reduce.input[1])
        if found is None:
            return None  # computed: the first batch tells
        axes = tuple(int(a) for a in np.asarray(found).reshape(-1))
        if axes:
            return axes
    return () if attrs.get("noop_with_empty_axes") else None


def _cast_to_float(node: onnx.NodeProto) -> bool:
    return any(a.name == "to" and a.i in _FLOATS for a in node.attribute)


def _is(value: np.ndarray | None, number: float) -> bool:
    """Whether `value` is a constant all of whose elements are `number`."""
    if value is None:
        return False
    array = np.asarray(value)
    return array.size > 0 and array.dtype.kind in "fiu" and bool(np.all(array == number))
