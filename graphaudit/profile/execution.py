"""Execution evidence: for each input, which nodes ran, at which shapes, and the FLOPs done.

Read from a profile taken at ORT_DISABLE_ALL, one run per input (batch), where every event
is one node of the graph, nested If / Loop bodies included. Per block it gives the fraction
of inputs for which the block ran, the fraction of its nodes that ran, the FLOPs executed
(static FLOP counts evaluated at the shapes the profiler recorded), and the nodes whose
shapes changed between inputs of the same input shape: the evidence of value-dependent
sizes (token dispatch, pruning).

A block *ran* for an input when one of its compute nodes (those the FLOP counter counts:
MatMul, Gemm, Conv, attention...) ran; a block without any runs when any of its nodes
did. A pass-through left in the skipping branch (an Identity) is not the block running.
Constant nodes (folded into initializers at load), Identity, control-flow owners and
inlined function bodies are not counted as block work; nor is a node of the main graph that
ran on no input: there nothing decides whether it runs, so ONNX Runtime removed it (a Cast to
the type its input already has), and its missing events say nothing of the input.

For a block the graph says runs on a subset of rows (a `subset` verdict), each selection
node's shapes tell how much of what it picks from it kept on each input (`rows_kept`): a
fixed capacity keeps the same share on every input, a threshold a share that varies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from graphaudit.analyses.switches import switched_nodes
from graphaudit.graph.model import ModelGraph, Node
from graphaudit.load.free_dims import is_fixed_shape
from graphaudit.profile.events import CONTROL_FLOW_OPS, NodeEvent, Run
from graphaudit.profile.mapping import BlockAssignment, NodeMap

FlopCounter = Callable[[Node, Sequence, Sequence], "int | None"]
_MAX_SHAPES = 8  # distinct shapes kept per value-dependent node


@dataclass(frozen=True)
class InputExecution:
    """What ran for one input (one batch of the data)."""

    index: int
    rows: tuple[int, int]  # examples [start, stop) of the data
    feed_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    ran: Mapping[str, tuple[str, ...]] = field(repr=False)  # node id -> shape signature of each call
    blocks_ran: tuple[str, ...]
    flops: Mapping[str, int | None] = field(repr=False)  # block -> FLOPs executed

    def to_json(self) -> dict:
        return {"index": self.index, "rows": list(self.rows), "blocks_ran": list(self.blocks_ran),
                "flops": dict(self.flops)}


@dataclass(frozen=True)
class ShapeVariation:
    """A node that ran at different shapes for inputs of the same shape."""

    node: str
    op_type: str
    distinct: int
    shapes: tuple[str, ...]  # up to _MAX_SHAPES, smallest and largest first
    compute: bool = True  # a node whose cost is counted (MatMul, Conv, attention …), not bookkeeping

    def to_json(self) -> dict:
        return {"node": self.node, "op_type": self.op_type, "distinct": self.distinct, "shapes": list(self.shapes),
                "compute": self.compute}


@dataclass(frozen=True)
class Stats:
    """min / median / max / total over inputs."""

    min: float
    median: float
    max: float
    total: float

    def to_json(self) -> dict:
        return {"min": self.min, "median": self.median, "max": self.max, "total": self.total}


@dataclass(frozen=True)
class BlockExecution:
    """One block over all inputs: how often and how much of it ran."""

    name: str
    nodes: int  # nodes counted as block work
    inputs: int
    inputs_executed: int
    node_fraction: Stats  # share of the block's nodes that ran, over inputs
    flops: Stats | None  # FLOPs executed per input; None without a FLOP counter
    value_dependent: tuple[ShapeVariation, ...]
    rows_kept: tuple[tuple[str, Stats], ...] = ()  # per selection node: the share of rows it kept, over inputs
    calls: Stats | None = None  # node runs per input (a Loop body's nodes run once per iteration)
    calls_vary: bool = False  # the number of runs differed between inputs fed the same shapes
    iterations: Stats | None = None  # per input, the most runs of one of its Loop bodies' nodes; None without any
    flops_vary: bool = False  # the FLOPs executed differed between inputs fed the same shapes (and switches' branches)
    ran_by_mode: bool = False  # it ran on some inputs only, but on all or none of those whose switches went one way

    @property
    def executed_fraction(self) -> float:
        return self.inputs_executed / self.inputs if self.inputs else float("nan")

    def to_json(self) -> dict:
        return {
            "name": self.name, "nodes": self.nodes, "inputs": self.inputs,
            "inputs_executed": self.inputs_executed, "executed_fraction": self.executed_fraction,
            "node_fraction": self.node_fraction.to_json(),
            "executed_flops": None if self.flops is None else self.flops.to_json(),
            "value_dependent_shapes": [v.to_json() for v in self.value_dependent],
            "rows_kept": [{"node": node, **stats.to_json()} for node, stats in self.rows_kept],
            "calls": None if self.calls is None else self.calls.to_json(), "calls_vary": self.calls_vary,
            "flops_vary": self.flops_vary, "ran_by_mode": self.ran_by_mode,
            "iterations": None if self.iterations is None else self.iterations.to_json(),
        }


@dataclass(frozen=True)
class Execution:
    """Execution evidence for every input and every block."""

    inputs: tuple[InputExecution, ...]
    blocks: tuple[BlockExecution, ...]
    flop_counter: str | None

    def mean_flops(self) -> float | None:
        """FLOPs executed per input (all blocks), mean over inputs; None without a FLOP counter."""
        if self.flop_counter is None or not self.inputs:
            return None
        return float(np.mean([sum(v or 0 for v in inp.flops.values()) for inp in self.inputs]))


NOT_WORK = frozenset({"Constant", "Identity"}) | CONTROL_FLOW_OPS


def block_work(mg: ModelGraph, blocks: BlockAssignment) -> dict[str, list[str]]:
    """Block -> its nodes that do work when they run (see the module docstring)."""
    callers = {s.owner for n in mg.nodes.values() for s in n.scopes if s.kind == "function"}
    work: dict[str, list[str]] = {name: [] for name in blocks.names}
    for node in mg.nodes.values():
        if node.op_type in NOT_WORK or node.id in callers:
            continue
        if any(s.kind == "function" for s in node.scopes):
            continue
        work.setdefault(blocks.block_of(node.id), []).append(node.id)
    return work


def read_execution(
    runs: Sequence[Run],
    rows: Sequence[tuple[int, int]],
    feed_shapes: Sequence[tuple[tuple[str, tuple[int, ...]], ...]],
    mg: ModelGraph,
    node_map: NodeMap,
    blocks: BlockAssignment,
    flop_counter: FlopCounter | None = None,
    selections: Mapping[str, Sequence[str]] | None = None,
) -> Execution:
    """Execution evidence from `runs`, one per input in order, mapped one-to-one.

    `selections`: block name -> the nodes that pick the rows it runs on (its `subset` evidence).
    """
    work = block_work(mg, blocks)
    compute = {b: [n for n in ids if _is_compute(mg.nodes[n])] or ids for b, ids in work.items()}
    inputs = tuple(
        _read_input(i, run, rows[i], feed_shapes[i], mg, node_map, blocks, compute, flop_counter)
        for i, run in enumerate(runs)
    )
    ran = {n for inp in inputs for n in inp.ran}
    work = {b: [n for n in ids if n in ran or mg.nodes[n].scopes] for b, ids in work.items()}
    # a node in a branch of a switch (analyses.switches) ran when its switch ran either branch
    twins = switched_nodes(mg) if any(n.op_type == "If" for n in mg.nodes.values()) else {}
    switched = [{twins[n] for n in inp.ran if n in twins} for inp in inputs] if twins else None
    # the branch each switch took: inputs that took other branches may run other numbers of nodes
    modes = [frozenset((twins[n], _branch(mg.nodes[n], twins[n])) for n in inp.ran if n in twins)
             for inp in inputs] if twins else [frozenset()] * len(inputs)
    summaries = tuple(_summarise(name, ids, inputs, mg, flop_counter is not None, (selections or {}).get(name),
                                 twins, switched, modes) for name, ids in work.items() if ids)
    name = getattr(flop_counter, "__module__", None) if flop_counter else None
    return Execution(inputs, summaries, name)


def _read_input(index, run, rows, feed_shapes, mg, node_map, blocks, compute, flop_counter) -> InputExecution:
    ran: dict[str, list[str]] = {}
    flops: dict[str, int] = {b: 0 for b in compute} if flop_counter else {}
    for ev in run.events:
        node_id = node_map.node_of(ev.name)
        if node_id is None:
            continue
        ran.setdefault(node_id, []).append(signature(ev))
        if flop_counter is not None and ev.input_shapes is not None:
            node = mg.nodes[node_id]
            count = flop_counter(node, aligned_inputs(node, ev.input_shapes, mg), ev.output_shapes or ())
            block = blocks.block_of(node_id)
            if count is not None:
                flops[block] = flops.get(block, 0) + int(count)
    blocks_ran = tuple(b for b, ids in compute.items() if any(n in ran for n in ids))
    return InputExecution(index, rows, feed_shapes, {k: tuple(v) for k, v in ran.items()}, blocks_ran, flops)


def _branch(node: Node, owner: str) -> str:
    return next(s.kind for s in node.scopes if s.owner == owner)


def _summarise(name, ids, inputs, mg, with_flops, selections, twins, switched, modes) -> BlockExecution:
    if switched is None:
        fractions = [sum(n in inp.ran for n in ids) / len(ids) for inp in inputs]
    else:
        fractions = [sum(n in inp.ran or twins.get(n) in ran for n in ids) / len(ids)
                     for inp, ran in zip(inputs, switched)]
    executed = sum(name in inp.blocks_ran for inp in inputs)
    flops = _stats([inp.flops.get(name) or 0 for inp in inputs]) if with_flops else None
    calls = [sum(len(inp.ran.get(n, ())) for n in ids) for inp in inputs]
    # inputs fed the same shapes, whose switches took the same branches, that ran other amounts of work
    groups: dict[tuple, set[int]] = {}
    done: dict[tuple, set[int]] = {}
    ran: dict[frozenset, set[bool]] = {}
    for inp, count, mode in zip(inputs, calls, modes):
        groups.setdefault((inp.feed_shapes, mode), set()).add(count)
        done.setdefault((inp.feed_shapes, mode), set()).add(inp.flops.get(name) or 0)
        ran.setdefault(mode, set()).add(name in inp.blocks_ran)
    looped = [n for n in ids if any(s.kind == "body" and mg.nodes[s.owner].op_type == "Loop"
                                    for s in mg.nodes[n].scopes if s.owner in mg.nodes)]
    iterations = _stats([max(len(inp.ran.get(n, ())) for n in looped) for inp in inputs]) if looped else None
    return BlockExecution(name, len(ids), len(inputs), executed, _stats(fractions), flops,
                          _value_dependent(ids, inputs, mg), _rows_kept(selections, inputs), _stats(calls),
                          any(len(counts) > 1 for counts in groups.values()), iterations,
                          with_flops and any(len(f) > 1 for f in done.values()),
                          0 < executed < len(inputs) and all(len(r) == 1 for r in ran.values()))


def _rows_kept(selections: Sequence[str] | None, inputs) -> tuple[tuple[str, Stats], ...]:
    """Per selection node, over inputs: the elements it output over those it picked from (its
    first input), summed over its calls; the nodes that ran with shapes only. A share is the
    selection's, not the block's: rows it left aside may join the block again (Token Merging
    concatenates them back)."""
    found = []
    for node_id in selections or ():
        shares = []
        for inp in inputs:
            kept = picked_from = 0
            for sig in inp.ran.get(node_id, ()):
                ins, _, outs = sig.partition(" -> ")
                data, out = _first_volume(ins), _first_volume(outs)
                if data and out is not None:
                    kept, picked_from = kept + out, picked_from + data
            if picked_from:
                shares.append(kept / picked_from)
        if shares:
            found.append((node_id, _stats(shares)))
    return tuple(found)


def _first_volume(shapes: str) -> int | None:
    """The element count of the first shape of "[2,32,64]x[2,16]", or None without one."""
    first = shapes.split("]", 1)[0].strip("[") if shapes.startswith("[") else None
    if first is None:
        return None
    dims = [d for d in first.split(",") if d.strip()]
    return int(np.prod([int(d) for d in dims], dtype=np.int64)) if dims else 1


def _value_dependent(ids, inputs, mg) -> tuple[ShapeVariation, ...]:
    """Nodes whose shapes differed between inputs fed the same shapes. A node that ran more
    often on one input (a Loop body's, once per iteration) at the same shapes did not change
    shape: that is `calls_vary`."""
    groups: dict[tuple, list[InputExecution]] = {}
    for inp in inputs:
        groups.setdefault(inp.feed_shapes, []).append(inp)
    found = []
    for node_id in ids:
        varies = False
        seen: list[str] = []
        for group in groups.values():
            sigs = {frozenset(inp.ran[node_id]) for inp in group if node_id in inp.ran}
            varies |= len(sigs) > 1
            seen += [s for calls in sigs for s in sorted(calls) if s not in seen]
        if varies:
            ordered = sorted(seen, key=_volume)
            keep = ordered if len(ordered) <= _MAX_SHAPES else ordered[:_MAX_SHAPES // 2] + ordered[-_MAX_SHAPES // 2:]
            found.append(ShapeVariation(node_id, mg.nodes[node_id].op_type, len(seen), tuple(keep),
                                        _is_compute(mg.nodes[node_id])))
    return tuple(found)


def _is_compute(node: Node) -> bool:
    try:
        from graphaudit.analyses.flops import is_counted
    except ImportError:
        return False
    return is_counted(node)


def aligned_inputs(node: Node, shapes: Sequence[tuple[int, ...]], mg: ModelGraph) -> tuple:
    """The event's input shapes lined up with the node's inputs.

    ORT leaves out inputs it holds no tensor for at run time, typically weights it prepacked
    (a MatMul's B), so the list can be shorter than the node's inputs. A constant input's
    shape is known from the graph; events are consumed only where they can belong.
    """
    inputs = [ref for ref in node.inputs if ref is not None]
    if len(shapes) >= len(inputs):
        return tuple(shapes)
    aligned: list = []
    p = 0
    for j, ref in enumerate(inputs):
        known = _constant_shape(ref, mg)
        left_inputs = sum(_constant_shape(r, mg) is None for r in inputs[j + 1:])
        take = p < len(shapes) and (known is None or (tuple(shapes[p]) == known and len(shapes) - p > left_inputs))
        if take:
            aligned.append(tuple(shapes[p]))
            p += 1
        else:
            aligned.append(known)
    return tuple(aligned)


def _constant_shape(ref, mg: ModelGraph) -> tuple[int, ...] | None:
    info = mg.tensors.get(ref)
    if info is None or not is_fixed_shape(info.shape):
        return None
    producer = mg.producer(ref)
    if info.kind == "initializer" or (producer is not None and producer.op_type == "Constant"):
        return tuple(info.shape)
    return None


def signature(ev: NodeEvent) -> str:
    """The shapes one call ran at: "[3,64]x[64,256] -> [3,256]"."""
    def fmt(shapes):
        return "x".join("[" + ",".join(map(str, s)) + "]" for s in shapes or ())
    return f"{fmt(ev.input_shapes)} -> {fmt(ev.output_shapes)}"


def _volume(sig: str) -> int:
    total = 0
    for part in sig.replace(" -> ", "x").split("x"):
        dims = [int(d) for d in part.strip("[]").split(",") if d.strip().lstrip("-").isdigit()]
        total += int(np.prod(dims)) if dims else 0
    return total


def _stats(values: Sequence[float]) -> Stats:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return Stats(0.0, 0.0, 0.0, 0.0)
    return Stats(float(a.min()), float(np.median(a)), float(a.max()), float(a.sum()))
