"""The tiny controller models of tests/support/models.py: checker-clean, ONNX Runtime agreeing
with onnx.reference, and `gated_lm` causal."""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from support.models import VOCAB, gate_in_branch, gated_lm, mixing_lm, run_ort, token_ids


def test_builders_are_checker_clean_and_agree_with_the_reference_evaluator():
    ids = token_ids(3)
    for model in (gated_lm(), mixing_lm(), gate_in_branch()):
        onnx.checker.check_model(model, full_check=True)
        (expected,) = ReferenceEvaluator(model).run(None, {"input_ids": ids})
        (got,) = run_ort(model, {"input_ids": ids})
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_gated_lm_is_causal():
    ids = token_ids(1, 6)
    changed = ids.copy()
    changed[0, 4] = (changed[0, 4] + 1) % VOCAB
    (a,), (b,) = run_ort(gated_lm(), {"input_ids": ids}), run_ort(gated_lm(), {"input_ids": changed})
    np.testing.assert_array_equal(a[0, :4], b[0, :4])
    assert not np.allclose(a[0, 4:], b[0, 4:])


