"""Variants of a graph for shape inference at concrete input sizes, and the shapes found there.

ONNX's shape inference leaves two things unknown that a FLOP count needs:

- the results of a Loop (it gives them no shape), and with them everything computed after
  the loop. In `variant` a loop-carried result keeps the shape of its initial value where
  the body gives it back in the shape it came in, and a scan output gets a leading axis of
  the trip count; a trip count M that is computed from input shapes is made the extent of
  a probe tensor, so that inference computes it (`probes`).
- the shapes inside a Loop's body: inference hands the body its carried values without
  shapes, so the body keeps the ones it declares (Paddle2ONNX's, symbols of their own). In
  `variant` each carried input whose initial value's shape is known is declared at it, and
  `infer_variant` takes back each that the body gives back in another shape (a buffer it
  grows), inferring again.
- the extent of a value-dependent selection, and with it everything that runs on the rows it
  picks. With `widen`, every value-dependent selection keeps every row: NonZero gives the
  index of every element, Compress keeps every slice, a TopK of value-dependent scores keeps
  its whole axis. The sizes inferred there are the largest the graph can run at: an upper
  bound for compute behind a data-dependent selection ("every row selected"), and the full
  size of compute behind a selection of fixed capacity (Mixture-of-Depths' top-k tokens).
  A capacity's k computed from shapes becomes the whole axis wherever it is read, with the
  casts and reshapes of it and every computation of it from the same values
  (`_Builder.same_size`): the reshapes after the selection then hold every row too. A
  capacity-factor MoE's one-hot dispatch (`analyses.dispatch`) has C slots per expert, the
  length of the Range(0, C) its mask compares each token's place with: that Range's limit
  becomes the whole token axis the dispatch contracts, every token to every expert.

`variant` gives back a new model without its large weights (typed graph inputs, never
copied); only the main graph and the declared shapes of its loops' carried inputs change, and
every value keeps its name, so the shapes found on a variant apply to the graph it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from graphaudit.analyses.dependence import VALUE, DependenceMap
from graphaudit.analyses.dispatch import dispatch_operands
from graphaudit.analyses.loop_trips import SAME_VALUE, Trips, Value
from graphaudit.graph.model import ModelGraph, Node, TensorRef
from graphaudit.load import external_data
from graphaudit.load.inference import INFER_WEIGHTS_OVER, infer_at

_PREFIX = "graphaudit__"
_LAYOUT = frozenset({"Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Transpose"})
_PRODUCT = frozenset({"Mul", "And", "Min"})  # a slot mask times another mask keeps its slot axis
_KEY_DEPTH = 32
_ROUNDS = 4  # rounds of inference for sizes computed before their data (`widest_shapes`)


@dataclass(frozen=True)
class Variant:
    """A variant of a model for shape inference, with its probes: loop id -> the probe tensor
    whose extent is that loop's trip count M."""

    model: onnx.ModelProto
    probes: Mapping[str, str]
    widened: tuple[str, ...]  # the selections that keep every row (node ids)
    # (data, axis) -> the length a size computed before its data was given: the length at the
    # given shapes, or the one a previous round of inference found (`widest_shapes`)
    assumed: Mapping[tuple[str, int], int] = field(default_factory=dict)
    # the carried inputs of main-graph loops' bodies declared at their initial values' shapes
    # (`_Builder.shape_body`), each checked against what the body gives back (`infer_variant`)
    declared: tuple[Declared, ...] = ()


@dataclass(frozen=True)
class Declared:
    """A body input of the variant declared at a concrete shape, and how to take that back."""

    node: int  # the Loop's place among the variant's main-graph nodes
    input: int  # the body input's place
    before: onnx.TypeProto  # its type as the file declared it
    given: str  # the key of what the body gives back for it, as `infer_at` keys body values
    shape: tuple[int, ...]

    def value(self, model: onnx.ModelProto) -> onnx.ValueInfoProto:
        body = next(a.g for a in model.graph.node[self.node].attribute if a.name == "body")
        return body.input[self.input]


