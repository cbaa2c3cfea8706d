"""`graphaudit replay`'s report as terminal text: parity, the conditions' table, retained gap, variance."""

from __future__ import annotations

from tabulate import tabulate

from graphaudit.replay.conditions import CORRECT, FLOOR
from graphaudit.replay.results import ReplayReport
from graphaudit.verdict.decide import MATERIAL_NATS
from graphaudit.wording import CONFIDENCE, DASH, bracketed, fmt, pct, sig, signed


def render_text(r: ReplayReport) -> str:
    """Return the replay report as terminal text."""
    if not r.controller:
        return (f"{r.model}: no controller — the model declares no coefficient tensors, none were given "
                "(--coefficients) and none were detected; there is nothing to freeze or replay")
    families = sorted({c.family for c in r.coefficients})
    lines = [f"model: {r.model} — {len(r.coefficients)} coefficient tensor{'s' if len(r.coefficients) != 1 else ''} ({', '.join(families)})"]
    # `replay` fills data, task and parity whenever a controller was found (the early return above)
    assert r.data is not None and r.task is not None and r.parity is not None
    d = r.data
    if d.split:
        lines.append(f"data: no --data given: {d.calibration} split into disjoint halves (seed {r.seed}): "
                     f"{d.calibration_inputs} calibration, {d.evaluation_inputs} evaluation inputs")
    else:
        lines.append(f"data: calibration {d.calibration} ({d.calibration_inputs} inputs), "
                     f"evaluation {d.evaluation} ({d.evaluation_inputs} inputs)")
        if d.shared_inputs:
            lines.append(f"warning: {d.shared_inputs} of the {d.evaluation_inputs} evaluation inputs are also "
                         "calibration inputs: the profiles saw them")
    if r.settings.get("batch_size_note"):
        lines.append(f"batch size {r.settings['batch_size']}: {r.settings['batch_size_note']}")
    lines += [f"{about}: {note}" for about, note in r.setting_notes()]
    p = r.parity
    lines.append(f"parity: {p.describe()} over the first {p.inputs} input{'s' if p.inputs != 1 else ''} — ok "
                 f"(tolerance {p.tolerance:g})")
    if p.every_input is not None:
        e = p.every_input
        lines.append(f"parity of every input: {e.kind} ({e.values} values) over all {e.inputs} inputs, "
                     f"max |Δ| {e.max_abs_diff:.3g} — ok (tolerance {e.tolerance:g})")
    div = r.task.divergence.upper() if r.task.divergence == "kl" else r.task.divergence
    if r.task.read is not None:
        lines.append(f"scored output: {r.task.read.describe()}")
    rows = [(c.name, fmt(c.nll.value, 4, missing=DASH), signed(c.delta_nll.value, missing=DASH), bracketed(c.delta_nll.ci), sig(c.divergence.value, missing=DASH),
             *((fmt(c.accuracy.value, 4, missing=DASH),) if c.accuracy.value is not None else ()),
             *((sig(c.mse.value, missing=DASH), bracketed(c.delta_mse.ci)) if c.mse.value is not None else ()))
            for c in r.conditions]
    headers = ["condition", "NLL", "ΔNLL", f"{_level(r)} CI of ΔNLL", div]
    if any(c.accuracy.value is not None for c in r.conditions):
        headers.append("accuracy")
    if any(c.mse.value is not None for c in r.conditions):
        headers += ["MSE (targets)", f"{_level(r)} CI of ΔMSE"]
    lines += ["", tabulate(rows, headers=headers, disable_numparse=True)]
    if all(c.nll.value is None for c in r.conditions):
        why = r.settings.get("no_nll") or f"the data has no labels or targets to score {r.task.output!r} against"
        lines.append(f"no NLL ({r.task.kind}): {why}, so no ΔNLL or retained gap either; the "
                     f"{'KL' if r.task.divergence == 'kl' else 'mean squared difference'} from the correct output "
                     "needs none")
    if r.retained_gap and any(e.value is not None for _, e in r.retained_gap):
        lines += ["", f"retained gap (share of {FLOOR} → {CORRECT} kept): " + "; ".join(
            f"{name} {_share(e.value)} {bracketed(e.ci, 2, percent=True)}" for name, e in r.retained_gap)]
        gap = r.condition(FLOOR).delta_nll if any(c.name == FLOOR for c in r.conditions) else None
        if gap is not None and gap.value is not None and (gap.value < MATERIAL_NATS or (
                gap.ci is not None and gap.ci[0] is not None and gap.ci[0] <= MATERIAL_NATS)):
            lines.append(f"  ({FLOOR} is not measurably worse than {CORRECT}, ΔNLL {signed(gap.value, missing=DASH)}: "
                         "there is no gap to share out, and these shares mean nothing)")
    if r.variance:
        rows = [(f, *(f"{_share(s[k].value)} {bracketed(s[k].ci, 2, percent=True)}" for k in
                      ("eta2_layer", "layer_slot_share", "input_share", "token_share"))) for f, s in r.variance]
        lines += ["", tabulate(rows, headers=["family", "η² layer", "(layer, slot)", "input", "token"],
                               disable_numparse=True)]
    for family, routing in r.routing.items():  # how often each expert was chosen: a router's mean is 1/E
        rows = [(f"{family} {layer}", k, *(_share(v) for v in shares))
                for layer, k, shares in zip(routing["layers"], routing["k"], routing["share"])]
        experts = max((len(shares) for shares in routing["share"]), default=0)
        lines += ["", "share of tokens routed to each expert (a layer's add up to k):",
                  tabulate(rows, headers=["router layer", "k", *(f"e{e}" for e in range(experts))],
                           disable_numparse=True)]
    lines += ["", f"seed {r.seed}; {r.settings.get('resamples')} bootstrap resamples over inputs; "
                  f"NLL in nats ({r.task.kind}, output {r.task.output!r})"]
    return "\n".join(lines)


def _level(r: ReplayReport) -> str:
    """The level of the report's intervals, "95%"."""
    return pct(r.settings.get("confidence", CONFIDENCE), None)


def _share(x) -> str:
    """A share of the gap or of the variance with two decimals, "12.34%"."""
    return pct(x, 2, missing=DASH, small=False)
