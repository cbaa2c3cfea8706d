#!/usr/bin/env bash
# Runs ruff over the repository and mypy over graphaudit/, both configured in pyproject.toml;
# fails when either finds something. scripts/test.sh runs it first, in the project's environment
# (the dev extra installs both tools).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python -m ruff check --quiet .
python -m mypy
