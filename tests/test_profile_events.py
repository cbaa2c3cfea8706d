"""Profiler files of both layouts: node events grouped into runs, self times, bad files."""

import json
from pathlib import Path

import pytest

from graphaudit.errors import GraphAuditError
from graphaudit.profile.events import NodeEvent, group_runs, parse_profile

PROFILES = Path(__file__).parent / "data" / "profiles"
BLOCK1 = {"/block1/MatMul", "/block1/Relu", "/block1/Add"}


@pytest.fixture(scope="module", params=["dynamic_disable_all.json", "dynamic_fenced.json"])
def recorded(request):
    return parse_profile(PROFILES / request.param)


def test_layouts_are_told_apart():
    assert parse_profile(PROFILES / "dynamic_disable_all.json").layout == "current"
    fenced = parse_profile(PROFILES / "dynamic_fenced.json")
    assert fenced.layout == "fenced"
    assert all(ev.graph_index is not None for run in fenced.runs for ev in run.events)


def test_node_events_are_grouped_into_their_runs(recorded):
    assert len(recorded.runs) == 4 and recorded.outside_runs == 0
    for run in recorded.runs:
        assert all(run.ts <= ev.ts and ev.end <= run.ts + run.dur + 1 for ev in run.events)
        assert [ev.ts for ev in run.events] == sorted(ev.ts for ev in run.events)
    names = [{ev.name for ev in run.events} for run in recorded.runs]
    # inputs 0 and 2 exit early (then-branch), 1 and 3 run block1 (else-branch)
    assert [n >= BLOCK1 for n in names] == [False, True, False, True]
    assert ["/block1/skip" in n for n in names] == [True, False, True, False]
    for run in recorded.runs:
        assert [ev.name for ev in run.events].count("/loop/Add") == 2  # the Loop body ran twice


def test_fence_events_are_not_node_executions():
    current = parse_profile(PROFILES / "dynamic_disable_all.json")
    fenced = parse_profile(PROFILES / "dynamic_fenced.json")
    raw = json.loads((PROFILES / "dynamic_fenced.json").read_text())["traceEvents"]
    assert any(e["name"].endswith("_fence_before") for e in raw)
    for a, b in zip(current.runs, fenced.runs):
        assert [(e.name, e.op_type, e.dur, e.output_shapes) for e in a.events] == \
               [(e.name, e.op_type, e.dur, e.output_shapes) for e in b.events]


def test_shapes_are_the_shapes_the_node_ran_at(recorded):
    nonzero = [next(ev for ev in run.events if ev.name == "/moe/NonZero") for run in recorded.runs]
    assert all(ev.input_shapes == ((6,),) and ev.input_types == ("bool",) for ev in nonzero)
    counts = [ev.output_shapes[0][1] for ev in nonzero]
    assert len(set(counts)) > 1  # tokens routed to the expert depend on the input's values
    gathers = [next(ev for ev in run.events if ev.name == "/moe/GatherND") for run in recorded.runs]
    assert [g.output_shapes[0][0] for g in gathers] == counts


def test_control_flow_self_time_excludes_the_body(recorded):
    for run in recorded.runs:
        for owner, prefix in (("/exit/If", "/block1/"), ("/loop/Loop", "/loop/")):
            parent = next(ev for ev in run.events if ev.name == owner)
            body = [ev for ev in run.events if ev.name.startswith(prefix) and ev.name != owner]
            assert body and all(parent.ts <= ev.ts and ev.end <= parent.end + 1 for ev in body)
            assert parent.self_dur == pytest.approx(max(parent.dur - sum(ev.dur for ev in body), 0))
        plain = [ev for ev in run.events if not ev.is_control_flow]
        assert all(ev.self_dur == ev.dur for ev in plain)


def test_busy_time_is_the_union_of_node_intervals(recorded):
    for run in recorded.runs:
        top = [ev for ev in run.events if ev.name in ("/exit/If", "/loop/Loop") or not _nested(ev, run)]
        assert run.busy_us() == pytest.approx(sum(ev.dur for ev in top), abs=len(top))
        assert 0 < run.busy_us() <= run.dur


def _nested(ev, run):
    return any(o is not ev and o.is_control_flow and o.ts <= ev.ts and ev.end <= o.end + 1 for o in run.events)


def _event(name, ts, dur, op="Relu"):
    return NodeEvent(name, op, "CPUExecutionProvider", ts, dur, 1, None, None, None, None)


def test_events_outside_any_run_are_counted_not_assigned():
    windows = [(100.0, 50.0), (200.0, 50.0)]
    runs, outside = group_runs([_event("a", 10, 5), _event("b", 110, 5), _event("c", 160, 5),
                                _event("d", 210, 5), _event("e", 240, 30)], windows)
    assert [[e.name for e in r.events] for r in runs] == [["b"], ["d"]]
    assert outside == 3


def test_nested_if_events_get_self_times_level_by_level():
    events = [_event("outer", 0, 100, "If"), _event("inner", 10, 50, "If"), _event("leaf", 20, 20),
              _event("after", 70, 10)]
    runs, _ = group_runs(events, [(0.0, 100.0)])
    self_times = {e.name: e.self_dur for e in runs[0].events}
    assert self_times == {"outer": 40, "inner": 30, "leaf": 20, "after": 10}


def test_trace_event_object_and_bad_files(tmp_path):
    raw = json.loads((PROFILES / "dynamic_disable_all.json").read_text())
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"traceEvents": raw}))
    assert len(parse_profile(wrapped).runs) == 4
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(GraphAuditError, match="expected an ONNX Runtime profile"):
        parse_profile(broken)
    with pytest.raises(GraphAuditError, match="JSON array of trace events"):
        parse_profile({"events": []})
    with pytest.raises(GraphAuditError, match="expected an ONNX Runtime profile"):
        parse_profile(tmp_path / "missing.json")


def test_gpu_kernel_events_are_attributed_to_the_node_before_them():
    raw = [
        {"cat": "Session", "name": "model_run", "ph": "X", "ts": 0, "dur": 100, "pid": 1, "tid": 1, "args": {}},
        {"cat": "Node", "name": "mm_kernel_time", "ph": "X", "ts": 10, "dur": 5, "pid": 1, "tid": 1,
         "args": {"op_name": "MatMul", "provider": "CUDAExecutionProvider"}},
        {"cat": "Kernel", "name": "sgemm_a", "ph": "X", "ts": 12, "dur": 30, "pid": 1, "tid": 9, "args": {}},
        {"cat": "Kernel", "name": "sgemm_b", "ph": "X", "ts": 45, "dur": 7, "pid": 1, "tid": 9, "args": {}},
        {"cat": "Node", "name": "relu_kernel_time", "ph": "X", "ts": 20, "dur": 3, "pid": 1, "tid": 1,
         "args": {"op_name": "Relu", "provider": "CUDAExecutionProvider"}},
    ]
    profile = parse_profile(raw)
    assert profile.kernel_events == 2 and profile.node_time_kind() == "gpu_kernel"
    assert {ev.name: ev.kernel_dur for ev in profile.runs[0].events} == {"mm": 37, "relu": 0}
    launch_only = parse_profile([e for e in raw if e["cat"] != "Kernel"])
    assert launch_only.node_time_kind() == "host_launch"
    assert parse_profile(PROFILES / "dynamic_disable_all.json").node_time_kind() == "kernel"
