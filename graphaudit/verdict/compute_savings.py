"""The verdict's fourth question: is the model faster than the dense baseline, and does it
execute fewer FLOPs? (`compute_savings`, from the profile against the baseline)

The answer rests on timing, so it is decided on the interval of the workload ratio over the
timed rounds (profile/baseline.py), not on its median: "yes" where the whole interval is at
or below SAVINGS_RATIO_MAX, "no" where it is wholly above, "inconclusive" where it straddles
it (or there is none), so that another run of the same inputs does not turn a yes into a no.
Where the profile ran on a sample of the inputs none of which skipped or shrank a block the graph
lets be skipped or shrunk (conditional execution inconclusive), the inputs left out can only run
less than the sample did: a "yes" stands, a "no" is inconclusive. Where every sampled input skipped
the same such blocks, the others may run them: a "yes" is inconclusive, and a "no" too unless the
sample skipped every one of them.
"""

from __future__ import annotations

from graphaudit.profile.settings import FEWEST_TIMED_ROUNDS, SAVINGS_RATIO_MAX
from graphaudit.profile.what_ran import per_input, profiled_sample
from graphaudit.verdict.conditional_execution import conditional_execution, skippable_blocks
from graphaudit.verdict.findings import INCONCLUSIVE, NO, NOT_MEASURED, YES, Evidence, Finding
from graphaudit.wording import LARGER_SAMPLE, SAME_WORK_WORDS, drawn, fmt, listed, median, num, pct

SAME_WORK = 0.995  # executed FLOPs at least this share of the baseline's: no less work done


