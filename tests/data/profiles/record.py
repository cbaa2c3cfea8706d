"""Re-record the profiler files in this folder: `python tests/data/profiles/record.py`.

- `dynamic_disable_all.json`: tests/support/profile_models.dynamic_model at ORT_DISABLE_ALL, one
  run per input of feeds_for(4) (inputs 0 and 2 exit early, 1 and 3 run block1).
- `dynamic_enable_all.json` and `transformer_enable_all.json`: the same model and the
  two-layer synthetic transformer at ORT_ENABLE_ALL, each with the optimised graph ORT
  saved (`*.optimised.onnx`, initializers stripped: mapping needs names only).
- `dynamic_fenced.json`: the older layout, derived from `dynamic_disable_all.json` as the
  ONNX Runtime profiling notes (shared/reference/ort-profiling.md) describe it: each
  `_kernel_time` event framed by `_fence_before` / `_fence_after` events, `exec_plan_index`
  and `graph_index` in its args, no memory fields, wrapped as `{"traceEvents": [...]}`.

Recorded with onnxruntime 1.32 (CPU). Tests only read these files.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[2]), str(HERE.parents[1])]

import numpy as np  # noqa: E402

from graphaudit.profile.session import session_options  # noqa: E402

from support.profile_models import dynamic_model, feeds_for, transformer_model  # noqa: E402

OLD_ARGS = ("op_name", "provider", "activation_size", "parameter_size", "output_size",
            "input_type_shape", "output_type_shape")


def record(model: onnx.ModelProto, feeds: list[dict], level: str, stem: str) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        optimised = Path(tmp) / "optimised.onnx" if level != "disable" else None
        so = session_options(level, threads=1, profile_prefix=Path(tmp) / "p", optimised_path=optimised)
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for feed in feeds:
            sess.run(None, feed)
        events = json.loads(Path(sess.end_profiling()).read_text())
        if optimised is not None:
            graph = onnx.load(str(optimised), load_external_data=False)
            del graph.graph.initializer[:]
            onnx.save(graph, str(HERE / f"{stem}.optimised.onnx"))
    out = HERE / f"{stem}.json"
    out.write_text(json.dumps(events, indent=0))
    return out


def fenced(events: list[dict]) -> dict:
    """The older layout of the same runs."""
    old = []
    for ev in events:
        if ev.get("cat") != "Node":
            old.append(ev)
            continue
        stem = ev["name"][: -len("_kernel_time")]
        args = {k: ev["args"][k] for k in OLD_ARGS if k in ev["args"]}
        args["graph_index"] = ev["args"].get("node_index", "0")
        args["exec_plan_index"] = ev["args"].get("node_index", "0")
        base = {"cat": "Node", "pid": ev["pid"], "tid": ev["tid"], "ph": "X"}
        old.append({**base, "dur": 0, "ts": ev["ts"], "name": stem + "_fence_before", "args": {"op_name": args.get("op_name")}})
        old.append({**base, "dur": ev["dur"], "ts": ev["ts"], "name": ev["name"], "args": args})
        old.append({**base, "dur": 0, "ts": ev["ts"] + ev["dur"], "name": stem + "_fence_after", "args": {"op_name": args.get("op_name")}})
    return {"traceEvents": old}


def main() -> None:
    feeds = [{"x": row[None]} for row in feeds_for(4)]
    dynamic = record(dynamic_model(), feeds, "disable", "dynamic_disable_all")
    record(dynamic_model(), feeds, "all", "dynamic_enable_all")
    ids = [{"input_ids": np.arange(5, dtype=np.int64)[None] % 32}, {"input_ids": np.arange(7, dtype=np.int64)[None] % 32}]
    record(transformer_model(), ids, "all", "transformer_enable_all")
    (HERE / "dynamic_fenced.json").write_text(json.dumps(fenced(json.loads(dynamic.read_text())), indent=0))


if __name__ == "__main__":
    main()
