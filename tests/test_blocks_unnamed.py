"""Blocks of a dynamo export whose nodes are mostly unnamed: only the LayerNorm weights name the
layer, the bias-free q/k/v/o projections read constant-folded `val_N` weights, and the
onnxscript rewriter leaves its own metadata on the Reshapes it rewrote (a plain ViT)."""

import onnx
import onnx.parser

from graphaudit.analyses.blocks import find_blocks
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model

W = "{1.0, 0.0, 0.0, 1.0}"


def vit(n: int) -> onnx.ModelProto:
    """A patch-embedding MatMul then `n` pre-norm layers of non-causal attention, no mask."""
    layer = """
        ["node_ln_@"] ln_@ = LayerNormalization <axis = 2> (x@, "blocks.@.ln1.weight", "blocks.@.ln1.bias")
        ["node_q_@"] q_@ = MatMul (ln_@, val_q@)
        ["node_k_@"] k_@ = MatMul (ln_@, val_k@)
        ["node_v_@"] v_@ = MatMul (ln_@, val_v@)
        ["node_Reshape_k_@"] rk_@ = Reshape (k_@, val_shape)
        ["node_kt_@"] kt_@ = Transpose <perm = [0, 2, 1]> (rk_@)
        ["node_s_@"] s_@ = MatMul (q_@, kt_@)
        ["node_p_@"] p_@ = Softmax <axis = 2> (s_@)
        ["node_a_@"] a_@ = MatMul (p_@, v_@)
        ["node_Reshape_a_@"] ra_@ = Reshape (a_@, val_shape)
        ["node_o_@"] o_@ = MatMul (ra_@, val_o@)
        ["node_add_@"] x@+1 = Add (x@, o_@)
    """
    weights = ["int64[3] val_shape = {1, 4, 2}"]
    for i in range(n):
        weights += [f'float[2] "blocks.{i}.ln1.{p}" = {{1.0, 0.0}}' for p in ("weight", "bias")]
        weights += [f"float[2, 2] val_{p}{i} = {W}" for p in "qkvo"]
    body = "\n".join(layer.replace("@+1", str(i + 1)).replace("@", str(i)) for i in range(n))
    return onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4, 2] pixels) => (float[1, 4, 2] y) <float[2, 2] "patch.weight" = {W}, {", ".join(weights)}> {{
        ["node_patch"] patch = MatMul (pixels, "patch.weight")
        ["node_Reshape_patch"] x0 = Reshape (patch, val_shape)
        {body}
        ["node_y"] y = Identity (x{n})
    }}""")


def test_unnamed_attention_is_in_its_layer():
    model = vit(3)
    for node in model.graph.node:  # what onnxscript's rewriter leaves, and says nothing of the layer
        if "Reshape" in node.name:
            node.metadata_props.add(key="pkg.onnxscript.rewriter.rule_name", value="MaterializeReshapeShape")
    onnx.checker.check_model(model)
    mg = build_graph(load_model(model).model)
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == ["blocks.0", "blocks.1", "blocks.2"]
    for i, block in enumerate(bm.blocks):
        names = {mg.nodes[n].name: mg.nodes[n].op_type for n in block.node_ids}
        # q, k, v, q·kᵀ, a·v and o: the layer's own, no other layer's, not the patch embedding
        assert sorted(n for n, op in names.items() if op == "MatMul") == \
            sorted(f"node_{p}_{i}" for p in ("q", "k", "v", "s", "a", "o")), (i, names)
        assert {f"node_Reshape_k_{i}", f"node_Reshape_a_{i}", f"node_add_{i}"} <= set(names), (i, names)
    patch = next(n.id for n in mg.nodes.values() if n.name == "node_patch")
    assert bm.block_of(patch) is None