def compute_savings(static: dict | None, profile: dict | None, baseline_flops: float | None = None,
                    execution: Finding | None = None) -> Finding:
    """Is the model faster than the baseline (and does it execute fewer FLOPs)? `execution`: the
    conditional-execution finding of the same documents, where it was already made."""
    if profile is None:
        return Finding(NOT_MEASURED, "Not measured: the model was not profiled.")
    latency = median(profile.get("latency_ms"))
    baseline = profile.get("baseline") or {}
    ratio = num(baseline.get("ratio"))
    if ratio is None:
        return Finding(NOT_MEASURED, (
            "Not measured: no baseline was given to compare against"
            + (f" (median latency {fmt(latency)} ms)." if latency is not None else ".")))
    name = baseline.get("model") or "the baseline"
    batch = num(profile.get("batch_size")) or 1  # a profiled run: one input, or a model's fixed batch
    per = "per input" if batch == 1 else f"per batch of {batch:.0f}"
    spread = baseline.get("ratio_spread") or {}
    spread_text = (f", p10–p90 {_ratio(spread['p10'])}–{_ratio(spread['p90'])}× over inputs and rounds"
                   if num(spread.get("p10")) is not None and num(spread.get("p90")) is not None else "")
    evidence = [Evidence("profile", (
        f"median latency {fmt(latency)} ms against {name}'s {fmt(median(baseline.get('latency_ms')))} ms, "
        f"workload ratio {_ratio(ratio)}× (each {'input' if batch == 1 else 'batch'}'s median of model over "
        f"baseline run by run, weighted by the baseline's latency){spread_text} "
        f"(paired rounds on {profile.get('provider', 'the runtime')})"))]
    interval = baseline.get("ratio_interval") or {}
    rounds = num(interval.get("rounds"))
    if rounds is not None:
        few = (f"; from fewer than {FEWEST_TIMED_ROUNDS} rounds, the fewest the profile runs where it chooses, "
               "the interval holds the ratio less often than its level says (from 3, about 3 times in 4)"
               if 1 < rounds < FEWEST_TIMED_ROUNDS else "")
        evidence.append(Evidence("profile", (
            f"the answer is decided on the ratio's interval over the {rounds:.0f} timed rounds{_sampled(profile, interval)}, "
            f"not on its median, so that another run of the same inputs does not turn it{few}{_stopped(profile)}")))
    flops_words = ""
    executed = num(profile.get("flops_executed"))
    full = num(((static or {}).get("flops") or {}).get("total"))
    if executed is not None and baseline_flops:
        flops_words = f"; it executes {executed / baseline_flops:.2f}× the baseline's FLOPs"
        evidence.append(Evidence("profile", (
            f"executed FLOPs {per}: {executed:,.0f} (measured) against the baseline's {baseline_flops:,.0f} "
            f"(its graph at the same input shape): {executed / baseline_flops:.2f}×")))
    elif executed is not None:
        evidence.append(Evidence("profile", f"executed FLOPs {per}: {executed:,.0f}"
                                 + (f", {pct(executed / full, 0, small=False)} of the graph's full count" if full else "")))
    elif full is not None:
        evidence.append(Evidence("static", f"FLOPs {per} in the graph: {full:,.0f}; executed FLOPs not counted"))
    low, high, level = decision_interval(baseline)
    words = _latency_words(ratio, low, high, level)
    answer = savings_answer(low, high)
    alike = _skipped_alike(static, profile)
    if alike is not None and (answer == YES or (answer == NO and alike[1])):
        sample, inputs = profiled_sample(profile) or (0, 0)
        skipped, ran = alike
        may = (f"the others may run {listed(sorted(skipped))}, so the workload may be slower than the sample"
               if answer == YES else
               f"the others may skip {listed(sorted(ran))} too, so the workload may be faster than the sample")
        return Finding(INCONCLUSIVE, (
            f"Inconclusive: {words}{flops_words}, but on a sample of {sample} of the {inputs} inputs, every one of "
            f"which skipped {listed(sorted(skipped))} alike: {may} ({LARGER_SAMPLE}, decides more)."),
            tuple(evidence))
    if answer == YES:
        if executed is not None and baseline_flops and executed >= SAME_WORK * baseline_flops:
            flops_words += (", so the time is saved in how the work runs (kernels, fusion, layout), "
                            "not by skipping any of it")
        return Finding(YES, f"Yes: {words}{flops_words}.", tuple(evidence))
    needs = f"a saving needs the workload ratio's interval at or below {SAVINGS_RATIO_MAX:.2f}×"
    if answer == NO and (execution or conditional_execution(static, profile)).answer == INCONCLUSIVE:
        # no sampled input skipped a block the graph lets be skipped: the others can only run less
        sample, inputs = profiled_sample(profile) or (0, 0)
        return Finding(INCONCLUSIVE, (
            f"Inconclusive: {words}{flops_words}, but on a sample of {sample} of the "
            f"{inputs} inputs, none of which skipped or shrank a block the graph lets be "
            "skipped or shrunk: the others may, and can only run less, so the workload may be faster than the "
            f"sample ({LARGER_SAMPLE}, decides more)."), tuple(evidence))
    if answer == NO:
        return Finding(NO, f"No: {words}{flops_words}; {needs}.", tuple(evidence))
    why = ("a single timed round gives no interval" if low is None else
           f"the interval straddles the {SAVINGS_RATIO_MAX:.2f}× a saving needs")
    if low is not None and high is not None and _mostly_sampling(low, high, baseline.get("ratio_interval") or {}):
        return Finding(INCONCLUSIVE, (
            f"Inconclusive: {words}{flops_words}; the sample of the inputs cannot decide, as {why}, and most of "
            f"its width is what the inputs left out of the sample could change ({LARGER_SAMPLE}, may decide)."),
            tuple(evidence))
    return Finding(INCONCLUSIVE, (
        f"Inconclusive: {words}{flops_words}; the timing cannot decide, as {why} (more timed rounds, --runs, "
        "fewer threads competing for the cores, --threads, or a quieter machine may)."), tuple(evidence))


def _skipped_alike(static: dict | None, profile: dict) -> tuple[set[str], set[str]] | None:
    """(the blocks the graph lets be skipped or shrunk that every sampled input skipped, those of
    them it ran) where the profile ran on a sample of the inputs, each of which ran the same blocks,
    some such block skipped; else None. Such a sample shows none of the variation the graph allows,
    so the interval's widening for the inputs left out has nothing to go on."""
    runs = per_input(profile)
    if profiled_sample(profile) is None or not runs:
        return None
    ran = {frozenset(str(b) for b in r.get("blocks_ran") or ()) for r in runs}
    skippable = set(skippable_blocks(static))
    if len(ran) != 1 or not skippable - next(iter(ran)):
        return None
    common = next(iter(ran))
    return skippable - common, skippable & common


