"""The runtime evidence held against each block's static verdict.

A static verdict says what the graph allows; the profile says what happened on the inputs
given. Per block, the outcome is one of:

- `confirmed`: the run matches the verdict (an `always` / `gated` / `masked` block ran in
  full at shape-set sizes on every input; a `branch` block was skipped or cut short on some
  input; a `subset` block ran at value-dependent sizes, or its selections kept only part of
  the rows, as a fixed capacity does on every input);
- `not_observed`: the graph allows skipping or shrinking, but these inputs never did it
  (the data may not exercise it);
- `contradicted`: the graph says every node always runs at shape-set sizes, yet the
  block was skipped, cut short or ran at value-dependent sizes (a static-analysis miss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphaudit.profile.execution import BlockExecution
from graphaudit.profile.what_ran import rows_kept_text
from graphaudit.vocabulary import BRANCH, SUBSET
from graphaudit.wording import pct


@dataclass(frozen=True)
class Agreement:
    """One block's static verdict and what the run made of it."""

    block: str
    verdict: str
    outcome: str  # confirmed | not_observed | contradicted
    detail: str

    def to_json(self) -> dict:
        return {"block": self.block, "static_verdict": self.verdict, "outcome": self.outcome, "detail": self.detail}


def compare_verdicts(static: Any, executed: tuple[BlockExecution, ...]) -> tuple[Agreement, ...]:
    """An Agreement for each block of `static` (a StaticReport) that the profile also saw."""
    seen = {b.name: b for b in executed}
    found = []
    for block in static.blocks:
        ex = seen.get(block.name)
        if ex is not None:
            found.append(_judge(block.name, block.verdict, ex))
    return tuple(found)


def _judge(name: str, verdict: str, ex: BlockExecution) -> Agreement:
    # Skipped as the input decides: on some inputs and not others, or more nodes on some than others.
    # (not where the caller's choice of mode, a switch's branch, decided it: `ran_by_mode`)
    varies = (0.0 < ex.executed_fraction < 1.0 and not ex.ran_by_mode) or ex.node_fraction.min < ex.node_fraction.max \
        or ex.calls_vary
    # The same part left out on every input: a branch no profiled input took, or one an If on a
    # shape never takes; only the graph's verdict tells them apart.
    always_less = not varies and (ex.executed_fraction == 0.0 or ex.node_fraction.max < 1.0)
    resized = any(v.compute for v in ex.value_dependent)  # bookkeeping that changes shape is no resizing
    kept = [(stats.min, stats.max) for _, stats in ex.rows_kept]
    picked = any(high < 1.0 for _, high in kept)  # some rows left out on every input
    facts = []
    if ex.executed_fraction < 1.0:
        facts.append(f"ran on {ex.inputs_executed} of {ex.inputs} inputs")
    elif ex.node_fraction.min < 1.0:
        where = "on some input" if varies else "on every input"
        facts.append(f"as little as {pct(ex.node_fraction.min, 0, small=False)} of its nodes ran {where}")
    if ex.calls_vary and ex.iterations is not None:
        facts.append(f"its loop ran {ex.iterations.min:.0f} to {ex.iterations.max:.0f} iterations, as the input decides")
    elif ex.calls_vary and ex.calls is not None:
        facts.append(f"its nodes ran {ex.calls.min:.0f} to {ex.calls.max:.0f} times in all, as the input decides")
    if resized:
        facts.append(f"{sum(v.compute for v in ex.value_dependent)} compute nodes ran at value-dependent shapes")
    if picked:
        facts.append(rows_kept_text(kept))
    seen = "; ".join(facts) or f"every node ran on every one of {ex.inputs} inputs at shape-set sizes"
    if verdict == BRANCH:
        outcome = "confirmed" if varies or always_less else "not_observed"
    elif verdict == SUBSET:
        outcome = "confirmed" if resized or varies or always_less or picked else "not_observed"
    else:
        outcome = "contradicted" if varies or resized else "confirmed"
    return Agreement(name, verdict, outcome, seen)
