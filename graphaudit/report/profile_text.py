"""`graphaudit profile`'s report as terminal text: latency, per-block time, what ran per input."""

from __future__ import annotations

from tabulate import tabulate

from graphaudit.profile.report import NODE_TIME_KINDS, ProfileReport
from graphaudit.wording import drawn, fmt, pct, si

_TOP_NODES = 10
_COMPUTE_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "Conv", "Einsum", "MatMulNBits", "Attention"})


def _inputs(r: ProfileReport) -> str:
    ran = len(r.execution.inputs)
    total = r.rounds.inputs if r.rounds is not None and r.rounds.inputs else ran
    return f"{ran} batches" if ran == total else f"{ran} of {total} batches ({drawn(ran)})"


def render_text(r: ProfileReport) -> str:
    """Return the profile report as terminal text."""
    lat, prof = r.latency_ms, r.profiled_latency_ms
    unit, units = ("input", "inputs") if r.batch_size == 1 else ("batch", "batches")  # what one run profiles
    per = "input" if r.batch_size == 1 else f"batch of {r.batch_size}"
    lines = [
        f"model: {r.model}  on {r.provider}, {r.opt_level}" + (f", {r.threads} intra-op thread{'s' if r.threads > 1 else ''}" if r.threads else ""),
        f"inputs: {_inputs(r)} of {r.batch_size} from {r.data}; "
        f"{r.runs} timed rounds after {r.warmup} warm-up, {r.profile_runs} profiled",
        *([f"rounds: {r.rounds.reason}"] if r.rounds is not None and r.rounds.chosen else []),
        f"latency per {per}: median {lat.median:.3f} ms (p10 {lat.p10:.3f}, p90 {lat.p90:.3f}, mean {lat.mean:.3f}); "
        f"profiled mean {prof.mean:.3f} ms (overhead x{r.overhead:.2f}); coverage {pct(r.coverage, small=False)}",
    ]
    if r.baseline is not None:
        b = r.baseline
        lines.append(f"baseline {b.model}: median {b.latency_ms.median:.3f} ms, mean {b.latency_ms.mean:.3f}; "
                     f"ratio {b.ratio:.3f} (p10 {b.ratio_spread.p10:.3f}, p90 {b.ratio_spread.p90:.3f}"
                     + (f"; {pct(b.ratio_interval.level, 0, small=False)} interval over rounds"
                        f"{' and the inputs left out' if b.ratio_interval.sampling else ''} {b.ratio_interval.low:.3f}–"
                        f"{b.ratio_interval.high:.3f}" if b.ratio_interval is not None and b.ratio_interval.rounds > 1
                        else "") + f"): {b.describe()}")
        if b.flops_executed is not None:
            lines.append(f"baseline FLOPs per {per}: {_count(b.flops_executed)}"
                         + (f" ({b.flops_source})" if b.flops_source else ""))
    lines += [
        f"node times: {NODE_TIME_KINDS[r.node_time_kind]}",
        f"mapping: {r.mapping}" + (f" ({r.fused_nodes} fused or replaced nodes)" if r.fused_nodes else ""),
        f"blocks: {r.block_method}",
        "",
    ]
    rows = []
    for entry in r.to_json()["blocks"]:
        flops = entry.get("executed_flops")
        varying = entry.get("value_dependent_shapes") or []
        nodes = entry.get("node_fraction")
        kept, loops = entry.get("rows_kept"), entry.get("iterations")
        rows.append((
            entry["name"], _ms(entry["median_ms"]), _share(entry["share"]), _share(entry["executed_fraction"]),
            "" if not nodes else _share(nodes["min"]) if nodes["min"] == nodes["max"] else
            f"{_share(nodes['min'])}..{_share(nodes['max'])}",
            "" if not flops else _count(flops["min"]) if flops["min"] == flops["max"] else
            f"{_count(flops['min'])}..{_count(flops['max'])}",
            " ".join(_share(k["min"]) if k["min"] == k["max"] else f"{_share(k['min'])}..{_share(k['max'])}"
                     for k in kept or ()),
            "" if not loops else f"{loops['min']:.0f}" if loops["min"] == loops["max"] else
            f"{loops['min']:.0f}..{loops['max']:.0f}",
            f"{len(varying)} nodes" if varying else "",
            " ".join(x for x in (entry.get("static_verdict"), entry.get("runtime_outcome")) if x),
        ))
    lines.append(tabulate(rows, headers=["block", "median ms", "share", f"{units} ran", "nodes ran",
                                         f"FLOPs/{unit}", "rows kept", "loop iterations", "value-dependent shapes",
                                         "static verdict: run"]))
    groups = r.by_blocks_ran()
    if len(groups) > 1:
        every = set.intersection(*(set(g["blocks_ran"]) for g in groups))
        lines += ["", f"{units} by the blocks that ran for them:"]
        for g in groups:
            extra = [b for b in g["blocks_ran"] if b not in every]
            ran = ", ".join(extra) if extra else "only the blocks common to all"
            lines.append(f"  {g['inputs']} {units} ran {ran}: "
                         f"median {g['latency_ms']:.3f} ms")
    varying = [(b.name, v) for b in r.execution.blocks for v in b.value_dependent]
    varying.sort(key=lambda bv: bv[1].op_type not in _COMPUTE_OPS)  # the compute that shrank first
    if varying:
        lines += ["", "shapes that changed between inputs of the same shape:"]
        for block, v in varying[:_TOP_NODES]:
            shown = f"{v.shapes[0]}  ..  {v.shapes[-1]}" if len(v.shapes) > 1 else v.shapes[0]
            lines.append(f"  {block}  {v.node} ({v.op_type}, {v.distinct} shapes): {shown}")
        if len(varying) > _TOP_NODES:
            lines.append(f"  ... and {len(varying) - _TOP_NODES} more (see --format json)")
    lines += ["", tabulate([(n.name, n.op_type, n.block, _ms(n.median_ms), _share(n.share))
                            for n in r.breakdown.nodes[:_TOP_NODES]],
                           headers=["node (as run)", "op", "block", "median ms", "share"])]
    if r.trace:
        lines.append(f"\ntrace: {r.trace}")
    lines += [f"note: {note}" for note in r.notes]
    return "\n".join(lines)


def _ms(value) -> str:
    """Milliseconds with three decimals, or nothing where none were measured."""
    return fmt(value, 3, missing="")


def _share(value) -> str:
    """A share of time, of inputs or of nodes: "0%" and "100%" whole, else one decimal."""
    return pct(value, missing="", small=False, whole=True)


def _count(value: float) -> str:
    """A count of FLOPs in a table cell, "1.25G"."""
    return si(value, units="GMk", sep="")
