"""Blocks applied more than once: one module, shared weights, several passes.

A model that applies one layer several times (ALBERT's shared layer group, a Universal
Transformer's recurrent block unrolled by the exporter) gives every pass the same module path,
so the blocks found by name put all passes in one block. Each pass runs the same operators in
the same modules, on the same weights: where most of a block's compute nodes, told apart by
module and operator, occur exactly k > 1 times, or most of the weights they read are read
exactly k times, the block is k passes, and `split_repeats` cuts it where each occurrence of
the first of them runs, in execution order. Only a block that is the model's only one, or
half again as large as the median block, is looked at: passes of one layer make a block
several times the size of the others (blocks that are all repeated alike are left as they
are).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict

from graphaudit.analyses.blockmap import Block, BlockMap, block_map, module_paths, recount
from graphaudit.analyses.flops import is_counted
from graphaudit.graph.model import ModelGraph
from graphaudit.graph.visit_order import execution_order


def split_repeats(mg: ModelGraph, bm: BlockMap) -> BlockMap:
    """`bm` with each block that holds k passes of one layer cut into k blocks; `bm` itself
    when none does."""
    sizes = sorted(len(b.node_ids) for b in bm.blocks)
    median = sizes[(len(sizes) - 1) // 2] if sizes else 0  # the lower one: of two blocks, the smaller
    # a block of several passes is several times the size of the others, or the only one
    suspects = {b.index for b in bm.blocks if len(bm.blocks) == 1 or len(b.node_ids) >= 1.5 * median}
    if not suspects:
        return bm
    order: dict[str, int] = {}  # execution order, made when a block needs it
    copies = _weight_copies(mg)
    blocks: list[tuple[str, frozenset[str]]] = []
    notes = []
    for block in bm.blocks:
        passes = _passes(mg, block, order, copies) if block.index in suspects else None
        if passes is None:
            blocks.append((block.name, block.node_ids))
            continue
        starts = sorted(order[n] for n in passes)
        parts: list[set[str]] = [set() for _ in starts]
        for nid in block.node_ids:
            node = mg.nodes[nid]
            at = order[node.scopes[0].owner] if node.scopes else order[nid]  # a body goes with its owner
            parts[max(bisect_right(starts, at) - 1, 0)].add(nid)
        blocks += [(f"{block.name} (pass {j + 1} of {len(parts)})", frozenset(p)) for j, p in enumerate(parts)]
        notes.append(f"`{block.name}` runs {len(parts)} times with the same weights: one block per pass")
    if not notes:
        return bm
    made = tuple(Block(i, name, ids) for i, (name, ids) in enumerate(blocks))
    return block_map(made, f"{recount(bm.method, len(bm.blocks), len(made))}; {'; '.join(notes)}",
                     Counter(dict(bm.sources)), bm.placed)


# Ops that only re-lay a weight (TorchScript's Identity copies of a shared weight): their
# readers read the weight.
_ALIASES = frozenset({"Identity", "Transpose", "Cast", "Reshape", "Unsqueeze", "Squeeze"})


def _passes(mg: ModelGraph, block: Block, order: dict[str, int], copies: dict) -> list[str] | None:
    """The nodes that start each pass, when the block is one layer run k > 1 times, told by
    either of two signs: most of its compute nodes' modules (from torch's metadata, with
    their operator; at least three different ones) occur exactly k times; or most of the
    weight matrices its compute nodes read, themselves or through copies, are read exactly k
    times (a TorchScript export, whose names do not tell a module's second call from a
    module of its own). Fills `order` (node id -> place in execution order) when needed."""
    by_module: dict[tuple[str, str], list[str]] = defaultdict(list)
    by_weight: dict[str, list[str]] = defaultdict(list)
    tensors = mg.tensors
    for nid in block.node_ids:
        node = mg.nodes[nid]
        if node.scopes or not is_counted(node):
            continue
        paths = module_paths(node)
        if paths:
            by_module[paths[-1], node.op_type].append(nid)
        for ref in node.inputs:
            info = tensors.get(ref) if ref is not None else None
            if ref is None or info is None:
                continue
            weight = ref.name if info.kind == "initializer" and info.shape is not None and len(info.shape) >= 2 \
                else copies.get(ref)
            if weight is not None:
                by_weight[weight].append(nid)
    # the groups' nodes, whatever names a group (a module and operator, or a weight)
    for seen in (list(by_module.values()), list(by_weight.values())):
        counts = Counter(len(v) for v in seen)
        if not counts:
            continue
        k, kinds = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        if k < 2 or kinds < 3 or kinds * 2 <= len(seen):
            continue
        if not order:
            order.update((n.id, i) for i, n in enumerate(execution_order(mg)))
        return min((v for v in seen if len(v) == k), key=lambda v: min(order[n] for n in v))
    return None


def _weight_copies(mg: ModelGraph) -> dict:
    """Each main-graph value that is a copy of a weight matrix (`_ALIASES` of an initializer of
    rank 2 or more, or of such a copy), with the weight's name."""
    copies: dict = {}
    for node in mg.nodes.values():
        if node.scopes or node.op_type not in _ALIASES or not node.inputs or node.inputs[0] is None:
            continue
        source = node.inputs[0]
        info = mg.tensors.get(source)
        root = source.name if info is not None and info.kind == "initializer" and info.shape is not None \
            and len(info.shape) >= 2 else copies.get(source)
        if root is not None:
            copies.update(dict.fromkeys((r for r in node.outputs if r is not None), root))
    return copies
