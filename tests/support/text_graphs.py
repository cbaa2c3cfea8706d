"""Tiny graphs in ONNX text syntax (onnx.parser), their parts, and the static audit of them.

A graph is a list of blocks, each a text in which `@` stands for the block's number: block
i reads x{i} and writes x{i+1} (`graph` for the static audit's tests, `layered` for block
finding's). `DENSE` always runs, `GATED` is weighted by a gate; `CONDITIONS` and `TRIPS` give
an If's condition or a Loop's trip count by value, constant or shape; `ROUTE`, `PICK_*` and
`DISPATCH` make a mixture-of-experts layer that selects rows.
"""

import onnx
import onnx.parser

from graphaudit.analyses.declared_coefficients import metadata_entry
from graphaudit.analyses.static import audit_static
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model

EYE = "{1.0, 0.0, 0.0, 1.0}"


def model_of(text: str, declared=()) -> onnx.ModelProto:
    """The checked model parsed from `text`, declaring the coefficients `declared` in its metadata."""
    model = onnx.parser.parse_model(text)
    if declared:
        model.metadata_props.append(metadata_entry(declared))
    onnx.checker.check_model(model)
    return model


def audit(text: str, declared=(), **options):
    """The static audit of the model in `text`."""
    return audit_static(load_model(model_of(text, declared)), **options)


def verdicts(report) -> list[str]:
    """The verdict of each block of a static report, in order."""
    return [b.verdict for b in report.blocks]


def graph(blocks: list[str], weights: list[str], inputs="float[T, 2] x0", opsets='"" : 17') -> str:
    """Blocks in order, block i reading x{i} and writing x{i+1}; `@` stands for the number."""
    body = "\n".join(b.replace("@+1", str(i + 1)).replace("@", str(i)) for i, b in enumerate(blocks))
    inits = ", ".join(w.replace("@", str(i)) for i, ws in enumerate(weights) for w in [ws] if w)
    return f"""
    <ir_version: 8, opset_import: [{opsets}]>
    g ({inputs}) => (float[T, 2] y) <{inits}> {{
        {body}
        ["/model/head/Identity"] y = Identity (x{len(blocks)})
    }}"""


def graph_of(model: onnx.ModelProto | str):
    """The graph model of `model`, a ModelProto or ONNX text, checked first."""
    if isinstance(model, str):
        model = onnx.parser.parse_model(model)
    onnx.checker.check_model(model)
    return build_graph(load_model(model).model)


def layered(layer: str, n: int, inits: str = "", header: str = "(float[B, T, 2] x0) => (float[B, T, 2] y)") -> str:
    """A graph of `n` copies of `layer`, whose `@` is the layer number, x@ → x(@+1)."""
    weights = ", ".join(inits.replace("@", str(i)) for i in range(n) if inits)
    body = "\n".join(layer.replace("@+1", str(i + 1)).replace("@", str(i)) for i in range(n))
    return f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g {header} {"<" + weights + ">" if weights else ""} {{
        {body}
        y = Identity (x{n})
    }}"""


def members(bm, mg, op=None):
    """The op types of each block's nodes (those of type `op` only, if given), sorted, block by block."""
    return [sorted(mg.nodes[n].op_type for n in b.node_ids if op is None or mg.nodes[n].op_type == op)
            for b in bm.blocks]


# -- blocks ----------------------------------------------------------------------------------
DENSE = """
        ["/model/layers.@/fc/MatMul"] h@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/Add"] x@+1 = Add (x@, h@)
"""
DENSE_W = f'float[2, 2] "model.layers.@.fc.weight" = {EYE}'

GATED = """
        ["/model/layers.@/fc/MatMul"] h@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/gate/MatMul"] gl@ = MatMul (x@, "model.layers.@.gate.weight")
        ["/model/layers.@/gate/Sigmoid"] "gate.@" = Sigmoid (gl@)
        ["/model/layers.@/Mul"] m@ = Mul ("gate.@", h@)
        ["/model/layers.@/Add"] x@+1 = Add (x@, m@)
"""
GATED_W = DENSE_W + f', float[2, 2] "model.layers.@.gate.weight" = {EYE}'

LEGACY = """
        ["/model/layers.@/mlp/MatMul"] h@ = MatMul (x@, "model.layers.@.mlp.weight")
        ["/model/layers.@/mlp/Relu"] r@ = Relu (h@)
        ["/model/layers.@/Add"] x@+1 = Add (x@, r@)
"""
LEGACY_W = 'float[2, 2] "model.layers.@.mlp.weight" = ' + EYE


# -- control flow ----------------------------------------------------------------------------
CONDITIONS = {
    "value": """
        total = ReduceSum <keepdims = 0> (x1)
        zero = Constant <value = float {0.0}> ()
        go = Greater (total, zero)""",
    "const": """
        go = Constant <value = bool {1}> ()""",
    "shape": """
        s = Shape (x1)
        four = Constant <value = int64[1] {4}> ()
        big = Greater (s, four)
        first = Constant <value = int64[1] {0}> ()
        bigs = Gather (big, first)
        go = Squeeze (bigs)""",
}
SKIPPABLE = """
        ["/model/exit/If"] x2 = If (go) <
            then_branch = t () => (float[T, 2] same) { same = Identity (x1) },
            else_branch = e () => (float[T, 2] x2b) {
                ["/model/layers.1/fc/MatMul"] h1 = MatMul (x1, "model.layers.1.fc.weight")
                ["/model/layers.1/Add"] x2b = Add (x1, h1)
            }
        >
"""
# the trip count `n` of a Loop after block 0, by value or by shape
TRIPS = {
    "value": """
        total = ReduceSum <keepdims = 0> (x1)
        n = Cast <to = 7> (total)""",
    "shape": """
        s = Shape (x1)
        first = Constant <value = int64[1] {0}> ()
        t = Gather (s, first)
        n = Squeeze (t)""",
}


# -- routing -----------------------------------------------------------------------------------
ROUTE = """
        ["/model/layers.@/router/MatMul"] s2 = MatMul (x@, "model.layers.@.router.weight")
        axis1 = Constant <value = int64[1] {1}> ()
        ["/model/layers.@/router/Squeeze"] score = Squeeze (s2, axis1)
"""
PICK_CAPACITY = """
        k = Constant <value = int64[1] {2}> ()
        ["/model/layers.@/TopK"] top, idx = TopK <axis = 0> (score, k)
"""
PICK_NONZERO = """
        zero = Constant <value = float {0.0}> ()
        positive = Greater (score, zero)
        ["/model/layers.@/NonZero"] nz = NonZero (positive)
        flat = Constant <value = int64[1] {-1}> ()
        ["/model/layers.@/Reshape"] idx = Reshape (nz, flat)
"""
DISPATCH = """
        ["/model/layers.@/Gather"] sel = Gather <axis = 0> (x@, idx)
        ["/model/layers.@/expert/MatMul"] out = MatMul (sel, "model.layers.@.expert.weight")
        ["/model/layers.@/Unsqueeze"] idx2 = Unsqueeze (idx, axis1)
        ["/model/layers.@/ScatterND"] x@+1 = ScatterND (x@, idx2, out)
"""
MOE_W = (f'float[2, 1] "model.layers.@.router.weight" = {{1.0, 1.0}}, '
         f'float[2, 2] "model.layers.@.expert.weight" = {EYE}')
