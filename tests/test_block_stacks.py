"""Blocks beyond one stack of layers with weights of their own: an encoder-decoder's two
stacks, one layer run several times with the same weights (one block per pass), and a last
"layer" that only holds the final norm."""

from graphaudit.analyses.blocks import find_blocks

from support.text_graphs import EYE, LEGACY, LEGACY_W, graph_of, layered, members

SUBLAYERED = """
        ["/model/STACK/block.@/layer.0/MatMul"] a@ = MatMul (x@, "STACK.@.w0")
        ["/model/STACK/block.@/layer.1/MatMul"] b@ = MatMul (a@, "STACK.@.w1")
        ["/model/STACK/block.@/Add"] x@+1 = Add (x@, b@)
"""
SUBLAYERED_W = 'float[2, 2] "STACK.@.w0" = ' + EYE + ', float[2, 2] "STACK.@.w1" = ' + EYE


def test_an_encoder_and_a_decoder_stack_are_both_blocks():
    # T5's layout: encoder.block.N and decoder.block.N, each with numbered sublayers inside
    # (block.N.layer.M, which are not blocks); the decoder reads the encoder's output
    encoder = SUBLAYERED.replace("STACK", "encoder")
    decoder = SUBLAYERED.replace("STACK", "decoder").replace("x@+1", "d@+1").replace("(x@,", "(d@,").replace(
        "a@", "da@").replace("b@", "db@")
    text = layered(encoder, 2, SUBLAYERED_W.replace("STACK", "encoder")).replace(
        "        y = Identity (x2)", "        [\"/model/bridge/Identity\"] d0 = Identity (x2)\n" + "\n".join(
            decoder.replace("@+1", str(i + 1)).replace("@", str(i)) for i in range(3)) + "\n        y = Identity (d3)")
    weights = ", ".join(SUBLAYERED_W.replace("STACK", "decoder").replace("@", str(i)) for i in range(3))
    text = text.replace("> {", f", {weights}> {{", 1)
    mg = graph_of(text)
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == ["model.encoder.block.0", "model.encoder.block.1", "model.decoder.block.0",
                                           "model.decoder.block.1", "model.decoder.block.2"]
    assert [b.index for b in bm.blocks] == [0, 1, 2, 3, 4]
    assert members(bm, mg) == [["Add", "MatMul", "MatMul"]] * 5
    assert "5 blocks under `model.encoder.block`, `model.decoder.block`" in bm.method
    # one stack alone is found as before, its sublayers inside its blocks
    single = find_blocks(graph_of(layered(encoder, 3, SUBLAYERED_W.replace("STACK", "encoder"))))
    assert [b.name for b in single.blocks] == [f"model.encoder.block.{i}" for i in range(3)]


SHARED = """
        ["/model/layers.0/q/MatMul@"] q@ = MatMul (x@, "model.layers.0.q.weight")
        ["/model/layers.0/k/MatMul@"] k@ = MatMul (x@, "model.layers.0.k.weight")
        ["/model/layers.0/mlp/MatMul@"] m@ = MatMul (q@, "model.layers.0.mlp.weight")
        ["/model/layers.0/Add@"] s@ = Add (m@, k@)
        ["/model/layers.0/Add_res@"] x@+1 = Add (x@, s@)
"""
SHARED_W = ", ".join(f'float[2, 2] "model.layers.0.{w}.weight" = {EYE}' for w in ("q", "k", "mlp"))


def test_one_layer_run_three_times_is_three_blocks():
    # ALBERT's shared layer group: one module path, the same weights, three passes
    text = layered(SHARED, 3).replace("(float[B, T, 2] x0) => (float[B, T, 2] y)",
                                      f"(float[B, T, 2] x0) => (float[B, T, 2] y) <{SHARED_W}>")
    mg = graph_of(text)
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == [f"model.layers.0 (pass {i} of 3)" for i in (1, 2, 3)]
    assert members(bm, mg) == [["Add", "Add", "MatMul", "MatMul", "MatMul"]] * 3
    assert [sorted(mg.nodes[n].name for n in b.node_ids)[0] for b in bm.blocks] == [
        "/model/layers.0/Add@".replace("@", str(i)) for i in range(3)]
    assert bm.method.startswith("node names: 3 blocks under `model.layers`")
    assert "runs 3 times with the same weights" in bm.method
    # beside a layer of its own, as in a model that shares one layer group and not the next
    after = text.replace("        y = Identity (x3)", LEGACY.replace("@+1", "4").replace("@", "3").replace(
        "layers.3", "layers.1") + "\n        y = Identity (x4)").replace("<" + SHARED_W, "<" + SHARED_W + ", " + LEGACY_W.replace("@", "1"))
    mixed = find_blocks(graph_of(after))
    assert [b.name for b in mixed.blocks] == [f"model.layers.0 (pass {i} of 3)" for i in (1, 2, 3)] + ["model.layers.1"]
    # three layers with weights of their own stay three blocks, named as before
    own = find_blocks(graph_of(layered(LEGACY, 3, LEGACY_W)))
    assert [b.name for b in own.blocks] == ["model.layers.0", "model.layers.1", "model.layers.2"]


def test_a_last_layer_holding_only_the_final_norm_is_not_a_block():
    # ONNX Runtime GenAI's builder names the final norm `/model/layers.N/final_norm_layernorm`
    text = layered(LEGACY, 3, LEGACY_W).replace("y = Identity (x3)", """
        ["/model/layers.3/final_norm_layernorm/LayerNorm"] y = LayerNormalization <axis = -1> (x3, "ln.scale")""")
    text = text.replace("<float[2, 2]", '<float[2] "ln.scale" = {1.0, 1.0}, float[2, 2]', 1)
    mg = graph_of(text)
    bm = find_blocks(mg)
    assert [b.name for b in bm.blocks] == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert bm.method.startswith("node names: 3 blocks under `model.layers`")
    assert "`model.layers.3` is left out" in bm.method and "LayerNormalization only" in bm.method
    ln = next(n for n in mg.nodes.values() if n.op_type == "LayerNormalization")
    assert bm.block_of(ln.id) is None
    # a user's pattern stands as given; so does a norm-only layer that is not the last
    assert len(find_blocks(mg, r"layers\.(\d+)").blocks) == 4
    early = layered(LEGACY, 3, LEGACY_W).replace('["/model/layers.0/mlp/MatMul"]', '["/model/front/MatMul"]')
    assert len(find_blocks(graph_of(early)).blocks) == 3
