#!/usr/bin/env bash
# Runs the demo audit on the bundled fixtures in the project's virtual environment.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec graphaudit demo "$@"
