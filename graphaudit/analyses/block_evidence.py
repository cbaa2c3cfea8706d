"""What a verdict rests on: the evidence in the graph, a block's verdict, every block's.

Kept apart from `analyses.block_verdicts`, which finds them, so that what reads them (the static
report, the FLOP count, the runtime profile) needs only these types.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphaudit.analyses.blockmap import Block


@dataclass(frozen=True)
class Evidence:
    """One fact in the graph behind a verdict."""

    kind: str  # branch | loop | switch | selection | extent | routing mask | gate | contrib
    node: str
    op: str
    tensor: str | None
    dependence: str | None  # const | shape | value: what decides it
    detail: str
    size: str | None = None  # for a selection: "fixed (capacity)" | "data-dependent"

    def to_json(self) -> dict:
        out = {"kind": self.kind, "node": self.node, "op": self.op, "tensor": self.tensor,
               "dependence": self.dependence, "text": self.detail}
        if self.size is not None:
            out["size"] = self.size
        return out


@dataclass(frozen=True)
class BlockVerdict:
    """A block's verdict, the evidence for it, and the nodes that can be skipped or shrunk."""

    block: Block
    verdict: str
    evidence: tuple[Evidence, ...]
    skippable: frozenset[str]


@dataclass(frozen=True)
class ExecutionVerdicts:
    """Per-block verdicts, every control-flow decision, and the graph-level facts."""

    blocks: tuple[BlockVerdict, ...]
    controls: tuple[Evidence, ...]  # every If / Loop / Scan / search operator, dynamic or not
    outside: tuple[Evidence, ...]  # dynamic evidence on nodes that are in no block
    conditional_execution: bool  # some compute runs or not, or a varying number of times, by an input's value
    data_dependent_compute: bool  # some compute runs on a value-dependent subset
    skippable: frozenset[str]  # every node that can be skipped or shrunk, in a block or not
    decisions: tuple = ()  # who decides each If and Loop (`analyses.decisions.Decision`)
    model_decides: bool = False  # some of that conditional execution the model decides (not the caller)
