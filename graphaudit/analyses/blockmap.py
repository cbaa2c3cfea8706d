"""What the block finders produce: the blocks, which block each node is in, and how they were
found (in words, with its count of blocks)."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from graphaudit.wording import counted

# How blocks were found, in words (BlockMap.method), by finder.
SOURCES = {
    "pattern": "--block-pattern",
    "metadata": "torch name-scope metadata",
    "fx_params": "parameters named in torch fx metadata",
    "node_names": "node names",
    "initializers": "initializer names",
    "owner": "the enclosing control-flow node or function call",
    "neighbours": "neighbouring nodes",
    "structure": "the residual chain",
    "bodies": "the control-flow bodies that hold compute",
}

# The node metadata torch writes with the module path of each operation.
NAMESPACE = "namespace"
NAME_SCOPES = "pkg.torch.onnx.name_scopes"


def module_paths(node) -> list[str] | None:
    """The module paths torch recorded for `node`, outermost first; None when it recorded none."""
    namespace = node.meta(NAMESPACE)
    if namespace is not None:
        segments = namespace.split("/")[:-1]  # the last one names the operation itself
        return [s.split(": ")[0].strip() for s in segments if s.split(": ")[0].strip()]
    scopes = node.meta(NAME_SCOPES)
    if scopes is not None:
        try:
            parsed = ast.literal_eval(scopes)
        except (ValueError, SyntaxError):
            return None
        if isinstance(parsed, (list, tuple)):
            return [str(p) for p in parsed[:-1] if p]
    return None


@dataclass(frozen=True)
class Block:
    """One repeated layer of the model and the ids of the nodes it is made of."""

    index: int
    name: str
    node_ids: frozenset[str] = field(repr=False)


@dataclass(frozen=True)
class BlockMap:
    """The blocks of a model, how they were found, and which block each node is in."""

    blocks: tuple[Block, ...]
    method: str
    sources: tuple[tuple[str, int], ...] = ()  # (source, nodes attributed by it)
    _by_node: Mapping[str, Block] = field(default_factory=dict, repr=False, compare=False)
    placed: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)  # node id -> its source

    def block_of(self, node_id: str) -> Block | None:
        """The block node `node_id` belongs to, or None when it is outside every block."""
        return self._by_node.get(node_id)

    def placed_by(self, node_id: str) -> str | None:
        """The source that put node `node_id` in its block ("metadata", "initializers",
        "neighbours", ...: the keys of SOURCES), or None where none was recorded (outside
        every block, or blocks cut from structure, which places every node alike)."""
        return self.placed.get(node_id)


def blocks_text(n: int) -> str:
    return counted(n, "block")


def recount(method: str, before: int, after: int) -> str:
    """`method` (how the blocks were found) with its count of blocks made `after`."""
    return method.replace(blocks_text(before), blocks_text(after), 1)


def make_blocks(assigned: dict[str, int], names: dict[int, str]) -> tuple[Block, ...]:
    members: dict[int, set[str]] = {}
    for nid, index in assigned.items():
        members.setdefault(index, set()).add(nid)
    return tuple(Block(i, names.get(i, f"block.{i}"), frozenset(members[i])) for i in sorted(members))


def block_map(blocks: tuple[Block, ...], method: str, counts: Counter, how: Mapping[str, str] | None = None) -> BlockMap:
    """The BlockMap of `blocks`; `how`: the source that placed each node, where known."""
    by_node = {nid: b for b in blocks for nid in b.node_ids}
    placed = {nid: how[nid] for nid in by_node if nid in how} if how else {}
    return BlockMap(blocks, method, tuple(counts.most_common()), MappingProxyType(by_node), MappingProxyType(placed))
