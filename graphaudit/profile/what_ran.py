"""What a profile's JSON document says ran: its blocks and inputs, and whether a block was
skipped or shrunk as its input decides (the run-time half of conditional execution)."""

from __future__ import annotations

from graphaudit.vocabulary import SAVES_COMPUTE, SUBSET
from graphaudit.wording import num, pct


def profiled_blocks(profile: dict) -> list[dict]:
    """The profile's blocks, without its catch-all entries such as `(other)`."""
    return [b for b in profile.get("blocks") or [] if not str(b.get("name", "")).startswith("(")]


def profiled_sample(profile: dict) -> tuple[int, int] | None:
    """(inputs profiled, inputs there were) where the profile ran on a sample of them, else None."""
    ran = profile.get("rounds") or {}
    sample, total = num(ran.get("sample")), num(ran.get("inputs"))
    return (int(sample), int(total)) if sample is not None and total is not None and 0 < sample < total else None


def profiled_inputs(profile: dict) -> int | None:
    """How many inputs (batches) the profile ran."""
    for key in ("inputs", "inputs_count"):
        if isinstance(profile.get(key), int) and not isinstance(profile.get(key), bool):
            return profile[key]
    runs = per_input(profile)
    return len(runs) or None


def per_input(profile: dict) -> list[dict]:
    """The profile's per-input entries ({"index", "blocks_ran", ...})."""
    for key in ("per_input", "inputs"):
        if isinstance(profile.get(key), list):
            return [r for r in profile[key] if isinstance(r, dict)]
    return []


def reduction(block: dict, verdict: str | None = None) -> str | None:
    """How a profiled block was skipped or shrunk in a way its input decides, in words, or None.

    A reduction that differs between inputs counts (skipped on some, fewer nodes or FLOPs on
    some, shapes that change between same-shaped inputs). One that is the same on every input
    counts only where the graph says values decide it (`verdict` branch or subset: every profiled
    input happened to go the same way); elsewhere it is a choice fixed by shapes or constants,
    such as an If on a shape, the same for every input, and no conditional execution.
    """
    fraction = num(block.get("executed_fraction"))
    if fraction is not None and 0.0 < fraction < 1.0 and not block.get("ran_by_mode"):
        return f"ran on {pct(fraction)} of inputs"
    varying = shrunk(block)
    rows = picked(block) if verdict == SUBSET else None
    if varying and rows and any(num(k.get("min"), 1.0) < num(k.get("max"), 1.0) for k in _kept(block)):
        return rows  # what its selections kept, rather than how many nodes changed shape for it
    if varying or verdict not in SAVES_COMPUTE:
        return varying
    # the same on every input: a fixed capacity (which rows, the input decides), else a part left out
    return rows or left_out(block)


MOST_SELECTIONS = 3  # a block picking rows in more places (a MoE's experts) is told by its shapes instead


def _kept(block: dict) -> list[dict]:
    return [k for k in block.get("rows_kept") or [] if isinstance(k, dict)]


def picked(block: dict) -> str | None:
    """The shares of the rows a `subset` block's selections kept, in words, when they left some
    out (at most MOST_SELECTIONS of them)."""
    shares = [(num(k.get("min")), num(k.get("max"))) for k in _kept(block)]
    shares = [(low, high) for low, high in shares if low is not None and high is not None]
    if not shares or len(shares) > MOST_SELECTIONS or all(high >= 1.0 for _, high in shares):
        return None
    return rows_kept_text(shares)


def rows_kept_text(shares: list[tuple[float, float]]) -> str:
    """Words for the shares of rows a block's selections kept (least, most over inputs): the
    same on every input (a fixed capacity; which rows, the input decides) or varying."""
    fixed = all(high - low < 1e-9 for low, high in shares)
    parts = [pct(high) if high - low < 1e-9 else f"{pct(low)} to {pct(high)}" for low, high in shares]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    which = ("a selection that kept " if len(parts) == 1 else f"{len(parts)} selections that kept ") + listed
    each = "it picks" if len(parts) == 1 else "each picks"
    if fixed:
        return (f"ran behind {which} of the rows {each} from, the same on every input (a fixed capacity; the input "
                "decides which rows)")
    return f"ran behind {which} of the rows {each} from, as the input decides"


def left_out(block: dict) -> str | None:
    """What part of a block no profiled input ran, when it is the same part for all, in words."""
    if num(block.get("executed_fraction")) == 0.0:
        return "ran on none of the inputs"
    most = num((block.get("node_fraction") or {}).get("max"), 1.0)
    return f"ran {pct(most)} of its nodes on every input" if most < 1.0 else None


def shrunk(block: dict) -> str | None:
    """How a profiled block ran at a size that differs between inputs, in words, or None."""
    nodes = block.get("node_fraction") or {}
    low, high = num(nodes.get("min"), 1.0), num(nodes.get("max"), 1.0)
    flops = block.get("executed_flops") or {}
    few, most = num(flops.get("min")), num(flops.get("max"))
    if low < high and few is not None and most is not None and few < most:  # the work, beside the nodes
        return (f"ran only {pct(low)} of its nodes on some input ({pct(high)} on another): {few:,.0f} to "
                f"{most:,.0f} FLOPs")
    if low < high:
        return f"ran only {pct(low)} of its nodes on some input ({pct(high)} on another)"
    calls, loops = block.get("calls") or {}, block.get("iterations") or {}
    if block.get("calls_vary") and num(loops.get("min")) is not None and num(loops.get("max")) is not None:
        return f"ran its loop {loops['min']:,.0f} to {loops['max']:,.0f} iterations depending on the input"
    if block.get("calls_vary") and num(calls.get("min")) is not None and num(calls.get("max")) is not None:
        return f"ran its nodes {calls['min']:,.0f} to {calls['max']:,.0f} times in all depending on the input"
    # Only compute that changed size: a bookkeeping node (a NonZero counting positives, say) whose
    # shape follows the values leaves the block's work the same.
    varying = [v for v in block.get("value_dependent_shapes") or [] if not isinstance(v, dict) or v.get("compute", True)]
    if varying:
        return (f"ran at input-dependent sizes ({len(varying)} compute nodes changed shape between "
                "same-shaped inputs)")
    # among inputs fed the same shapes whose switches took the same branches (`flops_vary`; a
    # report written before it has only the spread over all inputs)
    varied = block.get("flops_vary", True)
    if varied and few is not None and most is not None and few < most:
        return f"executed between {few:,.0f} and {most:,.0f} FLOPs depending on the input"
    return None
