"""The evidence of every control-flow node: who decides it, and whether the model does.

An If or Loop is dynamic (the model's own conditional execution) when the model decides it
(`decisions`) and what it decides can run some compute or not: an If whose branches differ in
compute, a Loop whose trip count constants do not fix. One the caller decides is a switch
(`switches`): conditional execution still, by the caller's choice, and no decision of the
model's. A Scan runs once per slice of what it scans, as its input's shape says.
"""

from __future__ import annotations

from dataclasses import replace

from graphaudit.analyses.block_evidence import Evidence
from graphaudit.analyses.decisions import CALLER, CONSTANT, MODEL, SHAPE, VALUE_DECIDERS, Decision, decisions
from graphaudit.analyses.dependence import DependenceMap
from graphaudit.analyses.loop_trips import Value
from graphaudit.analyses.switches import SWITCH, branches_differ, switches
from graphaudit.graph.model import ModelGraph, Node

_DEPENDENCE = {MODEL: "value", CALLER: "value", SHAPE: "shape", CONSTANT: "const"}


def _op(node: Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def control_evidence(mg: ModelGraph, dm: DependenceMap, value: Value | None = None
                     ) -> tuple[tuple[Evidence, ...], dict[str, Evidence], tuple[Decision, ...]]:
    """(every control-flow node's evidence, those the model decides by node id (dynamic), who
    decides each If and Loop with whether what it decides can run some compute or not)."""
    found, dynamic, decided = [], {}, []
    controls = dm.controls
    found_decisions = decisions(mg, value)
    switched = switches(mg, found_decisions)
    for node in mg.nodes.values():
        control, decision = controls.get(node.id), found_decisions.get(node.id)
        if control is None and decision is None:
            continue
        where = f"{_op(node)} `{node.id}` ({node.describe_scope()})"
        kind = "branch" if node.op_type == "If" else "loop"
        if decision is None:  # a Scan: its length is its scanned input's
            assert control is not None  # one of the two is there
            found.append(Evidence(kind, node.id, _op(node), ", ".join(r.name for r in control.tensors) or None,
                                  str(control.dependence), f"{where}: {control.reason}; not dynamic"))
            continue
        conditional = _conditional(mg, node, decision)
        decision = replace(decision, conditional=conditional)
        decided.append(decision)
        dep = _DEPENDENCE[decision.decided_by]
        tensors = ", ".join(decision.tensors) or None
        if node.id in switched and decision.decided_by in VALUE_DECIDERS:
            found.append(Evidence(SWITCH, node.id, _op(node), tensors, dep,
                                  f"{where}: {decision.reason}; {switched[node.id]}; not dynamic"))
            continue
        said = f"{decision.reason}; {control.reason}" if control is not None else decision.reason
        model = decision.decided_by == MODEL and conditional
        ev = Evidence(kind, node.id, _op(node), tensors, dep, f"{where}: {said}" + ("" if model else "; not dynamic"))
        found.append(ev)
        if model:
            dynamic[node.id] = ev
    return tuple(found), dynamic, tuple(decided)


def _conditional(mg: ModelGraph, node: Node, decision: Decision) -> bool:
    """Whether what `decision` decides can run some compute or not: an If whose branches differ
    in compute, a Loop (or search operator) whose trip count constants do not fix."""
    if node.op_type == "If" and not node.domain:
        return branches_differ(mg, node)
    return decision.decided_by != CONSTANT
