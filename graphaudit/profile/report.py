"""The runtime profile of one model: a frozen dataclass and its JSON form."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphaudit.profile.agreement import Agreement
from graphaudit.profile.baseline import BaselineComparison
from graphaudit.profile.breakdown import Breakdown
from graphaudit.profile.execution import Execution
from graphaudit.profile.latency import Spread
from graphaudit.profile.rounds import Rounds

NODE_TIME_KINDS = {
    "kernel": "kernel times measured on the CPU",
    "host_launch": "host-side launch times of GPU kernels (not GPU time, except where an op synchronises)",
    "gpu_kernel": "GPU kernel times from CUDA profiling events",
}


@dataclass(frozen=True)
class ProfileReport:
    """What ran, at what size, how long it took, and the ratio to a baseline."""

    model: str
    data: str
    provider: str  # the execution provider the model ran on
    opt_level: str  # ORT graph optimisation level of the timed and profiled runs
    mapping_method: str  # "one-to-one" | "optimised-model"
    mapping: str  # the mapping in words
    mapping_counts: dict
    fused_nodes: int
    node_time_kind: str  # key of NODE_TIME_KINDS
    profile_layout: str  # "current" | "fenced"
    block_method: str
    batch_size: int
    examples: int
    runs: int
    warmup: int
    profile_runs: int
    latency_ms: Spread  # un-profiled, across inputs (batches) of their median over rounds
    profiled_latency_ms: Spread  # the same with the profiler on
    overhead: float  # profiled over un-profiled workload time, from rounds interleaved with each other
    input_latency_ms: tuple[float, ...]  # per input (batch), median over rounds
    breakdown: Breakdown
    execution: Execution
    baseline: BaselineComparison | None
    trace: str | None
    renamed_nodes: int
    notes: tuple[str, ...]
    agreements: tuple[Agreement, ...] = ()  # static verdicts against the run, when given
    threads: int | None = None  # ONNX Runtime's intra-op threads as given; None: its own choice
    rounds: Rounds | None = None  # how runs, warmup and profile_runs were come by

    @property
    def coverage(self) -> float:
        return self.breakdown.coverage

    def by_blocks_ran(self) -> list[dict]:
        """Inputs grouped by the set of blocks that ran for them, with their median latency."""
        groups: dict[tuple[str, ...], list[float]] = {}
        for inp, ms in zip(self.execution.inputs, self.input_latency_ms):
            groups.setdefault(inp.blocks_ran, []).append(ms)
        return [{"blocks_ran": list(key), "inputs": len(values), "latency_ms": float(np.median(values))}
                for key, values in sorted(groups.items(), key=lambda kv: -len(kv[1]))]

    def block(self, name: str) -> dict:
        """The JSON entry of block `name`."""
        for entry in self._blocks():
            if entry["name"] == name:
                return entry
        raise KeyError(name)

    def _blocks(self) -> list[dict]:
        executed = {b.name: b for b in self.execution.blocks}
        agreed = {a.block: a for a in self.agreements}
        entries = []
        for t in self.breakdown.blocks:
            ex = executed.get(t.name)
            entry = {**t.to_json(), "executed_fraction": ex.executed_fraction if ex else None}
            if ex is not None:
                entry.update({k: v for k, v in ex.to_json().items() if k not in entry})
            if t.name in agreed:
                entry.update({"static_verdict": agreed[t.name].verdict, "runtime_outcome": agreed[t.name].outcome})
            entries.append(entry)
        return entries

    def to_json(self) -> dict:
        """The report as JSON-ready data (NaN becomes None)."""
        inputs = []
        for inp, ms in zip(self.execution.inputs, self.input_latency_ms):
            inputs.append({**inp.to_json(), "latency_ms": ms})
        data = {
            "model": self.model,
            "data": self.data,
            "provider": self.provider,
            "opt_level": self.opt_level,
            "threads": self.threads,
            "mapping": {"method": self.mapping_method, "description": self.mapping,
                        "matched_by": self.mapping_counts, "fused_nodes": self.fused_nodes},
            "node_time_kind": self.node_time_kind,
            "node_time_description": NODE_TIME_KINDS[self.node_time_kind],
            "profile_layout": self.profile_layout,
            "block_method": self.block_method,
            "flop_counter": self.execution.flop_counter,
            "batch_size": self.batch_size,
            "examples": self.examples,
            "inputs": len(self.execution.inputs),
            "runs": self.runs,
            "warmup": self.warmup,
            "profile_runs": self.profile_runs,
            "rounds": self.rounds.to_json() if self.rounds else None,
            "latency_ms": self.latency_ms.to_json(),
            "profiled_latency_ms": self.profiled_latency_ms.to_json(),
            "profiling_overhead": self.overhead,
            "coverage": self.coverage,
            "unmapped_share": self.breakdown.unmapped_share,
            "blocks": self._blocks(),
            "ops": [{"op_type": g.name, "median_ms": g.median_ms, "share": g.share} for g in self.breakdown.ops],
            "nodes": [n.to_json() for n in self.breakdown.nodes],
            "flops_executed": self.execution.mean_flops(),
            "per_input": inputs,
            "by_blocks_ran": self.by_blocks_ran(),
            "baseline": self.baseline.to_json() if self.baseline else None,
            "trace": self.trace,
            "renamed_nodes": self.renamed_nodes,
            "static_agreement": [a.to_json() for a in self.agreements],
            "notes": list(self.notes),
        }
        return _clean(data)


def _clean(value):
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value
