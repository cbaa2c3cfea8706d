"""Synthetic transformer-shaped ONNX graphs, for tests and benchmarks.

`transformer_graph` builds a GPT-NeoX-style decoder (Pythia-shaped by default: 24 layers,
hidden 2048, 16 heads, vocabulary 50,432) whose weights are *external-data references*
into a file that is never written, so a multi-GB model's graph costs kilobytes on disk. A
graph-only load must succeed on it; a load with weights must fail, saying the file is
missing. Node names follow the TorchScript exporter (`/gpt_neox/layers.3/attention/...`)
and initializers the module paths (`gpt_neox.layers.3.attention.dense.weight`).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

WEIGHTS_FILE = "weights.bin"


class _Weights:
    """Declares external initializers laid end to end in one (unwritten) file."""

    def __init__(self, location: str | None):
        self.location = location
        self.offset = 0
        self.tensors: list[TensorProto] = []

    def add(self, name: str, dims: list[int]) -> str:
        tensor = TensorProto(name=name, dims=dims, data_type=TensorProto.FLOAT)
        length = 4
        for d in dims:
            length *= d
        if self.location is None:
            tensor.raw_data = bytes(length)
        else:
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", self.location), ("offset", self.offset), ("length", length)):
                tensor.external_data.add(key=key, value=str(value))
        self.offset += length
        self.tensors.append(tensor)
        return name


def transformer_graph(
    layers: int = 24,
    hidden: int = 2048,
    heads: int = 16,
    vocab: int = 50432,
    ffn: int | None = None,
    external: str | None = WEIGHTS_FILE,
) -> onnx.ModelProto:
    """Return a decoder-only transformer graph with `layers` blocks.

    With `external=None` the weights are inline zeros (use small sizes then).
    """
    ffn = ffn or 4 * hidden
    head_dim = hidden // heads
    w = _Weights(external)
    nodes: list[onnx.NodeProto] = []

    def node(op, inputs, outputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0]

    def const_i64(name, values):
        return node("Constant", [], [name], f"{name}/Constant",
                    value=helper.make_tensor(name + "_value", TensorProto.INT64, [len(values)], values))

    emb = w.add("gpt_neox.embed_in.weight", [vocab, hidden])
    x = node("Gather", [emb, "input_ids"], ["/gpt_neox/embed_in/Gather_output_0"], "/gpt_neox/embed_in/Gather")
    qkv_shape = const_i64("/gpt_neox/qkv_shape", [0, 0, 3 * heads, head_dim])
    merge_shape = const_i64("/gpt_neox/merge_shape", [0, 0, hidden])
    for i in range(layers):
        p, s = f"gpt_neox.layers.{i}", f"/gpt_neox/layers.{i}"
        ln1 = node("LayerNormalization", [x, w.add(f"{p}.input_layernorm.weight", [hidden]),
                                          w.add(f"{p}.input_layernorm.bias", [hidden])],
                   [f"{s}/input_layernorm/out"], f"{s}/input_layernorm/LayerNormalization", axis=-1)
        qkv = node("MatMul", [ln1, w.add(f"{p}.attention.query_key_value.weight", [hidden, 3 * hidden])],
                   [f"{s}/attention/qkv"], f"{s}/attention/query_key_value/MatMul")
        qkv4 = node("Reshape", [qkv, qkv_shape], [f"{s}/attention/qkv4"], f"{s}/attention/Reshape")
        qkvt = node("Transpose", [qkv4], [f"{s}/attention/qkvt"], f"{s}/attention/Transpose", perm=[0, 2, 1, 3])
        q, k, v = (f"{s}/attention/{n}" for n in "qkv")
        node("Split", [qkvt], [q, k, v], f"{s}/attention/Split", axis=1, num_outputs=3)
        kt = node("Transpose", [k], [f"{s}/attention/kt"], f"{s}/attention/Transpose_1", perm=[0, 1, 3, 2])
        scores = node("MatMul", [q, kt], [f"{s}/attention/scores"], f"{s}/attention/MatMul")
        probs = node("Softmax", [scores], [f"{s}/attention/probs"], f"{s}/attention/Softmax", axis=-1)
        ctx = node("MatMul", [probs, v], [f"{s}/attention/ctx"], f"{s}/attention/MatMul_1")
        ctxt = node("Transpose", [ctx], [f"{s}/attention/ctxt"], f"{s}/attention/Transpose_2", perm=[0, 2, 1, 3])
        merged = node("Reshape", [ctxt, merge_shape], [f"{s}/attention/merged"], f"{s}/attention/Reshape_1")
        attn = node("MatMul", [merged, w.add(f"{p}.attention.dense.weight", [hidden, hidden])],
                    [f"{s}/attention/dense/out"], f"{s}/attention/dense/MatMul")
        ln2 = node("LayerNormalization", [x, w.add(f"{p}.post_attention_layernorm.weight", [hidden]),
                                          w.add(f"{p}.post_attention_layernorm.bias", [hidden])],
                   [f"{s}/post_attention_layernorm/out"], f"{s}/post_attention_layernorm/LayerNormalization", axis=-1)
        up = node("MatMul", [ln2, w.add(f"{p}.mlp.dense_h_to_4h.weight", [hidden, ffn])],
                  [f"{s}/mlp/up"], f"{s}/mlp/dense_h_to_4h/MatMul")
        act = node("Gelu", [up], [f"{s}/mlp/act"], f"{s}/mlp/act/Gelu")
        down = node("MatMul", [act, w.add(f"{p}.mlp.dense_4h_to_h.weight", [ffn, hidden])],
                    [f"{s}/mlp/down"], f"{s}/mlp/dense_4h_to_h/MatMul")
        branch = node("Add", [attn, down], [f"{s}/branch"], f"{s}/Add")
        x = node("Add", [x, branch], [f"{s}/Add_1_output_0"], f"{s}/Add_1")
    final = node("LayerNormalization", [x, w.add("gpt_neox.final_layer_norm.weight", [hidden]),
                                        w.add("gpt_neox.final_layer_norm.bias", [hidden])],
                 ["/gpt_neox/final_layer_norm/out"], "/gpt_neox/final_layer_norm/LayerNormalization", axis=-1)
    node("MatMul", [final, w.add("embed_out.weight", [hidden, vocab])], ["logits"], "/embed_out/MatMul")
    graph = helper.make_graph(
        nodes,
        f"transformer_{layers}x{hidden}",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])],
        initializer=w.tensors,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model
