"""Determinism: the same inputs and seed give byte-identical JSON, apart from what is timed.

`static`, `replay` and `run` are each run twice on a copy of a zoo model and a small
subset of its data; the two JSON documents must be identical byte for byte once the
fields that hold measured time are removed. Those fields are listed here, path by path
(`*` for every item of a list), and each must exist, so that a renamed timing field fails
this test instead of slipping through.
"""

from __future__ import annotations

import json

import pytest

from support.cli import accepted
from support.zoo import zoo_subset

# Fields that hold measured time, or are ordered or worded by it.
REPLAY_TIMING = [("timing",)]
RUN_TIMING = [
    ("replay", "timing"),
    ("profile", "latency_ms"),
    ("profile", "profiled_latency_ms"),
    ("profile", "profiling_overhead"),
    ("profile", "coverage"),  # the share of measured time mapped to nodes
    ("profile", "unmapped_share"),
    ("profile", "blocks", "*", "median_ms"),
    ("profile", "blocks", "*", "mean_ms"),
    ("profile", "blocks", "*", "p10_ms"),
    ("profile", "blocks", "*", "p90_ms"),
    ("profile", "blocks", "*", "share"),
    ("profile", "ops"),  # operators by time, slowest first
    ("profile", "nodes"),  # nodes by time, slowest first
    ("profile", "per_input", "*", "latency_ms"),
    ("profile", "by_blocks_ran", "*", "latency_ms"),
    ("profile", "rounds", "run_s"),  # the warm-up run the sample was chosen from
    ("profile", "rounds", "reached"),  # the interval the timed rounds reached
    ("profile", "rounds", "reason"),  # says both
    ("verdict", "compute_savings", "statement"),  # quotes the median latency when there is no baseline
    ("timing",),
]


def strip(doc, paths):
    """`doc` without the fields at `paths`; each path must be there."""
    for path in paths:
        _remove(doc, path, path)
    return doc


def _remove(node, path, full):
    key, rest = path[0], path[1:]
    if key == "*":
        assert isinstance(node, list) and node, f"no list items at {full}"
        for item in node:
            _remove(item, rest, full)
        return
    assert isinstance(node, dict) and key in node, f"no field {key!r} at {full}"
    if rest:
        _remove(node[key], rest, full)
    else:
        del node[key]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return zoo_subset(tmp_path_factory.mktemp("determinism"), "featuregate", rows=6, tokens=16)


def _twice(capfd, args, files):
    return [accepted(capfd, [str(a) for a in args], files) for _ in range(2)]


def test_static_json_is_byte_identical(zoo, capfd):
    first, second = _twice(capfd, ["static", zoo["model"], "--data", zoo["eval"], "--format", "json"],
                           list(zoo.values()))
    assert first == second and json.loads(first)["flops"] is not None


def test_replay_json_is_byte_identical_apart_from_timing(zoo, capfd):
    def replay(seed):
        return ["replay", zoo["model"], "--calib", zoo["calib"], "--data", zoo["eval"], "--seed", seed,
                "--resamples", "50", "--batch-size", "4", "--format", "json", "--quiet"]

    first, second = (json.dumps(strip(json.loads(text), REPLAY_TIMING), indent=2)
                     for text in _twice(capfd, replay("7"), list(zoo.values())))
    assert first == second
    other = accepted(capfd, [str(a) for a in replay("8")], list(zoo.values()))
    assert json.dumps(strip(json.loads(other), REPLAY_TIMING), indent=2) != first  # the seed is used


def test_run_json_is_byte_identical_apart_from_timing(zoo, capfd):
    args = ["run", zoo["model"], "--calib", zoo["calib"], "--data", zoo["eval"], "--seed", "3", "--format", "json",
            "--runs", "2", "--warmup", "0", "--profile-runs", "1", "--resamples", "50", "--provider", "cpu", "-q"]
    first, second = (json.dumps(strip(json.loads(text), RUN_TIMING), indent=2)
                     for text in _twice(capfd, args, list(zoo.values())))
    assert first == second
