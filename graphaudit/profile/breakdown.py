"""Where the time goes: per node, per block and per operator type, from profiled runs.

A node's time in a run is the sum of the self times of its events there (a Loop body node
runs many times; an If's own time excludes its branch). Per node and per block: median
and mean over runs of that time, and its share of all run time (sum over runs of its time
over the sum of the runs' durations). Coverage is the time covered by node events over
run time: what the profile accounts for; the rest is the session's own overhead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from graphaudit.profile.events import Run
from graphaudit.profile.mapping import UNMAPPED, BlockAssignment, NodeMap


@dataclass(frozen=True)
class NodeTime:
    """One node as ORT ran it: its event name, the graph node it maps to, its block."""

    name: str
    node: str | None
    op_type: str
    block: str
    calls: float  # events per run, mean
    median_ms: float
    mean_ms: float
    share: float

    def to_json(self) -> dict:
        return {"name": self.name, "node": self.node, "op_type": self.op_type, "block": self.block,
                "calls": self.calls, "median_ms": self.median_ms, "mean_ms": self.mean_ms, "share": self.share}


@dataclass(frozen=True)
class GroupTime:
    """A block's or an operator type's time."""

    name: str
    median_ms: float
    mean_ms: float
    share: float


@dataclass(frozen=True)
class Breakdown:
    nodes: tuple[NodeTime, ...]  # by total time, largest first
    blocks: tuple[GroupTime, ...]  # in block order
    ops: tuple[GroupTime, ...]  # by total time, largest first
    coverage: float
    unmapped_share: float
    runs: int
    run_ms: float  # median profiled run duration


def breakdown(runs: Sequence[Run], node_map: NodeMap, blocks: BlockAssignment) -> Breakdown:
    """The Breakdown of `runs` (warm-up runs already left out)."""
    n = len(runs)
    per_node: dict[str, np.ndarray] = {}
    calls: dict[str, int] = {}
    ops: dict[str, str] = {}
    for r, run in enumerate(runs):
        for ev in run.events:
            per_node.setdefault(ev.name, np.zeros(n))[r] += ev.self_dur if ev.self_dur is not None else ev.dur
            calls[ev.name] = calls.get(ev.name, 0) + 1
            ops.setdefault(ev.name, ev.op_type or "?")
    total_us = float(sum(run.dur for run in runs)) or float("nan")
    nodes = []
    for name, times in per_node.items():
        node = node_map.node_of(name)
        nodes.append(NodeTime(name, node, ops[name], blocks.block_of(node), calls[name] / n,
                              float(np.median(times)) / 1e3, float(times.mean()) / 1e3, float(times.sum()) / total_us))
    nodes.sort(key=lambda t: -t.share)
    block_names = list(blocks.names) + ([UNMAPPED] if any(t.block == UNMAPPED for t in nodes) else [])
    by_block = _group(per_node, {t.name: t.block for t in nodes}, block_names, n, total_us)
    by_op = sorted(_group(per_node, ops, sorted(set(ops.values())), n, total_us), key=lambda g: -g.share)
    busy = sum(run.busy_us() for run in runs)
    unmapped = sum(t.share for t in nodes if t.block == UNMAPPED)
    return Breakdown(tuple(nodes), tuple(g for g in by_block if g.share > 0 or g.name in blocks.names),
                     tuple(by_op), busy / total_us, unmapped, n,
                     float(np.median([run.dur for run in runs])) / 1e3 if runs else float("nan"))


def _group(per_node, key_of, names, n, total_us) -> list[GroupTime]:
    sums = {name: np.zeros(n) for name in names}
    for node, times in per_node.items():
        sums[key_of[node]] += times
    return [GroupTime(name, float(np.median(t)) / 1e3, float(t.mean()) / 1e3, float(t.sum()) / total_us)
            for name, t in sums.items()]