def _stopped(profile: dict) -> str:
    """Where the timed rounds stopped once the answer was decided, that they did, in words."""
    ran = profile.get("rounds") or {}
    at = num(ran.get("decide_at"))
    if ran.get("stop") != "decided" or at is None:
        return ""
    return (f"; the rounds stopped once it was decided, when a wider interval than this one, read for having "
            f"checked after each few rounds, lay on one side of {at:.2f}×")


def _mostly_sampling(low: float, high: float, interval: dict) -> bool:
    """Whether the inputs left out of the sample (`sampling_halfwidth`) make up more of the
    interval's width than the rounds' noise, which it was added to in quadrature."""
    sampling = num(interval.get("sampling_halfwidth"))
    half = (high - low) / 2
    return bool(sampling) and sampling * sampling > half * half - sampling * sampling


def savings_answer(low: float | None, high: float | None, threshold: float = SAVINGS_RATIO_MAX) -> str:
    """YES when the ratio's interval [low, high] lies at or below `threshold`, NO when it lies
    wholly above it, INCONCLUSIVE when it straddles it or is missing (None ends)."""
    if low is None or high is None:
        return INCONCLUSIVE
    if high <= threshold:
        return YES
    return NO if low > threshold else INCONCLUSIVE


def _sampled(profile: dict, interval: dict) -> str:
    """How the interval stands for the inputs: every one kept, or a sample's and what the inputs
    left out of it could change."""
    sampled = profiled_sample(profile)
    if sampled is None:
        return " (a bootstrap that keeps every input)"
    sample, inputs = sampled
    where = f", on {sample} of the {inputs} inputs, {drawn(sample)}"
    if "sampling_halfwidth" not in interval:  # a document written before the inputs left out were counted
        return where + " (a bootstrap that keeps every sampled input)"
    if interval.get("inputs_alike"):
        return (where + f" (a bootstrap that keeps every sampled input; {SAME_WORK_WORDS}, so the "
                f"{inputs - sample} left out could change only the noise the rounds hold: not widened)")
    widen = num(interval.get("sampling_halfwidth"))
    if widen is None:
        return where + f"; one input cannot say what the {inputs - sample} left out would change, so there is none"
    return (where + f" (a bootstrap that keeps every sampled input, each side widened by ±{widen:.3f} for what "
            f"the {inputs - sample} left out could change: the sampled inputs' ratios spread as a random sample's, "
            f"Student's t with {sample - 1} degrees of freedom)")


def decision_interval(baseline: dict) -> tuple[float | None, float | None, float | None]:
    """The (low, high, level) interval of the ratio the answer is decided on: the document's
    `ratio_interval`; where a document has none (written before it was), its p10–p90 spread,
    and failing that the ratio itself."""
    interval = baseline.get("ratio_interval")
    if isinstance(interval, dict):
        return num(interval.get("low")), num(interval.get("high")), num(interval.get("level"))
    spread = baseline.get("ratio_spread") or {}
    if num(spread.get("p10")) is not None and num(spread.get("p90")) is not None:
        return num(spread["p10"]), num(spread["p90"]), 0.8
    ratio = num(baseline.get("ratio"))
    return ratio, ratio, None


def _latency_words(ratio: float, low: float | None, high: float | None, level: float | None) -> str:
    """The latency ratio in words with its interval, calling it slower or faster only when the
    interval lies on that side of 1×."""
    change = abs(ratio - 1) * 100  # in percent
    within = "" if level is None or low is None or high is None else (
        f", {pct(level, 0, small=False)} interval {_ratio(low)}–{_ratio(high)}×")
    clear = low is not None and high is not None and (low > 1.0 if ratio > 1 else high < 1.0)
    if change < 0.05 or not clear:
        return f"no clear difference from the baseline (workload time {_ratio(ratio)}× the baseline's{within})"
    return (f"{pct(abs(ratio - 1), small=False)} {'slower' if ratio > 1 else 'faster'} than the baseline "
            f"(workload time {_ratio(ratio)}× the baseline's{within})")


def _ratio(ratio: float) -> str:
    """Two decimals, three where two would round onto an edge the verdict tests (the saving
    threshold, 1×) from the other side."""
    near = any(f"{ratio:.2f}" == f"{edge:.2f}" and ratio != edge for edge in (SAVINGS_RATIO_MAX, 1.0))
    return f"{ratio:.3f}" if near else f"{ratio:.2f}"
