"""ONNX Runtime profiler files: node events grouped into the runs they belong to.

`parse_profile` gives back a Profile: one Run per `model_run` window, each holding the
node events whose interval falls inside it, in time order. Two layouts are accepted:

- current (1.32): one `<node>_kernel_time` event per node execution;
- fenced (older builds): `<node>_fence_before` / `_kernel_time` / `_fence_after`, with
  `exec_plan_index` and `graph_index` in the args.

Either may be a bare JSON array or a Chrome-trace object with `traceEvents`. A control-flow
node's event (If, Loop, Scan) encloses the events of the body it ran, so each event also
gets its *self* time: its duration less that of the events directly nested in it, and
its *owners*: the control-flow events it ran inside. ONNX Runtime gives the nodes it creates
(`Gelu`, `gemm_input_reshape`) the same name in the main graph and in every body, and the
profiler's events say nothing else of where a node lies; so a name that ran under more than
one chain of owners is written with its owners (`/If_2 > Gelu`, see `qualified_name`), which
tells the nodes apart wherever events are keyed by name.
GPU kernel events (`cat == "Kernel"`, only in builds with CUDA profiling) follow, in file
order, the node event that launched them; their durations are added to that node's
`kernel_dur`, the GPU's time for it, where the node event itself times the launch.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphaudit.errors import GraphAuditError
from graphaudit.graph.build import made_frozen, paused_gc

KERNEL_SUFFIX = "_kernel_time"
FENCE_SUFFIXES = ("_fence_before", "_fence_after")
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
OWNER_SEPARATOR = " > "
# ts / dur are whole microseconds: a nested event may poke out of its parent by rounding.
_SLACK_US = 1.0

Shape = tuple[int, ...]


@dataclass(frozen=True)
class NodeEvent:
    """One execution of one node, as the profiler recorded it (times in microseconds)."""

    name: str  # the node's name in the graph ORT ran (suffix removed); qualified where nodes share it
    op_type: str | None
    provider: str | None
    ts: float
    dur: float
    tid: int
    input_types: tuple[str, ...] | None
    input_shapes: tuple[Shape, ...] | None
    output_types: tuple[str, ...] | None
    output_shapes: tuple[Shape, ...] | None
    self_dur: float | None = None  # dur less directly nested events; set when grouped
    graph_index: int | None = None  # fenced layout only
    plan_index: int | None = None  # node_index, or exec_plan_index in the fenced layout
    kernel_dur: float | None = None  # GPU kernel time it launched, when kernel events exist
    owners: tuple[str, ...] = ()  # names of the control-flow events it ran inside, outermost first; set when grouped

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def is_control_flow(self) -> bool:
        return self.op_type in CONTROL_FLOW_OPS


@dataclass(frozen=True)
class Run:
    """One `session.run` call: its window and the node events inside it."""

    index: int
    ts: float
    dur: float
    events: tuple[NodeEvent, ...]

    def busy_us(self) -> float:
        """Time covered by at least one node event (the union of their intervals)."""
        total, reach = 0.0, float("-inf")
        for ev in sorted(self.events, key=lambda e: e.ts):
            start, end = max(ev.ts, reach), ev.end
            if end > start:
                total += end - start
            reach = max(reach, end)
        return total


@dataclass(frozen=True)
class Profile:
    """A parsed profiler file."""

    layout: str  # "current" | "fenced"
    runs: tuple[Run, ...]
    outside_runs: int  # node events in no model_run window (session start, warm-up of EPs)
    kernel_events: int  # GPU kernel events, attributed to the node events before them
    source: str

    def node_time_kind(self) -> str:
        """What per-node durations measure: "kernel" (CPU), "host_launch" (GPU EP), "gpu_kernel"."""
        if self.kernel_events:
            return "gpu_kernel"  # breakdowns then use each event's kernel_dur
        providers = {ev.provider for run in self.runs for ev in run.events}
        return "host_launch" if providers - {"CPUExecutionProvider", None} else "kernel"


def parse_profile(source: str | os.PathLike | list | dict) -> Profile:
    """Return the Profile in `source`: a profiler JSON file, or its already-decoded content."""
    with paused_gc():  # tens of thousands of acyclic records: a collection would walk them all again
        return _parsed(source)


def _parsed(source: str | os.PathLike | list | dict) -> Profile:
    label = "<events>"
    if isinstance(source, (str, os.PathLike)):
        label = str(source)
        try:
            source = json.loads(Path(source).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise GraphAuditError(f"expected an ONNX Runtime profile (JSON) at {label}, found: {err}") from None
    raw = source.get("traceEvents") if isinstance(source, dict) else source
    if not isinstance(raw, list):
        raise GraphAuditError(
            f"expected a JSON array of trace events (or an object with traceEvents) in {label}, "
            f"found {type(source).__name__}"
        )
    windows: list[tuple[float, float]] = []
    nodes: list[NodeEvent] = []
    kernel_us: dict[int, float] = {}  # index in nodes -> GPU time of the kernels that followed it
    kernels = 0
    fenced = False
    for item in raw:
        if not isinstance(item, dict) or item.get("ph", "X") != "X":
            continue
        cat, name = item.get("cat"), str(item.get("name", ""))
        if cat == "Session" and name == "model_run":
            windows.append((_num(item.get("ts")), _num(item.get("dur"))))
        elif cat == "Kernel":
            kernels += 1
            if nodes:
                kernel_us[len(nodes) - 1] = kernel_us.get(len(nodes) - 1, 0.0) + _num(item.get("dur"))
        elif cat == "Node":
            if name.endswith(FENCE_SUFFIXES):
                fenced = True
            elif name.endswith(KERNEL_SUFFIX):
                nodes.append(_node_event(item, name[: -len(KERNEL_SUFFIX)]))
    if kernels:
        nodes = [_with(ev, kernel_dur=kernel_us.get(i, 0.0)) for i, ev in enumerate(nodes)]
    args_fenced = any(ev.graph_index is not None for ev in nodes)
    runs, outside = group_runs(nodes, sorted(windows))
    return Profile("fenced" if fenced or args_fenced else "current", runs, outside, kernels, label)


def qualified_name(owners: Sequence[str], name: str) -> str:
    """`name` as run inside the control-flow nodes `owners` (outermost first): "/If_2 > Gelu"."""
    return OWNER_SEPARATOR.join((*owners, name))


def group_runs(events: Sequence[NodeEvent], windows: Sequence[tuple[float, float]]) -> tuple[tuple[Run, ...], int]:
    """Assign each event to the model_run window holding it; return the runs and the leftovers.

    A name that ran under more than one chain of owners names more than one node: each of
    its events is renamed to its qualified name.
    """
    starts = [ts for ts, _ in windows]
    buckets: list[list[NodeEvent]] = [[] for _ in windows]
    outside = 0
    for ev in events:
        i = bisect.bisect_right(starts, ev.ts + _SLACK_US) - 1
        if i >= 0 and ev.ts >= windows[i][0] - _SLACK_US and ev.end <= sum(windows[i]) + _SLACK_US:
            buckets[i].append(ev)
        else:
            outside += 1
    nested = [_nested(sorted(bucket, key=lambda e: (e.ts, -e.dur))) for bucket in buckets]
    owners_of: dict[str, set[tuple[str, ...]]] = {}
    for ev in (ev for run_events in nested for ev in run_events):
        owners_of.setdefault(ev.name, set()).add(ev.owners)
    shared = {name for name, owners in owners_of.items() if len(owners) > 1}
    runs = tuple(
        Run(i, ts, dur, tuple(_with(ev, name=qualified_name(ev.owners, ev.name)) if ev.name in shared else ev
                              for ev in run_events))
        for i, ((ts, dur), run_events) in enumerate(zip(windows, nested))
    )
    return runs, outside


def _nested(events: list[NodeEvent]) -> list[NodeEvent]:
    """Each event with its owners and its self time: a parent (If/Loop body owner) less its direct children."""
    child_time = [0.0] * len(events)
    owners: list[tuple[str, ...]] = []
    stacks: dict[int, list[int]] = {}
    for i, ev in enumerate(events):
        stack = stacks.setdefault(ev.tid, [])
        while stack and not _contains(events[stack[-1]], ev):
            stack.pop()
        if stack and events[stack[-1]].is_control_flow:
            child_time[stack[-1]] += ev.dur
        owners.append(tuple(events[j].name for j in stack if events[j].is_control_flow))
        stack.append(i)
    return [_with(ev, self_dur=max(ev.dur - child_time[i], 0.0), owners=owners[i]) for i, ev in enumerate(events)]


def _contains(parent: NodeEvent, child: NodeEvent) -> bool:
    return parent.ts <= child.ts + _SLACK_US and child.end <= parent.end + _SLACK_US and child.ts < parent.end


def _node_event(item: dict, name: str) -> NodeEvent:
    args = item.get("args") or {}
    in_types, in_shapes = _shapes(args.get("input_type_shape"))
    out_types, out_shapes = _shapes(args.get("output_type_shape"))
    plan = args.get("node_index", args.get("exec_plan_index"))
    return _made({
        "name": name, "op_type": args.get("op_name"), "provider": args.get("provider"),
        "ts": _num(item.get("ts")), "dur": _num(item.get("dur")), "tid": int(_num(item.get("tid", 0))),
        "input_types": in_types, "input_shapes": in_shapes, "output_types": out_types, "output_shapes": out_shapes,
        "self_dur": None, "graph_index": _int_or_none(args.get("graph_index")), "plan_index": _int_or_none(plan),
        "kernel_dur": None, "owners": (),
    })


def _made(fields: dict) -> NodeEvent:
    """A NodeEvent of `fields` (every field, by name): a profile holds tens of thousands, each
    made and then regrouped, and a frozen dataclass's __init__ was most of the parse's time."""
    return made_frozen(NodeEvent, fields)


def _with(event: NodeEvent, **changes) -> NodeEvent:
    """`event` with `changes` (NodeEvent field names), as dataclasses.replace gives it."""
    return made_frozen(NodeEvent, {**event.__dict__, **changes})


def _shapes(entries: Any) -> tuple[tuple[str, ...] | None, tuple[Shape, ...] | None]:
    """`[{"float": [1, 4]}, ...]` → (("float", ...), ((1, 4), ...)); None when absent."""
    if not isinstance(entries, list):
        return None, None
    types, shapes = [], []
    for entry in entries:
        if isinstance(entry, dict) and len(entry) == 1:
            (dtype, dims), = entry.items()
            types.append(str(dtype))
            shapes.append(tuple(map(int, dims)) if isinstance(dims, list) else ())
        else:
            types.append("?")
            shapes.append(())
    return tuple(types), tuple(shapes)


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
