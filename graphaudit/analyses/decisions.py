"""Who decides each If and Loop: the caller, the input shapes, a constant, or the model.

Every If condition, and every Loop's trip count and condition, is traced back through the
operators that compute no learned values (PASSED_ON: reshapes, slices, casts, comparisons,
logic, shapes, counters' arithmetic) to what it comes from:

- `caller`: a graph input's value, passed on as it is or compared with a constant (a
  `use_cache_branch` flag, a sample rate `sr` compared with 16000): the caller chooses;
- `shape`: input shapes only (`Shape`, `Size` and what is computed from them);
- `constant`: constants only (initializers of a few values, Constant nodes, a loop counter);
- `model`: values computed from learned weights, or from input values through computation
  that is not passed on as it is (a mean of the data, a classifier's confidence).

A decision with several sources is decided by the strongest, MODEL > CALLER > SHAPE >
CONSTANT: a condition that the model's computation feeds is not known before the model
runs, whatever else it reads; one that reads a caller's value but nothing the model
computes is the caller's choice, made per call; a shape changes only between inputs of
other shapes, and a constant never changes.

A decision is conditional (`Decision.conditional`) when what it decides can run some
compute or not: an If whose branches differ in compute (`switches.same_compute`), a Loop
whose trip count is not fixed by constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphaudit.analyses.dependence import CONTRIB_LOOPS
from graphaudit.analyses.loop_trips import Value, constant_values
from graphaudit.graph.model import ModelGraph, Node, TensorRef

CONSTANT, SHAPE, CALLER, MODEL = "constant", "shape", "caller", "model"
DECIDERS = (CONSTANT, SHAPE, CALLER, MODEL)  # weakest to strongest
VALUE_DECIDERS = frozenset({CALLER, MODEL})  # those that can choose differently between inputs of one shape

# What a caller's flag, a shape or a constant passes through on its way to the decision it
# makes: a change of layout or type, a pick of some of its elements, a comparison, logic, and
# the arithmetic of counters and shapes; nothing that reads a learned weight (an initializer
# of more than SMALL values) or reduces the data.
PASSED_ON = frozenset({
    "Identity", "Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Expand",
    "Gather", "GatherElements", "Slice", "Concat", "Split",
    "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "And", "Or", "Xor",
    "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Max", "Min", "Floor", "Ceil",
    "ConstantOfShape", "Range",
})
COMPARING = frozenset({"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"})
SMALL = 64  # an initializer of at most this many values is a threshold or a shape, not a weight
_LIMIT = 4096  # nodes looked at per decision: past that, the walk says `model`
_WHAT = {CALLER: "the caller", SHAPE: "the input shapes", CONSTANT: "constants", MODEL: "the model"}


@dataclass(frozen=True)
class Decision:
    """Who decides one If or Loop, and from which inputs or tensors."""

    node: str
    op: str  # If | Loop | an ONNX Runtime search operator
    decided_by: str  # caller | shape | constant | model
    sources: tuple[str, ...]  # graph inputs (caller, shape), constants, or the tensors the model computes
    tensors: tuple[str, ...]  # the condition / trip-count tensors traced
    reason: str  # one line
    conditional: bool = False  # whether it can run some compute or not (branches differ, trip count not fixed)
    blocks: tuple[str, ...] = ()  # the blocks with compute inside it

    def to_json(self) -> dict:
        return {"node": self.node, "op": self.op, "decided_by": self.decided_by, "sources": list(self.sources),
                "tensors": list(self.tensors), "conditional": self.conditional, "blocks": list(self.blocks),
                "reason": self.reason}


def decisions(mg: ModelGraph, value: Value | None = None) -> dict[str, Decision]:
    """Node id -> the Decision of every If, Loop and ONNX Runtime search operator of `mg`
    (`conditional` left False: `analyses.block_verdicts` reads what the bodies hold). `value`: the
    value of a constant tensor (`trips.constant_values`; Constant nodes only when not given)."""
    value = value or constant_values(mg, {})
    found = {}
    for node in mg.nodes.values():
        if node.domain == "com.microsoft" and node.op_type in CONTRIB_LOOPS:
            # input 0 holds the prompt, input 1 max_length (ONNX Runtime's search operators alike)
            found[node.id] = Decision(node.id, node.op_type, MODEL, (), tuple(r.name for r in node.inputs[:2] if r),
                                      f"{node.op_type} decodes until every sequence ends: the model decides")
        elif node.domain in ("", "ai.onnx") and node.op_type in ("If", "Loop") and mg.bodies(node.id):
            found[node.id] = _decide(mg, node, value)
    return found


def decided_by(mg: ModelGraph, refs) -> tuple[str, dict[str, dict[str, None]]]:
    """(the strongest source, sources by kind) of the tensors `refs`."""
    return _Trace(mg, constant_values(mg, {})).of(refs)


def callers_alone(mg: ModelGraph, node: Node) -> tuple[str, ...] | None:
    """The graph inputs that decide `node` through no learned computation (`caller`), as a caller's
    attention mask reaches the NonZero that removes its padding; None when the model decides."""
    kind, sources = decided_by(mg, [r for r in node.inputs if r is not None])
    return tuple(sources[CALLER]) if kind == CALLER else None


def _decide(mg: ModelGraph, node: Node, value: Value) -> Decision:
    trace = _Trace(mg, value)
    if node.op_type == "If":
        refs = [node.inputs[0]] if node.inputs and node.inputs[0] is not None else []
    else:
        refs = [r for r in node.inputs[:2] if r is not None]
        body = mg.bodies(node.id)[0]
        if body.outputs and body.outputs[0] is not None and not _single_trip(trace, node):
            refs.append(body.outputs[0])  # the condition each iteration gives back decides the next
    kind, sources = trace.of(refs)
    names = tuple(sources[kind])
    shown = ", ".join(f"`{n}`" for n in names[:4]) + (", ..." if len(names) > 4 else "")
    compared = "".join(f" ({c})" for c in list(trace.compared)[:2]) if kind == CALLER else ""
    what = {CALLER: f"the graph input{'s' if len(names) > 1 else ''} {shown} passed on as it is{compared}, "
                    "through no learned computation",
            SHAPE: f"the shape{'s' if len(names) > 1 else ''} of {shown} alone",
            CONSTANT: "constants alone" + (f" ({shown})" if names else ""),
            MODEL: f"{shown}, which the model computes"}[kind]
    told = "condition is" if node.op_type == "If" else "trip count and condition are"
    return Decision(node.id, node.op_type, kind, names, tuple(r.name for r in refs),
                    f"its {told} {what}: {_WHAT[kind]} decide{'s' if kind in VALUE_DECIDERS else ''}")


def _single_trip(trace: _Trace, node: Node) -> bool:
    """Whether a Loop runs its body at most once whatever its body gives back: a constant trip
    count of at most 1 (the condition it gives back is then never read)."""
    m = trace.constant(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
    return m is not None and m <= 1


class _Trace:
    def __init__(self, mg: ModelGraph, value: Value):
        self.mg, self.value = mg, value
        self.seen: set[TensorRef] = set()
        self.sources: dict[str, dict[str, None]] = {k: {} for k in DECIDERS}
        self.compared: dict[str, None] = {}  # "Equal with 16000": comparisons of a caller's value with a constant
        self.steps = 0
        self.active: frozenset[TensorRef] = frozenset()  # computed values whose sources an enclosing walk notes

    def of(self, refs) -> tuple[str, dict[str, dict[str, None]]]:
        todo = list(refs)
        while todo:
            ref = todo.pop()
            if ref in self.seen:
                continue
            self.seen.add(ref)
            self.steps += 1
            if self.steps > _LIMIT:
                self.sources[MODEL].setdefault(ref.name)
                break
            todo.extend(self._step(ref))
        kind = next(k for k in reversed(DECIDERS) if self.sources[k] or k == CONSTANT)
        return kind, self.sources

    def _add(self, kind: str, name: str) -> list:
        self.sources[kind].setdefault(name)
        return []

    def _step(self, ref: TensorRef) -> list[TensorRef]:
        """The tensors `ref` comes from, having noted what it is when it is a source."""
        mg = self.mg
        info = mg.tensors.get(ref)
        if info is None or info.kind == "undefined":
            return self._add(MODEL, ref.name)
        if info.kind == "input":
            return self._add(CALLER, ref.name)
        if info.kind == "initializer":
            sizes = [d for d in info.shape or () if isinstance(d, int)]
            small = info.shape is not None and len(sizes) == len(info.shape) and math.prod(sizes) <= SMALL
            return self._add(CONSTANT if small else MODEL, ref.name)
        if info.kind in ("subgraph_input", "function_input"):
            return self._formal(ref, info.producer)
        node = mg.producer(ref)
        if node is None or node.domain not in ("", "ai.onnx"):
            return self._add(MODEL, ref.name)
        op = node.op_type
        if op == "Constant":
            return self._add(CONSTANT, ref.name)
        if op in ("Shape", "Size"):
            return self._shape(node.inputs[0]) if node.inputs and node.inputs[0] is not None else []
        if op in PASSED_ON:
            ins = [r for r in node.inputs if r is not None]
            if op in COMPARING:
                self._note_comparison(op, ins)
            return ins
        if op == "If" and node.inputs and node.inputs[0] is not None:  # a flag chosen by another If
            k = node.outputs.index(ref)
            return [node.inputs[0]] + [out for b in mg.bodies(node.id) if k < len(b.outputs)
                                       and (out := b.outputs[k]) is not None]
        return self._computed(ref, node)

    def _computed(self, ref: TensorRef, node: Node) -> list[TensorRef]:
        """Note what a node that computes `ref` decides from: on shapes and constants alone (a sum of
        dimensions), those; on any value the caller passes or the model computes, the model."""
        if ref in self.active:  # a carried value's update, read again: what it comes from is being noted
            return []
        inner = _Trace(self.mg, self.value)
        inner.steps, inner.active = self.steps, self.active | {ref}  # one budget for the whole walk
        kind, sources = inner.of([r for r in node.inputs if r is not None] + _outer_reads(self.mg, node))
        self.steps = inner.steps
        if kind in VALUE_DECIDERS:
            return self._add(MODEL, ref.name)
        for k in (SHAPE, CONSTANT):
            for name in sources[k]:
                self._add(k, name)
        return []

    def _formal(self, ref: TensorRef, owner_id: str | None) -> list[TensorRef]:
        """What a body's formal input stands for: a Loop's iteration number (a counter), its
        condition, its carried values (their first value and each iteration's update)."""
        owner = self.mg.nodes.get(owner_id) if owner_id else None
        bodies = self.mg.bodies(owner_id) if owner_id else ()
        if owner is None or not bodies:
            return self._add(MODEL, ref.name)
        if bodies[0].kind == "function":
            return [r for r in owner.inputs if r is not None]
        body = next((b for b in bodies if ref in b.inputs), None)
        if body is None or owner.op_type not in ("Loop", "Scan"):
            return self._add(MODEL, ref.name)
        k = body.inputs.index(ref)
        if owner.op_type == "Scan":  # a state (its first value, its update) or a slice of a scanned input
            states = len(owner.inputs) - next((a.i for a in owner.proto.attribute if a.name == "num_scan_inputs"), 0)
            return [r for r in (owner.inputs[k] if k < len(owner.inputs) else None,
                                body.outputs[k] if k < states and k < len(body.outputs) else None) if r is not None]
        if k == 0:
            return self._add(CONSTANT, f"iteration number of `{owner.id}`")
        outer = owner.inputs[k] if k < len(owner.inputs) else None  # cond, then the carried values
        update = body.outputs[k - 1] if k - 1 < len(body.outputs) else None
        return [r for r in (outer, update) if r is not None]

    def _shape(self, ref: TensorRef) -> list[TensorRef]:
        """Note the graph inputs whose shapes set the shape of `ref` (a constant when it is fixed)."""
        info = self.mg.tensors.get(ref)
        if info is not None and info.shape is not None and all(isinstance(d, int) for d in info.shape):
            return self._add(CONSTANT, f"shape of `{ref.name}`")
        inputs: dict[str, None] = {}  # an ordered set
        seen, todo = {ref}, [ref]
        while todo and len(seen) < _LIMIT:
            current = todo.pop()
            found = self.mg.tensors.get(current)
            if found is not None and found.kind == "input":
                inputs.setdefault(current.name)
                continue
            node = self.mg.producer(current)
            for r in node.inputs if node is not None else ():
                if r is not None and r not in seen:
                    seen.add(r)
                    todo.append(r)
        for name in inputs or [ref.name]:
            self._add(SHAPE, name)
        return []

    def _note_comparison(self, op: str, ins: list[TensorRef]) -> None:
        if len(ins) == 2:
            values = [self.constant(r) for r in ins]
            for value in values:
                if value is not None and values.count(None) == 1:
                    self.compared.setdefault(f"{op} with {value:g}")

    def constant(self, ref: TensorRef) -> float | None:
        """The number a constant scalar tensor holds, else None."""
        found = self.value(ref)
        return float(found.reshape(-1)[0]) if found is not None and found.size == 1 else None


def _outer_reads(mg: ModelGraph, node: Node) -> list[TensorRef]:
    """The values of enclosing scopes that the bodies of `node` (a Loop, a Scan) read."""
    if not mg.bodies(node.id):
        return []
    found: dict[TensorRef, None] = {}  # an ordered set
    for inner in mg.inside(node.id):
        for r in inner.inputs:
            if r is not None and not r.scope.startswith(node.id + "/") and r.scope != node.id:
                found.setdefault(r)
    return list(found)


def describe(decision: Decision) -> str:
    """Who decides `decision`, in a few words ("the caller (`sr`)")."""
    names = ", ".join(f"`{n}`" for n in decision.sources[:3])
    return _WHAT[decision.decided_by] + (f" ({names})" if names and decision.decided_by != CONSTANT else "")
