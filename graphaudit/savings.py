"""The verdict's fourth question: is the model faster than the dense baseline, and does it
execute fewer FLOPs? (`compute_savings`, from the profile against the baseline)"""

from __future__ import annotations

from graphaudit.findings import NO, NOT_MEASURED, YES, Evidence, Finding
from graphaudit.wording import fmt, median, num

# Faster than the baseline means a workload time (each input's median, summed) below this fraction of the baseline's.
SAVINGS_RATIO_MAX = 0.95
SAME_WORK = 0.995  # executed FLOPs at least this share of the baseline's: no less work done


def compute_savings(static: dict | None, profile: dict | None, baseline_flops: float | None = None) -> Finding:
    """Is the model faster than the baseline (and does it execute fewer FLOPs)?"""
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
    spread_text = (f", p10–p90 {_ratio(spread['p10'])}–{_ratio(spread['p90'])}×"
                   if num(spread.get("p10")) is not None and num(spread.get("p90")) is not None else "")
    evidence = [Evidence("profile", (
        f"median latency {fmt(latency)} ms against {name}'s {fmt(median(baseline.get('latency_ms')))} ms, "
        f"workload ratio {_ratio(ratio)}× (each {'input' if batch == 1 else 'batch'}'s median, summed){spread_text} "
        f"(paired rounds on {profile.get('provider', 'the runtime')})"))]
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
                                 + (f", {executed / full:.0%} of the graph's full count" if full else "")))
    elif full is not None:
        evidence.append(Evidence("static", f"FLOPs {per} in the graph: {full:,.0f}; executed FLOPs not counted"))
    low, high = num(spread.get("p10")), num(spread.get("p90"))
    words = _latency_words(ratio, low, high)
    if ratio <= SAVINGS_RATIO_MAX and (high is None or high < 1.0):
        if executed is not None and baseline_flops and executed >= SAME_WORK * baseline_flops:
            flops_words += (", so the time is saved in how the work runs (kernels, fusion, layout), "
                            "not by skipping any of it")
        return Finding(YES, f"Yes: {words}{flops_words}.", tuple(evidence))
    return Finding(NO, f"No: {words}{flops_words}; a saving needs a workload ratio of at most {SAVINGS_RATIO_MAX:.2f}× "
                       "with the spread below 1×.", tuple(evidence))


def _latency_words(ratio: float, low: float | None, high: float | None) -> str:
    """The latency ratio in words, calling it slower or faster only when the spread agrees."""
    change = abs(ratio - 1) * 100
    spread = f", p10–p90 {_ratio(low)}–{_ratio(high)}×" if low is not None and high is not None else ""
    clear = low is None or high is None or (low > 1.0 if ratio > 1 else high < 1.0)
    if change < 0.05 or not clear:
        return f"no clear difference from the baseline (workload time {_ratio(ratio)}× the baseline's{spread})"
    return (f"{change:.1f}% {'slower' if ratio > 1 else 'faster'} than the baseline "
            f"(workload time {_ratio(ratio)}× the baseline's{spread})")


def _ratio(ratio: float) -> str:
    """Two decimals, three where two would round onto an edge the verdict tests (the saving
    threshold, 1×) from the other side."""
    near = any(f"{ratio:.2f}" == f"{edge:.2f}" and ratio != edge for edge in (SAVINGS_RATIO_MAX, 1.0))
    return f"{ratio:.3f}" if near else f"{ratio:.2f}"
