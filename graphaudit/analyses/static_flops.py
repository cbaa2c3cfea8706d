"""The static audit's FLOPs: per node at the input shapes, then per block and in total.

`static_flops` counts every node once at the given input shapes, with the shapes ONNX's
inference leaves unknown found on a variant of the graph (`analyses.concrete_shapes`: loop results
shaped, trip counts computed), and finds each loop's trip count (`analyses.loop_trips`). Compute
behind a value-dependent selection has no size of its own: it is counted with every row
selected, an upper bound. Then, along the scopes (`analyses.flop_paths`):

- the **total** is the most expensive run: the larger branch of each If, each Loop body
  times its largest trip count, every row selected, but experts that a TopK of constant k
  routes at most k per routed row (`analyses.experts`);
- **skippable** is what the cheapest run that input values can choose saves against it:
  each value-dependent If's larger branch against its smaller, a value-dependent loop's
  most iterations against its fewest, a data-dependent selection's every row against none.
  Compute on a selection of *fixed* capacity (top-k tokens, k a fixed share) runs at that
  size on every input: it is not skippable; its saving, against the same compute on every
  row, is reported apart (`Capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from graphaudit.analyses.block_verdicts import ExecutionVerdicts
from graphaudit.analyses.concrete_shapes import infer_variant, variant, widest_shapes
from graphaudit.analyses.dependence import VALUE, DependenceMap
from graphaudit.analyses.experts import ExpertRows, expert_bounds
from graphaudit.analyses.flop_paths import Span, span
from graphaudit.analyses.flops import FlopCount, bind_dims, count_flops, resolver
from graphaudit.analyses.loop_trips import Trips, constant_values, trip_counts
from graphaudit.analyses.switches import SWITCH
from graphaudit.graph.model import ModelGraph
from graphaudit.vocabulary import SUBSET

CAPACITY = "fixed (capacity)"  # Evidence.size of a selection of fixed size


@dataclass(frozen=True)
class LoopFlops:
    """A Loop or Scan with compute in its body: its trip count and its body's FLOPs per iteration."""

    trips: Trips
    per_iteration: int
    counted_iterations: int  # how many iterations the total counts: the most, or 1 with no bound

    def to_json(self) -> dict:
        return {**self.trips.to_json(), "flops_per_iteration": self.per_iteration,
                "counted_iterations": self.counted_iterations}


@dataclass(frozen=True)
class Capacity:
    """Blocks that run on a selection of fixed size (a capacity): their FLOPs at that size, as
    every input runs them, and with every row selected."""

    blocks: tuple[str, ...]  # those whose full size was found
    flops: int
    full_size: int
    unsized: tuple[str, ...] = ()  # those whose full size was not found

    @property
    def saving(self) -> int:
        """What the fixed capacity saves on every input."""
        return self.full_size - self.flops

    def to_json(self) -> dict:
        return {"blocks": list(self.blocks), "flops": self.flops, "flops_full_size": self.full_size,
                "saving": self.saving, "full_size_not_found": list(self.unsized)}


@dataclass(frozen=True)
class BlockFlops:
    """One block's FLOPs in the most expensive run."""

    flops: int  # the compute of a size the graph fixes (a lower bound where `uncounted`)
    uncounted: int  # compute nodes of unknown size at the given shapes, left out of `flops`
    every_row: int | None  # with every row of each value-dependent selection selected; None: no such compute
    skippable: int  # what the cheapest run saves against the most expensive one
    full_size: int | None  # a block of fixed capacity: its FLOPs with every row selected


@dataclass(frozen=True)
class StaticFlops:
    """FLOPs at the given shapes: per node, per block, and along the most and least expensive runs."""

    count: FlopCount  # per node, one execution each; unknown_shape: nodes of unknown size
    run: Span  # the whole graph: most and least expensive run
    outside_blocks: int
    blocks: Mapping[int, BlockFlops]  # by block index
    every_row: tuple[str, ...]  # nodes counted with every row selected (value-dependent size)
    skippable_uncounted: int  # skippable compute nodes left out of every count
    loops: tuple[LoopFlops, ...]
    capacity: Capacity | None
    basis: tuple[str, ...]  # how the total is counted, in words
    experts: tuple[ExpertRows, ...] = ()  # routed experts counted at most k per row, not on every row


