#!/usr/bin/env bash
# The whole audit and the profile benchmark on CUDA, for a machine with an NVIDIA GPU:
#
#     bash benchmarks/gpu_check.sh            # every zoo model
#     GPU_CHECK_MODELS=featuregate,moe bash benchmarks/gpu_check.sh
#
# It needs a Python whose ONNX Runtime is the GPU build (`pip install -e '.[gpu]'`); set
# GRAPHAUDIT_PYTHON to it (default: the project's .venv, else python3). It stops in one line
# where CUDA cannot run a session. For each model it runs `graphaudit run --provider cuda` against
# the Dense baseline (reports in $GPU_CHECK_OUT, default a fresh temporary folder), then
# benchmarks/profile_zoo.py on CUDA, and prints one Markdown table of what the audits measured.
# GPU_CHECK_PROVIDER=cpu runs the same steps on the CPU (the test suite checks the script so).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${GRAPHAUDIT_PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
PROVIDER="${GPU_CHECK_PROVIDER:-cuda}"
MODELS="${GPU_CHECK_MODELS:-featuregate,mudd,moe,earlyexit}"
RUNS="${GPU_CHECK_RUNS:-20}"
OUT="${GPU_CHECK_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

if [[ "$PROVIDER" == cuda ]]; then
  "$PY" - <<'PY' || exit 1
import sys
try:
    import onnxruntime as ort
except ImportError:
    sys.exit("gpu_check: expected ONNX Runtime, found none: pip install -e '.[gpu]'")
from graphaudit.runtime.sessions import cuda_problem
if "CUDAExecutionProvider" not in ort.get_available_providers():
    sys.exit(f"gpu_check: expected ONNX Runtime's GPU build (onnxruntime-gpu), found providers "
             f"{', '.join(ort.get_available_providers())}: pip install -e '.[gpu]' in an environment without onnxruntime")
problem = cuda_problem()
if problem is not None:
    sys.exit(f"gpu_check: expected CUDA to run a session, found {problem}")
print(f"onnxruntime {ort.__version__} on CUDA", file=sys.stderr)
PY
fi

cd "$ROOT"
IFS=, read -ra names <<< "$MODELS"
for name in "${names[@]}"; do
  start=$(date +%s.%N)
  status=0
  "$PY" -m graphaudit run "fixtures/$name/model.onnx" --calib "fixtures/$name/calib.npz" \
      --data "fixtures/$name/eval.npz" --baseline fixtures/dense/model.onnx --provider "$PROVIDER" \
      --runs "$RUNS" -q --format json -o "$OUT/run-$name.json" || status=$?
  end=$(date +%s.%N)
  echo "$name $status $start $end" >> "$OUT/walls.txt"
done
"$PY" benchmarks/profile_zoo.py --provider "$PROVIDER" --models "dense,$MODELS" --runs "$RUNS" \
    --json "$OUT/profile_zoo.json" > "$OUT/profile_zoo.md"

"$PY" - "$OUT" "$PROVIDER" <<'PY'
import json, sys
from pathlib import Path
out, provider = Path(sys.argv[1]), sys.argv[2]
print(f"| model | exit | run wall s | provider used | coefficients vary | depends on them | skips work | faster than Dense | latency ms | ratio to Dense |")
print("|---|---|---|---|---|---|---|---|---|---|")
for line in (out / "walls.txt").read_text().split("\n"):
    if not line:
        continue
    name, status, start, end = line.split()
    path = out / f"run-{name}.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    verdict = doc.get("verdict") or {}
    answer = lambda key: (verdict.get(key) or {}).get("answer", "—")
    profile = doc.get("profile") or {}
    ratio = (profile.get("baseline") or {}).get("ratio")
    print(f"| {name} | {status} | {float(end) - float(start):.1f} | {profile.get('provider', '—')} "
          f"| {answer('coefficient_variation')} | {answer('functional_dependence')} | {answer('conditional_execution')} "
          f"| {answer('compute_savings')} | {(profile.get('latency_ms') or {}).get('median', float('nan')):.3f} "
          f"| {ratio if ratio is None else f'{ratio:.3f}'} |")
print()
print((out / "profile_zoo.md").read_text())
print(f"reports: {out}", file=sys.stderr)
PY
