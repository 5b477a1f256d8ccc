#!/usr/bin/env bash
# Installs everything the tests need, then runs them. This is exactly what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
# Two workers (pytest-xdist; TRTPIPE_TEST_WORKERS=1 runs the suite in one process): a test file stays on one worker
# and every Ray test on the same one (tests/conftest.py). --durations: the slowest tests in CI's log, to keep the
# run within its time budget (about 18 minutes on a quiet 2-core machine, 34 in one process).
workers="${TRTPIPE_TEST_WORKERS:-2}"
if [ "$workers" = 1 ]; then
  exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=40 "$@"
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" --dist loadgroup --durations=40 "$@"
