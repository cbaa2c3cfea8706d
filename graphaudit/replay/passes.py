"""The contract every graph transform of the replay keeps, and their composition.

A *pass* is a callable `pass_(model, *, owned=False)` that returns a `PassResult`: the model
it made, whether that differs from the model it was handed (`modified`), and what the pass
found or did (`details`, of a type each pass declares: the controller nodes freezing removed,
the count of each rewrite, the cut of the frozen graph). The passes are `Trace`, `Freeze` and
`LogProbs` (graphaudit.replay.surgery), `Rewrite` (graphaudit.replay.rewrite),
`RewriteAttention` (graphaudit.replay.rewrite_attention) and `CutPrefix`
(graphaudit.replay.prefix). `run_passes` runs a list of them, each on the model the one
before made.

Who may change a model is decided here, once:

- A pass never changes a model its caller still holds. It returns a new model when it
  changes something (`modified=True`), and the very model it was handed when it changes
  nothing (`modified=False`), so a caller can tell without comparing graphs.
- A caller that hands its model over (`owned=True`: its own copy, read by no one after the
  call) lets the pass change that model in place instead of copying it: copying a large
  model's weights is most of a cheap pass's time. The caller then reads only `result.model`.
- `run_passes` hands each pass the model the pass before it made, owned when that model is
  new (a pass's own copy), and never the model `run_passes` was given unless told it is owned.

This is onnx_ir's `PassResult(model, modified)` for ONNX's own protos, with the ownership
handed over explicitly instead of declared per pass (its `in_place` / `changes_input`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, overload

import onnx

# Covariant: a result is read, never written, so a pass giving a subclass's details is a GraphPass of the base.
D_co = TypeVar("D_co", covariant=True)
D = TypeVar("D")
T = TypeVar("T")


@dataclass(frozen=True)
class PassResult(Generic[D_co]):
    """The model a pass made, whether it differs from the model handed in, and the pass's details."""

    model: onnx.ModelProto = field(repr=False)
    modified: bool
    details: D_co


class GraphPass(Protocol[D_co]):
    """A graph transform that keeps this module's contract."""

    def __call__(self, model: onnx.ModelProto, *, owned: bool = False) -> PassResult[D_co]: ...


@dataclass(frozen=True)
class Step:
    """One pass of a `run_passes` run: the pass, whether it changed the model, and its details."""

    graph_pass: GraphPass[Any]
    modified: bool
    details: Any  # what `graph_pass` gave: a step's pass is any kind


@dataclass(frozen=True)
class Steps:
    """The steps of a `run_passes` run, in the order they ran."""

    steps: tuple[Step, ...] = ()

    @overload
    def of(self, kind: type[GraphPass[D]]) -> D | None: ...
    @overload
    def of(self, kind: type[GraphPass[D]], default: T) -> D | T: ...

    def of(self, kind: type[GraphPass[Any]], default: object = None) -> object:
        """Return the details of the first step whose pass is a `kind`, else `default`."""
        return next((s.details for s in self.steps if isinstance(s.graph_pass, kind)), default)


def run_passes(model: onnx.ModelProto, passes: Sequence[GraphPass], *, owned: bool = False) -> PassResult[Steps]:
    """Return the model `passes` make of `model`, one after another, with each step's details
    (`modified`: some step changed it). A step's model is not kept: the next step may change it
    in place. `owned`: `model` is handed over, as to a single pass."""
    steps, current = [], model
    for graph_pass in passes:
        result = graph_pass(current, owned=owned or current is not model)
        steps.append(Step(graph_pass, result.modified, result.details))
        current = result.model
    return PassResult(current, any(s.modified for s in steps), Steps(tuple(steps)))