def static_flops(model: onnx.ModelProto, mg: ModelGraph, dm: DependenceMap, verdicts: ExecutionVerdicts,
                 shapes: Mapping[str, Sequence[int]], at: Mapping[str, Sequence[int]] | None) -> StaticFlops:
    """Return the StaticFlops of `model` (graph model `mg`, dependence `dm`, `verdicts`) with the
    graph inputs at `shapes` (`at`: every input's shape, for inference; None when not all known)."""
    dims = bind_dims(mg, shapes)
    value = constant_values(mg, small_initializers(model))
    capacity = [bv.block.index for bv in verdicts.blocks
                if bv.verdict == SUBSET and any(e.size == CAPACITY for e in bv.evidence)]
    count = count_flops(mg, shapes)
    trips = trip_counts(mg, dm, value, resolver(mg, dims))
    known: dict[str, tuple[int, ...]] = {}
    has_loop = any(n.op_type == "Loop" for n in mg.top_level())
    if at and (count.unknown_shape or capacity or has_loop):
        first = variant(model, mg, dm, trips, resolver(mg, dims), value)
        known, probed = infer_variant(first, at)
        if known and has_loop:
            # a loop's carried values whose shapes this round found: its body inferred at them
            again = variant(model, mg, dm, trips, resolver(mg, dims, known), value)
            if len(again.declared) > len(first.declared):
                known, probed = infer_variant(again, at)
        if known:
            count = count_flops(mg, shapes, known)
            trips = trip_counts(mg, dm, value, resolver(mg, dims, known), probed)

    def value_sized(nid: str) -> bool:
        return any(r is not None and dm.shape(r) == VALUE for r in mg.nodes[nid].inputs)

    sized = [n for n in count.unknown_shape if value_sized(n)]
    wide: dict[str, int] = {}
    widest: dict[str, tuple[int, ...]] | None = None
    if at and (sized or capacity):
        widest = widest_shapes(model, mg, dm, trips, resolver(mg, dims, known), value, at)
        wide = _widest_count(mg, shapes, widest) if widest is not None else {}
    bounded = {n: wide[n] for n in sized if n in wide}
    experts: tuple[ExpertRows, ...] = ()
    floor: dict[str, int] = {}
    if at and bounded and widest is not None:  # routed experts: at most k of them per row, not all on every row
        def scaled(scale: Mapping[str, int]) -> dict[str, int]:
            found = widest_shapes(model, mg, dm, trips, resolver(mg, dims, known), value, at, scale)
            return _widest_count(mg, shapes, found) if found is not None else {}
        tight, floor, experts = expert_bounds(mg, dm, value, resolver(mg, dims, known), widest, bounded, scaled)
        bounded.update(tight)
    most = {**count.per_node, **bounded}
    least = {**most, **{n: 0 for n in verdicts.skippable if n in most and value_sized(n)}, **floor}
    dynamic = {e.node for e in verdicts.controls if e.dependence == "value" and e.kind != SWITCH}
    taken = _constant_branches(mg, value)

    def along(ids, most_: Mapping[str, int] = most, least_: Mapping[str, int] = least) -> Span:
        return span(mg, ids, most_, least_, trips, dynamic, taken)

    unknown = set(count.unknown_shape)
    left_out = unknown - bounded.keys()  # no size even with every row selected
    per_block = {}
    for bv in verdicts.blocks:
        ids = bv.block.node_ids
        run, full = along(ids), None
        if bv.block.index in capacity and all(n in wide for n in ids if n in most):
            widened = {**most, **{n: wide[n] for n in ids if n in wide}}
            full = along(ids, widened, widened).most
            full = full if full > run.most else None  # no wider: the whole axis was not found
        every_row = run.most if not bounded.keys().isdisjoint(ids) and left_out.isdisjoint(ids) else None
        per_block[bv.block.index] = BlockFlops(along(ids, count.per_node, count.per_node).most,
                                               len(unknown.intersection(ids)), every_row, run.varies, full)
    inside = {n for bv in verdicts.blocks for n in bv.block.node_ids}
    run = along(mg.nodes)
    loops = tuple(LoopFlops(t, flops, 1 if t.most is None else t.most)
                  for owner, flops in run.per_iteration.items() if flops and (t := trips.get(owner)) is not None)
    return StaticFlops(
        count=count, run=run, outside_blocks=along(n for n in mg.nodes if n not in inside).most,
        blocks=per_block, every_row=tuple(sorted(bounded)),
        skippable_uncounted=len(left_out & verdicts.skippable), loops=loops,
        capacity=_capacity(verdicts, per_block, capacity) if capacity else None,
        basis=_basis(mg, most, taken, loops, bool(bounded), experts, len(left_out)), experts=experts,
    )


