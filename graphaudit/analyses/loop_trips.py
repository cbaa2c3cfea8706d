"""How many times each Loop and Scan runs its body, at concrete input shapes.

A Loop runs its body until the trip count M is reached or the condition its body gives back
turns false. With the input shapes given:

- an M and a condition that input values do not decide give one trip count: M read from a
  constant or computed at the shapes (`probed`), or the limit of a loop counter that the
  condition compares with a constant (or with a state the body passes on unchanged, as
  Paddle2ONNX writes `while i < max_len`, each behind Paddle's `Add(x, 0)` assignments);
- where input values decide, the trip count has a range: at most M, or the limit of a loop
  counter (TorchScript writes `while` as a Loop with M = 2**63 - 1 and a condition such as
  `step < max_steps and not halted`), and at least one iteration when the loop is entered
  whatever the input; with neither, it has no bound.

A Scan runs its body once per slice of its scan inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from onnx import numpy_helper

from graphaudit.analyses.dependence import CONST, VALUE, DependenceMap
from graphaudit.graph.model import Body, ModelGraph, Node, TensorRef

# Operators that keep the value of a tensor of one element (a Cast of a number to another number type too)
SAME_VALUE = frozenset({"Identity", "Cast", "Squeeze", "Unsqueeze", "Reshape", "Flatten"})
# The operators of two values `_Loop._folded` computes from constants (besides `SAME_VALUE` and Not)
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Less": np.less, "LessOrEqual": np.less_equal,
    "Greater": np.greater, "GreaterOrEqual": np.greater_equal, "Equal": np.equal, "And": np.logical_and,
    "Or": np.logical_or,
}
NO_BOUND = 2**31 - 1  # an M at least this large is the exporters' "loop until the condition says stop"
_ITERATION = -1  # the counter that is the Loop's own iteration number
_DEPTH = 16
_NEVER = "never"  # a condition that is constant false: it implies any limit

Value = Callable[[TensorRef | None], "np.ndarray | None"]


@dataclass(frozen=True)
class Trips:
    """How many times a Loop or Scan runs its body at the given input shapes."""

    node: str
    op: str
    exact: int | None  # the trip count, where input values do not decide it and it was found
    most: int | None  # the largest trip count: `exact`, or a bound; None when none was found
    least: int  # the fewest
    how: str  # what sets it, in words
    m_from_shapes: bool = False  # M is computed from input shapes, and was not given (`probed`)

    def to_json(self) -> dict:
        return {"node": self.node, "op": self.op, "trip_count": self.exact, "max_trip_count": self.most,
                "min_trip_count": self.least, "trip_count_source": self.how}


def trip_counts(mg: ModelGraph, dm: DependenceMap, value: Value,
                resolve: Callable[[TensorRef], tuple[int, ...] | None],
                probed: Mapping[str, int] | None = None) -> dict[str, Trips]:
    """Return the Trips of every Loop and Scan of `mg`, by node id.

    `value`: the value of a constant tensor (None when it is not one, `constant_values`);
    `resolve`: a value's concrete shape; `probed`: trip counts M computed at the input shapes,
    by Loop id (`analyses.concrete_shapes`)."""
    found = {}
    for node in mg.nodes.values():
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Loop", "Scan") or not mg.bodies(node.id):
            continue
        if node.op_type == "Scan":
            found[node.id] = _scan(node, resolve)
        else:
            found[node.id] = _Loop(mg, dm, value, node, (probed or {}).get(node.id)).trips()
    return found


def constant_values(mg: ModelGraph, initializers: Mapping[str, np.ndarray]) -> Value:
    """A function giving the value of a tensor of `mg` that a Constant node or one of the small
    main-graph `initializers` holds (through Identity and Cast), else None.

    It walks the chain in a loop: a closure that called itself would hold itself, and `mg` with
    it, in a reference cycle, which only the cyclic collector frees (a pass over every node and
    tensor of the graph model: 55 ms at 18,000 nodes)."""
    def value(ref: TensorRef | None) -> np.ndarray | None:
        casts: list[Node] = []  # the Casts passed on the way, outermost first
        found = None
        for _ in range(_DEPTH + 1):
            if ref is None:
                return None
            info = mg.tensors.get(ref)
            if info is not None and info.kind == "initializer":
                found = initializers.get(ref.name) if not ref.scope else None
                break
            node = mg.producer(ref)
            if node is None or node.domain not in ("", "ai.onnx"):
                return None
            if node.op_type in ("Identity", "Cast") and node.inputs and node.inputs[0] is not None:
                if node.op_type == "Cast":
                    casts.append(node)
                ref = node.inputs[0]
                continue
            found = _constant_node(node) if node.op_type == "Constant" else None
            break
        else:
            return None
        for cast in reversed(casts):
            found = _cast(found, cast) if found is not None else None
        return found
    return value


def _constant_node(node: Node) -> np.ndarray | None:
    for a in node.proto.attribute:
        if a.name == "value" and a.t.data_location != a.t.EXTERNAL and math.prod(a.t.dims) <= 64:
            return numpy_helper.to_array(a.t)
        if a.name in ("value_int", "value_float"):
            return np.array(a.i if a.name == "value_int" else a.f)
        if a.name in ("value_ints", "value_floats"):
            return np.array(list(a.ints) if a.name == "value_ints" else list(a.floats))
    return None


def _cast(array: np.ndarray, node: Node) -> np.ndarray:
    to = next((a.i for a in node.proto.attribute if a.name == "to"), None)
    return array.astype(bool) if to == 9 else array  # 9: BOOL; the rest keeps the numbers


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _scalar(array: np.ndarray | None) -> float | None:
    return None if array is None or array.size != 1 else array.reshape(()).item()


def _scan(node: Node, resolve) -> Trips:
    attrs = {a.name: a for a in node.proto.attribute}
    n_scan = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 1
    axes = list(attrs["scan_input_axes"].ints) if "scan_input_axes" in attrs else []
    first = node.inputs[len(node.inputs) - n_scan] if n_scan <= len(node.inputs) else None
    shape = resolve(first) if first is not None else None
    axis = axes[0] if axes else 0
    if shape is None or not -len(shape) <= axis < len(shape):
        return Trips(node.id, "Scan", None, None, 0, "its scan input's length is unknown")
    n = shape[axis]
    return Trips(node.id, "Scan", n, n, n, f"{n} slices of its scan input")


class _Loop:
    def __init__(self, mg: ModelGraph, dm: DependenceMap, value: Value, node: Node, probed: int | None):
        self.mg, self.dm, self.value, self.node, self.probed = mg, dm, value, node, probed
        self.body: Body = mg.bodies(node.id)[0]

    def trips(self) -> Trips:
        node, ins = self.node, self.node.inputs
        control = self.dm.controls.get(node.id)
        by_values = control is not None and control.dependence == VALUE
        cond = _scalar(self._folded(ins[1], 0)) if len(ins) > 1 and ins[1] is not None else True
        if cond is not None and not cond:
            return Trips(node.id, "Loop", 0, 0, 0, "its initial condition is constant false")
        m_ref = ins[0] if ins else None
        m = self._m(m_ref)  # None: not found; math.inf: no M
        probe = m is None and self.dm.value(m_ref) != VALUE
        limit, counter, complete = self._counter_limit()
        bounds = [b for b in (m, limit[0] if limit else None) if isinstance(b, int)]
        most = min(bounds) if bounds else None
        if most is None:
            source = ""
        elif most == m:
            source = f"M = {m:,}"
        else:
            assert limit is not None  # the bound is M or the counter's limit
            source = f"loop counter `{counter}` below {_num(limit[1])}"
        if not by_values:
            settled = m is not None and cond is not None and (complete or self._passes_condition_on())
            if settled and most is not None:
                return Trips(node.id, "Loop", most, most, most, f"trip count {most:,} ({source})")
            # the same on every input: counted alike on the most and the least expensive run
            by = "constants" if control is not None and control.dependence == CONST else "input shapes"
            how = f"trip count set by {by}, not found" + ("" if most is None else f"; at most {most:,} ({source})")
            return Trips(node.id, "Loop", None, most, 1 if most is None else most, how, m_from_shapes=probe)
        least = 1 if cond is not None and (m is math.inf or (isinstance(m, int) and m >= 1)) else 0
        if most is None:
            return Trips(node.id, "Loop", None, None, least, "trip count depends on input values, with no bound",
                         m_from_shapes=probe)
        least = min(least, most)
        return Trips(node.id, "Loop", None, most, least,
                     f"trip count depends on input values: {least} to {most:,} ({source})", m_from_shapes=probe)

    def _m(self, ref: TensorRef | None):
        if ref is None:
            return math.inf
        found = _scalar(self.value(ref))
        if found is None:
            return self.probed
        return math.inf if found >= NO_BOUND else max(0, int(found))

    def _passes_condition_on(self) -> bool:
        """Whether the body gives its condition back unchanged or constant true."""
        out = self.body.outputs[0] if self.body.outputs else None
        cond_in = self.body.inputs[1] if len(self.body.inputs) > 1 else None
        for _ in range(_DEPTH):
            if out is None:
                return False
            if out == cond_in:
                return True
            constant = _scalar(self.value(out))
            if constant is not None:
                return bool(constant)
            node = self.mg.producer(out)
            if node is None or node.op_type not in ("Identity", "Cast") or not node.inputs:
                return False
            out = node.inputs[0]
        return False

    # -- a loop counter the condition keeps below a constant ------------------------------------
    def _counter_limit(self) -> tuple[tuple[int, int] | None, str | None, bool]:
        """(largest trip count, the counter's limit) that the body's condition implies, the
        counter's name, and whether the condition is nothing but such limits."""
        out = self.body.outputs[0] if self.body.outputs else None
        found = self._implied(out, 0)
        if found is None or found == _NEVER:
            return None, None, False
        best = None
        for (counter, offset, below), name in found[0]:
            start_step = self._counter(counter)
            if start_step is None:
                continue
            start, step = start_step
            # iteration j + 1 runs only if start + j*step + offset < below
            trips = max(1, math.ceil((below - start - offset) / step) + 1)
            if best is None or trips < best[0][0]:
                best = ((trips, below), name)
        if best is None:
            return None, None, False
        return best[0], best[1], found[1]

    def _counter(self, index: int) -> tuple[float, float] | None:
        """(initial value, step) of a loop counter: the iteration number, or a carried value
        that the body gives back increased by a constant."""
        if index == _ITERATION:
            return 0, 1
        init, step = self._state(index)
        return None if init is None or step is None or step <= 0 else (init, step)

    def _state(self, index: int) -> tuple[float | None, float | None]:
        """(initial value, what the body adds at each step) of carried value `index`; None for either
        not found. A step of 0: the body passes the value on unchanged."""
        init = self._folded(self.node.inputs[2 + index], 0) if 2 + index < len(self.node.inputs) else None
        out = self.body.outputs[1 + index] if 1 + index < len(self.body.outputs) else None
        step = self._affine(out, 0)
        return _scalar(init), (step[1] if step is not None and step[0] == index else None)

    def _fixed(self, ref: TensorRef | None) -> float | None:
        """The value of `ref` on every iteration: a constant, or a constant plus a carried value
        whose body passes it on unchanged (a `max_len` the loop carries along); else None."""
        found = _scalar(self._folded(ref, 0))
        if found is not None or ref is None:
            return found
        affine = self._affine(ref, 0)
        if affine is None or affine[0] == _ITERATION:
            return None
        init, step = self._state(affine[0])
        return init + affine[1] if init is not None and step == 0 else None

    def _folded(self, ref: TensorRef | None, depth: int) -> np.ndarray | None:
        """The value of `ref` where it is a constant or a single value computed from constants by
        arithmetic, comparisons and reshapes (a condition `Less(0, Cast(500) + 1)`); else None."""
        found = self.value(ref)
        if found is not None or ref is None or depth > _DEPTH:
            return found
        node = self.mg.producer(ref)
        if node is None or node.domain not in ("", "ai.onnx") or not node.inputs:
            return None
        op = node.op_type
        if op in SAME_VALUE or op == "Not":
            a = self._folded(node.inputs[0], depth + 1)
            if a is None or a.size != 1:
                return None
            return np.logical_not(a) if op == "Not" else _cast(a, node) if op == "Cast" else a
        if op not in _BINARY or len(node.inputs) != 2:
            return None
        a, b = (self._folded(r, depth + 1) for r in node.inputs)
        if a is None or b is None or a.size != 1 or b.size != 1:
            return None
        return np.asarray(_BINARY[op](a.reshape(()), b.reshape(())))

    def _affine(self, ref: TensorRef | None, depth: int) -> tuple[int, float] | None:
        """(counter, offset) when `ref` is a loop counter plus a constant."""
        if ref is None or depth > _DEPTH:
            return None
        inputs = self.body.inputs
        if inputs and ref == inputs[0]:
            return _ITERATION, 0
        if ref in inputs[2:]:
            return inputs.index(ref) - 2, 0
        node = self.mg.producer(ref)
        if node is None or node.domain not in ("", "ai.onnx") or not node.inputs:
            return None
        if node.op_type in SAME_VALUE:  # a counter is one value: reshaping keeps it
            return self._affine(node.inputs[0], depth + 1)
        if node.op_type in ("Add", "Sub") and len(node.inputs) == 2:
            a, b = node.inputs
            for var, const, sign in ((a, b, 1), (b, a, 1)) if node.op_type == "Add" else ((a, b, -1),):
                c = _scalar(self.value(const))
                if c is None:
                    continue
                found = self._affine(var, depth + 1)
                if found is not None:
                    return found[0], found[1] + sign * c
        return None

    def _implied(self, ref: TensorRef | None, depth: int):
        """The limits `counter + offset < below` that `ref` being true implies, as
        ([((counter, offset, below), name)], complete); _NEVER for a constant false; None for
        a value this reading does not follow."""
        if ref is None or depth > _DEPTH:
            return None
        constant = _scalar(self.value(ref))
        if constant is not None:
            return ([], True) if constant else _NEVER
        node = self.mg.producer(ref)
        if node is None or node.domain not in ("", "ai.onnx"):
            return ([], False)
        op, ins = node.op_type, node.inputs
        if op in ("Identity", "Cast") and ins:
            return self._implied(ins[0], depth + 1)
        if op in ("Add", "Sub") and len(ins) == 2 and _scalar(self.value(ins[1])) == 0:  # Paddle's bool + 0
            return self._implied(ins[0], depth + 1)
        if op == "And" and len(ins) == 2:
            parts = [self._implied(r, depth + 1) for r in ins]
            if _NEVER in parts:
                return _NEVER
            known = [p for p in parts if p is not None]
            return ([c for p in known for c in p[0]], len(known) == 2 and all(p[1] for p in known))
        if op in ("Less", "LessOrEqual", "Greater", "GreaterOrEqual") and len(ins) == 2:
            var, const = (ins[0], ins[1]) if op.startswith("Less") else (ins[1], ins[0])
            c = self._fixed(const)
            if var is None or c is None:
                return ([], False)
            found = self._affine(var, depth + 1)
            if found is None:
                return ([], False)
            below = math.floor(c) + 1 if op.endswith("OrEqual") else c
            return ([((found[0], found[1], below), var.name)], True)
        if op == "If":
            return self._implied_if(node, ref, depth)
        return ([], False)

    def _implied_if(self, node: Node, ref: TensorRef, depth: int):
        k = node.outputs.index(ref)
        parts = [self._implied(b.outputs[k] if k < len(b.outputs) else None, depth + 1)
                 for b in self.mg.bodies(node.id)]
        live = [p for p in parts if p != _NEVER]
        if not live:
            return _NEVER
        if any(p is None for p in live):
            return None
        if len(live) == 1:
            return live[0]
        shared = [c for c in live[0][0] if all(c in p[0] for p in live[1:])]
        return (shared, False)
