"""The rows every report shows, read from the audit's JSON document.

Text and Markdown render the same tables with different tabulate formats; the HTML page
uses them beside its figures. Everything here reads the document (the dict that
`AuditReport.to_json()` gives back, or one loaded from a JSON report), never the objects,
so a saved report renders exactly like a fresh one.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphaudit.profile.what_ran import profiled_blocks, profiled_sample, reduction
from graphaudit.replay.conditions import CORRECT, CROSS_INPUT, FLOOR, STATIC_LAYER, TOKEN_SHUFFLE
from graphaudit.verdict.decide import CALLER, FINDINGS, MATERIAL_NATS, NO, NOT_MEASURED, YES
from graphaudit.verdict.findings import INCONCLUSIVE
from graphaudit.vocabulary import SAVES_COMPUTE
from graphaudit.wording import (
    CONFIDENCE,
    DASH,
    bracketed,
    drawn,
    flops_cell,
    fmt,
    interval,
    median,
    moved_key,
    num,
    pct,
    signed,
    total_bound,
)

LABELS = {
    "coefficient_variation": "coefficient variation",
    "functional_dependence": "functional dependence",
    "conditional_execution": "conditional execution",
    "compute_savings": "compute savings",
}
SOURCES = {"static": "graph", "replay": "replay", "profile": "runtime"}
_BOUND_WORDS: dict[str | None, str] = {"most": "at most ", "least": "at least "}  # of total_bound; None: one count


@dataclass(frozen=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: list[tuple]
    note: str = ""


def header_lines(doc: dict) -> list[str]:
    """What was audited, with what, in one or two lines."""
    given = doc.get("inputs") or {}
    parts = [f"calib {given.get('calib') or '—'}"]
    if given.get("data"):
        parts.append(f"data {given['data']}")
    if given.get("baseline"):
        parts.append(f"baseline {given['baseline']}")
    parts.append(f"provider {given.get('provider', 'auto')}")
    parts.append(f"seed {given.get('seed', '—')}")
    return [f"model {doc.get('model', '?')}", "; ".join(parts)]


def verdict_table(doc: dict) -> Table:
    verdict = doc.get("verdict") or {}
    rows = [(LABELS[name], (verdict.get(name) or {}).get("answer", NOT_MEASURED),
             (verdict.get(name) or {}).get("statement", "")) for name in FINDINGS]
    return Table("Verdict", ("property", "answer", "in plain words"), rows)


def evidence_lines(doc: dict) -> list[tuple[str, list[str]]]:
    """(property label, ["[graph] text", ...]) for every finding that has evidence."""
    verdict = doc.get("verdict") or {}
    out = []
    for name in FINDINGS:
        items = (verdict.get(name) or {}).get("evidence") or []
        if items:
            out.append((LABELS[name], [f"[{SOURCES.get(e.get('source'), e.get('source'))}] {e.get('text', '')}"
                                       for e in items]))
    return out


def claim_lines(doc: dict) -> list[str]:
    return [f"claim {c['claim']}: {c['reason']}" for c in doc.get("claims") or []]


def static_table(doc: dict) -> Table | None:
    static = doc.get("static")
    if static is None:
        return None
    rows = []
    for b in static.get("blocks") or []:
        evidence = b.get("evidence")
        if isinstance(evidence, (list, tuple)):
            evidence = "; ".join(str(e) if not isinstance(e, dict) else e.get("detail") or e.get("text") or str(e)
                                 for e in evidence[:2])
        rows.append((b.get("index", ""), b.get("name", ""), b.get("verdict", ""), _block_flops(b),
                     _short(evidence or "", 80)))
    deciders = sorted(set((static.get("decided_by") or {}).values()))
    note = (f"conditional execution in the graph: {'yes' if static.get('conditional_execution') else 'no'}"
            + (f" (decided by {', '.join(deciders)})" if deciders and static.get("conditional_execution") else "")
            + f"; data-dependent compute: {'yes' if static.get('data_dependent_compute') else 'no'}")
    flops = static.get("flops") or {}
    if num(flops.get("total")) is not None:
        uncounted = flops.get("skippable_uncounted_nodes") or 0
        every_row = set(flops.get("every_row_selected_nodes") or ())  # counted with every row of a selection
        unknown = set(flops.get("unknown_shape_nodes") or ()) - every_row  # in no count
        # as `graphaudit static` says it
        bound = _BOUND_WORDS.get(total_bound(bool(every_row), bool(unknown), num(flops.get("skippable"))), "")
        share = "at least " if uncounted else "at most " if bound == "at most " else ""
        counted_as = f" ({'; '.join(flops['counted_as'])})" if flops.get("counted_as") else ""
        note += (f"; {bound}{num(flops['total']):,.0f} FLOPs at input shapes {flops.get('shapes') or 'as given'}"
                 f"{counted_as}, {share}{pct(flops.get('skippable_share'), missing=DASH, small=False)} where input "
                 "values can skip or shrink them" + (f" ({uncounted} skippable compute nodes of a value-dependent size "
                                                    "not counted)" if uncounted else ""))
        capacity = flops.get("fixed_capacity") or {}
        if capacity.get("blocks") and num(capacity.get("saving")) is not None:
            note += (f"; a fixed capacity ({', '.join(capacity['blocks'])}) saves {num(capacity['saving']):,.0f} "
                     "FLOPs on every input")
    return Table("Static audit (graph)", ("#", "block", "verdict", "FLOPs", "evidence"), rows, note)


def _block_flops(b: dict) -> str:
    """A block's FLOPs: "≥" where some compute has a size the graph does not fix, "≤" with every
    row of a value-dependent selection selected, and a fixed capacity's full size."""
    flops, every_row, full = num(b.get("flops")), num(b.get("flops_every_row_selected")), num(b.get("flops_full_size"))
    if flops is None:
        return "—"
    return flops_cell(flops, b.get("flops_uncounted_nodes"), every_row, full, b.get("skippable_flops"),
                      lambda n: f"{n:,.0f}")


