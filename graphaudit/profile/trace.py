"""A Chrome-trace file (opens in Perfetto and chrome://tracing) with block annotations.

Three tracks: `runs` (one span per run, with the input and round it served), `blocks`
(one span per stretch of consecutive node events of the same block) and `nodes` (ORT's
node events, each with the graph node and block it maps to in `args`). Times are the
profiler's, in microseconds from the start of profiling.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from graphaudit.files.write import replace_file
from graphaudit.profile.events import Run
from graphaudit.profile.mapping import BlockAssignment, NodeMap

_PID = 1
_RUNS, _BLOCKS, _NODES = 1, 2, 3


def trace_events(runs: Sequence[Run], inputs_per_round: int, node_map: NodeMap,
                 blocks: BlockAssignment, title: str) -> list[dict]:
    """The trace events for `runs` (run i served input i % inputs_per_round)."""
    events: list[dict] = [
        {"ph": "M", "pid": _PID, "name": "process_name", "args": {"name": title}},
        *({"ph": "M", "pid": _PID, "tid": tid, "name": "thread_name", "args": {"name": name}}
          for tid, name in ((_RUNS, "runs"), (_BLOCKS, "blocks"), (_NODES, "nodes"))),
    ]
    for k, run in enumerate(runs):
        events.append(_span(_RUNS, f"input {k % inputs_per_round}", run.ts, run.dur, "run",
                            {"input": k % inputs_per_round, "round": k // inputs_per_round}))
        for name, start, end in block_segments(run, node_map, blocks):
            events.append(_span(_BLOCKS, name, start, end - start, "block", {"block": name}))
        for ev in run.events:
            node = node_map.node_of(ev.name)
            events.append(_span(_NODES, ev.name, ev.ts, ev.dur, "node", {
                "op_type": ev.op_type, "node": node, "block": blocks.block_of(node),
                "self_us": ev.self_dur, "input_shapes": ev.input_shapes, "output_shapes": ev.output_shapes,
            }))
    return events


def block_segments(run: Run, node_map: NodeMap, blocks: BlockAssignment) -> list[tuple[str, float, float]]:
    """(block, start, end) for each stretch of consecutive leaf events of one block."""
    segments: list[list] = []
    for ev in sorted((e for e in run.events if not e.is_control_flow), key=lambda e: e.ts):
        block = blocks.block_of(node_map.node_of(ev.name))
        if segments and segments[-1][0] == block:
            segments[-1][2] = max(segments[-1][2], ev.end)
        else:
            start = max(ev.ts, segments[-1][2]) if segments else ev.ts
            segments.append([block, start, max(ev.end, start)])
    return [tuple(s) for s in segments]


def write_trace(path: str | os.PathLike, events: list[dict], metadata: dict) -> Path:
    """Write the trace to `path` and return it."""
    path = Path(path)
    text = json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": metadata})
    replace_file(path, lambda fresh: fresh.write_text(text, encoding="utf-8"), "the trace")  # never through a link
    return path


def _span(tid: int, name: str, ts: float, dur: float, cat: str, args: dict) -> dict:
    return {"ph": "X", "pid": _PID, "tid": tid, "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args}
