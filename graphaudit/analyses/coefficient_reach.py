"""Where a coefficient's values go and which block it serves: the walks from a tensor through
reshapes, slices and thresholds (PLUMBING) to the node that gates, routes or decides with it,
and from there to the nearest block."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator, Sequence

from graphaudit.analyses.blockmap import BlockMap
from graphaudit.graph.model import ModelGraph, Node, TensorRef

# (QLinearMul and QLinearMatMul: the same in a static quantization's operator form)
GATING = frozenset({"Mul", "MatMul", "Einsum", "Gemm", "Where", "Div", "QLinearMul", "QLinearMatMul"})
ROUTING = frozenset({"TopK", "ArgMax", "ArgMin", "NonZero"})  # NonZero: of a thresholded score
DECIDING = frozenset({"If", "Loop"})  # what their condition (a Loop's trip count too) decides runs or not
# Operators a coefficient may pass through on its way to the node it weights (a quantised
# model's QuantizeLinear / DequantizeLinear pairs included; a hard gate's threshold or rounding:
# SkipNet's and BlockDrop's (σ > ½) cast to 0 / 1, a straight-through estimator's round(σ)).
PLUMBING = frozenset({
    "Reshape", "Unsqueeze", "Squeeze", "Transpose", "Slice", "Split", "Gather", "Expand", "Cast",
    "Identity", "Concat", "Flatten", "Add", "Sub", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
    "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Round",
    "ScatterND", "ScatterElements",  # a mask edited in place (a class token forced in) before it selects
})
# What turns a router's choice into a condition: argmax(p) == slot, and its negations and unions.
COMPARING = frozenset({"Equal", "Not", "And", "Or", "Xor"})


def weighted_block(mg: ModelGraph, ref: TensorRef, blocks: BlockMap):
    """The block that computed what `ref` weights (the other operand of the nearest gating node it
    reaches through PLUMBING, one that weights before one that chooses or divides), or the block
    of the If / Loop it decides, or the block whose result a router's choice takes, or None."""
    reached = sorted(reached_consumers(mg, ref, limit=16, nearest_first=True),
                     key=lambda found: found[0].op_type in ("Where", "Div"))
    for consumer, current in reached:
        if consumer.op_type in GATING:
            block = block_upstream(mg, [r for r in consumer.inputs if r is not None and r != current], blocks)
        elif consumer.op_type in DECIDING:
            block = blocks.block_of(consumer.id) or next(
                (b for n in mg.nodes.values() if n.scopes and n.scopes[0].owner == consumer.id
                 for b in [blocks.block_of(n.id)] if b is not None), None)
        elif routes(consumer, current):  # a router serves the block its choice feeds
            block = _taken_block(mg, consumer, blocks) or blocks.block_of(consumer.id) or block_downstream(
                mg, [r for r in consumer.outputs if r is not None], blocks)
        else:
            continue
        if block is not None:
            return block
    return None


def _taken_block(mg: ModelGraph, router: Node, blocks: BlockMap):
    """For a router whose choice (compared with a slot: argmax(p) == skip) is the condition of a
    Where that keeps a block's input or takes its result, where(skip, h, block(h)): the block
    whose result it takes (the latest that made an option, as verdicts' routing mask finds it);
    else None. The choice serves that block, not the next block that reads the Where's result."""
    for out in filter(None, router.outputs):
        for consumer, current in reached_consumers(mg, out, limit=8, through=PLUMBING | COMPARING):
            if consumer.op_type == "Where" and current == consumer.inputs[0] and None not in consumer.inputs:
                return block_upstream(mg, [r for r in consumer.inputs[1:] if r is not None], blocks)
    return None


def routes(consumer: Node, current: TensorRef) -> bool:
    """Whether `consumer` chooses by `current`: a TopK / ArgMax / NonZero of it, or a Compress
    keeping what it marks."""
    return consumer.op_type in ROUTING or (consumer.op_type == "Compress" and current == consumer.inputs[1])


def block_downstream(mg: ModelGraph, refs: Sequence[TensorRef], blocks: BlockMap, depth: int = 12):
    """The earliest block among the nearest readers of `refs` that are in a block, looking down
    through nodes in none (a token pruner's TopK, then the Gathers that keep the tokens), or None."""
    return _nearest_block(refs, blocks, depth, lambda level: [c for r in level for c in mg.consumers(r)],
                          lambda node: node.outputs, min)