def confidence(doc: dict) -> str:
    """The level of the replay's intervals as a percentage, "95%": the one its settings name."""
    return pct(((doc.get("replay") or {}).get("settings") or {}).get("confidence", CONFIDENCE), None)


def condition_table(doc: dict) -> Table | None:
    replay = doc.get("replay")
    if replay is None:
        return None
    conditions = replay.get("conditions") or {}
    # how far each condition's output is from the correct one: KL for logits, else the squared difference
    key = moved_key(conditions)
    targets = any(num(c.get("mse")) is not None for c in conditions.values())  # a loss against the data's targets
    rows = []
    for name, c in conditions.items():
        moved = num(c.get(key))
        lo, hi = (num(v) for v in (c.get(f"{key}_ci") or (None, None)))
        spread = f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None and name != CORRECT else ""
        rows.append((name, fmt(c.get("nll"), 4, missing=DASH), signed(c.get("delta_nll"), missing=DASH), bracketed(c.get("ci")),
                     "—" if moved is None else f"{moved:.4g}{spread}",
                     *((fmt(c.get("mse"), 4, missing=DASH), bracketed(c.get("delta_mse_ci"))) if targets else ())))
    parity = replay.get("parity") or {}
    note = ""
    if parity:
        all_inputs = parity.get("every_input") or {}
        every = (f", {all_inputs.get('kind')} of all {all_inputs.get('inputs')} inputs "
                 f"{num(all_inputs.get('max_abs_diff'), float('nan')):.2e}") if all_inputs else ""
        note = (f"parity: max |Δ| {num(parity.get('max_abs_diff'), float('nan')):.2e}{every} "
                f"({'ok' if parity.get('ok') else 'FAILED'}); seed {replay.get('seed', '—')}")
    read = (replay.get("task") or {}).get("read_as") or {}
    if read.get("reason"):
        what = "per-value probabilities (Bernoulli)" if read.get("bernoulli") else \
            {"logits": "logits", "probs": "probabilities", "logprobs": "log-probabilities"}.get(read.get("kind", ""), "values")
        note += f"{'; ' if note else ''}output {replay['task'].get('output')!r} read as {what}: {read['reason']}"
    moved = "KL from correct (nats)" if key == "kl" else "mean squared difference from correct"
    level = confidence(doc)
    extra = ("MSE (targets)", f"{level} CI of ΔMSE") if targets else ()
    return Table("Frozen-controller replay (NLL in nats)", ("condition", "NLL", "ΔNLL", f"{level} CI of ΔNLL", moved,
                                                           *extra), rows, note)


