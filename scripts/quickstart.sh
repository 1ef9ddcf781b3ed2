#!/usr/bin/env bash
# README command 1: install what is missing, build, start a local cluster
# (router + 1 prefill worker + 1 decode worker) on the default model, and show
# it working; then stop it.
#
# Today the project goes as far as: the default model is fetched and read,
# the offline engine answers PROMPT (streamed, with TTFT and tokens/s), the
# cluster comes up, every process answers health checks, the workers are
# registered with the router, and pdctl reports them. Answering through the
# cluster (prefill -> KV transfer -> decode) joins with the serving path.
#
# Environment: PDSERVE_HOME (default ~/.cache/pdserve), PDSERVE_ROUTER_PORT
# (default 50050), PROMPT (the question to answer).
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
WORK="$PDSERVE_HOME/local-cluster"
mkdir -p "$WORK"
rm -f "$WORK/ready"
"$BIN/cli/pdctl" up --router_listen="$ROUTER" --work_dir="$WORK" \
  --ready_file="$WORK/ready" &
PDCTL_PID=$!
trap 'kill -TERM $PDCTL_PID 2>/dev/null; wait $PDCTL_PID 2>/dev/null' EXIT
for _ in $(seq 1 300); do
  [ -s "$WORK/ready" ] && break
  kill -0 $PDCTL_PID 2>/dev/null || die "the cluster failed to start (logs in $WORK)"
  sleep 0.1
done
[ -s "$WORK/ready" ] || die "the cluster did not become ready in 30 s (logs in $WORK)"

step "Cluster status (pdctl status)"
"$BIN/cli/pdctl" status --router="$ROUTER"

step "Health of the router (pdctl health $ROUTER)"
"$BIN/cli/pdctl" health "$ROUTER"

step "Stopping the cluster"
kill -TERM $PDCTL_PID
wait $PDCTL_PID
trap - EXIT
info "done. Logs of every process are in $WORK"
