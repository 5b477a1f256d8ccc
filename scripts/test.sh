#!/usr/bin/env bash
# Installs everything the tests need, then runs them. This is exactly what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
# --durations: the slowest tests in CI's log, to keep the run within its time budget.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=40 "$@"