def block_upstream(mg: ModelGraph, refs: Sequence[TensorRef], blocks: BlockMap, depth: int = 8):
    """The latest block among the nearest producers of `refs` that are in a block, looking up
    through nodes in none (x + g·(block(x) − x): the Sub is in no block, block(x) is), or None."""
    return _nearest_block(refs, blocks, depth, lambda level: [p for p in map(mg.producer, level) if p is not None],
                          lambda node: node.inputs, max)


def _nearest_block(refs, blocks: BlockMap, depth: int, step, onward, pick):
    """Walk from `refs` level by level (`step`: the nodes one level on, `onward`: the tensors
    past a node), and `pick` (min or max by index) among the blocks of the first level in any."""
    level, seen = list(refs), set(refs)
    for _ in range(depth):
        nodes = step(level)
        found = [b for b in (blocks.block_of(n.id) for n in nodes) if b is not None]
        if found:
            return pick(found, key=lambda b: b.index)
        level = [r for n in nodes for r in onward(n) if r is not None and r not in seen]
        seen.update(level)
        if not level:
            return None
    return None


def reached_consumers(mg: ModelGraph, ref: TensorRef, limit: int, *, through: frozenset[str] = PLUMBING,
                      nearest_first: bool = False) -> Iterator[tuple[Node, TensorRef]]:
    """Each node `ref` reaches through reshapes and slices (`through`) and scalings by constants
    (Hyper-Connections' tanh(·)·s with a learned s), with the tensor it reads.

    The walk stops going further once `limit` nodes have been seen. `nearest_first`: breadth
    first, so that a score summed on from block to block (A-ViT's cumulative halting score)
    meets the gate it makes next before those of the sums after it.
    """
    todo, seen = deque([ref]), set()
    while todo:
        current = todo.popleft() if nearest_first else todo.pop()
        for consumer in mg.consumers(current):
            if consumer.id in seen:
                continue
            seen.add(consumer.id)
            yield consumer, current
            if len(seen) < limit and (consumer.op_type in through or _scaled(mg, consumer, current)):
                todo.extend(r for r in consumer.outputs if r is not None)


def _scaled(mg: ModelGraph, node: Node, current: TensorRef) -> bool:
    """Whether `node` multiplies or divides `current` by constants only."""
    return node.op_type in ("Mul", "Div") and not node.domain and (node.op_type == "Mul" or node.inputs[0] == current) \
        and all(_constant(mg, r) for r in node.inputs if r is not None and r != current)


def _constant(mg: ModelGraph, ref: TensorRef, depth: int = 4) -> bool:
    """Whether `ref` is an initializer, a Constant's, or computed from those alone (a learned
    scale unsqueezed or cast)."""
    info = mg.tensors.get(ref)
    if info is None or info.kind not in ("initializer", "node_output"):
        return False
    if info.kind == "initializer":
        return True
    node = mg.producer(ref)
    if node is None or node.domain:
        return False
    if node.op_type == "Constant":
        return True
    return depth > 0 and bool(node.inputs) and node.op_type not in ("Shape", "Size") \
        and all(_constant(mg, r, depth - 1) for r in node.inputs if r is not None)


def block_index(mg: ModelGraph, ref: TensorRef | None, blocks: BlockMap | None) -> int | None:
    """The index of the block that computes `ref`, else of the block whose output it weights,
    else of the block that reads it (as `layer_of` reads them); None where no block does."""
    if blocks is None or ref is None:
        return None
    producer = mg.producer(ref)
    block = blocks.block_of(producer.id) if producer is not None else None
    if producer is None or block is None or blocks.placed_by(producer.id) == "neighbours":
        block = weighted_block(mg, ref, blocks) or block
    reader = next(iter(mg.consumers(ref)), None)
    block = block or (blocks.block_of(reader.id) if reader is not None else None)
    return block.index if block is not None else None


def layer_of(mg: ModelGraph, ref: TensorRef | None, name: str, blocks: BlockMap | None, fallback: int) -> int:
    """The block that computes the coefficient; else the block whose output it weights (a gate
    computed and applied between the blocks, x + g·block(x)); else the block that reads it;
    else the number its name ends in; else `fallback`.

    A computing node that only its neighbours put in a block (no name of its own says where it
    is) yields to what the coefficient weights: the controller `routers.2`, run between
    `blocks.1` and `blocks.2`, lands in `blocks.1` by its neighbours and serves `blocks.2`.
    """
    index = block_index(mg, ref, blocks)
    return index if index is not None else named_layer(name, fallback)


def named_layer(name: str, fallback: int) -> int:
    """The number `name` ends in (not the output number exporters append), else `fallback`."""
    m = re.search(r"(\d+)$", re.sub(r"_output_\d+$", "", name))
    return int(m.group(1)) if m else fallback
