"""Every model of ONNX's own operator test cases (the `onnx` package generates them; nothing is
downloaded): the static audit reads each one without a traceback, and a sample of those ONNX
Runtime can run is profiled on the case's own inputs, each either measured or refused with one
"expected ..., found ..." line."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from graphaudit.analyses.static import audit_static
from graphaudit.errors import GraphAuditError
from graphaudit.load.data import from_arrays, input_specs
from graphaudit.load.model import load_model
from graphaudit.profile import profile_model


@pytest.fixture(scope="module")
def cases():
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the generators' own casts overflow on purpose
        return node.collect_testcases(None)


def _refusal(err: GraphAuditError) -> str:
    message = str(err)
    assert "\n" not in message and message.startswith("expected "), message
    return message


def test_every_operator_test_model_gets_a_static_audit(cases):
    audited, refused = 0, {}
    for case in cases:
        try:
            report = audit_static(load_model(case.model))
        except GraphAuditError as err:
            refused[case.name] = _refusal(err)
            continue
        json.dumps(report.to_json())  # the JSON document holds plain values only
        audited += 1
    assert len(cases) > 1000
    assert not refused and audited == len(cases), refused


def test_a_sample_of_them_is_profiled_or_refused_in_one_line(cases):
    measured, refused = 0, {}
    for case in cases[::7]:
        inputs = case.data_sets[0][0] if case.data_sets else []
        names = [i.name for i in case.model.graph.input]
        if len(inputs) != len(names) or not all(isinstance(x, np.ndarray) and x.ndim for x in inputs):
            continue  # sequences, optionals and scalars have no .npz rows to give
        if len({x.shape[0] for x in inputs}) != 1:
            continue  # no common first axis to cut into inputs
        try:
            loaded = load_model(case.model)
            data = from_arrays(dict(zip(names, inputs)), input_specs(loaded.model), case.name)
            report = profile_model(loaded, data, runs=1, warmup=0, profile_runs=1, threads=1,
                                   batch_size=None if data.count == 1 else data.count)
        except GraphAuditError as err:
            refused[case.name] = _refusal(err)
            continue
        assert report.examples == data.count
        measured += 1
    assert measured > 50, refused