def variant(model: onnx.ModelProto, mg: ModelGraph, dm: DependenceMap, trips: Mapping[str, Trips],
            resolve: Callable[[TensorRef], tuple[int, ...] | None], value: Value, *, widen: bool = False,
            lengths: Mapping[tuple[str, int], int] | None = None, scale: Mapping[str, int] | None = None) -> Variant:
    """Return the Variant of `model` (whose graph model is `mg`, `resolve` giving its values'
    concrete shapes and `value` its constants' values): its main-graph loops' results shaped
    and their trip counts probed, and with `widen`, every value-dependent selection keeping
    every row (`lengths`: the whole axis, by (data, axis), of a size computed before its data;
    `scale`: NonZero id -> how many times every element it gives, to see how compute after it
    grows with its rows). `model` is not changed."""
    copy = external_data.as_inputs(model, lambda t: t.data_location == onnx.TensorProto.EXTERNAL
                                   or (external_data.tensor_bytes(t) or 0) > INFER_WEIGHTS_OVER)
    return _Builder(mg, dm, trips, resolve, value, widen, lengths or {}, scale or {}).build(model, copy)


def widest_shapes(model: onnx.ModelProto, mg: ModelGraph, dm: DependenceMap, trips: Mapping[str, Trips],
                  resolve: Callable[[TensorRef], tuple[int, ...] | None], value: Value,
                  shapes: Mapping[str, Sequence[int]], scale: Mapping[str, int] | None = None
                  ) -> dict[str, tuple[int, ...]] | None:
    """The concrete shapes inferred on the widest variant with the inputs at `shapes`; None when
    no selection was widened (`scale`: as for `variant`).

    A size computed before the data it selects from (dynamo computes every symbolic size at the
    top of the graph) is given that data's length at the given shapes; where an earlier
    selection kept every row, the data is longer there, so inference runs again with the
    lengths it found, until they hold (one more round per chained capacity)."""
    lengths: dict[tuple[str, int], int] = {}
    for _ in range(_ROUNDS):
        found = variant(model, mg, dm, trips, resolve, value, widen=True, lengths=lengths, scale=scale)
        if not found.widened:
            return None
        known = infer_variant(found, shapes)[0]
        longer = {(data, axis): known[data][axis] for (data, axis), used in found.assumed.items()
                  if len(known.get(data, ())) > axis and known[data][axis] != used}
        if not longer:
            break
        lengths.update(longer)
    return known


def infer_variant(found: Variant, shapes: Mapping[str, Sequence[int]]) -> tuple[dict[str, tuple[int, ...]],
                                                                                dict[str, int]]:
    """The concrete shapes `load.inference.infer_at` finds on the variant with the inputs at `shapes`,
    and the trip counts its probes give, by loop id."""
    known = infer_at(found.model, shapes)
    changing = [d for d in found.declared if known.get(d.given) != d.shape]
    if changing:  # a value the body gives back in another shape (a buffer grown each step): as declared
        for d in changing:
            d.value(found.model).type.CopyFrom(d.before)
        known = infer_at(found.model, shapes)
    probed = {loop: known[name][0] for loop, name in found.probes.items() if len(known.get(name, ())) == 1}
    return {k: v for k, v in known.items() if not k.startswith(_PREFIX)}, probed


