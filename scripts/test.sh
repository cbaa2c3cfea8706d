#!/usr/bin/env bash
# Runs the lint checks (scripts/lint.sh), then the whole test suite, in the project's virtual
# environment (created on first use).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash scripts/lint.sh
exec python -m pytest -n 2 -q "$@"
