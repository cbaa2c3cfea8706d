"""The answer to each of the verdict's questions: "yes", "no", "not measured" or, where a
measurement was made but its noise cannot decide (a latency ratio whose interval straddles the
threshold), "inconclusive"; a statement in plain words, and the measured facts (evidence) it
rests on."""

from __future__ import annotations

from dataclasses import dataclass

YES, NO, NOT_MEASURED, INCONCLUSIVE = "yes", "no", "not measured", "inconclusive"
ANSWERS = (YES, NO, NOT_MEASURED, INCONCLUSIVE)


@dataclass(frozen=True)
class Evidence:
    """One measured fact a finding rests on, and which part of the audit measured it."""

    source: str  # static | replay | profile
    text: str

    def to_json(self) -> dict:
        return {"source": self.source, "text": self.text}


@dataclass(frozen=True)
class Finding:
    """The answer to one of the four questions, in plain words, with its evidence."""

    answer: str
    statement: str
    evidence: tuple[Evidence, ...] = ()
    decided_by: str | None = None  # conditional execution's "yes": the model's own decision, or only the caller's

    def to_json(self) -> dict:
        doc = {"answer": self.answer, "statement": self.statement, "evidence": [e.to_json() for e in self.evidence]}
        if self.decided_by is not None:
            doc["decided_by"] = self.decided_by
        return doc
