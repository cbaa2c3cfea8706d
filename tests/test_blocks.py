"""Block finding from each source: torch metadata, node names, initializer names, a pattern,
the enclosing If, and the residual chain when nothing is named."""

import time
import warnings

import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper

from graphaudit.analyses.blocks import find_blocks
from graphaudit.errors import UsageError
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model
from graphaudit.testing.synthetic import transformer_graph

from support.text_graphs import EYE, LEGACY, LEGACY_W, graph_of, layered, members


def test_legacy_node_names():
    mg = graph_of(layered(LEGACY, 3, LEGACY_W))
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert [b.index for b in bm.blocks] == [0, 1, 2]
    assert members(bm, mg) == [["Add", "MatMul", "Relu"]] * 3
    assert bm.method.startswith("node names") and "`model.layers`" in bm.method
    assert bm.block_of(next(iter(bm.blocks[1].node_ids))) == bm.blocks[1]


def test_a_container_called_pattern_is_no_block_pattern():
    # Without --block-pattern, a container named "pattern" is named like any other.
    mg = graph_of(layered("""
        ["/pattern.@/MatMul"] h@ = MatMul (x@, "w@")
        ["/pattern.@/Add"] x@+1 = Add (x@, h@)
    """, 3, 'float[2, 2] "w@" = ' + EYE))
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == ["pattern.0", "pattern.1", "pattern.2"]
    assert bm.method == "node names: 3 blocks under `pattern`"


def test_synthetic_pythia_names_and_shared_constants_stay_outside():
    mg = build_graph(load_model(transformer_graph(layers=3, hidden=8, heads=2, vocab=16, external=None)).model)
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == [f"gpt_neox.layers.{i}" for i in range(3)]
    assert all(len(b.node_ids) == 18 for b in bm.blocks)
    assert bm.block_of("/gpt_neox/qkv_shape/Constant") is None
    assert bm.block_of("/embed_out/MatMul") is None


def test_initializer_names_when_nodes_are_unnamed():
    mg = graph_of(layered("""
        h@ = MatMul (x@, "encoder.layer.@.dense.weight")
        x@+1 = Add (x@, h@)
    """, 2, 'float[2, 2] "encoder.layer.@.dense.weight" = ' + EYE))
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == ["encoder.layer.0", "encoder.layer.1"]
    # The Adds read no weight: they join the block of what they read.
    assert members(bm, mg) == [["Add", "MatMul"]] * 2
    assert "initializer names" in bm.method


def test_a_weight_shared_by_layers_is_not_evidence():
    mg = graph_of(layered("""
        h@ = Gemm (x@, "stack.0.shared.weight", "stack.@.bias")
        x@+1 = Add (x@, h@)
    """, 2, 'float[2] "stack.@.bias" = {0.0, 0.0}', header="(float[B, 2] x0) => (float[B, 2] y)").replace(
        "<float", '<float[2, 2] "stack.0.shared.weight" = ' + EYE + ", float"))
    bm = find_blocks(mg)
    # Dynamo de-duplicates equal weights under the first layer's name: only the bias counts.
    gemms = [n for n in mg.nodes.values() if n.op_type == "Gemm"]
    assert [bm.block_of(n.id).index for n in gemms] == [0, 1]


def test_block_pattern_overrides_names():
    mg = graph_of(layered("""
        ["/net/stage@/conv"] h@ = MatMul (x@, "w@")
        ["/net/stage@/add"] x@+1 = Add (x@, h@)
    """, 3, "float[2, 2] w@ = " + EYE))
    bm = find_blocks(mg, pattern=r"stage(\d+)")
    assert [(b.index, b.name) for b in bm.blocks] == [(0, "stage0"), (1, "stage1"), (2, "stage2")]
    assert "--block-pattern" in bm.method
    named = find_blocks(mg, pattern=r"stage(?P<index>\d)")
    assert [b.index for b in named.blocks] == [0, 1, 2]


def test_block_pattern_matches_raw_slash_separated_node_names():
    mg = graph_of(layered(LEGACY, 3, LEGACY_W))
    bm = find_blocks(mg, pattern=r"/model/layers\.(\d+)/")
    assert [(b.index, b.name) for b in bm.blocks] == [(i, f"/model/layers.{i}/") for i in range(3)]
    assert members(bm, mg) == [["Add", "MatMul", "Relu"]] * 3
    # The dotted module path the names spell still matches, with the same blocks.
    dotted = find_blocks(mg, pattern=r"layers\.(\d+)")
    assert [(b.index, b.name) for b in dotted.blocks] == [(i, f"layers.{i}") for i in range(3)]
    assert members(dotted, mg) == members(bm, mg)


