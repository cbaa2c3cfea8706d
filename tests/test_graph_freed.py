"""The static audit leaves its graph model in no reference cycle: once the audit returns, the
graph model is freed by reference counting alone, not by a pass of the cyclic collector over
every node and tensor (55 ms at 18,000 nodes, benchmarks/NOTES.md, static audit)."""

import gc
import weakref

import onnx
import pytest

from graphaudit.analyses import static
from graphaudit.load.model import load_model

from support.models import blockdrop_cnn, gate_in_branch, gated_lm
from support.zoo import FIXTURES, ZOO

MODELS = {"gated_lm": gated_lm, "gate_in_branch": gate_in_branch, "blockdrop_cnn": blockdrop_cnn}


@pytest.mark.parametrize("name", [*MODELS, *ZOO])
def test_the_graph_model_goes_when_the_static_audit_returns(name, monkeypatch):
    model = MODELS[name]() if name in MODELS else onnx.load(FIXTURES / name / "model.onnx")
    loaded = load_model(model, weights=False)
    built: list[weakref.ref] = []
    build_graph = static.build_graph

    def recorded(proto):
        graph = build_graph(proto)
        built.append(weakref.ref(graph))
        return graph

    monkeypatch.setattr(static, "build_graph", recorded)
    enabled = gc.isenabled()
    gc.disable()
    try:
        report = static.audit_static(loaded)
        assert report.node_count > 0 and len(built) == 1
        assert built[0]() is None, "the graph model outlived the audit: something holds it in a reference cycle"
    finally:
        if enabled:
            gc.enable()
