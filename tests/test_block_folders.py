"""Block candidates from a node name's folder, read one component at a time.

The finder reads a folder ("/model/layers.3/mlp") as the folder above it plus its last
component, so that each distinct component meets the regex once however many layers repeat
it. That must give what reading the folder's whole dotted text ("model.layers.3.mlp") gives,
for any name: numbers that open a component, end it, stand alone, follow underscores, repeat,
or sit in a first component, and folders with empty components.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from graphaudit.analyses.blocks import _Finder, find_blocks
from graphaudit.graph.build import build_graph
from graphaudit.testing.synthetic import transformer_graph

COMPONENT = st.text(alphabet="ab_.0123٣", max_size=8)  # ٣: a digit that is not ASCII
FOLDER = st.lists(COMPONENT, max_size=6).map(lambda parts: "/".join(parts))


def _whole(finder: _Finder, folder: str):
    text = ".".join(p for p in folder.split("/") if p)
    return finder._parse("node_names", text) if text else []


@settings(max_examples=400, deadline=None)
@given(st.lists(FOLDER, min_size=1, max_size=6))
def test_a_folder_read_component_by_component_gives_what_its_whole_text_gives(folders):
    finder = _Finder(build_graph(transformer_graph(layers=1, hidden=8, heads=2, vocab=13)), None)
    for folder in folders:  # in turn, so that folders above are read first or on the way
        assert finder._folder(folder)[1] == _whole(finder, folder), folder


def test_the_usual_names_give_the_usual_candidates():
    finder = _Finder(build_graph(transformer_graph(layers=1, hidden=8, heads=2, vocab=13)), None)
    assert finder._folder("/model/layers.3/mlp")[1] == [("model.layers", 3, "model.layers.3")]
    assert finder._folder("/blocks/2/attn.0/proj")[1] == [("blocks", 2, "blocks.2"), ("blocks.2.attn", 0, "blocks.2.attn.0")]
    assert finder._folder("/3/x")[1] == []  # a number that opens the text follows no container
    assert finder._folder("//encoder/block.1")[1] == [("encoder.block", 1, "encoder.block.1")]


def test_blocks_of_a_layered_graph_are_found_as_before():
    found = find_blocks(build_graph(transformer_graph(layers=3, hidden=8, heads=2, vocab=13)))
    assert [b.name for b in found.blocks] == ["gpt_neox.layers.0", "gpt_neox.layers.1", "gpt_neox.layers.2"]


def test_a_number_too_long_to_be_a_layer_names_no_block(tmp_path, capsys):
    """A name holding a 5,000-digit number (past what int() reads) is audited, its number taken
    for no block's: it raised a ValueError traceback before."""
    import onnx
    from onnx import TensorProto, helper

    from support.cli import run_main

    nodes = [helper.make_node("Relu", ["x"], ["h"], name="/model/layers." + "7" * 5000 + "/act/Relu"),
             helper.make_node("Relu", ["h"], ["y"], name="/model/layers.12345678901234567890/act/Relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "long.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    finder = _Finder(build_graph(onnx.load(str(path))), None)
    assert finder._folder("/model/layers." + "7" * 5000 + "/act")[1] == []
    assert finder._folder("/model/layers.123456789012345678/act")[1] == [
        ("model.layers", 123456789012345678, "model.layers.123456789012345678")]
    code, out, err = run_main(["static", "--graph-only", str(path)], capsys)
    assert code == 0 and "Traceback" not in err and "conditional execution: no" in out
