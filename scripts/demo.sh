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

SERVE_JSON=$(mktemp)
trtpipe serve "$REPO" --json > "$SERVE_JSON" &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -f "$SERVE_JSON"' EXIT
for _ in $(seq 1 240); do
  [ -s "$SERVE_JSON" ] && break
  kill -0 $SERVER 2>/dev/null || { echo "error: trtpipe serve exited before it was ready" >&2; exit 1; }
  sleep 0.5
done
GRPC=$(python -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["grpc_url"])' "$SERVE_JSON")
trtpipe smoke "$GRPC" --parity "$SPEC" --record "$REPO"
echo
echo "Done. Repository: $REPO"
echo "Serve it yourself with: .venv/bin/trtpipe serve $REPO"
