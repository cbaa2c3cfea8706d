#!/usr/bin/env bash
# Runs the lint checks (scripts/lint.sh), then the whole test suite, in the project's virtual
# environment (created on first use).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash scripts/lint.sh
# The HTML report's browser test needs Chromium: installed from Debian's packages where it is
# missing and this is root on Debian (CI is); elsewhere that test says how to get it, and skips.
if ! command -v chromium >/dev/null 2>&1 && [ -z "${GRAPHAUDIT_BROWSER:-}" ] && [ "$(id -u)" = 0 ] \
        && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
        || echo "scripts/test.sh: could not install chromium; the browser test will be skipped" >&2
fi
# loadgroup: the tests of one xdist_group (the Ray tests: one Ray instance) run in one worker
exec python -m pytest -n 2 --dist loadgroup -q "$@"