class _Builder:
    def __init__(self, mg, dm, trips, resolve, value, widen, lengths, scale):
        self.mg, self.dm, self.trips, self.resolve, self.value, self.widen = mg, dm, trips, resolve, value, widen
        self.lengths, self.assumed, self.scale = lengths, {}, scale
        self.count = 0
        self.probes: dict[str, str] = {}
        self.widened: list[str] = []
        self.refill: dict[str, tuple[str, int, tuple[int, ...], int]] = {}  # size -> (data, axis, shape, whole)
        self.own_capacity: dict[str, tuple[int, str, int, tuple[int, ...], int]] = {}  # node -> (input, data, axis, shape, whole)
        self.keys: dict[TensorRef, tuple] = {}  # what a size is computed from (`key`)
        self.declared: list[tuple[onnx.NodeProto, int, onnx.TypeProto, str, tuple[int, ...]]] = []  # `Declared`'s

    def name(self, what: str) -> str:
        self.count += 1
        return f"{_PREFIX}{what}_{self.count}"

    def const(self, values: list[int]) -> tuple[onnx.NodeProto, str]:
        out = self.name("const")
        return helper.make_node("Constant", [], [out], value=helper.make_tensor(
            out, onnx.TensorProto.INT64, [len(values)], values)), out

    def build(self, model: onnx.ModelProto, copy: onnx.ModelProto) -> Variant:
        index = {id(proto): i for i, proto in enumerate(model.graph.node)}
        top = {index[id(n.proto)]: n for n in self.mg.top_level() if id(n.proto) in index}
        if self.widen:
            self.plan_capacities([top[i] for i in sorted(top)])
        defined = {v.name for v in copy.graph.input} | {t.name for t in copy.graph.initializer}
        nodes: list[onnx.NodeProto] = []
        for i, proto in enumerate(copy.graph.node):
            node = top.get(i)
            before, after = self.rewrite(node, proto, defined) if node is not None and node.domain in ("", "ai.onnx") \
                else ([], [])
            for name in [n for n in proto.input if n in self.refill]:  # a capacity computed before: the whole axis
                before = self.whole_axis(name, *self.refill.pop(name), defined) + before
            if after is not None:  # None: `before` replaces the node
                for k, out in enumerate(proto.output):
                    if out in self.refill:  # the node keeps running, under a name nothing reads
                        proto.output[k] = self.name("capacity")
                after = [proto] + after
            for made in before + (after or []):
                nodes.append(made)
                defined.update(made.output)
        del copy.graph.node[:]
        copy.graph.node.extend(nodes)  # copies: the Loops' bodies are found again by their places
        place = {id(made): i for i, made in enumerate(nodes)}
        declared = tuple(Declared(place[id(loop)], k, before, given, shape)
                         for loop, k, before, given, shape in self.declared)
        return Variant(copy, dict(self.probes), tuple(self.widened), dict(self.assumed), declared)

    def rewrite(self, node: Node, proto: onnx.NodeProto, defined: set[str]):
        """(nodes before, nodes after) `proto`, which may be changed in place; after is None where
        the nodes before replace it (`defined`: the values computed before it)."""
        op, ins = node.op_type, node.inputs
        if op == "Loop" and self.mg.bodies(node.id):
            return self.probe(node), self.shape_loop(node, proto)
        if not self.widen:
            return [], []
        if op == "NonZero" and ins and self.dm.value(ins[0]) == VALUE:
            return self.all_indices(node, proto)
        if op == "Compress" and len(ins) > 1 and self.dm.value(ins[1]) == VALUE:
            self.widened.append(node.id)
            if any(a.name == "axis" for a in proto.attribute):
                return [helper.make_node("Identity", [proto.input[0]], [proto.output[0]])], None
            flat_node, flat = self.const([-1])
            return [flat_node, helper.make_node("Reshape", [proto.input[0], flat], [proto.output[0]])], None
        if node.id in self.own_capacity:
            position, data, axis, shape, whole = self.own_capacity[node.id]
            size = self.name("capacity")
            proto.input[position] = size
            return self.whole_axis(size, data, axis, shape, whole, defined), []
        return [], []

    # -- loops ---------------------------------------------------------------------------------
    def probe(self, node: Node) -> list[onnx.NodeProto]:
        """A tensor of shape [M] for a trip count M that input shapes set (inference computes it)."""
        m = node.inputs[0] if node.inputs else None
        trips = self.trips.get(node.id)
        if m is None or trips is None or not trips.m_from_shapes:
            return []
        cast, flat, probe = self.name("m"), self.name("m"), self.name("m")
        one_node, one = self.const([1])
        self.probes[node.id] = probe
        return [helper.make_node("Cast", [m.name], [cast], to=onnx.TensorProto.INT64), one_node,
                helper.make_node("Reshape", [cast, one], [flat]),
                helper.make_node("ConstantOfShape", [flat], [probe])]

    def shape_loop(self, node: Node, proto: onnx.NodeProto) -> list[onnx.NodeProto]:
        """Nodes that give the loop's results their shapes, the loop writing them under new names;
        and its body's carried inputs declared in the concrete shapes they keep (`shape_body`)."""
        body = self.mg.bodies(node.id)[0]
        carried = len(node.inputs) - 2
        self.shape_body(node, proto, body, carried)
        after: list[onnx.NodeProto] = []
        for k, out in enumerate(node.outputs):
            if out is None or self.resolve(out) is not None or 1 + k >= len(body.outputs):
                continue
            given = body.outputs[1 + k]
            inner = self.name("loop")
            if k < carried:  # a carried value: the shape it came in with
                start, came = node.inputs[2 + k], body.inputs[2 + k] if 2 + k < len(body.inputs) else None
                if start is None or came is None or given is None or not self._same_shape(came, given):
                    continue
                shape = self.name("shape")
                after += [helper.make_node("Shape", [start.name], [shape]),
                          helper.make_node("Reshape", [inner, shape], [out.name])]
            else:  # a scan output: one slice per iteration
                trips, each = self.trips.get(node.id), self.resolve(given) if given is not None else None
                if trips is None or trips.exact is None or each is None:
                    continue
                const, shape = self.const([trips.exact, *each])
                after += [const, helper.make_node("Reshape", [inner, shape], [out.name])]
            proto.output[k] = inner
        return after

    def shape_body(self, node: Node, proto: onnx.NodeProto, body, carried: int) -> None:
        """Declare, in the variant's body of `proto`, each carried input at the concrete shape of its
        initial value, where that is known and of the rank the body declares. ONNX's inference
        hands a Loop's body its carried values without shapes (they may change from one
        iteration to the next), so the body keeps the shapes it declares: Paddle2ONNX declares
        them with symbols of their own, and every product of SLANet's decoder was of unknown
        size. Whether the body gives a value back in the shape it came in is checked once
        inferred (`infer_variant`); the body's earlier shapes go."""
        graph = next((a.g for a in proto.attribute if a.name == "body" and a.type == onnx.AttributeProto.GRAPH), None)
        if graph is None or len(graph.input) != len(body.inputs) or len(graph.input) < 2 + carried:
            return
        kept = False
        for k in range(carried):
            start, given = node.inputs[2 + k], body.outputs[1 + k] if 1 + k < len(body.outputs) else None
            shape = self.resolve(start) if start is not None else None
            value = graph.input[2 + k]
            if shape is None or given is None or not value.type.HasField("tensor_type"):
                continue
            dims = value.type.tensor_type.shape.dim
            if value.type.tensor_type.HasField("shape") and len(dims) != len(shape):
                continue
            before = onnx.TypeProto()
            before.CopyFrom(value.type)
            del dims[:]
            for size in shape:
                dims.add().dim_value = int(size)
            self.declared.append((proto, 2 + k, before, f"{node.id}/body::{given.name}", tuple(shape)))
            kept = True
        if kept:
            del graph.value_info[:]

    def _same_shape(self, a: TensorRef, b: TensorRef) -> bool:
        sa, sb = (self.mg.tensors[r].shape if r in self.mg.tensors else None for r in (a, b))
        if sa is not None and sa == sb and None not in sa:
            return True
        ra, rb = self.resolve(a), self.resolve(b)
        return ra is not None and ra == rb

    # -- data-dependent selections keeping every row -------------------------------------------
    def all_indices(self, node: Node, proto: onnx.NodeProto):
        """NonZero of every element (`scale` times): int64 [rank, elements], as inference sees it."""
        x = node.inputs[0]
        assert x is not None  # asked only of a NonZero of values (dm.value(None) is CONST)
        info = self.mg.tensors.get(x)
        rank = len(info.shape) if info is not None and info.shape is not None else len(self.resolve(x) or ()) or None
        if rank is None:
            return [], []
        self.widened.append(node.id)
        size, flat, dims = self.name("size"), self.name("size"), self.name("dims")
        counted = [helper.make_node("Size", [x.name], [size])]
        if self.scale.get(node.id, 1) != 1:
            factor_node, factor = self.const([self.scale[node.id]])
            counted += [factor_node, helper.make_node("Mul", [size, factor], [scaled := self.name("size")])]
            size = scaled
        one_node, one = self.const([1])
        rank_node, rank_name = self.const([rank])
        return [*counted, one_node,
                helper.make_node("Reshape", [size, one], [flat]), rank_node,
                helper.make_node("Concat", [rank_name, flat], [dims], axis=0),
                helper.make_node("ConstantOfShape", [dims], [proto.output[0]],
                                 value=helper.make_tensor("zero", onnx.TensorProto.INT64, [1], [0]))], None

    # -- selections of fixed capacity keeping every row: a TopK's k, a Slice's end, a Range's limit
    def plan_capacities(self, nodes: list[Node]) -> None:
        """Find every selection of fixed size short of its whole axis: a TopK of value-dependent
        scores, a Slice of the indices such a TopK gives, a one-hot dispatch whose slots a Range
        numbers; plan its size to become its whole axis. A size computed from shapes becomes the
        whole axis for every node that reads it (dynamo writes one symbolic size into the
        selection and into the reshapes after it); a constant one only for the selection."""
        routed: set[TensorRef] = set()
        numbered: dict[TensorRef, Node] = {}  # a Range(0, C, 1), reshaped or cast -> the Range
        slotted: dict[TensorRef, Node] = {}  # values with an axis of C slots, by the Range that sets it
        for node in nodes:
            ins, outs = node.inputs, [r for r in node.outputs if r is not None]
            if node.domain not in ("", "ai.onnx"):
                continue
            op = node.op_type
            if op == "TopK" and len(ins) > 1 and self.dm.value(ins[0]) == VALUE:
                if len(node.outputs) > 1 and node.outputs[1] is not None:
                    routed.add(node.outputs[1])
                self.capacity(node, 1, next((a.i for a in node.proto.attribute if a.name == "axis"), -1))
            elif op in ("Identity", "Cast", "Squeeze", "Unsqueeze") and ins and ins[0] in routed:
                routed.update(outs)
            elif op == "Slice" and len(ins) > 2 and ins[0] in routed:
                axes = self.value(ins[3]) if len(ins) > 3 and ins[3] is not None else np.zeros(1)
                if axes is not None and axes.size == 1:
                    self.capacity(node, 2, int(axes.reshape(-1)[0]))
            elif op == "Range" and len(ins) == 3 and self.counts_from_zero(node):
                numbered.update(dict.fromkeys(outs, node))
            elif op in _LAYOUT and ins and ins[0] in numbered:
                numbered.update(dict.fromkeys(outs, numbered[ins[0]]))
            elif op == "Equal" and len(ins) == 2 and (ins[0] in numbered) != (ins[1] in numbered):
                slotted.update(dict.fromkeys(outs, next(numbered[r] for r in ins if r in numbered)))
            elif (op in _LAYOUT and ins and ins[0] in slotted) or (op in _PRODUCT and not slotted.keys().isdisjoint(ins)):
                slotted.update(dict.fromkeys(outs, next(slotted[r] for r in ins if r in slotted)))
            elif op == "Einsum" and slotted and (found := dispatch_operands(node, slotted)) is not None:
                self.slots(node, slotted[found[0]], *found)

    def counts_from_zero(self, node: Node) -> bool:
        """Whether a Range gives 0, 1, ... up to its limit: its length is its limit."""
        start, step = (self.value(r) if r is not None else None for r in (node.inputs[0], node.inputs[2]))
        return start is not None and step is not None and start.size == step.size == 1 \
            and start.reshape(-1)[0] == 0 and step.reshape(-1)[0] == 1

    def slots(self, einsum: Node, numbering: Node, mask: TensorRef, data: TensorRef) -> None:
        """Plan the limit of the Range that numbers a one-hot dispatch's slots (`numbering`) to
        become the length of the token axis the dispatch contracts: each expert takes every token.
        Only where that Range's length C is the extent of an axis the mask brings to the result
        (experts and their slots) and short of the tokens'."""
        equation = next(a.s.decode() for a in einsum.proto.attribute if a.name == "equation").replace(" ", "")
        terms = equation.split("->")[0].split(",")
        ms, ds = (terms[0], terms[1]) if einsum.inputs[0] == mask else (terms[1], terms[0])
        axis = next(i for i, c in enumerate(ds) if c in ms and c not in equation.split("->")[1])
        whole, length = self.resolve(data), self.resolve(numbering.outputs[0])
        held = self.resolve(mask)
        if whole is None or length is None or held is None or len(length) != 1 or len(held) != len(ms) \
                or not any(held[i] == length[0] for i, c in enumerate(ms) if c not in ds):
            return
        self.plan(numbering, 1, data, axis, length[0], whole)

    def capacity(self, node: Node, position: int, axis: int) -> None:
        data, out = node.inputs[0], node.outputs[0]
        if data is None or out is None:
            return
        whole, picked = self.resolve(data), self.resolve(out)
        if whole is None or picked is None or not -len(whole) <= axis < len(whole):
            return
        self.plan(node, position, data, axis % len(whole), picked[axis], whole)

    def plan(self, node: Node, position: int, data: TensorRef, axis: int, picked: int,
             whole: tuple[int, ...]) -> None:
        """Plan `node`'s size input at `position` (`picked` rows of `data`'s `axis`, of shape
        `whole`) to become the whole axis."""
        size = node.inputs[position]
        shape = self.resolve(size) if size is not None else None
        if size is None or picked >= whole[axis] or shape not in ((), (1,)) or node.id in self.widened:
            return
        self.widened.append(node.id)
        if not self.computed(size):
            self.own_capacity[node.id] = (position, data.name, axis, shape, whole[axis])
            return
        for same in self.same_size(size):
            self.refill.setdefault(same.name, (data.name, axis, self.resolve(same), whole[axis]))

    def computed(self, ref: TensorRef) -> bool:
        """Whether `ref` is a main-graph value a node other than a Constant computes."""
        info, producer = self.mg.tensors.get(ref), self.mg.producer(ref)
        return info is not None and info.kind == "node_output" and not ref.scope and producer is not None \
            and producer.op_type != "Constant"

    def same_size(self, size: TensorRef) -> list[TensorRef]:
        """The values that hold a selection's computed `size` on every input, to be given the whole
        axis together: the one-element int64 value it is a reshape or cast of (the exporter computes
        k once, then casts and reshapes it for each use: the selection's k, the reshapes after it),
        and every value computed from the same inputs by the same operators (k computed again)."""
        root = size
        while (producer := self.mg.producer(root)) is not None and producer.domain in ("", "ai.onnx") \
                and producer.op_type in SAME_VALUE and producer.inputs and producer.inputs[0] is not None \
                and self.computed(producer.inputs[0]) and self.one_int64(producer.inputs[0]):
            root = producer.inputs[0]
        key = self.key(root)
        op = self.mg.producer(root).op_type
        return [root] + [out for node in self.mg.top_level() if node.op_type == op for out in node.outputs
                         if out is not None and out != root and self.computed(out) and self.one_int64(out)
                         and self.key(out) == key]

    def one_int64(self, ref: TensorRef) -> bool:
        info, shape = self.mg.tensors.get(ref), self.resolve(ref)
        return info is not None and info.elem_type == onnx.TensorProto.INT64 and shape is not None \
            and int(np.prod(shape)) == 1

    def key(self, ref: TensorRef, depth: int = 0):
        """What `ref` is computed from, equal for two computations of the same size: the operators
        and their attributes, down to constants (by value), the tensors a Shape or Size reads and
        values that depend on input values (by name)."""
        if ref in self.keys:
            return self.keys[ref]
        constant = self.value(ref)
        producer = self.mg.producer(ref)
        found: tuple
        if constant is not None:
            found = ("constant", str(constant.dtype), constant.shape, tuple(constant.reshape(-1).tolist()))
        elif producer is None or ref.scope or depth > _KEY_DEPTH or self.dm.value(ref) == VALUE \
                or producer.domain not in ("", "ai.onnx"):
            found = ("value", ref.name)
        else:
            reads = tuple(("value", r.name) if producer.op_type in ("Shape", "Size") or r is None
                          else self.key(r, depth + 1) for r in producer.inputs)
            found = (producer.op_type, tuple(sorted(a.SerializeToString() for a in producer.proto.attribute)),
                     reads, producer.outputs.index(ref))
        self.keys[ref] = found
        return found

    def whole_axis(self, size: str, data: str, axis: int, shape: tuple[int, ...], whole: int,
                   defined: set[str] | None = None) -> list[onnx.NodeProto]:
        """Nodes computing `size`, the length of `data`'s `axis`, in the shape `shape`; the length
        `whole` found at the given shapes where `data` is not computed yet (`defined`)."""
        if defined is not None and data not in defined:
            whole = self.assumed[data, axis] = self.lengths.get((data, axis), whole)
            return [helper.make_node("Constant", [], [size], value=helper.make_tensor(
                size, onnx.TensorProto.INT64, list(shape), [whole]))]
        dims, length = self.name("shape"), self.name("length")
        index_node, index = self.const([axis])
        target_node, target = self.const(list(shape))
        return [helper.make_node("Shape", [data], [dims]), index_node,
                helper.make_node("Gather", [dims, index], [length], axis=0), target_node,
                helper.make_node("Reshape", [length, target], [size])]
