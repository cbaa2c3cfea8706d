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


def fmt(value) -> str:
    x = num(value)
    if x is None:
        return "?"
    return f"{x:.4f}" if abs(x) < 10 else f"{x:.1f}"


def num_text(value) -> str:
    x = num(value)
    return "?" if x is None else f"{x:.2e}"


def signed(value) -> str:
    x = num(value)
    return "?" if x is None else f"{x:+.4f}"


def ci_text(lo, hi) -> str:
    return "" if lo is None or hi is None else f" (95% CI {lo:+.4f} to {hi:+.4f})"


NOISE = 1e-9  # a share smaller than this is float64 rounding, not a measurement


def pct(value) -> str:
    x = num(value)
    if x is None:
        return "?"
    # + 0.0: a share that rounds to zero is "0%", whatever its sign ("-0%" read as a loss); below
    # NOISE, a share is the rounding of a sum that is zero (4.3e-14% of a variance)
    if abs(x) < NOISE:
        return "0%"
    return f"{round(x * 100, 1) + 0.0:.1f}%" if abs(x) >= 0.001 else f"{x * 100 + 0.0:.2g}%"


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
