"""A Switch Transformer / GShard mixture of experts with a capacity factor, in ONNX text syntax,
and what it computes in numpy.

Its dispatch is written as DeepSpeed writes it: a one-hot mask of each token's slot in its
expert's buffer (ArgMax → OneHot → cumsum − 1 < C, == range(C)) contracted with the tokens by
an Einsum, so that each expert runs on a buffer of C = ⌊1.25·N/E⌋ slots, and an Einsum with
the router's score that gives the rows back to their tokens.
"""

import numpy as np

from support.text_graphs import DENSE, DENSE_W, graph

E, D = 2, 2
# logits = router(x); p = softmax(logits); top = argmax(p); gate = max(p); C = ⌊1.25·N/E⌋;
# oh = one_hot(top); loc = cumsum(oh, 0)·oh − 1; keep = (loc < C) & (oh > 0);
# slot = Σₑ loc·keep; disp[n, e, c] = keep[n, e]·(slot[n] == c)
ROUTING = """
        ["/model/layers.@/mlp/router/MatMul"] logits = MatMul (x@, "model.layers.@.mlp.router.weight")
        ["/model/layers.@/mlp/Softmax"] p = Softmax <axis = -1> (logits)
        ["/model/layers.@/mlp/ArgMax"] top = ArgMax <axis = -1, keepdims = 0> (p)
        ["/model/layers.@/mlp/ReduceMax"] gate = ReduceMax <keepdims = 0> (p, last)
        ["/model/layers.@/mlp/Shape"] shape = Shape (x@)
        ["/model/layers.@/mlp/Gather"] n = Gather <axis = 0> (shape, zero)
        ["/model/layers.@/mlp/Cast"] nf = Cast <to = 1> (n)
        ["/model/layers.@/mlp/Mul"] cf = Mul (nf, factor)
        ["/model/layers.@/mlp/Floor"] cfl = Floor (cf)
        ["/model/layers.@/mlp/Cast_1"] c = Cast <to = 7> (cfl)
        ["/model/layers.@/mlp/OneHot"] oh = OneHot <axis = -1> (top, depth, onoff)
        ["/model/layers.@/mlp/CumSum"] cs = CumSum (oh, zero)
        ["/model/layers.@/mlp/Mul_1"] csm = Mul (cs, oh)
        ["/model/layers.@/mlp/Sub"] loc = Sub (csm, onef)
        ["/model/layers.@/mlp/Less"] under = Less (loc, cfl)
        ["/model/layers.@/mlp/Greater"] chosen = Greater (oh, zerof)
        ["/model/layers.@/mlp/And"] keep = And (under, chosen)
        ["/model/layers.@/mlp/Cast_2"] keepf = Cast <to = 1> (keep)
        ["/model/layers.@/mlp/Mul_2"] lockeep = Mul (loc, keepf)
        ["/model/layers.@/mlp/ReduceSum"] slot = ReduceSum <keepdims = 0> (lockeep, last)
        ["/model/layers.@/mlp/Unsqueeze"] slot3 = Unsqueeze (slot, axes12)
        ["/model/layers.@/mlp/Range"] r = Range (zero, c, onei)
        ["/model/layers.@/mlp/Cast_3"] rf = Cast <to = 1> (r)
        ["/model/layers.@/mlp/Unsqueeze_1"] r3 = Unsqueeze (rf, axes01)
        ["/model/layers.@/mlp/Equal"] at = Equal (slot3, r3)
        ["/model/layers.@/mlp/Cast_4"] atf = Cast <to = 1> (at)
        ["/model/layers.@/mlp/Unsqueeze_2"] keep3 = Unsqueeze (keepf, axes2)
        ["/model/layers.@/mlp/Mul_3"] disp = Mul (keep3, atf)
        ["/model/layers.@/mlp/Unsqueeze_3"] gate3 = Unsqueeze (gate, axes12)
        ["/model/layers.@/mlp/Mul_4"] comb = Mul (disp, gate3)
"""
EXPERTS = """
        ["/model/layers.@/mlp/Einsum"] buf = Einsum <equation = "DISPATCH"> (MASK, x@)
        ["/model/layers.@/mlp/experts/MatMul"] h = MatMul (buf, "model.layers.@.mlp.experts.weight")
        ["/model/layers.@/mlp/experts/Relu"] hr = Relu (h)
        ["/model/layers.@/mlp/Einsum_1"] out = Einsum <equation = "nec,ecd->nd"> (comb, hr)
        ["/model/layers.@/Add"] x@+1 = Add (x@, out)
"""
CONSTANTS = ('int64 "zero" = {0}, int64 "onei" = {1}, int64[1] "last" = {-1}, float "factor" = {0.625}, '
             'int64 "depth" = {2}, float[2] "onoff" = {0.0, 1.0}, float "onef" = {1.0}, float "zerof" = {0.0}, '
             'int64[2] "axes12" = {1, 2}, int64[2] "axes01" = {0, 1}, int64[1] "axes2" = {2}')
ROUTER_W = 'float[2, 2] "model.layers.@.mlp.router.weight" = {1.0, -1.0, -0.5, 1.0}'
EXPERTS_W = 'float[2, 2, 2] "model.layers.@.mlp.experts.weight" = {1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0}'


def switch(dispatch: str = "nec,nd->ecd", mask: str = "disp") -> str:
    """Three blocks in ONNX text: dense, the Switch layer dispatching by `mask` with the Einsum
    `dispatch`, dense."""
    operands = "(x@, MASK)" if dispatch.startswith("nd,") else "(MASK, x@)"
    moe = ROUTING + EXPERTS.replace("(MASK, x@)", operands).replace("DISPATCH", dispatch).replace("MASK", mask)
    return graph([DENSE, moe, DENSE], [DENSE_W, f"{ROUTER_W}, {EXPERTS_W}, {CONSTANTS}", DENSE_W], opsets='"" : 18')


def reference(x: np.ndarray) -> np.ndarray:
    """The Switch layer of `switch()` between its two dense blocks, in numpy."""
    x1 = x + x
    logits = x1 @ np.array([[1.0, -1.0], [-0.5, 1.0]])
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    n, capacity = len(x), int(np.floor(len(x) * 1.25 / E))
    buffers = np.zeros((E, capacity, D))
    out = np.zeros_like(x1)
    filled = [0] * E
    for t in range(n):  # each token to its expert's next slot, dropped when the buffer is full
        e = int(p[t].argmax())
        if filled[e] < capacity:
            buffers[e, filled[e]] = x1[t]
            out[t] = p[t, e] * np.maximum(0.0, (e + 1) * x1[t])  # expert e: (e+1)·I, then ReLU
            filled[e] += 1
    x2 = x1 + out
    return x2 + x2
