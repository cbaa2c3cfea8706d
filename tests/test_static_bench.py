"""benchmarks/static_bench.py's bare loop, which `--stages` times beside the graph model's build,
makes the objects the build makes for a graph without bodies: the comparison is of like with like."""

import importlib.util
from pathlib import Path

from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model
from graphaudit.testing.synthetic import transformer_graph

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("static_bench", ROOT / "benchmarks" / "static_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bare_loop_makes_the_graph_models_nodes_and_values():
    model = load_model(transformer_graph(layers=2, hidden=64, heads=4, vocab=128, external=None), weights=False).model
    built, bare = build_graph(model), _bench().bare_graph_loop(model)
    assert len(bare) == len(built.nodes) > 40
    assert bare == built.nodes  # the same ids, names, op types, inputs, outputs and protos, node by node
