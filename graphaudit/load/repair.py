"""Repairs, made in memory, of models ONNX Runtime runs but the ONNX checker refuses.

Each repair is exact: it changes nothing ONNX Runtime computes, because it is what ONNX
Runtime itself assumes as it loads the model (checked against onnxruntime 1.32, by building
each kind of model and opening a session on it):

- a node of a domain the model does not import (ONNX Runtime's own test models use
  `com.microsoft` operators without importing it): ONNX Runtime imports every domain it
  knows at its latest version, so the import is added at that version;
- a `value_info` entry without a type says nothing, and ONNX Runtime ignores it: dropped;
- a main graph written out of order is sorted (checker.sort_nodes), as ONNX Runtime sorts it;
- a graph output without a type is typed by shape inference (load.py), as ONNX Runtime types it.

What ONNX Runtime refuses too is refused with one line instead: a name assigned twice
(graph input, initializer or node output, in any body), a body written out of order, a graph
input without a type, a model with no opset import at all, a domain ONNX Runtime does not know.
The file is never changed; the loader says what was repaired (`repair_note`).
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Sequence
from pathlib import Path

import onnx

from graphaudit.load.protos import graphs


def add_runtime_imports(model: onnx.ModelProto, every: Sequence[onnx.GraphProto] | None = None,
                        domains: set[str] | None = None) -> list[str]:
    """The opset imports added to `model` (in place) for domains its nodes use but it does not
    import, where ONNX Runtime knows the domain, at the version ONNX Runtime gives it, as
    `domain version`; none when the model imports no opset at all (ONNX Runtime refuses it).
    `every`: the model's graphs, as `protos.graphs` lists them, and `domains`: the domains their
    nodes use (`protos.Walked.domains`), where the caller has them."""
    if not model.opset_import:
        return []
    imported = {"" if o.domain == "ai.onnx" else o.domain for o in model.opset_import}
    if domains is None:
        domains = {node.domain for graph in every or graphs(model.graph) for node in graph.node}
    used = {"" if domain == "ai.onnx" else domain for domain in domains}
    missing = sorted(used - imported)
    if not missing:
        return []
    known = _runtime_opsets()
    added = []
    for domain in missing:
        version = known.get(domain)
        if version is None or (domain == "" and version > onnx.defs.onnx_opset_version()):
            continue  # ONNX Runtime refuses it too (or onnx could not read it): the checker says so
        model.opset_import.add(domain=domain, version=version)
        added.append(f"{domain or 'ai.onnx'} {version}")
    return added


def drop_untyped_value_info(model: onnx.ModelProto, every: Sequence[onnx.GraphProto] | None = None) -> int:
    """How many `value_info` entries without a type were dropped from `model`'s graphs, in place
    (`every`: those graphs, as `protos.graphs` lists them, where the caller has them)."""
    dropped = 0
    for graph in every or graphs(model.graph):
        kept = [v for v in graph.value_info if v.type.WhichOneof("value") is not None]
        if len(kept) < len(graph.value_info):
            dropped += len(graph.value_info) - len(kept)
            kept = [_copy(v) for v in kept]  # before the field that holds them is cleared
            del graph.value_info[:]
            graph.value_info.extend(kept)
    return dropped


def untyped_outputs(graph: onnx.GraphProto) -> list[str]:
    """The outputs of `graph` that declare no type."""
    return [o.name for o in graph.output if o.type.WhichOneof("value") is None]


def describe(imports: Sequence[str] = (), moved: int = 0, dropped: int = 0, typed: Sequence[str] = ()) -> list[str]:
    """The repairs made, each in words, for `repair_note`."""
    said = []
    if imports:
        said.append(f"added the opset import{'s' if len(imports) > 1 else ''} ONNX Runtime assumes, "
                    f"{', '.join(imports)}")
    if moved:
        said.append(f"sorted the nodes topologically, as ONNX Runtime does ({moved} moved)")
    if dropped:
        said.append(f"dropped {dropped} value_info {'entry' if dropped == 1 else 'entries'} without a type")
    if typed:
        said.append(f"typed output{'s' if len(typed) > 1 else ''} {', '.join(map(repr, typed))} by shape inference")
    return said


def repair_note(repairs: Sequence[str]) -> str | None:
    """The one note that says what the loader repaired; None when nothing was."""
    if not repairs:
        return None
    return (f"the model was repaired in memory as ONNX Runtime reads it (the file is unchanged): "
            f"{'; '.join(repairs)}; every part audits and runs the repaired model")


def reassigned(model: onnx.ModelProto) -> str | None:
    """Which name is assigned twice (what ONNX Runtime refuses as a duplicate definition), and
    by what, in words; None when no graph assigns a name twice."""
    def walk(graph: onnx.GraphProto, outer: dict[str, str]) -> str | None:
        made = dict(outer)
        own = [(v.name, f"input {v.name!r}") for v in graph.input] + \
            [(t.name, f"initializer {t.name!r}") for t in graph.initializer if t.name not in {v.name for v in graph.input}]
        own += [(name, f"node {node.name or node.op_type!r}") for node in graph.node for name in node.output if name]
        for name, what in own:
            if name in made:
                return f"{name!r} assigned by {made[name]} and by {what}"
            made[name] = what
        for node in graph.node:
            for attr in node.attribute:
                for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    found = walk(body, made)
                    if found:
                        return found
        return None

    return walk(model.graph, {})


def untyped_input(model: onnx.ModelProto) -> str | None:
    """The first main-graph input without a type; None when each has one."""
    return next((v.name for v in model.graph.input if v.type.WhichOneof("value") is None), None)


@functools.cache
def _runtime_opsets() -> dict[str, int]:
    """Each domain ONNX Runtime imports by itself into a model that does not import it, with the
    version it gives it: read from the model ONNX Runtime writes back for a model importing none
    of them (its Identity node runs in the default domain ONNX Runtime adds), so they are what this ONNX Runtime does, not a table that could drift from it."""
    import onnxruntime as ort

    value = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    probe = onnx.helper.make_model(
        onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "probe",
                               [value], [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]),
        opset_imports=[onnx.helper.make_opsetid("graphaudit.probe", 1)])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with tempfile.TemporaryDirectory(prefix="graphaudit-opsets-") as folder:
        options.optimized_model_filepath = str(Path(folder) / "written.onnx")
        ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        found = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return {o.domain: o.version for o in found.opset_import if o.domain != "graphaudit.probe"}


def _copy(value: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    return copy
