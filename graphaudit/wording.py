"""Numbers read from the audit's JSON parts and written as text, for the verdict and the reports.

The parts' documents may hold None, NaN, text or booleans where a number is missing; `num`
turns each into a float or a default, and the writers print "?" for what is missing.
"""

from __future__ import annotations

import math


def num(value, default=None):
    """`value` as a float, or `default` for None, booleans, text and NaN."""
    if isinstance(value, bool) or value is None:
        return default
    try:
        x = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(x) else x


def median(value):
    """A latency given as a number or as a spread {"median", "p10", "p90"}."""
    return num(value.get("median")) if isinstance(value, dict) else num(value)


def interval(ci) -> tuple[float | None, float | None]:
    """(low, high) of a confidence interval given as [lo, hi] or {"low", "high"}."""
    if isinstance(ci, dict):
        ci = (ci.get("low", ci.get("lo")), ci.get("high", ci.get("hi")))
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        return num(ci[0]), num(ci[1])
    return None, None


DASH = "—"  # a table cell's missing number


def fmt(value, digits: int | None = None, *, missing: str = "?") -> str:
    """`value` in fixed point: `digits` decimals, or (None) four under 10 and one from 10 on."""
    x = num(value)
    if x is None:
        return missing
    if digits is None:
        digits = 4 if abs(x) < 10 else 1
    return f"{x:.{digits}f}"


def signed(value, digits: int = 4, *, missing: str = "?") -> str:
    """`value` in fixed point with its sign, "+0.0123"."""
    x = num(value)
    return missing if x is None else f"{x:+.{digits}f}"


def sig(value, digits: int = 4, *, missing: str = "?") -> str:
    """`value` to `digits` significant digits, "0.01234"."""
    x = num(value)
    return missing if x is None else f"{x:.{digits}g}"


def num_text(value) -> str:
    """`value` in scientific notation, "1.23e-05"."""
    x = num(value)
    return "?" if x is None else f"{x:.2e}"


def si(value, *, units: str = "TGMk", sep: str = " ", missing: str = "-") -> str:
    """A count with the largest of `units` (T, G, M, k) it reaches: "1.25 G"; under 1000, whole."""
    if value is None:
        return missing
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if unit in units and abs(value) >= scale:
            return f"{value / scale:.2f}{sep}{unit}"
    return f"{value:.0f}"


# The confidence level of every interval the replay reports (its bootstrap's percentile interval)
CONFIDENCE = 0.95
NOISE = 1e-9  # a share smaller than this is float64 rounding, not a measurement


def pct(value, digits: int | None = 1, *, missing: str = "?", small: bool = True, whole: bool = False) -> str:
    """A share as a percentage with `digits` decimals ("12.3%"; None: as few as it needs, "97.5%").

    `small`: a share under 0.1% keeps two significant digits ("0.0052%") and one under NOISE
    reads "0%" (the verdict's sentences); else it rounds like any other ("0.0%", the tables).
    `whole`: exactly 0 and 1 read "0%" and "100%" (the profile's fractions of inputs and nodes).
    """
    x = num(value)
    if x is None:
        return missing
    if whole and x in (0, 1):
        return f"{x + 0.0:.0%}"
    if digits is None:
        return f"{x * 100:g}%"
    # + 0.0: a share that rounds to zero is "0%", whatever its sign ("-0%" read as a loss); below
    # NOISE, a share is the rounding of a sum that is zero (4.3e-14% of a variance)
    if small and abs(x) < NOISE:
        return "0%"
    if small and abs(x) < 0.001:
        return f"{x * 100 + 0.0:.2g}%"
    return f"{round(x * 100, digits) + 0.0:.{digits}f}%"


def ci_text(lo, hi) -> str:
    """" (95% CI +0.0100 to +0.0200)" after a figure, or "" without an interval."""
    return "" if lo is None or hi is None else f" ({pct(CONFIDENCE, None)} CI {lo:+.4f} to {hi:+.4f})"


def bracketed(ci, digits: int = 4, *, percent: bool = False, missing: str = DASH) -> str:
    """An interval [lo, hi] as "[+0.0100, +0.0200]" (signed, or as percentages), or `missing`."""
    lo, hi = interval(ci)
    if lo is None or hi is None:
        return missing
    if percent:
        return f"[{pct(lo, digits, small=False)}, {pct(hi, digits, small=False)}]"
    return f"[{signed(lo, digits)}, {signed(hi, digits)}]"


# The option that sets a profile's sample of the inputs, as each command names it
SAMPLE_OPTION = "--sample (run's --profile-sample)"
# What decides more where a profile's sample of the inputs cannot
LARGER_SAMPLE = f"a larger sample, {SAMPLE_OPTION}"
# Why a profile's inputs are alike (profile.baseline.same_work): their sample is the fewest, and
# those it leaves out widen nothing
SAME_WORK_WORDS = ("every input does the same work in each graph timed (nothing in it depends on input values, "
                   "and every input has the same shapes)")


def drawn(sample: int) -> str:
    """How the profile's sample of `sample` inputs was drawn, in words (profile.rounds.sample_rows)."""
    return f"one drawn at random from each of {sample:.0f} equal stretches of them"


def counted(n: int, noun: str) -> str:
    """"1 block", "3 blocks"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def listed(names, most: int = 3) -> str:
    """"`a`, `b`, `c` and 2 more": the first `most` names, quoted, and how many are left."""
    names = list(names)
    shown = ", ".join(f"`{n}`" for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def flops_cell(flops, uncounted, every_row, full, skippable, show) -> str:
    """A block's FLOPs, each count written by `show`: one count where its least run is its most
    (experts that take every routed row); "≥ n, ≤ m" with every row of a value-dependent
    selection selected; "≥" where compute of unknown size is left out; a fixed capacity's full
    size after its count."""
    if every_row is not None and skippable == 0:
        return show(every_row)
    if every_row is not None:
        return (f"≥ {show(flops)}, " if flops else "") + f"≤ {show(every_row)}"
    return ("≥ " if uncounted else "") + show(flops) + (f" ({show(full)} at full size)" if full is not None else "")


def total_bound(every_row: bool, unknown: bool, skippable) -> str | None:
    """How a FLOP total stands to the runs of the graph: "most" (counted with every row of each
    value-dependent selection selected, where some input runs less), "least" (compute of unknown
    size left out), or None: one count, or neither bound with both."""
    if every_row:
        return "most" if not unknown and skippable else None
    return "least" if unknown else None


# Why a frozen graph may refuse coefficients it was not exported with
TRACED_SIZES = "a graph exported by tracing can hold sizes that fit only the routing it was traced with"


def moved_key(conditions) -> str:
    """Which figure of a replay's conditions says how far each moved the output from the correct
    one: "kl" for logits, else "mse_from_correct" (`ReplayReport.to_json` names it by the task)."""
    return "kl" if any("kl" in (c or {}) for c in conditions.values()) else "mse_from_correct"
