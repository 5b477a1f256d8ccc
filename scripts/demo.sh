#!/usr/bin/env bash
# The main job on the default cpu-reference target, from a fresh clone:
# install -> tiny model -> check -> plan -> build (convert, reference engine, Triton repository)
# -> serve on 127.0.0.1 -> smoke with greedy parity -> stop. Artifacts go to ./out (store: ./out/store).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export PATH="$PWD/.venv/bin:$PATH"
export TRTPIPE_HOME="${TRTPIPE_HOME:-$PWD/out/store}"
SPEC="${SPEC:-build_configs/examples/tiny-cpu.yaml}"  # SPEC=build_configs/examples/tiny-cpu-llmapi.yaml: the LLM-API track

[ -f out/tiny-llama/config.json ] || trtpipe example-model out/tiny-llama
trtpipe check --spec "$SPEC"
trtpipe plan "$SPEC"
trtpipe build "$SPEC"
# Built again on purpose: every stage is a cache hit (no work), and --json names the repository.
REPO=$(trtpipe build "$SPEC" --json | python -c 'import json,sys; print(json.load(sys.stdin)["repository_path"])')
trtpipe validate "$REPO"

READY=$(mktemp -d)/serve.json
# Returns once the server is ready and reports the repository's digest (or fails with serve's own line and code).
trtpipe serve "$REPO" --detach --ready-file "$READY"
trap 'trtpipe serve-stop "$READY" >/dev/null' EXIT
GRPC=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["grpc_url"])' "$READY")
trtpipe smoke "$GRPC" --parity "$SPEC" --record "$REPO"
echo
echo "Done. Repository: $REPO"
echo "Serve it yourself with: .venv/bin/trtpipe serve $REPO"
