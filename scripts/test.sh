#!/usr/bin/env bash
# Runs the whole test suite in the project's virtual environment (created on first use).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec python -m pytest -n 2 -q "$@"
