"""The audit as one self-contained HTML page: the verdict, then figures, then the tables.

Figures are inline SVG (graphaudit.report.svg): coefficient means per layer and token,
variance shares, ΔNLL per condition with intervals, per-block latency against the
baseline, and blocks executed per input. The page loads nothing: no script, no font, no
stylesheet from elsewhere. A figure whose data the audit did not measure is replaced by a
sentence saying so.
"""

from __future__ import annotations

import re
from html import escape

from graphaudit.profile.what_ran import per_input, profiled_blocks
from graphaudit.replay.conditions import CORRECT
from graphaudit.report import svg
from graphaudit.report.tables import (
    Cut,
    Table,
    claim_lines,
    confidence,
    detail_tables,
    evidence_lines,
    header_lines,
    interval,
    median,
    num,
    summary_phrase,
    verdict_table,
)
from graphaudit.wording import pct

ROUTED_LAYERS_SHOWN = 4  # a router's layers drawn per position (the JSON holds every layer)

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:980px;color:#1d2430;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
.sub{color:#5b6573;margin-top:0} table{border-collapse:collapse;margin:.6em 0}
td,th{border:1px solid #d6dbe1;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f5f8} .answer{font-weight:bold;white-space:nowrap}
.yes{color:#1f6f3a} .no{color:#a33a2c} .not-measured{color:#6b7280;font-style:italic}
figure{margin:1em 0} figcaption{color:#5b6573;font-size:.92em} .missing{color:#6b7280;font-style:italic}
.claim{padding:.4em .8em;border-left:4px solid #a33a2c;background:#fbf1ef}
.claim.ok{border-color:#1f6f3a;background:#eff8f1} .note{color:#5b6573}
svg.chart{max-width:100%;height:auto} .scroll{overflow-x:auto;max-width:100%}
td{overflow-wrap:anywhere} code{font-size:.92em;background:#f3f5f8;padding:0 .2em}
"""


def _text(value) -> str:
    """`value` as HTML text: escaped, its `code spans` as <code>, no backtick left over."""
    html = re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(str(value)))
    return html.replace("`", "'")


def render_html(doc: dict) -> str:
    """Return the audit document as a complete, self-contained HTML page."""
    head = header_lines(doc)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>graphaudit: {escape(str(doc.get('model', '?')))}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>graphaudit: {escape(str(doc.get('model', '?')))}</h1>",
        f'<p class="sub">{_text(head[1])} · {_text(summary_phrase(doc))}</p>',
        _verdict(doc),
        _figures(doc),
    ]
    for table in detail_tables(doc):
        parts.append(_table(table))
    parts.append(f'<p class="note">graphaudit {escape(str(doc.get("graphaudit_version", "")))}, '
                 f'report schema {escape(str(doc.get("version", "")))}</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _verdict(doc: dict) -> str:
    table = verdict_table(doc)
    rows = "".join(
        f'<tr><th>{escape(label)}</th><td class="answer {answer.replace(" ", "-")}">{escape(answer)}</td>'
        f"<td>{_text(statement)}</td></tr>" for label, answer, statement in table.rows)
    out = [f'<h2>Verdict</h2><table class="verdict"><tbody>{rows}</tbody></table>']
    for claim, line in zip(doc.get("claims") or [], claim_lines(doc)):
        out.append(f'<p class="claim{" ok" if claim.get("supported") else ""}">{_text(line)}</p>')
    evidence = evidence_lines(doc)
    if evidence:
        out.append("<h2>Evidence</h2>")
        for label, items in evidence:
            out.append(f"<h3>{escape(label)}</h3><ul>" + "".join(f"<li>{_text(i)}</li>" for i in items) + "</ul>")
    for note in doc.get("notes") or []:
        out.append(f'<p class="note">Note: {_text(note)}</p>')
    return "\n".join(out)


def _figures(doc: dict) -> str:
    figures = [
        ("coefficient-means", "Coefficient means per layer and token; for a router, how often each expert is chosen",
         coefficient_means_figure(doc)),
        ("variance-shares", "Variance shares", variance_figure(doc)),
        ("delta-nll", f"ΔNLL per replay condition, with {confidence(doc)} intervals", delta_nll_figure(doc)),
        ("latency", "Latency per block, against the baseline", latency_figure(doc)),
        ("executed", "Blocks executed per input", executed_figure(doc)),
    ]
    out = ["<h2>Figures</h2>"]
    for ident, caption, (body, missing) in figures:
        if body:
            out.append(f'<figure id="{ident}">{body}<figcaption>{escape(caption)}</figcaption></figure>')
        else:
            out.append(f'<figure id="{ident}" class="absent"><figcaption>{escape(caption)}</figcaption>'
                       f'<p class="missing">{_text(missing)}</p></figure>')
    return "\n".join(out)


def coefficient_means_figure(doc: dict) -> tuple[str, str]:
    means = doc.get("coefficient_means") or {}
    routing = (doc.get("replay") or {}).get("routing") or {}
    if not means and not routing:
        why = ("no coefficients were captured" if doc.get("replay") is None
               else "the replay did not report per-layer, per-token coefficient means")
        return "", f"Not shown: {why}."
    charts = [chart for family, r in routing.items() for chart in routing_charts(family, r)]
    for family, m in means.items():
        if family in routing:  # a router's mean is 1/E by construction: how often each expert is chosen says more
            continue
        values = m.get("values") or []
        tokens = max((len(r) for r in values), default=0)
        charts.append(svg.heatmap([f"layer {layer}" for layer in m.get("layers") or range(len(values))],
                                  [str(t) for t in range(tokens)], values,
                                  title=f"{family}: mean coefficient by layer (rows) and token position (columns)"))
    return "".join(charts), ""


def routing_charts(family: str, routing: dict, most_layers: int = ROUTED_LAYERS_SHOWN) -> list[str]:
    """A router family's choices: the share of tokens each expert took, per layer, and for the first
    `most_layers` layers per position too (the JSON has them all)."""
    layers = routing.get("layers") or []
    ks, shares = routing.get("k") or [], routing.get("share") or []
    even = {k / e for k, e in zip(ks, routing.get("experts") or []) if e}
    split = f"; an even split is {pct(next(iter(even)))}" if len(even) == 1 else ""
    experts = max((len(row) for row in shares), default=0)
    charts = [svg.heatmap([f"layer {layer}" for layer in layers], [f"e{e}" for e in range(experts)], shares, low=0,
                          title=f"{family}: share of tokens routed to each expert (top-{ks[0] if ks else '?'}){split}")]
    for layer, grid in list(zip(layers, routing.get("by_position") or []))[:most_layers]:
        positions = max((len(row) for row in grid), default=0)
        charts.append(svg.heatmap([f"e{e}" for e in range(len(grid))], [str(t) for t in range(positions)], grid,
                                  low=0, high=1, title=f"{family} layer {layer}: share of inputs routing each "
                                                       "token position (columns) to each expert (rows)"))
    return charts


def variance_figure(doc: dict) -> tuple[str, str]:
    variance = (doc.get("replay") or {}).get("variance") or {}
    if not variance:
        return "", "Not shown: no coefficient variance was measured."
    families = list(variance)
    parts = {label: [num(variance[f].get(key)) for f in families]
             for key, label in (("layer_slot_share", "(layer, slot)"), ("input_share", "input"),
                                ("token_share", "token"))}
    markers = [num(variance[f].get("eta2_layer")) for f in families]
    return svg.shares(families, parts, markers=markers, marker_name="η² layer alone",
                      title="Share of coefficient variance explained by level"), ""


def delta_nll_figure(doc: dict) -> tuple[str, str]:
    conditions = (doc.get("replay") or {}).get("conditions") or {}
    if not conditions:
        return "", "Not shown: no frozen replay ran."
    # ΔNLL; without labels or token ids to score against, the KL from the correct output
    for key, ci, title in (("delta_nll", "ci", "ΔNLL against correct coefficients (nats)"),
                           ("kl", "kl_ci", "KL from the correct output (nats; the data has no labels for an NLL)")):
        rows = [(name, c) for name, c in conditions.items() if name != CORRECT and num(c.get(key)) is not None]
        if rows:
            lows, highs = zip(*(interval(c.get(ci)) for _, c in rows))
            return svg.intervals([n for n, _ in rows], [num(c[key]) for _, c in rows], list(lows), list(highs),
                                 title=title, unit=" nats"), ""
    why = ((doc.get("replay") or {}).get("settings") or {}).get("no_nll") or "the data has no labels or targets"
    return "", f"Not shown: the replay has no NLL ({why}) and its output is not logits."


def latency_figure(doc: dict) -> tuple[str, str]:
    profile = doc.get("profile")
    if not profile or not profile.get("blocks"):
        return "", "Not shown: the model was not profiled."
    blocks = profiled_blocks(profile)
    names = [b.get("name", "?") for b in blocks]
    series = {"model": [num(b.get("median_ms")) for b in blocks]}
    errors = {"model": [_block_spread(b) for b in blocks]}
    base = profile.get("baseline") or {}
    base_blocks = {b.get("name"): b for b in base.get("blocks") or []}
    if base_blocks:  # the baseline's blocks of the same names beside the model's (a Dense model's layers)
        names += [n for n in base_blocks if n not in names and not str(n).startswith("(")]
        series = {"model": series["model"] + [None] * (len(names) - len(blocks)),
                  "baseline": [num((base_blocks.get(n) or {}).get("median_ms")) for n in names]}
        errors = {"model": errors["model"] + [None] * (len(names) - len(blocks)),
                  "baseline": [_block_spread(base_blocks.get(n) or {}) for n in names]}
    charts = [svg.bars(names, series, errors=errors, unit="",
                       title="Median time per block (ms, p10–p90 over inputs)")]
    lat = profile.get("latency_ms") or {}
    base_latency = base.get("latency_ms")
    if median(base_latency) is not None:
        totals = {"median latency": [median(lat), median(base_latency)]}
        spread = {"median latency": [_p10_p90(lat), _p10_p90(base_latency)]}
        charts.append(svg.bars(["model", f"baseline ({_short_name(base.get('model'), 'baseline')})"],
                               totals, errors=spread, height=200,
                               title=f"Whole-model median latency (ms, p10–p90), ratio {num(base.get('ratio'), 0):.2f}×"))
    return "".join(charts), ""


def _block_spread(block: dict) -> tuple[float, float] | None:
    return _p10_p90({"p10": block.get("p10_ms"), "p90": block.get("p90_ms")})


def _p10_p90(spread) -> tuple[float, float] | None:
    if isinstance(spread, dict) and num(spread.get("p10")) is not None and num(spread.get("p90")) is not None:
        return num(spread["p10"]), num(spread["p90"])
    return None


def _short_name(path, default: str) -> str:
    if not path:
        return default
    return "/".join(str(path).replace("\\", "/").split("/")[-2:])


def executed_figure(doc: dict) -> tuple[str, str]:
    profile = doc.get("profile")
    if not profile or not profile.get("blocks"):
        return "", "Not shown: the model was not profiled."
    blocks = profiled_blocks(profile)
    names = [b.get("name", "?") for b in blocks]
    runs = [r for r in per_input(profile) if "blocks_ran" in r]
    if runs:
        values: list[list[float | None]] = [_ran_shares(name, runs) for name in names]
        return svg.heatmap(names, [str(r.get("index", i)) for i, r in enumerate(runs)], values, low=0.0, high=1.0,
                           title="Block compute run per profiled input (dark: the most any input ran; light: none)"), ""
    fractions = [num(b.get("executed_fraction")) for b in blocks]
    if all(f is None for f in fractions):
        return "", "Not shown: the profile did not report which blocks ran."
    return svg.bars([b.get("name", "?") for b in blocks],
                    {"inputs on which the block ran": [None if f is None else f * 100 for f in fractions]},
                    title="Share of profiled inputs on which each block ran (%)", unit="%"), ""


def _ran_shares(name: str, runs: list[dict]) -> list[float | None]:
    """How much of block `name` ran for each input: 0 where it did not run, else its FLOPs that
    run over the most any input ran (a subset block's rows kept); 1 where no FLOPs were counted."""
    done = [num((r.get("flops") or {}).get(name)) for r in runs]
    most = max((d or 0.0 for d in done), default=0.0)
    return [0.0 if name not in r["blocks_ran"] else 1.0 if d is None or most <= 0 else d / most
            for r, d in zip(runs, done, strict=True)]


def _cell(value) -> str:
    """A table cell; one cut short shows its whole text as a tooltip."""
    if isinstance(value, Cut):
        return f'<td title="{escape(value.full.replace("`", ""))}">{_text(value)}</td>'
    return f"<td>{_text(value)}</td>"


def _table(table: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.headers)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in table.rows)
    note = f'<p class="note">{_text(table.note)}</p>' if table.note else ""
    return (f'<h2>{_text(table.title)}</h2><div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>{note}")
