"""The runtime profile: what actually ran, at what size, how long it took, against a baseline.

`profile_model(model, data, baseline=...)` gives back a ProfileReport (frozen; `.to_json()`).
The pieces, in the order the data flows:

- session.py   — ORT sessions: optimisation level, profiler files in a temp folder, unique names
- rounds.py    — which inputs, how many rounds: as given, or chosen from measured times; when timing stops
- latency.py   — un-profiled wall-clock timing (perf_counter_ns, warm-ups dropped, I/O binding on CUDA)
- events.py    — profiler JSON (both layouts) → node events grouped per run, self times
- mapping.py   — event names → graph nodes (one-to-one, or through ORT's optimised model) → blocks
- execution.py — per input: nodes that ran and their shapes → per block executed fraction and FLOPs
- breakdown.py — per node / block / op type: median time, share, coverage
- baseline.py  — same inputs, alternating runs, latency ratio with its spread
- trace.py     — Chrome-trace / Perfetto file with block annotations
- report.py    — the ProfileReport
"""

import importlib

# Each name is imported from its module on first use: the verdict and the reports read
# graphaudit.profile.what_ran without loading ONNX Runtime and the profiler.
_HOMES = {
    "BaselineComparison": "baseline", "NodeEvent": "events", "Profile": "events", "Run": "events",
    "parse_profile": "events", "Spread": "latency", "profile_model": "profiler", "ProfileReport": "report",
    "Rounds": "rounds",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
