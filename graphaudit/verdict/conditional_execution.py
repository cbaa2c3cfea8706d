"""The verdict's third finding: can any block be skipped or shrunk (graph), was any (runtime), and
who decides what runs (the model, or only the caller's switches)."""

from __future__ import annotations

from dataclasses import replace

from graphaudit.profile.what_ran import left_out, profiled_blocks, profiled_inputs, profiled_sample, reduction
from graphaudit.verdict.findings import INCONCLUSIVE, NO, NOT_MEASURED, YES, Evidence, Finding
from graphaudit.vocabulary import SAVES_COMPUTE
from graphaudit.wording import LARGER_SAMPLE, counted, drawn, listed, num, pct

MODEL, CALLER = "model", "caller"  # who decides conditional execution (`analyses.decisions`)


def conditional_execution(static: dict | None, profile: dict | None) -> Finding:
    """Can any block be skipped or shrunk (graph), and was any (runtime)? A "yes" says who decides:
    the model (dynamic inference), or only the caller, whose switches choose between branches of
    different compute (a voice detector's sample rate) where the model itself skips nothing."""
    found = _model_execution(static, profile)
    if found.answer == YES:
        return replace(found, decided_by=MODEL)
    switches = _callers_switches(static)
    if found.answer == NO and switches:
        rest = found.statement.removeprefix("No: ")
        return Finding(YES, (f"Yes, by the caller's choice only: {'; '.join(switches[:3])} "
                             f"choose{'s' if len(switches) == 1 else ''} between branches of different compute; the "
                             f"model itself decides nothing of what runs: {rest[:1].lower()}{rest[1:]}"),
                       found.evidence, CALLER)
    return found


def skippable_blocks(static: dict | None) -> dict[str, str]:
    """Name -> verdict of the blocks the static document's graph lets be skipped or shrunk
    (SAVES_COMPUTE), in its order."""
    return {str(b.get("name")): str(b.get("verdict")) for b in (static or {}).get("blocks") or []
            if b.get("verdict") in SAVES_COMPUTE}


def _model_execution(static: dict | None, profile: dict | None) -> Finding:
    """Whether the model skipped or shrank any block (graph and runtime), as `conditional_execution` says it."""
    evidence = []
    skippable: list[str] = []
    at_capacity: list[str] = []  # skippable blocks that run at a fixed capacity: one size on every input
    if static is not None:
        blocks = static.get("blocks") or []
        counts: dict[str, int] = {}
        for b in blocks:
            counts[b.get("verdict", "?")] = counts.get(b.get("verdict", "?"), 0) + 1
        skippable = [f"{name} ({verdict})" for name, verdict in skippable_blocks(static).items()]
        summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "no blocks found"
        evidence.append(Evidence("static", f"{counted(len(blocks), 'block')}: {summary}"))
        if skippable:
            evidence.append(Evidence("static", "can be skipped or shrunk: " + ", ".join(skippable)))
        flops = static.get("flops") or {}
        share = num(flops.get("skippable_share"))
        capacity = flops.get("fixed_capacity") or {}
        at_capacity = [name for name in skippable_blocks(static) if name in set(capacity.get("blocks") or [])]
        # A zero share beside skippable blocks means their sizes were unknown, or that they run at a
        # fixed capacity on every input (said below), not that input values could save nothing.
        if share is not None and (share > 0 or not skippable):
            evidence.append(Evidence("static", (
                f"{pct(flops['skippable_share'])} of the graph's FLOPs sit where they can be skipped or shrunk "
                "(the most dynamic execution could save)")))
        if num(capacity.get("saving")) is not None and num(capacity.get("flops_full_size")):
            evidence.append(Evidence("static", (
                f"fixed capacity: {', '.join(capacity.get('blocks') or [])} run {num(capacity['flops']):,.0f} FLOPs "
                f"at their selected size against {num(capacity['flops_full_size']):,.0f} on every row, on every "
                "input alike")))
        for item in (static.get("outside_blocks") or [])[:2]:
            if isinstance(item, dict) and item.get("detail"):
                evidence.append(Evidence("static", f"outside the blocks: {item['detail']}"))
    reduced: list[str] = []
    fixed: list[str] = []  # the same part left out on every input, where no value decides it
    inputs = None
    if profile is not None:
        pblocks = profiled_blocks(profile)
        inputs = profiled_inputs(profile)
        verdicts = {b.get("name"): b.get("verdict") for b in (static or {}).get("blocks") or []}
        by_mode: list[str] = []  # run on some inputs only, as the caller's switches chose (`ran_by_mode`)
        for b in pblocks:
            how = reduction(b, verdicts.get(b.get("name")))
            if how:
                reduced.append(f"{b.get('name')} {how}")
            elif left_out(b):
                fixed.append(f"{b.get('name')} {left_out(b)}{_why_left_out(static, b.get('name'))}")
            elif b.get("ran_by_mode"):
                by_mode.append(str(b.get("name")))
        if fixed:
            evidence.append(Evidence("profile", (
                "the same on every input, so not the model's decision: " + "; ".join(fixed)
                + ("" if any(": " in f for f in fixed) else
                   " (a part the graph leaves out by a caller's switch, shapes or constants, e.g. an If on a shape)"))))
        if by_mode:
            evidence.append(Evidence("profile", (
                f"{listed(by_mode)} ran on some inputs only, on all or none of those whose switches went one way: "
                "the caller's choice of mode, not the model's")))
        if pblocks:
            evidence.append(Evidence("profile", (
                "blocks skipped or shrunk at run time: " + "; ".join(reduced)) if reduced else
                _ran_in_full(len(pblocks), len(fixed) + len(by_mode), at_capacity)
                + (f" ({_profiled_inputs(profile, inputs)})" if inputs else "")))
    if static is None and profile is None:
        return Finding(NOT_MEASURED, "Not measured: neither the graph nor the runtime was examined.")
    if reduced:
        where = "" if skippable or static is None else " (the graph analysis did not predict it)"
        return Finding(YES, (f"Yes: some blocks were skipped or shrunk at run time{where}: "
                             f"{'; '.join(reduced)}."), tuple(evidence))
    if profile is not None and profiled_blocks(profile):
        sampled = profiled_sample(profile)
        if skippable and len(at_capacity) == len(skippable):
            return Finding(NO, (f"No: {', '.join(at_capacity)} run at a fixed capacity, one size on every input "
                                "(which rows, the input decides), and no block was skipped or shrunk by its "
                                f"input on the profiled inputs{_left_unprofiled(sampled)}."), tuple(evidence))
        if skippable and sampled:
            return Finding(INCONCLUSIVE, (
                "Inconclusive: the graph lets some blocks be skipped or shrunk, and none was on the "
                f"{sampled[0]} profiled inputs, but they are a sample of the {sampled[1]}: the other "
                f"{sampled[1] - sampled[0]} did not run under the profiler, and a block that only some inputs skip "
                f"may skip on none of a sample ({LARGER_SAMPLE}, decides more)."), tuple(evidence))
        if skippable and not fixed:
            return Finding(NO, ("No: the graph lets some blocks be skipped or shrunk, but every block "
                                "ran in full on every profiled input."), tuple(evidence))
        if skippable:
            return Finding(NO, ("No: the graph lets some blocks be skipped or shrunk, but no input skipped or "
                                f"shrank any; what was left out is the same on every input: {'; '.join(fixed)}."),
                           tuple(evidence))
        if by_mode:
            return Finding(NO, (f"No: the model skipped or shrank no block; {listed(by_mode)} ran on some inputs "
                                f"only, as the caller's switches chose{_callers_words(static)}."), tuple(evidence))
        if fixed:
            return Finding(NO, ("No: every input ran the same nodes of every block, in the graph and at run "
                                f"time; what was left out is the same on every input: {'; '.join(fixed)}."),
                           tuple(evidence))
        return Finding(NO, "No: every block runs for every input, in the graph and at run time.", tuple(evidence))
    if static is not None and not skippable:
        return Finding(NO, ("No: the graph has no block that can be skipped or shrunk (no data-dependent "
                            "branch or token subset); not profiled at run time."), tuple(evidence))
    return Finding(NOT_MEASURED, ("Not measured: the graph lets some blocks be skipped or shrunk, but "
                                  "nothing was profiled at run time."), tuple(evidence))


