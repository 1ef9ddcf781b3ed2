#!/usr/bin/env bash
# README command 1: install what is missing, build, start a local cluster
# (router + 1 prefill worker + 1 decode worker) on the default model, and
# stream an answer through it: router -> prefill worker -> KV over UCX ->
# decode worker -> router, with its TTFT and TPOT; then stop the cluster.
#
# Environment: PDSERVE_HOME (default ~/.cache/pdserve), PDSERVE_ROUTER_PORT
# (client gRPC, default 50050), PDSERVE_HTTP_PORT (OpenAI HTTP, default
# 8000), PDSERVE_CONTROL_PORT (membership/admin, default 50051), PROMPT (the
# question to answer).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(repo_root)"

bash scripts/setup.sh

step "Building the servers and tools (bazel build -c opt)"
TARGETS=(//cli:pdctl //router:pd-router //prefill_worker:pd-prefill-worker
         //decode_worker:pd-decode-worker //model:pd-gguf-info
         //engine:pd-generate)
bazel build --config=opt "${TARGETS[@]}"
BIN=$(bazel info --config=opt bazel-bin 2>/dev/null)

step "The default model"
"$BIN/model/pd-gguf-info" "$PDSERVE_DEFAULT_MODEL"

PROMPT="${PROMPT:-What is the capital of France? Answer in one sentence.}"
step "The offline engine answers: $PROMPT"
"$BIN/engine/pd-generate" --model="$PDSERVE_DEFAULT_MODEL" --chat \
  --prompt="$PROMPT" --max_tokens=96

step "Starting a local cluster: router, 1 prefill worker, 1 decode worker"
ROUTER="127.0.0.1:${PDSERVE_ROUTER_PORT:-50050}"
HTTP="127.0.0.1:${PDSERVE_HTTP_PORT:-8000}"
CONTROL="127.0.0.1:${PDSERVE_CONTROL_PORT:-50051}"
WORK="$PDSERVE_HOME/local-cluster"
PDCTL="$BIN/cli/pdctl"
# A cluster left over from an interrupted run is stopped first.
"$PDCTL" down --work_dir="$WORK" >/dev/null
# One forward-pass thread per worker: the two processes share 2 cores.
"$PDCTL" up --work_dir="$WORK" --model="$PDSERVE_DEFAULT_MODEL" \
  --router_listen="$ROUTER" --http_listen="$HTTP" --control_listen="$CONTROL" \
  --worker_args=--threads=1
trap '"$PDCTL" down --work_dir="$WORK"' EXIT

step "Cluster status (pdctl status)"
"$PDCTL" status --router="$CONTROL"

step "The cluster answers (router -> prefill -> KV over UCX -> decode): $PROMPT"
"$PDCTL" generate --grpc="$ROUTER" --chat --prompt="$PROMPT" --max_tokens=96

step "The same through the OpenAI-compatible HTTP API (curl, streamed SSE)"
curl -sS -N --max-time 120 "http://$HTTP/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d "{\"messages\": [{\"role\": \"user\", \"content\": \"$PROMPT\"}],
       \"max_tokens\": 3, \"temperature\": 0, \"stream\": true}"

step "Stopping the cluster"
trap - EXIT
"$PDCTL" down --work_dir="$WORK"
info "done. Logs of every process are in $WORK"