def gap_table(doc: dict) -> Table | None:
    gap = (doc.get("replay") or {}).get("retained_gap") or {}
    if not gap:
        return None
    return Table("Retained gap (share of global-mean → correct kept by the profile)",
                 ("profile", "retained gap"), [(k, pct(v, missing=DASH, small=False)) for k, v in gap.items()])


def variance_table(doc: dict) -> Table | None:
    variance = (doc.get("replay") or {}).get("variance") or {}
    if not variance:
        return None
    rows = [(family, *(pct(v.get(k), missing=DASH, small=False)
                       for k in ("eta2_layer", "layer_slot_share", "input_share", "token_share")))
            for family, v in variance.items()]
    return Table("Coefficient variance", ("family", "η² layer", "(layer, slot)", "input", "token"), rows)


def profile_table(doc: dict) -> Table | None:
    profile = doc.get("profile")
    if profile is None:
        return None
    lat = profile.get("latency_ms") or {}
    # a catch-all entry (`(other)`: the nodes of no block) is no block that runs or not
    blocks = {id(b) for b in profiled_blocks(profile)}
    rows = [(b.get("name", ""), fmt(b.get("median_ms"), 3, missing=DASH), pct(b.get("share"), missing=DASH, small=False),
             pct(b.get("executed_fraction"), missing=DASH, small=False) if id(b) in blocks else DASH)
            for b in profile.get("blocks") or []]
    note = (f"{profile.get('provider', '?')}: median {fmt(lat.get('median'), 3, missing=DASH)} ms "
            f"(p10 {fmt(lat.get('p10'), 3, missing=DASH)}, p90 {fmt(lat.get('p90'), 3, missing=DASH)})")
    base = profile.get("baseline") or {}
    if num(base.get("ratio")) is not None:
        note += (f"; baseline {base.get('model') or ''} {fmt(median(base.get('latency_ms')), 3, missing=DASH)} ms, "
                 f"ratio {fmt(base.get('ratio'), 2, missing=DASH)}×")
    if num(profile.get("coverage")) is not None:
        note += f"; node events cover {pct(profile.get('coverage'), missing=DASH, small=False)} of the profiled runs' time"
    if num(profile.get("profiling_overhead")) is not None:
        note += (f"; block times were taken under the profiler, whose runs took {fmt(profile['profiling_overhead'], 2, missing=DASH)}× "
                 "the plain runs")
    rounds = profile.get("rounds") or {}
    if rounds.get("chosen"):
        note += (f"; {rounds.get('runs')} timed rounds after {rounds.get('warmup')} warm-up, "
                 f"{rounds.get('profile_runs')} profiled: {rounds.get('reason')}")
    sampled = profiled_sample(profile)
    if sampled is not None:
        note += (f"; every figure of the profile comes from {sampled[0]} of the {sampled[1]} inputs (batches), "
                 f"{drawn(sampled[0])}")
    return Table("Runtime profile", ("block", "median ms (profiled)", "share", "executed on"), rows, note)


def detail_tables(doc: dict) -> list[Table]:
    """The tables under the verdict, in the order of the data flow; parts not run are left out."""
    found = (static_table(doc), condition_table(doc), gap_table(doc), variance_table(doc), profile_table(doc))
    return [t for t in found if t is not None]


class Cut(str):
    """A table cell cut short (`_short`), which still holds the whole text (`full`): the HTML
    report shows it as the cell's tooltip; text and Markdown print the cell as it is."""

    full: str

    def __new__(cls, shown: str, full: str) -> Cut:
        cell = super().__new__(cls, shown)
        cell.full = full
        return cell


