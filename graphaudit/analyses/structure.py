"""Blocks from structure alone, for a graph whose names say nothing.

The residual chain is the longest run of Add nodes, each adding to the previous one's
output (pre-norm), or to that output normalised or activated (post-norm, as in BERT or
ResNet); its Adds are grouped into blocks by the period of their repeating operator pattern.
Without such a chain, each top-level If, Loop or Scan whose bodies hold compute is a block (an
adaptive-computation model's one layer, applied by a Loop as often as its halting score says).
"""

from __future__ import annotations

from collections import Counter

from graphaudit.analyses.blockmap import SOURCES, BlockMap, block_map, blocks_text, make_blocks
from graphaudit.graph.model import ModelGraph, Node, TensorRef

# Operators that only move or reshape data: left out of the pattern that blocks repeat.
_PLUMBING = frozenset({
    "Shape", "Size", "Constant", "ConstantOfShape", "Gather", "Concat", "Unsqueeze", "Squeeze",
    "Slice", "Cast", "Range", "Reshape", "Expand", "Identity",
})


# What a post-norm layer puts between one residual Add and the next (read on its first input).
_THROUGH = frozenset({
    "LayerNormalization", "SimplifiedLayerNormalization", "BatchNormalization", "Relu", "Gelu", "Identity",
})


def structural_blocks(mg: ModelGraph) -> BlockMap:
    """Blocks cut along the residual chain, for a graph whose names say nothing."""
    chain = _residual_chain(mg)
    if len(chain) < 2:
        return _bodies(mg) or BlockMap((), "no blocks: no layer names, no --block-pattern, no residual chain "
                                           f"of Add nodes ({len(chain)} found) and no control flow holding compute")
    position = {nid: i for i, nid in enumerate(chain)}
    segment: dict[str, int] = dict(position)
    for nid, i in position.items():  # a post-norm's normalisation belongs with the Add it normalises
        after = _readers(mg, mg.nodes[nid])
        while len(after) == 1 and after[0].op_type in _THROUGH and after[0].id not in segment:
            segment[after[0].id] = i
            after = _readers(mg, after[0])
    top = [n for n in mg.nodes.values() if not n.scopes]
    for node in reversed(top):  # each node joins the first residual Add it feeds
        if node.id in segment:
            continue
        found = [segment[c.id] for r in node.outputs if r is not None for c in mg.consumers(r)
                 if c.id in segment]
        if found:
            segment[node.id] = min(found)
    start = _stream_input(mg, chain)
    before = _ancestors(mg, start) if start is not None else set()
    for nid in before:  # the embedding and everything before the first block
        segment.pop(nid, None)
    nested = [n for n in mg.nodes.values() if n.scopes]
    for node in nested:
        owner = node.scopes[0].owner
        if owner in segment:
            segment[node.id] = segment[owner]
    period = _period([Counter(mg.nodes[n].op_type for n, s in segment.items()
                              if s == i and mg.nodes[n].op_type not in _PLUMBING)
                      for i in range(len(chain))])
    assigned = {nid: s // period for nid, s in segment.items()}
    names = {i: f"block.{i}" for i in set(assigned.values())}
    blocks = make_blocks(assigned, names)
    method = (f"{SOURCES['structure']}: {len(chain)} residual Add nodes, "
              f"{period} per block, {blocks_text(len(blocks))} (no layer names found)")
    return block_map(blocks, method, Counter({"structure": len(assigned)}))


def _readers(mg: ModelGraph, node: Node) -> list[Node]:
    """The nodes that read `node`'s first output; none where it has no first output."""
    out = node.outputs[0] if node.outputs else None
    return mg.consumers(out) if out is not None else []


def _bodies(mg: ModelGraph) -> BlockMap | None:
    """One block per top-level control-flow node whose bodies hold compute (its own node and
    everything nested under it), in graph order; None when there is none."""
    from graphaudit.analyses.flops import is_counted

    owners = {n.id: n for n in mg.nodes.values() if not n.scopes and mg.bodies(n.id)}
    members: dict[str, set[str]] = {}
    for node in mg.nodes.values():
        if node.scopes and node.scopes[0].owner in owners:
            members.setdefault(node.scopes[0].owner, set()).add(node.id)
    chosen = [o for o in owners if any(is_counted(mg.nodes[n]) for n in members.get(o, ()))]
    if not chosen:
        return None
    assigned = {n: i for i, owner in enumerate(chosen) for n in (owner, *members[owner])}
    blocks = make_blocks(assigned, {i: owner for i, owner in enumerate(chosen)})
    kinds = ", ".join(sorted({owners[o].op_type for o in chosen}))
    method = (f"{SOURCES['bodies']}: {blocks_text(len(blocks))}, one per {kinds} (no layer names and no "
              "residual chain found)")
    return block_map(blocks, method, Counter({"bodies": len(assigned)}))


def _residual_chain(mg: ModelGraph) -> list[str]:
    """The longest run of top-level Adds, each adding to the previous one's (shared) output."""
    def shared(ref):
        return ref is not None and len({c.id for c in mg.consumers(ref)}) >= 2

    # A residual Add adds a branch to a stream that something else reads too.
    adds = [n for n in mg.nodes.values() if not n.scopes and n.op_type in ("Add", "Sum")
            and any(shared(r) for r in n.inputs)]
    residual = {n.id for n in adds}

    def previous(ref):
        """The residual Add whose output reaches `ref` directly or through a post-norm's
        normalisation and activation (x = LayerNorm(x + f(x))), else None."""
        node = mg.producer(ref)
        for _ in range(3):
            if node is None or node.id in residual:
                return node
            if node.op_type not in _THROUGH or not node.inputs or node.inputs[0] is None \
                    or len(mg.consumers(node.inputs[0])) != 1:
                return None
            node = mg.producer(node.inputs[0])
        return None

    nxt: dict[str, str] = {}
    has_prev: set[str] = set()
    for node in adds:
        for ref in node.inputs:
            prev = previous(ref) if ref is not None else None
            if prev is not None and shared(ref) and prev.id not in nxt:
                nxt[prev.id] = node.id
                has_prev.add(node.id)
                break
    best: list[str] = []
    for node in adds:
        if node.id in has_prev:
            continue
        run = [node.id]
        while run[-1] in nxt:
            run.append(nxt[run[-1]])
        if len(run) > len(best):
            best = run
    return best


def _stream_input(mg: ModelGraph, chain: list[str]) -> TensorRef | None:
    """The residual stream entering the first Add: its input shared with the rest of the block."""
    first = mg.nodes[chain[0]]
    shared = [r for r in first.inputs if r is not None and len({c.id for c in mg.consumers(r)}) >= 2]
    return shared[0] if shared else None


def _ancestors(mg: ModelGraph, ref: TensorRef) -> set[str]:
    seen: set[str] = set()
    todo = [ref]
    while todo:
        producer = mg.producer(todo.pop())
        if producer is None or producer.id in seen:
            continue
        seen.add(producer.id)
        todo.extend(r for r in producer.inputs if r is not None)
    return seen


def _period(signatures: list[Counter]) -> int:
    """The smallest p such that the segments' operator counts repeat every p segments."""
    n = len(signatures)
    for p in range(1, n // 2 + 1):
        # Segment 0 also holds the shape computations every later block reuses: skip it.
        if n % p == 0 and all(signatures[i] == signatures[i + p] for i in range(1, n - p)):
            return p
    return 1
