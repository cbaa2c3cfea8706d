"""The runtime profile: what actually ran, at what size, how long it took, against a baseline.

`profile_model(model, data, baseline=...)` gives back a ProfileReport (frozen; `.to_json()`).
The pieces, in the order the data flows:

- session.py   — ORT sessions: optimisation level, profiler files in a temp folder, unique names
- rounds.py    — how many rounds: as given, or chosen from the first round's time to fit a budget
- latency.py   — un-profiled wall-clock timing (perf_counter_ns, warm-ups dropped, I/O binding on CUDA)
- events.py    — profiler JSON (both layouts) → node events grouped per run, self times
- mapping.py   — event names → graph nodes (one-to-one, or through ORT's optimised model) → blocks
- execution.py — per input: nodes that ran and their shapes → per block executed fraction and FLOPs
- breakdown.py — per node / block / op type: median time, share, coverage
- baseline.py  — same inputs, alternating runs, latency ratio with its spread
- trace.py     — Chrome-trace / Perfetto file with block annotations
- report.py    — the ProfileReport
"""

from graphaudit.profile.baseline import BaselineComparison
from graphaudit.profile.events import NodeEvent, Profile, Run, parse_profile
from graphaudit.profile.latency import Spread
from graphaudit.profile.profiler import profile_model
from graphaudit.profile.report import ProfileReport
from graphaudit.profile.rounds import Rounds, choose_rounds

__all__ = [
    "BaselineComparison",
    "NodeEvent",
    "Profile",
    "ProfileReport",
    "Rounds",
    "Run",
    "Spread",
    "choose_rounds",
    "parse_profile",
    "profile_model",
]