def _short(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters; a code span the cut opens is closed first."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    return Cut((cut[:-1] + "`…") if cut.count("`") % 2 else cut + "…", text)


# -- the zoo comparison (graphaudit demo) ------------------------------------------------

COMPARISON_ROWS = ("coefficients vary with input", "layer identity (η²)", "ΔNLL cross-input",
                   "ΔNLL token shuffle", "retained gap, static layer", "skippable blocks (graph)",
                   "skipped or shrunk (measured)", "latency vs baseline", "dynamic inference", "verdict")


def comparison_table(named: list[tuple[str, dict]], baseline: str = "baseline") -> Table:
    """The models side by side (one column each), one row per measured property."""
    columns = [comparison_column(doc) for _, doc in named]
    rows = [(label, *(col[i] for col in columns)) for i, label in enumerate(COMPARISON_ROWS)]
    rows[7] = (f"latency vs {baseline}", *rows[7][1:])
    return Table("graphaudit demo: the zoo side by side", ("", *(name for name, _ in named)), rows)


def comparison_column(doc: dict) -> tuple[str, ...]:
    """One model's entries of the side-by-side table, in the order of COMPARISON_ROWS."""
    verdict = doc.get("verdict") or {}
    replay = doc.get("replay") or {}
    answer = lambda k: (verdict.get(k) or {}).get("answer", NOT_MEASURED)  # noqa: E731
    no_replay = "—" if doc.get("replay") is None else "?"
    etas = [num(v.get("eta2_layer")) for v in (replay.get("variance") or {}).values()]
    etas = [e for e in etas if e is not None]
    share = lambda x: pct(x, missing=DASH, small=False)  # noqa: E731
    eta = no_replay if not etas else share(etas[0]) if len(etas) == 1 else f"{share(min(etas))}–{share(max(etas))}"
    conditions = replay.get("conditions") or {}

    def delta(name: str) -> str:
        c = conditions.get(name) or {}
        if num(c.get("delta_nll")) is None:
            return no_replay
        lo, hi = interval(c.get("ci"))
        value = signed(c.get("delta_nll"), 3, missing=DASH)
        return value if lo is None or hi is None else f"{value} ±{(hi - lo) / 2:.3f}"

    blocks = (doc.get("static") or {}).get("blocks") or []
    skippable = [b for b in blocks if b.get("verdict") in SAVES_COMPUTE]
    kinds = ", ".join(sorted({b["verdict"] for b in skippable}))
    graph = "—" if doc.get("static") is None else f"{len(skippable)}/{len(blocks)}" + (f" {kinds}" if kinds else "")
    profile = doc.get("profile")
    if profile is None:
        measured = "—"
    else:
        pblocks = profiled_blocks(profile)
        verdicts = {b.get("name"): b.get("verdict") for b in blocks}
        reduced = [b for b in pblocks if reduction(b, verdicts.get(b.get("name")))]
        measured = f"{len(reduced)}/{len(pblocks)}"
    ratio = num(((profile or {}).get("baseline") or {}).get("ratio"))
    latency = "(baseline)" if (doc.get("inputs") or {}).get("is_baseline") else (
        "—" if ratio is None else f"{ratio:.2f}×")
    gap = (replay.get("retained_gap") or {}).get(STATIC_LAYER)
    global_gap = num((conditions.get(FLOOR) or {}).get("delta_nll"))
    gap_text = no_replay if num(gap) is None else share(gap)
    if global_gap is not None and abs(global_gap) < MATERIAL_NATS:
        gap_text = "no gap"  # one global mean is as good as the correct coefficients: 0/0
    return (answer("coefficient_variation") if doc.get("replay") is not None else "— (none)", eta,
            delta(CROSS_INPUT), delta(TOKEN_SHUFFLE), gap_text, graph,
            measured, latency, _model_decides(verdict), summary_phrase(doc))


def _model_decides(verdict: dict) -> str:
    """Conditional execution's answer where the model decides; "no (the caller's switches)" where only
    the caller does, which is no dynamic inference."""
    execution = verdict.get("conditional_execution") or {}
    if execution.get("answer") == YES and execution.get("decided_by") == CALLER:
        return "no (the caller's switches)"
    return execution.get("answer", NOT_MEASURED)


def summary_phrase(doc: dict) -> str:
    """The verdict in a few words: what the model's dynamism amounts to."""
    verdict = doc.get("verdict") or {}
    varies = (verdict.get("coefficient_variation") or {}).get("answer")
    execution = verdict.get("conditional_execution") or {}
    executes = execution.get("answer")
    if executes == YES and execution.get("decided_by") == CALLER:
        return "dynamic parameters; the caller's switches only" if varies == YES else "the caller's switches only"
    if executes == YES:
        return "dynamic inference"
    if executes == NO and varies == YES:
        return "dynamic parameters only"
    if executes == NO:
        return "static"
    if executes == INCONCLUSIVE:  # no block skipped on a sample of the inputs: the others may
        return "dynamic parameters; execution undecided on a sample" if varies == YES else "execution undecided on a sample"
    return "execution not measured"
