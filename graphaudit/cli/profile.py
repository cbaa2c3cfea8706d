"""`graphaudit profile`: latency, per-block time, what ran per input, ratio to a baseline."""

from __future__ import annotations

import click
from tabulate import tabulate

from graphaudit.analyses.static import audit_static
from graphaudit.cli import check_output, feeding_of, feeding_options
from graphaudit.load.model import load_for_runtime
from graphaudit.profile import ProfileReport, profile_model
from graphaudit.profile.report import NODE_TIME_KINDS
from graphaudit.profile.rounds import DEFAULT_BUDGET_S, ROUNDS_DEFAULT
from graphaudit.profile.session import OPT_LEVELS
from graphaudit.runtime.sessions import MAX_THREADS
from graphaudit.report.jsondoc import command_json

_TOP_NODES = 10
_COMPUTE_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "Conv", "Einsum", "MatMulNBits", "Attention"})


@click.command("profile")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--data", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="Inputs (.npz keyed by graph-input name); each batch is one profiled input.")
@feeding_options
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=str),
              help="A dense model taking the same inputs, timed in alternation with MODEL.")
@click.option("--runs", type=int, help="Timed rounds, each running every batch once (default: " + ROUNDS_DEFAULT + ").")
@click.option("--warmup", type=int, help="Rounds run first and discarded (default: 3, or 2 when fewer rounds fit).")
@click.option("--profile-runs", type=int, help="Rounds run with the profiler on (default: 3, or one per 5 timed rounds).")
@click.option("--budget", type=float, default=DEFAULT_BUDGET_S, show_default=True,
              help="Seconds the profile's rounds may take, at the first round's time, where --runs, --warmup or "
                   "--profile-runs are not given.")
@click.option("--batch-size", type=int,
              help="Examples per run; default 1, which shows per-input decisions (an If decides per batch), "
                   "or the model's own batch when its inputs fix their first dimension.")
@click.option("--limit", type=int, help="Use only the first N examples of the data.")
@click.option("--provider", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True,
              help="Execution provider; cuda fails when ONNX Runtime has no CUDA.")
@click.option("--opt-level", type=click.Choice(list(OPT_LEVELS)), default="all", show_default=True,
              help="ORT graph optimisation level; 'disable' maps events one-to-one to nodes.")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), help="ORT intra-op threads (default: ORT's choice).")
@click.option("--block-pattern", help="Regex naming blocks (see graphaudit static); default: found from names.")
@click.option("--trace", type=click.Path(dir_okay=False, path_type=str),
              help="Write a Chrome-trace / Perfetto file with block annotations here.")
@click.option("--keep-profiles", type=click.Path(file_okay=False, path_type=str),
              help="Keep ORT's profiler files in this folder (default: a temporary one, removed).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Output format.")
def profile_cmd(model, data, set_values, input_axes, baseline, runs, warmup, profile_runs, budget, batch_size, limit,
                provider, opt_level, threads, block_pattern, trace, keep_profiles, fmt) -> None:
    """Run MODEL on the inputs in --data: latency, per-block time and which blocks really ran.

    Each block's static verdict (graphaudit static) is checked against what ran.
    """
    feeding = feeding_of(set_values, input_axes)  # bad usage before the model is read
    if trace is not None:
        check_output(trace, "--trace", (model, data, baseline))
    loaded = load_for_runtime(model)
    static = audit_static(loaded, block_pattern=block_pattern)
    report = profile_model(loaded, data, baseline=baseline, runs=runs, warmup=warmup, profile_runs=profile_runs,
                           budget=budget, batch_size=batch_size, provider=provider, opt_level=opt_level, threads=threads,
                           limit=limit, trace=trace, keep_profiles=keep_profiles, block_pattern=block_pattern,
                           static=static, feeding=feeding)
    click.echo(command_json(report.to_json()) if fmt == "json" else render_text(report))


def render_text(r: ProfileReport) -> str:
    """The report as terminal text."""
    lat, prof = r.latency_ms, r.profiled_latency_ms
    unit, units = ("input", "inputs") if r.batch_size == 1 else ("batch", "batches")  # what one run profiles
    per = "input" if r.batch_size == 1 else f"batch of {r.batch_size}"
    lines = [
        f"model: {r.model}  on {r.provider}, {r.opt_level}" + (f", {r.threads} intra-op thread{'s' if r.threads > 1 else ''}" if r.threads else ""),
        f"inputs: {len(r.execution.inputs)} batches of {r.batch_size} from {r.data}; "
        f"{r.runs} timed rounds after {r.warmup} warm-up, {r.profile_runs} profiled",
        *([f"rounds: {r.rounds.reason}"] if r.rounds is not None and r.rounds.chosen else []),
        f"latency per {per}: median {lat.median:.3f} ms (p10 {lat.p10:.3f}, p90 {lat.p90:.3f}, mean {lat.mean:.3f}); "
        f"profiled mean {prof.mean:.3f} ms (overhead x{r.overhead:.2f}); coverage {r.coverage:.1%}",
    ]
    if r.baseline is not None:
        b = r.baseline
        lines.append(f"baseline {b.model}: median {b.latency_ms.median:.3f} ms, mean {b.latency_ms.mean:.3f}; "
                     f"ratio {b.ratio:.3f} (p10 {b.ratio_spread.p10:.3f}, p90 {b.ratio_spread.p90:.3f}"
                     + (f"; {b.ratio_interval.level:.0%} interval over rounds {b.ratio_interval.low:.3f}–"
                        f"{b.ratio_interval.high:.3f}" if b.ratio_interval is not None and b.ratio_interval.rounds > 1
                        else "") + f"): {b.describe()}")
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
            entry["name"], _ms(entry["median_ms"]), _pct(entry["share"]), _pct(entry["executed_fraction"]),
            "" if not nodes else _pct(nodes["min"]) if nodes["min"] == nodes["max"] else
            f"{_pct(nodes['min'])}..{_pct(nodes['max'])}",
            "" if not flops else _si(flops["min"]) if flops["min"] == flops["max"] else
            f"{_si(flops['min'])}..{_si(flops['max'])}",
            " ".join(_pct(k["min"]) if k["min"] == k["max"] else f"{_pct(k['min'])}..{_pct(k['max'])}"
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
    lines += ["", tabulate([(n.name, n.op_type, n.block, _ms(n.median_ms), _pct(n.share))
                            for n in r.breakdown.nodes[:_TOP_NODES]],
                           headers=["node (as run)", "op", "block", "median ms", "share"])]
    if r.trace:
        lines.append(f"\ntrace: {r.trace}")
    lines += [f"note: {note}" for note in r.notes]
    return "\n".join(lines)


def _ms(value) -> str:
    return "" if value is None else f"{value:.3f}"


def _pct(value) -> str:
    return "" if value is None else f"{value:.0%}" if value in (0, 1) else f"{value:.1%}"


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"
