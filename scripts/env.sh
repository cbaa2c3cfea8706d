# Sourced by the README's two commands: creates (or reuses) the project's virtual environment
# in .venv and installs graphaudit with ONNX Runtime's CPU build (the [cpu] extra), the exporters,
# Ray (the [ray] extra, for --ray) and the test and lint tools (the dev extra). Re-runs are
# cheap: the install is skipped while pyproject.toml and constraints.txt are unchanged.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GRAPHAUDIT_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
stamp="$venv/.graphaudit-installed"
want="$(cat "$root/pyproject.toml" "$root/scripts/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # torch is pinned (constraints.txt): any other version downloads several GB.
    "$venv/bin/python" -m pip install --quiet -c "$root/scripts/constraints.txt" \
        -e "$root[cpu,exporters,dev,ray]"
    echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
