"""Where the time goes: per node, per block and per operator type, from profiled runs.

A node's time in a run is the sum of the self times of its events there (a Loop body node
runs many times; an If's own time excludes its branch), or of the GPU kernel times they
launched when the profile has kernel events. Runs come in rounds over the same
inputs; each figure is first reduced to its median over rounds for each input, so that one
preempted kernel does not skew it, and then:

- `median_ms` / `mean_ms`: median / mean over inputs, and for blocks and operator types
  `p10_ms` / `p90_ms`, the 10th and 90th percentiles over inputs: the spread between inputs;
- `share`: the sum over inputs over the same sum of run durations.

Coverage is, in the same way, the time covered by node events over run time: what the
profile accounts for; the rest is the session's own overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    p10_ms: float = float("nan")  # over inputs
    p90_ms: float = float("nan")

    def to_json(self) -> dict:
        return {"name": self.name, "median_ms": self.median_ms, "p10_ms": self.p10_ms, "p90_ms": self.p90_ms,
                "mean_ms": self.mean_ms, "share": self.share}


@dataclass(frozen=True)
class Breakdown:
    nodes: tuple[NodeTime, ...]  # by total time, largest first
    blocks: tuple[GroupTime, ...]  # in block order
    ops: tuple[GroupTime, ...]  # by total time, largest first
    coverage: float
    unmapped_share: float
    runs: int
    run_ms: float  # median profiled run duration


def breakdown(runs: Sequence[Run], node_map: NodeMap, blocks: BlockAssignment, inputs: int | None = None) -> Breakdown:
    """The Breakdown of `runs` (warm-up left out); run k served input k % `inputs`."""
    inputs = inputs or len(runs)
    rounds = len(runs) // inputs
    per_node: dict[str, np.ndarray] = {}
    calls: dict[str, int] = {}
    ops: dict[str, str] = {}
    for k, run in enumerate(runs[: rounds * inputs]):
        for ev in run.events:
            times = per_node.setdefault(ev.name, np.zeros((rounds, inputs)))
            times[k // inputs, k % inputs] += _time(ev)
            calls[ev.name] = calls.get(ev.name, 0) + 1
            ops.setdefault(ev.name, ev.op_type or "?")
    used = runs[: rounds * inputs]
    durations = _per_input(np.array([run.dur for run in used], dtype=float).reshape(rounds, inputs))
    total_us = float(durations.sum()) or float("nan")
    nodes = []
    for name, times in per_node.items():
        node = node_map.node_of(name)
        t = _per_input(times)
        nodes.append(NodeTime(name, node, ops[name], blocks.block_of(node), calls[name] / len(used),
                              float(np.median(t)) / 1e3, float(t.mean()) / 1e3, float(t.sum()) / total_us))
    nodes.sort(key=lambda t: -t.share)
    block_names = list(blocks.names) + ([UNMAPPED] if any(t.block == UNMAPPED for t in nodes) else [])
    by_block = _group(per_node, {t.name: t.block for t in nodes}, block_names, total_us)
    by_op = sorted(_group(per_node, ops, sorted(set(ops.values())), total_us), key=lambda g: -g.share)
    busy = _per_input(np.array([run.busy_us() for run in used], dtype=float).reshape(rounds, inputs))
    unmapped = sum(t.share for t in nodes if t.block == UNMAPPED)
    return Breakdown(tuple(nodes), tuple(g for g in by_block if g.share > 0 or g.name in blocks.names),
                     tuple(by_op), float(busy.sum()) / total_us, unmapped, len(used),
                     float(np.median(durations)) / 1e3)


def _time(ev) -> float:
    """GPU kernel time where the profile has it, else the event's own (self) time."""
    if ev.kernel_dur is not None:
        return ev.kernel_dur
    return ev.self_dur if ev.self_dur is not None else ev.dur


def _per_input(times: np.ndarray) -> np.ndarray:
    """(round, input) → input: the median over rounds."""
    return np.median(times, axis=0)


def _group(per_node, key_of, names, total_us) -> list[GroupTime]:
    sums: dict[str, np.ndarray] = {}
    for node, times in per_node.items():
        key = key_of[node]
        sums[key] = sums[key] + times if key in sums else times.copy()
    groups = []
    for name in names:
        t = _per_input(sums[name]) if name in sums else np.zeros(1)
        p10, p90 = np.percentile(t, [10, 90]) / 1e3
        groups.append(GroupTime(name, float(np.median(t)) / 1e3, float(t.mean()) / 1e3, float(t.sum()) / total_us,
                                float(p10), float(p90)))
    return groups