def _profiled_inputs(profile: dict, inputs: int) -> str:
    """The profiled inputs in words: "32 inputs", or "4 of the 32 inputs, a sample"."""
    sampled = profiled_sample(profile)
    return f"{inputs} inputs" if sampled is None else f"{sampled[0]} of the {sampled[1]} inputs, {drawn(sampled[0])}"


def _left_unprofiled(sampled: tuple[int, int] | None) -> str:
    """Where the profile ran on a `sampled` (sample, inputs), that the others did not run under it
    ("" otherwise)."""
    if sampled is None:
        return ""
    return f" (a sample of {sampled[0]} of the {sampled[1]} inputs; the other {sampled[1] - sampled[0]} did not run under the profiler)"


def _ran_in_full(blocks: int, partly: int, at_capacity: list[str]) -> str:
    """How many of `blocks` ran in full on every input, `partly` of them not (left out or by mode)."""
    if at_capacity:
        return f"every one of {blocks} blocks ran the same on every profiled input ({', '.join(at_capacity)} at a " \
               "fixed capacity)"
    if not partly:
        return f"every one of {blocks} blocks ran in full on every profiled input"
    return f"{blocks - partly} of {blocks} blocks ran in full on every profiled input"


def _why_left_out(static: dict | None, block: str | None) -> str:
    """Why no profiled input ran (part of) `block`, in words: the If or Loop whose body holds it and
    who decides that (a caller's switch and its input, the input shapes, a constant); "" unknown."""
    for d in (static or {}).get("decisions") or []:
        if isinstance(d, dict) and block in (d.get("blocks") or []) and d.get("decided_by") != "model":
            names = ", ".join(f"`{n}`" for n in (d.get("sources") or [])[:3])
            why = {"caller": f"a switch the caller decides by {names or 'an input'}, which no profiled input set "
                             "to run it",
                   "shape": f"decided by the shapes of {names or 'the inputs'}, the same at these shapes",
                   "constant": "decided by a constant, the same for every input"}.get(d.get("decided_by", ""), "")
            return f": it lies inside {d.get('op', 'If')} `{d.get('node')}`, {why}" if why else ""
    return ""


def _callers_words(static: dict | None) -> str:
    """The caller's switches that decide which blocks run, in words ("" when none)."""
    found = _callers_switches(static)
    return (" (" + "; ".join(found[:3]) + "), not the model" if found else "")


def _callers_switches(static: dict | None) -> list[str]:
    """Each If or Loop the caller decides whose branches differ in compute, in words."""
    return [f"{d.get('op', 'If')} `{d.get('node')}` by {', '.join(f'`{n}`' for n in (d.get('sources') or [])[:3])}"
            for d in (static or {}).get("decisions") or []
            if isinstance(d, dict) and d.get("decided_by") == CALLER and d.get("conditional")]
