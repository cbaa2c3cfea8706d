"""The replay's rewrites (graphaudit.replay.rewrite): masked fills and plain Einsums become operators
ONNX Runtime's CPU runs faster, and give the same outputs; anything else is left as it is."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from graphaudit.analyses.declared_coefficients import declared_coefficients
from graphaudit.cli import cli
from graphaudit.load.model import load_for_runtime
from graphaudit.replay.pipeline import replay
from graphaudit.replay.prefix import CutPrefix
from graphaudit.replay.rewrite import GEMM_EXACT_DEPTH, Rewrite
from graphaudit.replay.surgery import Freeze
from graphaudit.runtime.sessions import create_session

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _masked_softmax(fill: float = -np.inf, reader: str = "Softmax", fill_first: bool = True,
                    extra_output: bool = False) -> onnx.ModelProto:
    """scores (2,3,4,4) masked by an upper-triangular mask computed from constants, as torch's
    masked_fill exports a causal mask."""
    t = TensorProto
    nodes = [helper.make_node("Constant", [], ["fill"], value=helper.make_tensor("f", t.FLOAT, [], [fill])),
             helper.make_node("Constant", [], ["shape"], value=helper.make_tensor("s", t.INT64, [2], [4, 4])),
             helper.make_node("Constant", [], ["one"], value=helper.make_tensor("o", t.FLOAT, [], [1.0])),
             helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", t.INT64, [], [1])),
             helper.make_node("Expand", ["one", "shape"], ["ones"]),
             helper.make_node("Trilu", ["ones", "k"], ["upper"], upper=1),
             helper.make_node("Cast", ["upper"], ["mask"], to=t.BOOL),
             helper.make_node("Not", ["mask"], ["keep"]),
             helper.make_node("Where", ["mask", "fill", "scores"] if fill_first else ["keep", "scores", "fill"],
                              ["masked"], name="masked_fill"),
             helper.make_node(reader, ["masked"], ["probs"], **({"axis": -1} if reader == "Softmax" else {}))]
    outputs = [helper.make_tensor_value_info("probs", t.FLOAT, [2, 3, 4, 4])]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("masked", t.FLOAT, [2, 3, 4, 4]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("scores", t.FLOAT, [2, 3, 4, 4])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return create_session(model).run(None, feeds)


def _scores(seed: int = 0) -> np.ndarray:
    scores = np.random.default_rng(seed).standard_normal((2, 3, 4, 4)).astype(np.float32)
    scores[0, 0, 0, 0] = -0.0
    return scores


@pytest.mark.parametrize("fill_first, fill", [(True, -np.inf), (False, -np.inf), (True, np.finfo(np.float32).min)],
                         ids=["fill-first", "fill-second", "finfo-min"])
def test_a_masked_fill_before_a_softmax_becomes_an_add_of_the_masks_bias_with_the_same_bits(fill_first, fill):
    # (finfo.min: Hugging Face's fill, torch.where(mask, scores, torch.finfo(dtype).min))
    model = _masked_softmax(fill_first=fill_first, fill=fill)
    before = model.SerializeToString()
    result = Rewrite()(model)
    new, made = result.model, result.details
    assert made == {"masked_fill": 1}
    assert model.SerializeToString() == before, "the input model is not changed"
    onnx.checker.check_model(new, full_check=True)
    where = [n for n in new.graph.node if n.op_type == "Where"]
    assert len(where) == 1 and "scores" not in where[0].input, "the Where now makes the mask's bias only"
    add = next(n for n in new.graph.node if n.op_type == "Add")
    assert add.input[0] == "scores" and add.output[0] == "masked"
    feeds = {"scores": _scores()}
    expected, got = _run(model, feeds)[0], _run(new, feeds)[0]
    assert got.tobytes() == expected.tobytes()
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["finite fill", "read by another op", "a graph output"])
def test_a_where_that_is_not_a_masked_fill_before_a_softmax_is_left_alone(case):
    model = {"finite fill": lambda: _masked_softmax(fill=-1e9),
             "read by another op": lambda: _masked_softmax(reader="Relu"),
             "a graph output": lambda: _masked_softmax(extra_output=True)}[case]()
    result = Rewrite()(model)
    new, made = result.model, result.details
    assert made == {} and new is model


def _einsum(equation: str, shapes: list[tuple[int, ...]], kind: int = TensorProto.FLOAT) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(f"x{i}", kind, s) for i, s in enumerate(shapes)]
    try:
        shape = np.einsum(equation.replace(" ", ""), *(np.zeros(s) for s in shapes)).shape
    except ValueError:  # not one numpy takes: left alone anyway
        shape = ()
    out = helper.make_tensor_value_info("y", kind, shape)
    node = helper.make_node("Einsum", [i.name for i in inputs], ["y"], equation=equation, name="mix")
    return helper.make_model(helper.make_graph([node], "g", inputs, [out]),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("equation, shapes", [
    ("cbtl,lbtd->cbtd", [(4, 2, 5, 3), (3, 2, 5, 6)]),  # MUDD's dense connections
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]),  # attention scores
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),  # already a MatMul: no Transpose at all
    ("ij,jk->ki", [(3, 4), (4, 5)]),  # the product transposed
    ("i j, j k -> i k", [(3, 4), (4, 5)]),
])
def test_a_two_operand_einsum_with_one_summed_index_becomes_transpose_matmul_transpose(equation, shapes):
    model = _einsum(equation, shapes)
    unasked = Rewrite(kinds=("masked_fill", "matmul_bias"))(model)
    assert unasked.model is model and not unasked.modified and unasked.details == {}, "only the kinds asked for"
    result = Rewrite()(model)
    new, made = result.model, result.details
    assert made == {"einsum": 1}
    onnx.checker.check_model(new, full_check=True)
    ops = [n.op_type for n in new.graph.node]
    assert "Einsum" not in ops and ops.count("MatMul") == 1
    if equation == "bij,bjk->bik":
        assert ops == ["MatMul"]
    typed = {v.name: v.type.tensor_type.elem_type for v in new.graph.value_info}
    made_values = {o for n in new.graph.node for o in n.output} - {"y"}
    assert typed == {name: TensorProto.FLOAT for name in made_values}, "every new value's type is declared"
    rng = np.random.default_rng(1)
    feeds = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    got = _run(new, feeds)[0]
    np.testing.assert_allclose(got, np.einsum(equation.replace(" ", ""), *feeds.values()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, _run(model, feeds)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("equation, shapes", [
    ("ii->i", [(3, 3)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("bijk,bjkl->bil", [(2, 3, 4, 5), (2, 4, 5, 6)]),  # two summed indices: would need a Reshape
    ("i,j->ij", [(3,), (4,)]),  # nothing summed
    ("bij,bjk->bi", [(2, 3, 4), (2, 4, 5)]),  # k summed on one side alone
    ("bij,bj->bi", [(2, 3, 4), (2, 4)]),  # no free index on the right
])
def test_other_einsums_are_left_alone(equation, shapes):
    model = _einsum(equation, shapes)
    result = Rewrite()(model)
    new, made = result.model, result.details
    assert made == {} and new is model


@pytest.mark.parametrize("kind", [TensorProto.INT8, TensorProto.UNDEFINED])
def test_an_einsum_of_a_type_matmul_has_no_cpu_kernel_for_or_of_unknown_type_is_left_alone(kind):
    model = _einsum("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], TensorProto.FLOAT if kind == TensorProto.UNDEFINED
                    else kind)
    if kind == TensorProto.UNDEFINED:  # the graph does not say the operands' type
        for value in model.graph.input:
            value.type.tensor_type.elem_type = TensorProto.UNDEFINED
    result = Rewrite()(model)
    new, made = result.model, result.details
    assert made == {} and new is model


def test_new_names_do_not_clash_with_the_models_own():
    model = _masked_softmax()
    taken = helper.make_node("Identity", ["scores"], ["masked/bias"], name="unused")
    model.graph.node.insert(0, taken)
    result = Rewrite()(model)
    new, made = result.model, result.details
    names = [o for n in new.graph.node for o in n.output]
    assert made == {"masked_fill": 1} and len(names) == len(set(names))
    onnx.checker.check_model(new, full_check=True)


@pytest.mark.skipif(not (FIXTURES / "mudd" / "model.onnx").is_file(), reason="no zoo fixtures")
def test_the_replay_records_its_rewrites_and_its_figures_do_not_move_without_them():
    folder = FIXTURES / "mudd"
    args = (folder / "model.onnx", folder / "calib.npz", folder / "eval.npz")
    runner = CliRunner()

    def doc(*extra):
        result = runner.invoke(cli, ["replay", str(args[0]), "--calib", str(args[1]), "--data", str(args[2]), "--format", "json", "-q", "--resamples", "50",
                                     "--threads", "1", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    on, off = doc(), doc("--no-rewrite")
    assert on["settings"]["rewrites"] == {"masked_fill": 4, "einsum": 4, "matmul_bias": 24, "attention": 4}
    assert off["settings"]["rewrite"] is False and off["settings"]["rewrites"] == {}
    assert on["parity"]["ok"] and on["parity"]["max_abs_diff"] <= 1e-4
    for condition, values in off["conditions"].items():
        for key, value in values.items():
            if isinstance(value, float):
                assert on["conditions"][condition][key] == pytest.approx(value, rel=1e-6, abs=1e-9), (condition, key)
    assert replay(*args, threads=1, resamples=20, conditions=("correct", "cross_input"),
                  provider="cpu").settings["rewrites"] == {"masked_fill": 4, "einsum": 4, "matmul_bias": 24, "attention": 4}


def _linears(depth: int = 8, rank: int = 3, opset: int = 17, bias_shape=(5,), second_reader: bool = False,
             lead=("batch", "seq")) -> onnx.ModelProto:
    """Two linear layers x @ W1 + b1 → Relu → @ W2 + b2 on rows of `rank` dimensions."""
    rng = np.random.default_rng(2)
    t = TensorProto
    weights = [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w1", (depth, 5)), ("b1", bias_shape), ("w2", (5, 5)), ("b2", (5,)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["y1"]),
             helper.make_node("Relu", ["y1"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m2"]), helper.make_node("Add", ["b2", "m2"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", t.FLOAT, None)]
    if second_reader:
        nodes.append(helper.make_node("Neg", ["m1"], ["n"]))
        outputs.append(helper.make_tensor_value_info("n", t.FLOAT, None))
    x = helper.make_tensor_value_info("x", t.FLOAT, [*lead[:rank - 1], depth])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outputs, weights),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)  # the loader writes inferred shapes in, as here


def test_a_matmul_read_only_by_a_bias_add_becomes_one_gemm_on_the_rows_with_the_same_bits():
    model = _linears()
    result = Rewrite()(model)
    new, made = result.model, result.details
    assert made == {"matmul_bias": 2}
    onnx.checker.check_model(new, full_check=True)
    ops = [n.op_type for n in new.graph.node]
    assert ops.count("Gemm") == 2 and "MatMul" not in ops and "Add" not in ops
    shapes = [n for n in new.graph.node if n.op_type == "Shape"]
    assert len(shapes) == 1, "the shape to go back to is made once for rows of the same (batch, seq)"
    assert shapes[0].input[0] == "x" and shapes[0].attribute[0].i == 2, "read off the graph input that has them"
    x = np.random.default_rng(3).standard_normal((3, 7, 8)).astype(np.float32)
    expected, got = _run(model, {"x": x})[0], _run(new, {"x": x})[0]
    assert got.shape == (3, 7, 5) and got.tobytes() == expected.tobytes()


def test_rows_whose_leading_dimensions_the_graph_does_not_name_get_their_own_shape():
    result = Rewrite()(_linears(lead=(None, None)))
    new, made = result.model, result.details
    assert made == {"matmul_bias": 2}
    assert [n.op_type for n in new.graph.node].count("Shape") == 2
    x = np.ones((2, 3, 8), np.float32)
    assert _run(new, {"x": x})[0].shape == (2, 3, 5)


@pytest.mark.parametrize("case", ["deeper than the exact depth", "rows of rank 2", "opset 14", "a matrix bias",
                                  "the product read twice"])
def test_other_matmuls_keep_their_add(case):
    model = {"deeper than the exact depth": lambda: _linears(depth=GEMM_EXACT_DEPTH + 1),
             "rows of rank 2": lambda: _linears(rank=2),
             "opset 14": lambda: _linears(opset=14),
             "a matrix bias": lambda: _linears(bias_shape=(1, 5)),
             "the product read twice": lambda: _linears(second_reader=True)}[case]()
    result = Rewrite()(model)
    new, made = result.model, result.details
    first = "m1" in {o for n in new.graph.node for o in n.output}
    assert first, "the first MatMul stays as it is"
    if case in ("deeper than the exact depth", "a matrix bias", "the product read twice"):
        assert made == {"matmul_bias": 1}, "the second, plain one, is still rewritten"
    else:
        assert made == {} and new is model


@pytest.mark.skipif(not (FIXTURES / "mudd" / "model.onnx").is_file(), reason="no zoo fixtures")
@pytest.mark.parametrize("name", ["featuregate", "mudd", "moe", "earlyexit"])
def test_the_rewritten_frozen_graph_is_cut_where_the_exported_one_is(name):
    # the shapes the Gemms go back to are read off the input ids, not off a value of the prefix,
    # so the rewrites add nothing to what the prefix hands the rest (graphaudit.replay.prefix)
    loaded = load_for_runtime(FIXTURES / name / "model.onnx")
    coefs = declared_coefficients(loaded.model)
    frozen = Freeze(coefs)(loaded.model).model
    result = Rewrite()(frozen)
    new, made = result.model, result.details
    assert made.get("matmul_bias", 0) >= 12
    assert {n.input[0] for n in new.graph.node if n.name.endswith("/lead")} == {"input_ids"}
    exported, cut = (CutPrefix([c.tensor for c in coefs])(m).details for m in (frozen, new))
    assert len(cut.cut) == len(exported.cut)
    assert all(v in exported.cut or v.split("/")[0] in exported.cut for v in cut.cut), cut.cut


def _attention(scale: str = "div", mask: bool = True, k_swap: bool = False, opset: int = 20,
               probs_out: bool = False) -> onnx.ModelProto:
    """A multi-head attention as the exporters spell it: q, k, v (batch, seq, 8) in 2 heads of 4."""
    t = TensorProto
    c = lambda name, values, kind=t.INT64, dims=None: helper.make_node(  # noqa: E731
        "Constant", [], [name], value=helper.make_tensor(name, kind, [len(values)] if dims is None else dims, values))
    nodes = [c("heads", [0, 0, 2, 4]), c("merged", [0, 0, 8]), c("root", [2.0], t.FLOAT, []), c("inv", [0.5], t.FLOAT, [])]
    for x in "qkv":
        nodes.append(helper.make_node("Reshape", [x, "heads"], [f"{x}4"]))
    nodes.append(helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]))
    if k_swap:
        nodes += [helper.make_node("Transpose", ["k4"], ["kh"], perm=[0, 2, 1, 3]),
                  helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2])]
    else:
        nodes.append(helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]))
    nodes += [helper.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["qh", "kt"], ["qk"])]
    scaled = {"div": lambda: helper.make_node("Div", ["qk", "root"], ["scaled"]),
              "mul": lambda: helper.make_node("Mul", ["inv", "qk"], ["scaled"]),
              "none": lambda: helper.make_node("Identity", ["qk"], ["scaled"])}[scale]()
    nodes.append(scaled)
    if scale == "none":  # no scale node at all: the MatMul feeds the mask's Add
        nodes.pop()
    into = "qk" if scale == "none" else "scaled"
    if mask:
        nodes.append(helper.make_node("Add", [into, "bias"], ["masked"]))
        into = "masked"
    nodes += [helper.make_node("Softmax", [into], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "vh"], ["heads_out"]),
              helper.make_node("Transpose", ["heads_out"], ["back"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["back", "merged"], ["y"]),
              helper.make_node("Relu", ["y"], ["out"])]
    inputs = [helper.make_tensor_value_info(x, t.FLOAT, ["batch", "seq", 8]) for x in "qkv"]
    if mask:
        inputs.append(helper.make_tensor_value_info("bias", t.FLOAT, ["seq", "seq"]))
    outputs = [helper.make_tensor_value_info("out", t.FLOAT, None)]
    if probs_out:
        outputs.append(helper.make_tensor_value_info("probs", t.FLOAT, None))
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _attention_feeds(mask: bool = True) -> dict:
    rng = np.random.default_rng(4)
    feeds = {x: rng.standard_normal((3, 5, 8)).astype(np.float32) for x in "qkv"}
    if mask:  # causal, plus a finite part: Attention adds the mask after the scale, as the graph does
        causal = np.where(np.triu(np.ones((5, 5), bool), 1), -np.inf, 0)
        feeds["bias"] = (causal + 3 * rng.standard_normal((5, 5))).astype(np.float32)
    return feeds


@pytest.mark.parametrize("variant", [{}, {"scale": "mul"}, {"scale": "none"}, {"mask": False}, {"k_swap": True}])
def test_a_spelled_out_multi_head_attention_becomes_onnx_attention_at_opset_23(variant):
    model = _attention(**variant)
    before = model.SerializeToString()
    result = Rewrite(kinds=("attention",))(model)
    new, made = result.model, result.details
    assert made == {"attention": 1} and model.SerializeToString() == before
    onnx.checker.check_model(new, full_check=True)
    attention = [n for n in new.graph.node if n.op_type == "Attention"]
    assert len(attention) == 1 and [n.op_type for n in new.graph.node] == ["Attention", "Relu"], \
        "the heads' reshapes, transposes and their shape constants are gone"
    assert list(attention[0].input) == ["q", "k", "v"] + (["bias"] if variant.get("mask", True) else [])
    attrs = {a.name: helper.get_attribute_value(a) for a in attention[0].attribute}
    assert attrs["q_num_heads"] == attrs["kv_num_heads"] == 2
    assert attrs["scale"] == pytest.approx({"div": 0.5, "mul": 0.5, "none": 1.0}[variant.get("scale", "div")])
    assert next(o.version for o in new.opset_import if o.domain == "") == 23
    feeds = _attention_feeds(variant.get("mask", True))
    expected, got = _run(model, feeds)[0], _run(new, feeds)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", ["opset 18", "a function at opset 18", "probabilities given out",
                                  "heads of unknown size"])
def test_an_attention_that_cannot_be_one_node_is_left_alone(case):
    if case == "opset 18":
        model = _attention(opset=18)
    elif case == "a function at opset 18":
        model = _attention()
        model.functions.append(helper.make_function("local", "f", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])],
                                                    [helper.make_opsetid("", 18)]))
    elif case == "probabilities given out":
        model = _attention(probs_out=True)
    else:
        model = _attention()
        for v in model.graph.value_info:
            if v.name in ("q4", "k4", "v4"):
                v.type.tensor_type.shape.dim[2].Clear()
    result = Rewrite(kinds=("attention",))(model)
    new, made = result.model, result.details
    assert made == {} and new is model


def test_rewriting_in_place_gives_what_the_copy_gives():
    model = _attention()
    copy = Rewrite()(model)
    same = Rewrite()(model, owned=True)
    assert same.model is model and same.details == copy.details
    assert same.model.SerializeToString() == copy.model.SerializeToString()


def test_the_models_functions_are_declared_at_opset_23_with_it():
    model = _attention()
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.functions.append(helper.make_function("local", "f", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])],
                                                [helper.make_opsetid("", 20)]))
    result = Rewrite(kinds=("attention",))(model)
    new, made = result.model, result.details
    assert made == {"attention": 1}
    assert [o.version for o in new.functions[0].opset_import] == [23]
    onnx.checker.check_model(new, full_check=True)


def test_an_onnx_runtime_without_attention_keeps_the_attention_spelled_out(monkeypatch):
    import graphaudit.replay.rewrite_attention as module

    assert module.runtime_has_attention(), "this environment's ONNX Runtime runs Attention (opset 23)"
    monkeypatch.setattr(module, "runtime_has_attention", lambda: False)
    model = _attention()
    result = Rewrite()(model)
    new, made = result.model, result.details
    assert "attention" not in made and "Attention" not in {n.op_type for n in new.graph.node}
    assert next(o.version for o in new.opset_import if o.domain == "") == 20


@pytest.mark.skipif(not (FIXTURES / "featuregate" / "model.onnx").is_file(), reason="no zoo fixtures")
def test_run_records_whether_its_replay_rewrote_the_frozen_graph():
    folder = FIXTURES / "featuregate"
    for flag, expected in (([], True), (["--no-rewrite"], False)):
        result = CliRunner().invoke(cli, ["run", str(folder / "model.onnx"), "--calib", str(folder / "calib.npz"),
                                          "--resamples", "20", "--format", "json", "-q", "--runs", "1", "--warmup",
                                          "0", "--profile-runs", "1", "--limit", "2", *flag])
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        assert report["inputs"]["rewrite"] is expected
        assert bool(report["replay"]["settings"].get("rewrites")) is expected


def _wrong_scale(node):  # an attention that scales its scores wrongly: not the live outputs
    if node.op_type == "Attention":
        next(a for a in node.attribute if a.name == "scale").f *= 3.0


def _unknown_operator(node):  # an operator ONNX Runtime has no kernel for: the session is refused
    if node.op_type == "Attention":
        node.op_type = "NoSuchAttention"


@pytest.mark.skipif(not (FIXTURES / "featuregate" / "model.onnx").is_file(), reason="no zoo fixtures")
@pytest.mark.parametrize("spoil", [_wrong_scale, _unknown_operator])
def test_a_rewrite_that_fails_the_parity_check_is_dropped_and_said(monkeypatch, spoil):
    import graphaudit.replay.steps as replay_module

    class Broken(Rewrite):
        def __call__(self, model, *, owned=False):
            result = super().__call__(model, owned=owned)
            for node in result.model.graph.node:
                spoil(node)
            return result

    folder = FIXTURES / "featuregate"
    args = (folder / "model.onnx", folder / "calib.npz", folder / "eval.npz")
    expected = replay(*args, threads=1, resamples=20, rewrite=False).to_json()
    monkeypatch.setattr(replay_module, "Rewrite", Broken)
    report = replay(*args, threads=1, resamples=20)
    assert report.settings["rewrites"] == {}
    assert report.settings["rewrite_note"].startswith("the rewritten frozen graph did not run as the live model does")
    assert ("rewrites", report.settings["rewrite_note"]) in report.setting_notes()
    assert report.parity.ok
    got = report.to_json()
    assert got["conditions"] == expected["conditions"] and got["variance"] == expected["variance"]
