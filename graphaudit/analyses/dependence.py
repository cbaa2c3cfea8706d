"""What every tensor depends on: nothing, the input shapes, or the input values.

`analyse_dependence` walks the model once (bodies of If / Loop / Scan / function calls
included) and gives back, for every tensor, two points of the lattice
CONST < SHAPE < VALUE: what its *values* depend on and what its *shape* depends on. A
tensor's dependence as a whole is the larger of the two (`data_dependence`). It also
records, for every control-flow node, what decides whether and how often its bodies run.

The rules that matter for an execution audit:

- `Shape` / `Size` reveal only a shape: their value is as dependent as their input's shape.
  `ConstantOfShape`, `Range`, `Gather` / `Slice` / `Concat` of shapes stay shape-dependent.
- Ops whose output *extent* is given by an input's values (Reshape, Expand, Tile, Range,
  Slice, TopK's k, ...) carry that input's value dependence into their shape; NonZero,
  Compress and Unique have a value-dependent extent whenever their input is.
- A shape that shape inference gives with integer dimensions only is constant.
- An `If` output depends on its condition; a `Loop`'s carried values are iterated to a
  fixed point, and its results depend on the trip count and on the body's condition (the
  shape of a carried value too, unless the body gives it back in the shape it came in).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from graphaudit.graph.model import ModelGraph, Node, TensorRef
from graphaudit.graph.visit_order import nodes_by_scope
from graphaudit.load.shape_values import SHAPE_ARGUMENTS


class Dependence(IntEnum):
    """How much of the input a tensor reveals: nothing, the shapes, or the values."""

    CONST = 0
    SHAPE = 1
    VALUE = 2

    def __str__(self) -> str:
        return self.name.lower()


CONST, SHAPE, VALUE = Dependence.CONST, Dependence.SHAPE, Dependence.VALUE

# Ops whose output has the shape of some inputs only (a scatter keeps its data's shape).
SHAPE_FROM: dict[str, tuple[int, ...]] = {
    "ScatterND": (0,), "ScatterElements": (0,), "Scatter": (0,), "TensorScatter": (0,),
}
# Ops whose output extent depends on the *values* of their inputs.
VALUE_SIZED = frozenset({"NonZero", "Compress", "Unique", "NonMaxSuppression", "StringSplit"})
# Ops whose output values say nothing about the input's values, only about its shape.
SHAPE_READERS = frozenset({"Shape", "Size"})
# Ops whose outputs are filled from attributes or a random source, shaped after an input.
FILLED_LIKE = frozenset({"ConstantOfShape", "RandomNormalLike", "RandomUniformLike", "EyeLike"})
SOURCES = frozenset({"Constant", "RandomNormal", "RandomUniform"})
# ONNX Runtime contrib operators whose subgraphs run a value-dependent number of times.
CONTRIB_LOOPS = frozenset({"BeamSearch", "GreedySearch", "Sampling", "WhisperBeamSearch"})
_MAX_ROUNDS = 16
# Ops that need more than "the largest dependence among the inputs" (the rule for the rest).
_SPECIAL = SOURCES | SHAPE_READERS | FILLED_LIKE | VALUE_SIZED | SHAPE_FROM.keys() | SHAPE_ARGUMENTS.keys()


@dataclass(frozen=True)
class Control:
    """What decides whether, or how often, the bodies of a control-flow node run."""

    node: str
    op: str
    dependence: Dependence
    tensors: tuple[TensorRef, ...]  # the condition / trip-count tensors that decide it
    reason: str


@dataclass(frozen=True)
class DependenceMap:
    """Per tensor: what its values and its shape depend on; per control node: its Control."""

    values: dict[TensorRef, Dependence]
    shapes: dict[TensorRef, Dependence]
    controls: dict[str, Control]

    def of(self, ref: TensorRef | None) -> Dependence:
        """The dependence of `ref` as a whole: the larger of its values' and its shape's."""
        if ref is None:
            return CONST
        return max(self.values.get(ref, VALUE), self.shapes.get(ref, VALUE))

    def value(self, ref: TensorRef | None) -> Dependence:
        return CONST if ref is None else self.values.get(ref, VALUE)

    def shape(self, ref: TensorRef | None) -> Dependence:
        return CONST if ref is None else self.shapes.get(ref, VALUE)


def data_dependence(mg: ModelGraph) -> dict[TensorRef, Dependence]:
    """Return, for every tensor of `mg`, what it depends on (CONST < SHAPE < VALUE)."""
    dm = analyse_dependence(mg)
    return {ref: max(v, dm.shapes.get(ref, VALUE)) for ref, v in dm.values.items()}


def analyse_dependence(mg: ModelGraph, given: frozenset[str] = frozenset()) -> DependenceMap:
    """Return the DependenceMap of `mg`: values, shapes and control decisions. `given`: graph
    inputs whose values count as given, not as the input's (the coefficients a frozen graph is
    fed: what still depends on the input's values is then what they do not decide)."""
    return _Propagation(mg, given).run()


