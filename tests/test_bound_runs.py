"""The GPU path's timed runs, I/O binding, run here on the CPU: no GPU is needed to check it.

On a GPU provider the profile times runs through I/O binding (inputs copied to the device once,
outputs bound there, each run waited for), so a run's time is the device's work. The same
BoundRunner runs with device "cpu" on the CPU provider: its outputs must be the plain run's, and
`make_runner` must pick it for a provider that BOUND_DEVICES names.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from graphaudit.profile import latency
from graphaudit.profile.latency import BoundRunner, make_runner, time_rounds

from support.models import float_data, float_gated


def _session() -> ort.InferenceSession:
    return ort.InferenceSession(float_gated().SerializeToString(), providers=["CPUExecutionProvider"])


def test_bound_runs_give_the_plain_runs_outputs_and_are_timed_alike():
    session = _session()
    feeds = [{"x": float_data(2, seed=s)} for s in range(3)]
    runner = BoundRunner(session, feeds, "cpu")
    for i, feed in enumerate(feeds):
        runner(i)
        bound = runner.bindings[i].copy_outputs_to_cpu()
        plain = session.run(None, feed)
        assert [o.shape for o in bound] == [o.shape for o in plain]
        for a, b in zip(bound, plain):
            np.testing.assert_array_equal(a, b)
    ns = time_rounds([runner, make_runner(session, feeds)], batches=3, runs=2, warmup=1)
    assert ns.shape == (2, 2, 3) and (ns > 0).all()


def test_a_provider_named_in_bound_devices_is_timed_through_io_binding(monkeypatch):
    session = _session()
    feeds = [{"x": float_data(2)}]
    assert not isinstance(make_runner(session, feeds), BoundRunner)  # the CPU: plain runs
    monkeypatch.setitem(latency.BOUND_DEVICES, "CPUExecutionProvider", "cpu")
    runner = make_runner(session, feeds)
    assert isinstance(runner, BoundRunner)
    runner(0)
    np.testing.assert_array_equal(runner.bindings[0].copy_outputs_to_cpu()[0], session.run(None, feeds[0])[0])