def _flat_names(n: int) -> onnx.ModelProto:
    """`n` layers whose nodes are named `layer{i}_fc`, `layer{i}_add`: no slash, weights `w{i}`."""
    nodes, inits = [], []
    for i in range(n):
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, [2, 2], [1.0, 0.0, 0.0, 1.0]))
        nodes.append(helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"h{i}"], name=f"layer{i}_fc"))
        nodes.append(helper.make_node("Add", [f"x{i}", f"h{i}"], [f"x{i + 1}"], name=f"layer{i}_add"))
    graph = helper.make_graph(nodes, "flat_names",
                              [helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["batch", 2])],
                              [helper.make_tensor_value_info(f"x{n}", TensorProto.FLOAT, ["batch", 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_block_pattern_matches_node_names_without_a_slash():
    mg = graph_of(_flat_names(3))
    bm = find_blocks(mg, pattern=r"layer(\d+)")
    assert [(b.index, b.name) for b in bm.blocks] == [(0, "layer0"), (1, "layer1"), (2, "layer2")]
    assert members(bm, mg) == [["Add", "MatMul"]] * 3
    assert bm.method.startswith("--block-pattern")


def test_block_pattern_still_matches_name_scopes_and_initializer_names():
    mg = graph_of(_dynamo_like("namespace"))
    bm = find_blocks(mg, pattern=r"blocks\.(\d+)")
    assert [(b.index, b.name) for b in bm.blocks] == [(0, "blocks.0"), (1, "blocks.1")]
    assert members(bm, mg) == [["Add", "MatMul"]] * 2
    mg = graph_of(layered("""
        h@ = MatMul (x@, "encoder.layer.@.dense.weight")
        x@+1 = Add (x@, h@)
    """, 2, 'float[2, 2] "encoder.layer.@.dense.weight" = ' + EYE))
    bm = find_blocks(mg, pattern=r"layer\.(\d+)")
    assert [(b.index, b.name) for b in bm.blocks] == [(0, "layer.0"), (1, "layer.1")]
    assert members(bm, mg) == [["Add", "MatMul"]] * 2


def test_block_pattern_errors_are_usage_errors():
    mg = graph_of(layered(LEGACY, 2, LEGACY_W))
    with pytest.raises(UsageError, match="regular expression"):
        find_blocks(mg, pattern="layers.(")
    with pytest.raises(UsageError, match="found no match"):
        find_blocks(mg, pattern=r"decoder\.(\d+)")


def _linear(name, x, w, out, meta):
    node = helper.make_node("MatMul", [x, w], [out], name=name)
    for key, value in meta.items():
        node.metadata_props.add(key=key, value=value)
    return node


def _dynamo_like(meta_key: str) -> onnx.ModelProto:
    """Two blocks whose nodes carry only torch metadata (dynamo-style names `node_*`)."""
    nodes, inits = [], []
    x = "x"
    for i in range(2):
        path = f"model.blocks.{i}"
        if meta_key == "namespace":
            meta = {"namespace": f": M/model: Inner/{path}: Block/{path}.fc: torch.nn.Linear/linear_{i}: aten.linear"}
        else:
            meta = {"pkg.torch.onnx.name_scopes": repr(["", "model", path, f"{path}.fc", f"linear_{i}"])}
        inits.append(helper.make_tensor(f"val_{i}", TensorProto.FLOAT, [2, 2], [1.0, 0.0, 0.0, 1.0]))
        nodes.append(_linear(f"node_linear_{i}", x, f"val_{i}", f"h{i}", meta))
        add = helper.make_node("Add", [x, f"h{i}"], [f"x{i + 1}"], name=f"node_add_{i}")
        add.metadata_props.add(key=meta_key, value=next(iter(meta.values())).replace(f"linear_{i}", f"add_{i}"))
        nodes.append(add)
        x = f"x{i + 1}"
    head = helper.make_node("Relu", [x], ["y"], name="node_relu")
    head.metadata_props.add(key=meta_key, value=": M/relu: aten.relu" if meta_key == "namespace" else "['', 'relu']")
    nodes.append(head)
    graph = helper.make_graph(nodes, "dynamo_like",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("key", ["namespace", "pkg.torch.onnx.name_scopes"])
def test_torch_name_scope_metadata(key):
    mg = graph_of(_dynamo_like(key))
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == ["model.blocks.0", "model.blocks.1"]
    assert members(bm, mg) == [["Add", "MatMul"]] * 2
    assert bm.block_of("node_relu") is None
    assert bm.method.startswith("torch name-scope metadata")


IF_BLOCKS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 2] x, bool skip) => (float[B, 2] y) <float[2, 2] "blocks.0.fc.weight" = {1.0, 0.0, 0.0, 1.0},
                                                float[2, 2] "blocks.1.fc.weight" = {1.0, 0.0, 0.0, 1.0},
                                                float[2, 2] "blocks.2.fc.weight" = {1.0, 0.0, 0.0, 1.0}> {
    h0 = MatMul (x, "blocks.0.fc.weight")
    x1 = Add (x, h0)
    [cond] y = If (skip) <
        then_branch = t () => (float[B, 2] same) { same = Identity (x1) },
        else_branch = e () => (float[B, 2] x3) {
            h1 = MatMul (x1, "blocks.1.fc.weight")
            x2 = Add (x1, h1)
            h2 = MatMul (x2, "blocks.2.fc.weight")
            x3 = Add (x2, h2)
        }
    >
}
"""


def test_nodes_inside_if_branches_by_the_weights_they_read():
    mg = graph_of(IF_BLOCKS)
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == ["blocks.0", "blocks.1", "blocks.2"]
    # The then-branch's pass-through joins the first block its If holds.
    assert members(bm, mg) == [["Add", "MatMul"], ["Add", "Identity", "MatMul"], ["Add", "MatMul"]]
    assert bm.block_of("cond") is None  # the If reads two blocks' weights through its branches
    # an If around one layer only (SkipNet as TorchScript writes it, `/If` in no layer's scope)
    # is that layer's, so its own time is too
    one = IF_BLOCKS.replace("h2 = MatMul (x2, \"blocks.2.fc.weight\")\n            x3 = Add (x2, h2)",
                            "x3 = Identity (x2)").replace("[cond] y = If", '["/If"] y = If')
    assert "x3 = Identity (x2)" in one
    mg = graph_of(one)
    bm = find_blocks(mg)
    assert bm.block_of("/If").name == "blocks.1"


def if_blocks_with_fx(path: str, outside: tuple[str, str], on_if: str | None = None) -> onnx.ModelProto:
    """IF_BLOCKS with dynamo's anonymous weights: the else-branch's MatMuls name theirs in fx
    metadata (`%p_<path>_1_fc_weight`), every main-graph node but the If has the metadata
    `outside` (key, value), and the If has `on_if` as its fx metadata when given."""
    model = onnx.parser.parse_model(IF_BLOCKS.replace('"blocks.', '"val.'))
    fx = {"h1": f"%p_{path}_1_fc_weight", "h2": f"%p_{path}_2_fc_weight"}
    for node in model.graph.node:
        if node.op_type == "If":
            if on_if is not None:
                node.metadata_props.add(key="pkg.torch.onnx.fx_node", value=on_if)
            branch = next(a.g for a in node.attribute if a.name == "else_branch")
            for inner in branch.node:
                if inner.output[0] in fx:
                    inner.metadata_props.add(key="pkg.torch.onnx.fx_node", value=f"linear(%x, {fx[inner.output[0]]})")
        else:
            node.metadata_props.add(key=outside[0], value=outside[1])
    return model


def test_nodes_inside_if_branches_by_fx_metadata_and_the_if_metadata():
    model = if_blocks_with_fx("blocks", ("pkg.torch.onnx.fx_node", "%p_blocks_0_fc_weight"),
                              "%cond = cond(%skip, %t, %f, (%x1, %p_blocks_1_fc_weight, %p_blocks_2_fc_weight))")
    mg = graph_of(model)
    bm = find_blocks(mg)
    assert [b.index for b in bm.blocks] == [0, 1, 2]
    inside = {mg.nodes[n].outputs[0].name: bm.block_of(n).index for n in mg.nodes if mg.nodes[n].scopes}
    assert inside == {"same": 1, "h1": 1, "x2": 1, "h2": 2, "x3": 2}  # `same` is clipped into {1, 2}
    assert "fx metadata" in bm.method


def test_blocks_named_from_fx_parameters_are_spelled_as_the_others():
    """fx parameter names spell a module path with underscores (`%p_m_blocks_2_fc_weight`): the
    blocks only they name take the path of the blocks the name scopes name (`m.blocks.2`)."""
    model = if_blocks_with_fx("m_blocks", ("pkg.torch.onnx.name_scopes", "['', 'm', 'm.blocks.0', 'm.blocks.0.fc']"))
    bm = find_blocks(graph_of(model))
    assert [b.name for b in bm.blocks] == ["m.blocks.0", "m.blocks.1", "m.blocks.2"]


def test_nodes_inside_an_owned_if_take_the_owners_block():
    mg = graph_of(layered("""
        ["/model/layers.@/If"] x@+1 = If (flag) <
            then_branch = t@ () => (float[B, T, 2] a@) { a@ = Relu (x@) },
            else_branch = e@ () => (float[B, T, 2] b@) { b@ = Neg (x@) }
        >
    """, 2, header="(float[B, T, 2] x0, bool flag) => (float[B, T, 2] y)"))
    bm = find_blocks(mg)
    assert members(bm, mg) == [["If", "Neg", "Relu"]] * 2
    assert "enclosing control-flow node" in bm.method


PRE_NORM = """
        n@ = LayerNormalization (x@, scale, bias)
        a@ = MatMul (n@, w)
        h@ = Add (x@, a@)
        m@ = LayerNormalization (h@, scale, bias)
        u@ = MatMul (m@, w)
        g@ = Relu (u@)
        d@ = MatMul (g@, w)
        x@+1 = Add (h@, d@)
"""


def test_structure_when_nothing_is_named():
    text = layered(PRE_NORM, 3, "").replace(
        "{\n", "<float[2, 2] w = " + EYE + ", float[2] scale = {1.0, 1.0}, float[2] bias = {0.0, 0.0}> {\n", 1)
    text = text.replace("x0) =>", "inp) =>").replace("n0 = Layer", "x0 = Add (inp, inp)\n        n0 = Layer")
    mg = graph_of(text)
    bm = find_blocks(mg)
    assert len(bm.blocks) == 3, bm.method
    assert "residual" in bm.method and "2 per block" in bm.method
    assert members(bm, mg, "MatMul") == [["MatMul"] * 3] * 3
    first_add = next(n for n in mg.nodes.values() if n.outputs[0].name == "x0")
    assert bm.block_of(first_add.id) is None  # before the first block


POST_NORM = """
        a@ = MatMul (x@, w)
        h@ = Add (x@, a@)
        n@ = LayerNormalization (h@, scale, bias)
        u@ = MatMul (n@, w)
        g@ = Relu (u@)
        d@ = MatMul (g@, w)
        s@ = Add (n@, d@)
        x@+1 = LayerNormalization (s@, scale, bias)
"""


def test_structure_of_a_post_norm_stack():
    """x = LayerNorm(x + f(x)), as BERT: the chain runs from each Add through the normalisation."""
    text = layered(POST_NORM, 3, "").replace(
        "{\n", "<float[2, 2] w = " + EYE + ", float[2] scale = {1.0, 1.0}, float[2] bias = {0.0, 0.0}> {\n", 1)
    mg = graph_of(text)
    bm = find_blocks(mg)
    assert "6 residual Add nodes, 2 per block, 3 blocks" in bm.method
    assert members(bm, mg, "MatMul") == [["MatMul"] * 3] * 3
    assert members(bm, mg, "LayerNormalization") == [["LayerNormalization"] * 2] * 3


def test_no_names_and_no_residual_chain_gives_no_blocks():
    mg = graph_of("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) { h = Relu (x)
                                     y = Neg (h) }""")
    bm = find_blocks(mg)
    assert bm.blocks == () and "no blocks" in bm.method


# -- real torch exports ----------------------------------------------------------------------
torch = pytest.importorskip("torch")


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block() for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _Inner()

    def forward(self, x):
        return self.model(x)


def test_torchscript_export_with_model_layers_names(tmp_path):
    path = tmp_path / "ts.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Outer(), (torch.randn(2, 3, 8),), str(path), dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch", 1: "seq"}})
    mg = build_graph(load_model(path).model)
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == ["model.layers.0", "model.layers.1"]
    assert all(any(mg.nodes[n].op_type == "MatMul" for n in b.node_ids) for b in bm.blocks)


def test_dynamo_export_with_metadata_only(tmp_path):
    pytest.importorskip("onnxscript")
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(_Outer(), (torch.randn(2, 3, 8),), dynamo=True, verbose=False,
                                    dynamic_shapes=({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")},))
    model = program.model_proto
    assert all(not n.name.startswith("/") for n in model.graph.node)  # names say nothing
    mg = build_graph(load_model(model).model)
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == ["model.layers.0", "model.layers.1"]
    assert bm.method.startswith("torch name-scope metadata")
    assert all({"MatMul", "Relu"} <= {mg.nodes[n].op_type for n in b.node_ids} for b in bm.blocks)
    assert time.perf_counter() - start < 60

