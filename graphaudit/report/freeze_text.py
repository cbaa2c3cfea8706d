"""`graphaudit freeze`'s report as terminal text: the coefficients frozen and the graphs written."""

from __future__ import annotations

from collections.abc import Sequence

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.replay.frozen_files import WrittenGraphs


def render_text(written: WrittenGraphs, coefficients: Sequence[Coefficient], link: bool = False) -> str:
    """Return what `graphaudit freeze` wrote, as terminal text; `link`: its weights were hard-linked."""
    n = len(coefficients)
    lines = [f"{n} coefficient tensors ({', '.join(sorted({c.family for c in coefficients}))})",
             f"trace graph:  {written.trace}  (+{n} outputs)",
             f"frozen graph: {written.frozen}  (+{n} inputs, {len(written.freezing.removed)} controller nodes removed)"]
    if written.placed:
        how = "hard-linked, or copied where a link cannot be made" if link else "copied"
        lines.append(f"weights: {', '.join(written.placed)} beside them ({how})")
    return "\n".join(lines)
