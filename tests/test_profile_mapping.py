"""Event names mapped to graph nodes and blocks, with and without graph optimisations."""

import sys
from pathlib import Path

import onnx
import pytest

from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model
from graphaudit.profile.events import parse_profile
from graphaudit.profile.mapping import OTHER, UNMAPPED, assign_blocks, one_to_one, through_optimised
from graphaudit.profile.session import runnable_model

from support.profile_models import dynamic_model, prefix_blocks, transformer_model

PROFILES = Path(__file__).parent / "data" / "profiles"


def _names(profile):
    return {ev.name for run in profile.runs for ev in run.events}


@pytest.mark.parametrize("stem", ["dynamic_disable_all", "dynamic_fenced"])
def test_one_to_one_at_disable_all(stem):
    mg = build_graph(dynamic_model())
    names = _names(parse_profile(PROFILES / f"{stem}.json"))
    node_map = one_to_one(mg, names)
    assert node_map.method == "one-to-one" and "ORT_DISABLE_ALL" in node_map.describe()
    assert all(node_map.node_of(n) == n for n in names)
    blocks = assign_blocks(mg, prefix_blocks(mg))
    assert blocks.block_of(node_map.node_of("/block1/Relu")) == "block1"  # inside the If's else-branch
    assert blocks.block_of(node_map.node_of("/loop/Add")) == "loop"  # inside the Loop body
    assert blocks.block_of(node_map.node_of("/exit/If")) == OTHER
    assert blocks.block_of(node_map.node_of("NoSuchNode")) == UNMAPPED


def test_through_the_optimised_model_fused_and_inserted_nodes():
    mg = build_graph(dynamic_model())
    optimised = onnx.load(PROFILES / "dynamic_enable_all.optimised.onnx")
    profile = parse_profile(PROFILES / "dynamic_enable_all.json")
    node_map = through_optimised(mg, optimised, "ORT_ENABLE_ALL", _names(profile))
    assert node_map.method == "optimised-model" and "ORT_ENABLE_ALL" in node_map.describe()
    names = _names(profile)
    assert "/block0/MatMul" not in names and "/block0/MatMul/MatMulAddFusion" in names  # fused into a Gemm
    assert all(node_map.node_of(n) is not None for n in names), names - set(node_map.nodes)
    blocks = assign_blocks(mg, prefix_blocks(mg))
    for name in ("/block0/MatMul/MatMulAddFusion", "gemm_input_reshape", "gemm_output_reshape"):
        assert blocks.block_of(node_map.node_of(name)) == "block0"
    assert node_map.fused["/block0/MatMul/MatMulAddFusion"] == "Gemm"
    assert {node_map.how[n] for n in ("/block0/MatMul/MatMulAddFusion", "gemm_input_reshape",
                                      "gemm_output_reshape")} == {"scope", "consumer", "output"}


def test_through_the_optimised_transformer():
    mg = build_graph(transformer_model())
    optimised = onnx.load(PROFILES / "transformer_enable_all.optimised.onnx")
    names = _names(parse_profile(PROFILES / "transformer_enable_all.json"))
    node_map = through_optimised(mg, optimised, "ORT_ENABLE_ALL", names)
    assert all(node_map.node_of(n) is not None for n in names)
    # ORT renamed the Transposes after the Split, and fused the last residual Add into the final norm
    assert node_map.node_of("Transpose_token_2") == "/gpt_neox/layers.0/attention/Split"
    assert node_map.node_of("SkipLayerNormalization") == "/gpt_neox/final_layer_norm/LayerNormalization"
    assert node_map.how["SkipLayerNormalization"] == "output"
    assert node_map.counts()["name"] > node_map.counts()["output"] > 0


def test_blocks_default_to_the_static_block_finder_or_other(monkeypatch):
    mg = build_graph(transformer_model())
    blocks = assign_blocks(mg)
    assert blocks.names == ("gpt_neox.layers.0", "gpt_neox.layers.1", OTHER)
    assert blocks.block_of("/gpt_neox/layers.1/mlp/dense_h_to_4h/MatMul") == "gpt_neox.layers.1"
    monkeypatch.setitem(sys.modules, "graphaudit.analyses.blocks", None)  # as if not installed
    blocks = assign_blocks(mg)
    assert blocks.names == (OTHER,) and "not available" in blocks.method
    assert blocks.block_of("/gpt_neox/layers.1/mlp/dense_h_to_4h/MatMul") == OTHER


def test_given_block_map_orders_blocks_and_puts_other_last():
    mg = build_graph(dynamic_model())
    blocks = assign_blocks(mg, prefix_blocks(mg))
    assert blocks.names == ("block0", "block1", "moe", "loop", OTHER)
    assert set(blocks.nodes_of("block1")) == {"/block1/skip", "/block1/MatMul", "/block1/Relu", "/block1/Add"}


def test_unnamed_and_repeated_names_are_replaced_by_graph_ids(tmp_path):
    model = dynamic_model()
    model.graph.node[1].name = ""  # /block0/Add
    model.graph.node[2].name = "/block0/MatMul"  # a repeat
    path = tmp_path / "unnamed.onnx"
    onnx.save(model, path)
    loaded = load_model(path)
    runnable = runnable_model(loaded)
    assert runnable.renamed >= 2 and isinstance(runnable.source, bytes)
    names = [n.name for n in runnable.model.graph.node]
    assert len(set(names)) == len(names) and all(names)
    assert set(build_graph(runnable.model).nodes) == set(build_graph(loaded.model).nodes)
    assert onnx.load(path).graph.node[1].name == ""  # the user's file is untouched


def test_unique_names_keep_the_users_file(tmp_path):
    path = tmp_path / "dynamic.onnx"
    onnx.save(dynamic_model(), path)
    runnable = runnable_model(load_model(path))
    assert runnable.source == str(path) and runnable.renamed == 0


def test_names_repeated_across_if_branches_are_made_unique():
    model = dynamic_model()
    if_node = next(n for n in model.graph.node if n.op_type == "If")
    then_branch = next(a for a in if_node.attribute if a.name == "then_branch").g
    then_branch.node[0].name = "/block1/MatMul"  # same name as a node of the else-branch
    runnable = runnable_model(load_model(model))
    mg = build_graph(runnable.model)
    assert "/block1/MatMul#1" in mg.nodes and "/block1/MatMul#2" in mg.nodes
    onnx.checker.check_model(runnable.model)
