"""The profiler's tiny graphs of tests/support/profile_models.py, checked against ONNX's
reference evaluator, and the inputs that make them take every path."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator

from support.profile_models import EXIT_THRESHOLD, dense_model, dynamic_model, feeds_for, transformer_model


def test_models_are_valid_and_ort_agrees_with_the_reference():
    for model in (dynamic_model(), dense_model(), transformer_model()):
        onnx.checker.check_model(model, full_check=True)
    model = dynamic_model()
    ref = ReferenceEvaluator(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for row in feeds_for(4):
        x = row[None]
        (expected,) = ref.run(None, {"x": x})
        (got,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_feeds_take_both_branches_and_route_different_token_counts():
    x = feeds_for(4)
    assert [bool(row.mean() > EXIT_THRESHOLD) for row in x] == [True, False, True, False]
    counts = set()
    # the router's token count, recomputed: rows of h1 with a positive score
    model = dynamic_model()
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for row in x:
        h0 = np.maximum(row @ weights["w0"] + weights["b0"], 0)
        h1 = h0 if row.mean() > EXIT_THRESHOLD else h0 + np.maximum(h0 @ weights["w1"], 0)
        counts.add(int(((h1 @ weights["wr"])[:, 0] > 0).sum()))
    assert len(counts) > 1