def _widest_count(mg: ModelGraph, shapes: Mapping[str, Sequence[int]], found: Mapping[str, tuple[int, ...]]
                  ) -> dict[str, int]:
    """FLOPs per node at the shapes `found` on the widest variant, but for the nodes after a
    reshape that does not hold its elements there (a size the widening did not reach)."""
    wide = dict(count_flops(mg, shapes, found, prefer_known=True).per_node)
    for nid in _after_broken_reshapes(mg, found):
        wide.pop(nid, None)
    return wide


def _capacity(verdicts: ExecutionVerdicts, per_block: Mapping[int, BlockFlops], indices: list[int]) -> Capacity:
    sized = [i for i in indices if per_block[i].full_size is not None]
    names = {bv.block.index: bv.block.name for bv in verdicts.blocks}
    return Capacity(tuple(names[i] for i in sized),
                    sum(b.every_row if b.every_row is not None else b.flops for b in (per_block[i] for i in sized)),
                    sum(per_block[i].full_size or 0 for i in sized),
                    tuple(names[i] for i in indices if i not in sized))


def _after_broken_reshapes(mg: ModelGraph, shapes: Mapping[str, tuple[int, ...]]) -> set[str]:
    """The nodes at or after a main-graph Reshape whose input and output hold different numbers
    of elements in `shapes`: a selection kept every row, but a size computed apart from it (a
    second computation of the same k) did not follow, so what comes after is no full size."""
    broken = [n.id for n in mg.top_level() if n.op_type == "Reshape" and n.inputs and n.outputs
              and n.inputs[0] is not None and n.outputs[0] is not None
              and n.inputs[0].name in shapes and n.outputs[0].name in shapes
              and math.prod(shapes[n.inputs[0].name]) != math.prod(shapes[n.outputs[0].name])]
    seen, stack = set(broken), list(broken)
    while stack:
        for out in mg.nodes[stack.pop()].outputs:
            for consumer in mg.consumers(out) if out is not None else ():
                if consumer.id not in seen:
                    seen.add(consumer.id)
                    stack.append(consumer.id)
    return seen


def _constant_branches(mg: ModelGraph, value) -> dict[str, str]:
    """The branch each If of a constant condition takes, by If id."""
    taken = {}
    for node in mg.nodes.values():
        if node.op_type == "If" and node.domain in ("", "ai.onnx") and node.inputs and node.inputs[0] is not None:
            condition = value(node.inputs[0])
            if condition is not None and condition.size == 1:
                taken[node.id] = "then_branch" if bool(condition.reshape(())) else "else_branch"
    return taken


def _basis(mg: ModelGraph, most: Mapping[str, int], taken: Mapping[str, str], loops: tuple[LoopFlops, ...],
           bounded: bool, experts: tuple[ExpertRows, ...], left_out: int = 0) -> tuple[str, ...]:
    """How the total is counted, in words, for the parts of the graph that need saying (`left_out`:
    compute nodes of unknown size, in no count)."""
    words = []
    if any(most.get(n.id) and any(s.owner_op == "If" and s.owner not in taken for s in n.scopes)
           for n in mg.nodes.values() if n.scopes):
        words.append("the larger branch of each If")
    if any(loop.trips.exact is not None for loop in loops):
        words.append("each Loop body times its trip count")
    if any(loop.trips.exact is None and loop.trips.most is not None for loop in loops):
        words.append("a value-dependent loop at its most iterations")
    for loop in loops:
        if loop.trips.most is None:
            words.append(f"one iteration of {loop.trips.op} `{loop.trips.node}`, whose trip count has no bound")
    if bounded:
        words.append("every row of each value-dependent selection selected" + _experts_words(experts))
    if left_out:
        words.append(f"without {left_out} compute node{'s' if left_out > 1 else ''} of unknown size")
    return tuple(words)


def _experts_words(experts: tuple[ExpertRows, ...]) -> str:
    """What the bound on routed experts assumes, in words."""
    by_k: dict[tuple[int, int], list[str]] = {}
    for e in experts:
        by_k.setdefault((e.k, e.choices), []).append(f"`{e.topk}`")
    return "".join(f", but at most k = {k} of {choices} experts per routed row behind TopK {', '.join(topks)}"
                   for (k, choices), topks in by_k.items()) + (
        " (the experts' masks are disjoint; each expert's FLOPs in proportion to its rows)" if experts else "")


def small_initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The main graph's initializers of up to 64 values stored in the file (trip counts, limits)."""
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
            if t.data_location != onnx.TensorProto.EXTERNAL and int(np.prod(t.dims, dtype=np.int64)) <= 64}
