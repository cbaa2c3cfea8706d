"""The verdict: four findings, each in plain words with the evidence it rests on.

`decide(static, replay, profile)` is a pure function of the three sub-reports' JSON
documents (any of them may be None when that part did not run). It keeps the three
properties apart, and adds the fourth question people actually ask:

- coefficient_variation: do the controller's coefficients change with the input, and how
  much of their variance does layer identity alone explain? (replay's variance split)
- functional_dependence: does the frozen model get worse when its coefficients are
  reassigned across inputs or tokens, and how much of the global-mean gap does a static
  per-layer profile keep? (replay's conditions and retained gap)
- conditional_execution: can any block be skipped or shrunk (static), and was it (measured)?
  Who decides: the model, or only the caller's switches (`verdict.conditional_execution`).
- compute_savings: is it faster than the dense baseline? (profile against the baseline)

Every finding answers "yes", "no" or "not measured". Nothing is answered from a part that
did not run: a finding without its measurement says "not measured" and why. The
thresholds below are the whole policy; they are in the report's evidence lines as numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graphaudit.verdict.compute_savings import SAVINGS_RATIO_MAX, compute_savings  # noqa: F401
from graphaudit.verdict.conditional_execution import CALLER, conditional_execution
from graphaudit.verdict.findings import ANSWERS, INCONCLUSIVE, NO, NOT_MEASURED, YES, Evidence, Finding  # noqa: F401
from graphaudit.vocabulary import COMPUTE_SAVINGS, DYNAMIC_INFERENCE
from graphaudit.wording import (
    CONFIDENCE,
    TRACED_SIZES,
    ci_text,
    counted,
    fmt,
    interval,
    listed,
    moved_key,
    num,
    num_text,
    pct,
    sig,
    signed,
)

FINDINGS = ("coefficient_variation", "functional_dependence", "conditional_execution", "compute_savings")
# a claim `run --claim` checks -> the finding that answers it
CLAIM_FINDINGS = {DYNAMIC_INFERENCE: "conditional_execution", COMPUTE_SAVINGS: "compute_savings"}

# Coefficients "vary with the input" when the input and token levels together explain at
# least this share of their variance (the rest is what a static per-layer profile keeps).
INPUT_SHARE_MIN = 0.001
# A reassignment "hurts" when its ΔNLL interval lies wholly above this many nats.
MATERIAL_NATS = 0.01
# Layer and slot together explain this much more of a family's variance than layer identity alone:
# the headline says so (a static profile per layer and slot keeps that much).
SLOT_MORE = 0.10
# A reassignment "hurts" a model scored by MSE against targets when its ΔMSE interval lies wholly
# above this share of the correct coefficients' MSE.
MATERIAL_MSE_SHARE = 0.01


def conditions_registry():
    """The replay's conditions (`graphaudit.replay.conditions`), imported when a finding first reads
    them: that module loads numpy, which `import graphaudit` (and so `graphaudit --help`) must not."""
    from graphaudit.replay import conditions

    return conditions


@dataclass(frozen=True)
class Verdict:
    coefficient_variation: Finding
    functional_dependence: Finding
    conditional_execution: Finding
    compute_savings: Finding

    def to_json(self) -> dict:
        return {name: getattr(self, name).to_json() for name in FINDINGS}


@dataclass(frozen=True)
class ClaimCheck:
    """Whether the audit supports a claim; `supported` is False when refuted, unmeasured or
    inconclusive (`inconclusive`: measured, but its noise could not decide)."""

    claim: str
    supported: bool
    reason: str
    inconclusive: bool = False

    def to_json(self) -> dict:
        doc = {"claim": self.claim, "supported": self.supported, "reason": self.reason}
        if self.inconclusive:
            doc["inconclusive"] = True
        return doc


def decide(static: dict | None, replay: dict | None, profile: dict | None, *,
           baseline_flops: float | None = None, replay_failure: str | None = None) -> Verdict:
    """Return the four findings from the sub-reports' JSON documents (None: not run).

    `baseline_flops` is the baseline graph's FLOP count per profiled run (an input, or the batch
    a model fixes) at the profiled shape. `replay_failure`: why the frozen replay stopped, when
    it did (ONNX Runtime would not run the frozen graph on some condition's coefficients).
    """
    execution = conditional_execution(static, profile)
    return Verdict(
        coefficient_variation=coefficient_variation(static, replay, replay_failure),
        functional_dependence=functional_dependence(replay, replay_failure),
        conditional_execution=execution,
        compute_savings=compute_savings(static, profile, baseline_flops, execution),
    )


def check_claim(verdict: Verdict | dict, claim: str) -> ClaimCheck:
    """Return whether `verdict` supports `claim` (dynamic-inference or compute-savings).

    A claim is supported only by a "yes" that was measured; "no" refutes it, and "not
    measured" and "inconclusive" leave it unsupported, so a gate built on it fails closed.
    """
    if claim not in CLAIM_FINDINGS:
        raise ValueError(f"expected a claim in {sorted(CLAIM_FINDINGS)}, found {claim!r}")
    findings = verdict.to_json() if isinstance(verdict, Verdict) else verdict
    finding = findings[CLAIM_FINDINGS[claim]]
    answer, statement = finding["answer"], finding["statement"]
    if answer == YES and finding.get("decided_by") == CALLER:  # the caller's switch is no inference of the model's
        return ClaimCheck(claim, False, f"refuted: only the caller decides what runs, not the model: {statement}")
    if answer == YES:
        return ClaimCheck(claim, True, f"supported: {statement}")
    if answer == INCONCLUSIVE:
        return ClaimCheck(claim, False, f"not established (inconclusive): {statement}", inconclusive=True)
    word = "refuted" if answer == NO else "not established (not measured)"
    return ClaimCheck(claim, False, f"{word}: {statement}")


REFUTED_STATUS, INCONCLUSIVE_STATUS = 3, 4


def claims_status(checks: Sequence[ClaimCheck]) -> int:
    """The exit status of claims checked: 0 when all are supported, 3 when one is refuted or
    was not measured, else 4 when one was measured but inconclusive (a timing too noisy to decide)."""
    if any(not c.supported and not c.inconclusive for c in checks):
        return REFUTED_STATUS
    return INCONCLUSIVE_STATUS if any(c.inconclusive for c in checks) else 0


# -- coefficient variation ---------------------------------------------------------------

VARIANCE_SHARES = ("eta2_layer", "layer_slot_share", "input_share", "token_share")

def coefficient_variation(static: dict | None, replay: dict | None, failure: str | None = None) -> Finding:
    """Do the coefficients vary with the input; how much does layer identity explain?"""
    variance = (replay or {}).get("variance") or {}
    if not variance:
        declared = len((static or {}).get("coefficients") or [])
        why = (f"the frozen replay stopped ({failure})" if failure else
               "no coefficient tensors were declared, given or detected"
               if static is not None and declared == 0 else
               "the coefficients were not captured (no replay ran)")
        return Finding(NOT_MEASURED, f"Not measured: {why}.")
    # a family in one layer: layer identity explains nothing by construction, which says nothing
    layers: dict[str | None, set] = {}  # a coefficient without a family counts under None
    for c in (replay or {}).get("coefficients") or []:
        if isinstance(c, dict):
            layers.setdefault(c.get("family"), set()).add(c.get("layer"))
    single = {f for f in variance if len(layers.get(f, ())) == 1}
    # no share at all: the family's values are the same everywhere (a gate fed zeros at random init)
    constant = {f for f, v in variance.items() if all(num(v.get(k)) is None for k in VARIANCE_SHARES)}
    evidence, varying = [], []
    for family, v in sorted(variance.items()):
        if family in constant:
            evidence.append(Evidence("replay", f"{family}: the same value at every input, position and slot: "
                                               "no variance to share out"))
            continue
        within = num(v.get("input_share"), 0.0) + num(v.get("token_share"), 0.0)
        eta2 = num(v.get("eta2_layer"))
        if within >= INPUT_SHARE_MIN:
            varying.append(family)
        layer_words = (f"{family}: one layer only, so layer identity explains nothing by construction"
                       if family in single else f"{family}: layer identity alone explains {pct(eta2)} of the variance (η²)")
        evidence.append(Evidence("replay", (
            f"{layer_words}; (layer, slot) {pct(v.get('layer_slot_share'))}, input {pct(v.get('input_share'))}, "
            f"token {pct(v.get('token_share'))}")))
    if constant == set(variance):
        return Finding(NO, "No: the coefficients are constant, the same value for every input and position "
                           f"({', '.join(sorted(constant))}).", tuple(evidence))
    etas = [num(v.get("eta2_layer")) for f, v in variance.items() if f not in single]
    etas = [e for e in etas if e is not None]
    eta_words = (f"layer identity alone explains {pct(min(etas))}–{pct(max(etas))} of their variance"
                 if etas and pct(min(etas)) != pct(max(etas)) else  # a range only where it prints as one
                 f"layer identity alone explains {pct(etas[0])} of their variance" if etas else "")
    # where the slot (feature, way, expert) explains much more, what a static profile keeps is that
    slotted = [num(v.get("layer_slot_share")) for f, v in variance.items()
               if num(v.get("layer_slot_share")) is not None and num(v.get("layer_slot_share")) - num(
                   v.get("eta2_layer"), 0.0) >= SLOT_MORE]
    if eta_words and slotted:
        eta_words += (f", layer and slot together {pct(min(slotted))}" if pct(min(slotted)) == pct(max(
            slotted)) else f", layer and slot together {pct(min(slotted))}–{pct(max(slotted))}") + \
            " (the variance a static per-layer profile reproduces)"
    if varying:
        statement = (f"Yes: the coefficients change with the input ({', '.join(varying)}); "
                     f"{eta_words}." if eta_words else
                     f"Yes: the coefficients change with the input ({', '.join(varying)}).")
        return Finding(YES, statement, tuple(evidence))
    return Finding(NO, (f"No: the input and token levels explain less than {pct(INPUT_SHARE_MIN)} "
                        f"of the coefficients' variance; a fixed per-layer profile reproduces them."),
                   tuple(evidence))


# -- functional dependence ---------------------------------------------------------------

def functional_dependence(replay: dict | None, failure: str | None = None) -> Finding:
    """Does the frozen model depend on which input's coefficients it is given?"""
    reg = conditions_registry()
    if not replay and failure:
        return Finding(NOT_MEASURED, f"Not measured: the frozen replay stopped: {failure}.",
                       (Evidence("replay", f"the frozen replay stopped: {failure}"),))
    if not replay:
        return Finding(NOT_MEASURED, "Not measured: no frozen replay ran (it needs coefficient tensors).")
    parity = replay.get("parity") or {}
    if parity and not parity.get("ok", True):
        return Finding(NOT_MEASURED, (
            "Not measured: the frozen model fed its own coefficients did not reproduce the live "
            f"model (max |Δ| {num_text(parity.get('max_abs_diff'))}), so no replay can be trusted."),
            (Evidence("replay", f"parity check failed: max |Δ| {num_text(parity.get('max_abs_diff'))}"),))
    conditions = replay.get("conditions") or {}
    evidence = []
    if parity:
        all_inputs = parity.get("every_input") or {}
        every = (f"; {all_inputs.get('kind')} of all {all_inputs.get('inputs')} inputs, max |Δ| "
                 f"{num_text(all_inputs.get('max_abs_diff'))}") if all_inputs else ""
        evidence.append(Evidence("replay", (
            f"parity: the frozen graph with its own coefficients matches the live model "
            f"(max |Δ| {num_text(parity.get('max_abs_diff'))}{every})")))
    hurts, helps, measured = [], [], []
    for name in reg.reassignments():
        c = conditions.get(name)
        if not c or num(c.get("delta_nll")) is None:
            continue
        measured.append(name)
        lo, hi = interval(c.get("ci"))
        evidence.append(Evidence("replay", f"ΔNLL {name} = {signed(c['delta_nll'])} nats{ci_text(lo, hi)}"))
        if (lo is not None and lo > MATERIAL_NATS) or (lo is None and num(c["delta_nll"]) > MATERIAL_NATS):
            hurts.append(name)
        elif hi is not None and hi < -MATERIAL_NATS:  # measurably better: the outputs do change
            helps.append(name)
    gap = replay.get("retained_gap") or {}
    gap_ci = replay.get("retained_gap_ci") or {}
    global_gap = num((conditions.get(reg.FLOOR) or {}).get("delta_nll"))
    global_lo, _ = interval((conditions.get(reg.FLOOR) or {}).get("ci"))
    # no gap to retain: one global mean does as well as the correct coefficients, or better, or
    # is not measurably worse (its interval reaches below a material amount)
    no_gap = global_gap is not None and (global_gap < MATERIAL_NATS or (global_lo is not None and global_lo <= MATERIAL_NATS))
    for name in reg.gap_profiles():
        if num(gap.get(name)) is not None:
            lo, hi = interval(gap_ci.get(name))
            ci = f" ({pct(CONFIDENCE, None)} CI {pct(lo)} to {pct(hi)})" if lo is not None and hi is not None else ""
            of = (f"of a gap of {signed(global_gap)} nats between global-mean and correct coefficients, too small "
                  "to share out" if no_gap else "of the gap between global-mean and correct coefficients")
            evidence.append(Evidence("replay", f"a {name.replace('_', ' ')} profile retains {pct(gap[name])}{ci} {of}"))
    failed = (replay.get("settings") or {}).get("failed_conditions") or {}
    if failed:
        evidence.append(Evidence("replay", (
            f"{listed(list(failed))} did not run: ONNX Runtime would not run the frozen graph on "
            f"{'its' if len(failed) == 1 else 'their'} coefficients ({TRACED_SIZES})")))
    live = (replay.get("settings") or {}).get("live_decisions") or []
    if live:  # decided from the input in every condition: what the reassignments could not change
        evidence.append(Evidence("replay", (
            f"{counted(len(live), 'decision')} of control flow in the frozen graph ({listed(live)}) stayed live in every "
            "condition: made from the input, not from the fed coefficients, which no condition reassigned")))
    if not measured and any(num((conditions.get(n) or {}).get("delta_mse")) is not None for n in reg.reassignments()):
        return _from_mse(replay, conditions, evidence)
    if not measured:
        return _from_outputs(replay, conditions, evidence)
    gap_words = ""
    if no_gap:
        how = ("does as well as the correct coefficients or better" if global_gap <= -MATERIAL_NATS else
               "does as well as the correct coefficients" if global_gap < MATERIAL_NATS else
               "is not measurably worse than the correct coefficients")
        gap_words = f"; one global mean {how}, so no gap is left for a profile"
    elif num(gap.get(reg.STATIC_LAYER)) is not None:
        share, (lo, hi) = num(gap[reg.STATIC_LAYER]), interval(gap_ci.get(reg.STATIC_LAYER))
        if hi is not None and hi < 0:
            gap_words = (f"; a static per-layer profile does worse than one global mean (it keeps {pct(share)} of "
                         "what the coefficients contribute over it)")
        elif lo is not None and lo <= 0:
            gap_words = (f"; a static per-layer profile keeps no measurable part of what the coefficients "
                         f"contribute over one global mean ({pct(share)}, {pct(CONFIDENCE, None)} CI {pct(lo)} to {pct(hi)})")
        else:
            gap_words = (f"; a static per-layer profile keeps {pct(share)} of what the coefficients contribute "
                         "over one global mean")
    if hurts:
        parts = [f"{n.replace('_', '-')} +{fmt(conditions[n]['delta_nll'])} nats" for n in hurts]
        return Finding(YES, (f"Yes: giving the frozen model other coefficients makes it worse "
                             f"({', '.join(parts)}){gap_words}."), tuple(evidence))
    fed = " or ".join(reg.REGISTRY[n].words for n in measured)
    unfed = (f" ({counted(len(live), 'decision')} of control flow stayed live, made from the input: their "
             "controllers were not frozen)") if live else ""
    lowered = ""
    if helps:  # the model's outputs depend on its coefficients, but not as a controller that helps would
        parts = [f"{n.replace('_', '-')} {signed(conditions[n]['delta_nll'])} nats" for n in helps]
        lowered = (f"; it lowers it measurably ({', '.join(parts)}): the outputs do change with the "
                   "coefficients, and these inputs do better with coefficients that are not their own")
    else:  # the NLL does not move, yet the output distribution may: say so, with the KL as evidence
        moved = _moved_kl(conditions, measured, evidence)
        if moved:
            lowered = (f"; its output distribution does move (KL from correct: {moved}), without a "
                       "measurable cost in NLL")
    return Finding(NO, (f"No: feeding the frozen model {fed} raises its NLL by no measurable amount above "
                        f"{MATERIAL_NATS:g} nats{lowered}{gap_words}{unfed}."), tuple(evidence))


def _moved_kl(conditions: dict, names: list[str], evidence: list) -> str:
    """The reassignments among `names` whose KL from correct lies wholly above MATERIAL_NATS, in
    words ("" if none), each added to `evidence`."""
    parts = []
    for name in names:
        c = conditions.get(name) or {}
        value, (lo, hi) = num(c.get("kl")), interval(c.get("kl_ci"))
        if value is not None and lo is not None and lo > MATERIAL_NATS:
            evidence.append(_moved("kl", name, value, lo, hi))
            parts.append(f"{name.replace('_', '-')} {value:.3g} nats")
    return ", ".join(parts)


def _moved(key: str, name: str, value: float, lo: float | None, hi: float | None) -> Evidence:
    """How far condition `name` moved the output from the correct one: its KL (`key` "kl") or
    mean squared difference, with its interval."""
    ci = f" ({pct(CONFIDENCE, None)} CI {sig(lo, 3)} to {sig(hi, 3)})" if lo is not None and hi is not None else ""
    what = "KL from correct" if key == "kl" else "mean squared difference from the correct output"
    return Evidence("replay", f"{what}, {name} = {value:.3g}{' nats' if key == 'kl' else ''}{ci}")


def _from_outputs(replay: dict, conditions: dict, evidence: list) -> Finding:
    """The answer where no condition has a ΔNLL (the data has no token ids, labels or targets to
    score a loss against): from how far the outputs moved from the `correct` ones. KL, for
    logits, is in nats as ΔNLL is and has its threshold; a mean squared difference has no scale
    to call a change material, nor says whether a change hurts."""
    reg = conditions_registry()
    key = moved_key({n: conditions.get(n) for n in reg.reassignments()})
    moved, measured = [], []
    for name in reg.reassignments():
        c = conditions.get(name) or {}
        value = num(c.get(key))
        if value is None:
            continue
        measured.append(name)
        lo, hi = interval(c.get(f"{key}_ci"))
        evidence.append(_moved(key, name, value, lo, hi))
        if (lo if lo is not None else value) > (MATERIAL_NATS if key == "kl" else 0.0):
            moved.append(name)
    if not measured:
        return Finding(NOT_MEASURED, "Not measured: the replay reported no cross-input or token-shuffle condition.",
                       tuple(evidence))
    output = (replay.get("task") or {}).get("output", "?")
    why = ((replay.get("settings") or {}).get("no_nll")  # sequences of one token: no next token
           or f"the data has no labels or targets to score {output!r} against")
    no_loss = f"{why}, so no ΔNLL says whether it gets worse"
    fed = " or ".join(reg.REGISTRY[n].words for n in measured)
    if key == "kl" and moved:
        parts = ", ".join(f"{n.replace('_', '-')} {fmt(conditions[n]['kl'])} nats" for n in moved)
        return Finding(YES, (f"Yes: giving the frozen model other coefficients changes its output distribution "
                             f"(KL from correct: {parts}); {no_loss}."), tuple(evidence))
    if key == "kl":
        return Finding(NO, (f"No: feeding the frozen model {fed} changes its output distribution by no measurable "
                            f"amount above {MATERIAL_NATS:g} nats of KL; {no_loss}."), tuple(evidence))
    how = "moved measurably" if moved else "did not move measurably"
    return Finding(NOT_MEASURED, (f"Not measured: {no_loss}, and {output!r} is not a distribution, so no KL either; fed "
                                  f"{fed}, its values {how} (mean squared difference in the evidence)."),
                   tuple(evidence))


def _from_mse(replay: dict, conditions: dict, evidence: list) -> Finding:
    """The answer where the loss is the MSE against the data's `targets` (a regression output or a
    probability map): a reassignment hurts when its ΔMSE interval lies wholly above MATERIAL_MSE_SHARE
    of the correct condition's MSE (an MSE has the targets' units, so the threshold is relative)."""
    reg = conditions_registry()
    base = num((conditions.get(reg.CORRECT) or {}).get("mse"), 0.0)
    floor = MATERIAL_MSE_SHARE * base
    hurts, measured = [], []
    for name in reg.reassignments():
        c = conditions.get(name) or {}
        if num(c.get("delta_mse")) is None:
            continue
        measured.append(name)
        lo, hi = interval(c.get("delta_mse_ci"))
        evidence.append(Evidence("replay", f"ΔMSE {name} = {signed(c['delta_mse'])} against the targets"
                                           f"{ci_text(lo, hi)} (correct: MSE {fmt(base)})"))
        if (lo if lo is not None else num(c["delta_mse"])) > floor:
            hurts.append(name)
    output = (replay.get("task") or {}).get("output", "?")
    if hurts:
        parts = ", ".join(f"{n.replace('_', '-')} {signed(conditions[n]['delta_mse'])}" for n in hurts)
        return Finding(YES, (f"Yes: giving the frozen model other coefficients makes its MSE against the targets "
                             f"worse ({parts}, from {fmt(base)} with its own; output {output!r})."), tuple(evidence))
    fed = " or ".join(reg.REGISTRY[n].words for n in measured)
    return Finding(NO, (f"No: feeding the frozen model {fed} raises its MSE against the targets by no measurable "
                        f"amount above {pct(MATERIAL_MSE_SHARE)} of its own ({fmt(base)}; output {output!r})."),
                   tuple(evidence))
