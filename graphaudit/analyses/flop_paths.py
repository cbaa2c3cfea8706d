"""FLOPs along the paths control flow can take: the most and the least one run executes.

Per-node FLOPs (`flops.count_flops`) count one execution of each node. A run of the graph
executes one branch of each If and each Loop body once per iteration, so `span` adds them
up along the scopes:

- an If takes its larger branch on the most expensive path and, where its condition depends
  on input values, its smaller one on the cheapest; a condition that values do not decide
  takes the same branch on every input: the one a constant condition names, else the larger
  one, on both paths;
- a Loop or Scan multiplies its body by its trip count (`trips`): the largest on the most
  expensive path, the fewest on the cheapest. A loop with no bound counts one iteration of
  its body, and says so (`open_loops`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from graphaudit.analyses.loop_trips import Trips
from graphaudit.graph.model import ModelGraph, Scope


@dataclass(frozen=True)
class Span:
    """The FLOPs of a part of the graph in one run: along its most and its least expensive path."""

    most: int
    least: int
    open_loops: frozenset[str] = frozenset()  # loops with no bound: `most` counts one iteration of each
    per_iteration: Mapping[str, int] = field(default_factory=dict, repr=False)  # loop id -> its body's most

    @property
    def varies(self) -> int:
        """What the cheapest path saves against the most expensive one."""
        return self.most - self.least


def span(mg: ModelGraph, ids: Iterable[str], most: Mapping[str, int], least: Mapping[str, int],
         trips: Mapping[str, Trips], dynamic: frozenset[str] | set[str], taken: Mapping[str, str] | None = None
         ) -> Span:
    """Return the Span of the nodes `ids` of `mg`, with each node's FLOPs on the most and the
    least expensive path (`most`, `least`; a node in neither counts 0), the loops' `trips`,
    the control-flow nodes whose decision depends on input values (`dynamic`) and the branch
    each If of a constant condition takes (`taken`: If id -> "then_branch" | "else_branch")."""
    sums: dict[tuple[Scope, ...], list] = {(): [0, 0, frozenset()]}
    for nid in ids:
        node = mg.nodes[nid]
        entry = sums.get(node.scopes)
        if entry is None:
            entry = sums[node.scopes] = [0, 0, frozenset()]
        entry[0] += most.get(nid, 0)
        entry[1] += least.get(nid, 0)
    for path in list(sums):  # every enclosing scope holds its nested ones, even with no node of its own
        for depth in range(1, len(path)):
            sums.setdefault(path[:depth], [0, 0, frozenset()])
    per_iteration: dict[str, int] = {}
    for depth in range(max(map(len, sums)), 0, -1):
        owners: dict[tuple, dict[str, Span]] = {}
        for path in [p for p in sums if len(p) == depth]:
            scope = path[-1]
            owners.setdefault((path[:-1], scope.owner, scope.owner_op), {})[scope.kind] = Span(*sums.pop(path))
        for (parent, owner, op), bodies in owners.items():
            if taken and owner in taken:
                combined = bodies.get(taken[owner], Span(0, 0))
            else:
                combined = _combine(owner, op, bodies, trips.get(owner), owner in dynamic, per_iteration)
            entry = sums[parent]
            entry[0] += combined.most
            entry[1] += combined.least
            entry[2] = entry[2] | combined.open_loops
    most_flops, least_flops, open_loops = sums[()]
    return Span(most_flops, least_flops, open_loops, per_iteration)


def _combine(owner: str, op: str, bodies: Mapping[str, Span], trips: Trips | None, dynamic: bool,
             per_iteration: dict[str, int]) -> Span:
    opened = frozenset().union(*(b.open_loops for b in bodies.values()))
    if op == "If":
        branches = [bodies.get("then_branch", Span(0, 0)), bodies.get("else_branch", Span(0, 0))]
        larger = max(branches, key=lambda b: b.most)
        least = min(b.least for b in branches) if dynamic else larger.least
        return Span(larger.most, least, opened)
    if op in ("Loop", "Scan") and "body" in bodies:
        body = bodies["body"]
        per_iteration[owner] = per_iteration.get(owner, 0) + body.most
        if trips is None or trips.most is None:  # no bound: one iteration, said so
            fewest = trips.least if trips is not None else 1
            return Span(body.most, min(fewest, 1) * body.least, opened | {owner})
        return Span(trips.most * body.most, trips.least * body.least, opened)
    most = sum(b.most for b in bodies.values())  # a function call, or another operator's bodies
    return Span(most, 0 if dynamic else sum(b.least for b in bodies.values()), opened)