def _static_shape(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


class _Propagation:
    def __init__(self, mg: ModelGraph, given: frozenset[str] = frozenset()):
        self.mg = mg
        self.by_scope = nodes_by_scope(mg)
        self.values: dict[TensorRef, Dependence] = {}
        self.shapes: dict[TensorRef, Dependence] = {}
        self.controls: dict[str, Control] = {}
        self.static: set[TensorRef] = set()
        static_shape: dict[tuple, bool] = {}  # shape -> all dims fixed: the same shapes recur
        for ref, info in mg.tensors.items():
            shape = info.shape
            if shape is not None:
                fixed = static_shape.get(shape)
                if fixed is None:
                    fixed = static_shape[shape] = _static_shape(shape)
                if fixed:
                    self.static.add(ref)
            kind = info.kind
            if kind == "initializer":
                self.values[ref] = self.shapes[ref] = CONST
            elif kind == "input":
                self.values[ref] = CONST if ref.name in given else VALUE
                self.shapes[ref] = CONST if ref in self.static else SHAPE
            elif kind == "undefined":  # nothing defines it: assume the worst
                self.values[ref] = self.shapes[ref] = VALUE

    def run(self) -> DependenceMap:
        self._scope("")
        return DependenceMap(self.values, self.shapes, self.controls)

    # -- helpers ---------------------------------------------------------------------------
    def _v(self, ref: TensorRef | None) -> Dependence:
        return CONST if ref is None else self.values.get(ref, VALUE)

    def _s(self, ref: TensorRef | None) -> Dependence:
        return CONST if ref is None else self.shapes.get(ref, VALUE)

    def _set(self, ref: TensorRef | None, value: Dependence, shape: Dependence) -> None:
        if ref is None:
            return
        self.values[ref] = value
        self.shapes[ref] = CONST if ref in self.static else shape

    def _scope(self, key: str) -> None:
        owners = self.mg.body_table
        values, shapes, static = self.values, self.shapes, self.static
        for node in self.by_scope.get(key, ()):
            if owners and node.id in owners:
                self._owner(node)
                continue
            # The largest dependence among the inputs, for values and for shapes alike (a
            # missing input reads as CONST, an unknown one as VALUE): the rule of most nodes,
            # and where the others' (`_plain`) start.
            value = shape = CONST
            for ref in node.inputs:
                if ref is not None:
                    v, s = values.get(ref, VALUE), shapes.get(ref, VALUE)
                    if v > value:
                        value = v
                    if s > shape:
                        shape = s
            domain = node.domain
            op = f"{domain}.{node.op_type}" if domain and domain != "ai.onnx" else node.op_type
            if op in _SPECIAL:
                self._plain(node, op, value, shape)
                continue
            for out in node.outputs:
                if out is not None:
                    values[out] = value
                    shapes[out] = CONST if out in static else shape

    # -- ordinary nodes --------------------------------------------------------------------
    def _plain(self, node: Node, op: str, value: Dependence, shape: Dependence) -> None:
        """The outputs of `node`, whose operator `op` has a rule of its own; `value` and `shape`:
        the largest dependence among its inputs' values and shapes."""
        ins = node.inputs
        if op in SOURCES:
            value = shape = CONST
        elif op in SHAPE_READERS:
            value, shape = (self._s(ins[0]) if ins else CONST), CONST
        elif op in FILLED_LIKE:
            extent = self._v(ins[0]) if op == "ConstantOfShape" else self._s(ins[0])
            value = extent if op == "EyeLike" else CONST
            shape = extent if ins else CONST
        else:
            if op in SHAPE_FROM:
                shape = max((self._s(ins[i]) for i in SHAPE_FROM[op] if i < len(ins)), default=CONST)
            args = SHAPE_ARGUMENTS.get(op, ())
            shape = max([shape] + [self._v(ins[i]) for i in args if i < len(ins)])
            if op in VALUE_SIZED:
                shape = max(shape, value)
        for out in node.outputs:
            self._set(out, value, shape)

    # -- control flow and calls ------------------------------------------------------------
    def _owner(self, node: Node) -> None:
        bodies = self.mg.bodies(node.id)
        if bodies[0].kind == "function":
            self._scope(bodies[0].scope)
            for out, res in zip(node.outputs, bodies[0].outputs):
                self._set(out, self._v(res), self._s(res))
        elif node.domain in ("", "ai.onnx") and node.op_type == "If":
            self._if(node, bodies)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Loop":
            self._loop(node, bodies[0])
        elif node.domain in ("", "ai.onnx") and node.op_type == "Scan":
            self._scan(node, bodies[0])
        else:
            self._opaque(node, bodies)

    def _if(self, node: Node, bodies) -> None:
        cond = node.inputs[0] if node.inputs else None
        c = self._v(cond)
        for body in bodies:
            self._scope(body.scope)
        for k, out in enumerate(node.outputs):
            results = [b.outputs[k] for b in bodies if k < len(b.outputs)]
            value = max([c] + [self._v(r) for r in results])
            shape = max([self._s(r) for r in results], default=CONST)
            if c > shape and not self._agreed(out):
                shape = c
            self._set(out, value, shape)
        reason = {CONST: "constant condition", SHAPE: "condition depends only on input shapes",
                  VALUE: "condition depends on input values"}[c]
        self.controls[node.id] = Control(node.id, "If", c, (cond,) if cond else (), reason)

    def _agreed(self, ref: TensorRef | None) -> bool:
        """Whether shape inference gave `ref` every dimension: it clears a dimension on which
        an If's branches disagree, so a full shape means both branches give it."""
        info = self.mg.tensors.get(ref) if ref is not None else None
        return info is not None and info.shape is not None and None not in info.shape

    def _loop(self, node: Node, body) -> None:
        ins = node.inputs
        trip, cond = (ins[0] if ins else None), (ins[1] if len(ins) > 1 else None)
        carried_init = list(ins[2:])
        n_carried = len(carried_init)
        formal = body.inputs  # (iteration_num, cond_in, carried...)
        results = body.outputs  # (cond_out, carried..., scan outputs...)
        count = max(self._v(trip), self._v(cond))
        carried = [(self._v(r), self._s(r)) for r in carried_init]
        cond_out = self._v(cond)
        for _ in range(_MAX_ROUNDS):
            if formal:
                self._set(formal[0], count, CONST)
            if len(formal) > 1:
                self._set(formal[1], max(self._v(cond), cond_out), CONST)
            for ref, (v, s) in zip(formal[2:], carried):
                self._set(ref, v, s)
            self._scope(body.scope)
            cond_out = self._v(results[0]) if results else CONST
            updated = [
                (max(v, self._v(r)), max(s, self._s(r)))
                for (v, s), r in zip(carried, results[1 : 1 + n_carried])
            ]
            if updated == carried:
                break
            carried = updated
        decided = max(count, cond_out)
        for out, (v, s), ref, r in zip(node.outputs[:n_carried], carried, formal[2:], results[1:]):
            if not self._same_shape(ref, r):  # it may grow or shrink with each iteration
                s = max(s, decided)
            self._set(out, max(v, decided), s)
        for out, r in zip(node.outputs[n_carried:], results[1 + n_carried :]):
            self._set(out, max(self._v(r), decided), max(self._s(r), decided))
        tensors = tuple(r for r in (trip, cond, results[0] if results else None) if r is not None)
        parts = []
        if self._v(trip) == VALUE:
            parts.append("trip count depends on input values")
        if max(self._v(cond), cond_out) == VALUE:
            parts.append("loop condition depends on input values")
        if not parts:
            parts.append("trip count and condition depend only on input shapes" if decided == SHAPE
                         else "constant trip count and condition")
        self.controls[node.id] = Control(node.id, "Loop", decided, tensors, "; ".join(parts))

    def _same_shape(self, a: TensorRef, b: TensorRef) -> bool:
        """Whether `a` and `b` have one shape that shape inference gives in every dimension."""
        info_a, info_b = self.mg.tensors.get(a), self.mg.tensors.get(b)
        if info_a is None or info_b is None or info_a.shape is None or None in info_a.shape:
            return False
        return info_a.shape == info_b.shape

    def _scan(self, node: Node, body) -> None:
        n_scan = next((a.i for a in node.proto.attribute if a.name == "num_scan_inputs"), 0)
        ins = list(node.inputs)
        n_state = len(ins) - n_scan
        states = [(self._v(r), self._s(r)) for r in ins[:n_state]]
        scanned = ins[n_state:]
        count = max((self._s(r) for r in scanned), default=CONST)
        for _ in range(_MAX_ROUNDS):
            for ref, (v, s) in zip(body.inputs[:n_state], states):
                self._set(ref, v, s)
            for ref, src in zip(body.inputs[n_state:], scanned):
                self._set(ref, self._v(src), self._s(src))
            self._scope(body.scope)
            updated = [(max(v, self._v(r)), max(s, self._s(r))) for (v, s), r in zip(states, body.outputs)]
            if updated == states:
                break
            states = updated
        for out, (v, s) in zip(node.outputs[:n_state], states):
            self._set(out, v, s)
        for out, r in zip(node.outputs[n_state:], body.outputs[n_state:]):
            self._set(out, max(self._v(r), count), max(self._s(r), count))
        reason = "iterates over the scanned axis (its length " + {
            CONST: "is fixed)", SHAPE: "is an input shape)", VALUE: "depends on input values)"}[count]
        self.controls[node.id] = Control(node.id, "Scan", count, tuple(r for r in scanned if r), reason)

    def _opaque(self, node: Node, bodies) -> None:
        """A node with subgraphs whose semantics we do not model: its bodies see values."""
        for body in bodies:
            for ref in body.inputs:
                self._set(ref, VALUE, VALUE)
            self._scope(body.scope)
        value = max([self._v(r) for r in node.inputs] + [self._v(r) for b in bodies for r in b.outputs],
                    default=CONST)
        for out in node.outputs:
            self._set(out, value, value)
        if node.op_type in CONTRIB_LOOPS:
            self.controls[node.id] = Control(node.id, node.op_type, VALUE, tuple(r for r in node.inputs[:2] if r),
                                             self._search_steps(node))

    def _search_steps(self, node: Node) -> str:
        """What decides how many steps an ONNX Runtime search operator's loop runs, in words."""
        # ONNX Runtime's BeamSearch, GreedySearch, Sampling and WhisperBeamSearch all take
        # max_length as input 1 and end a sequence at the attribute eos_token_id.
        eos = next((a.i for a in node.proto.attribute if a.name == "eos_token_id"), None)
        limit = node.inputs[1] if len(node.inputs) > 1 else None
        who = "unset" if limit is None else (f"the caller's graph input `{limit.name}`" if limit in self.mg.inputs
                                             else f"tensor `{limit.name}`")
        return (f"{node.domain or 'ai.onnx'}.{node.op_type} runs its decoder once per generated token until every "
                f"sequence ends: at end-of-sequence token{'' if eos is None else f' {eos}'} (the model decides, "
                f"from input values) or at max_length ({who})")
