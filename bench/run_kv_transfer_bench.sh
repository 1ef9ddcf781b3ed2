#!/usr/bin/env bash
# Runs kv_transfer_bench twice, into a pool the transport allocated (a decode
# worker's: shared memory the writer stores into directly) and into a
# registered heap pool (written through the endpoint: TCP loopback under peer
# error handling), each against ucx_perftest with and without -e in the same
# run, then plots both into one PNG. Results go to bench/results/ (or $1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-bench/results}
mkdir -p "$out"
bazel build --config=opt //bench:kv_transfer_bench
bin=$(bazel info --config=opt bazel-bin 2>/dev/null)/bench/kv_transfer_bench
echo "==> receiver pool allocated by the transport (direct stores)"
"$bin" --receiver_memory=allocated --json="$out/kv_transfer_allocated.json"
echo "==> receiver pool registered (puts through the endpoint)"
"$bin" --receiver_memory=registered --json="$out/kv_transfer_registered.json"
python3 -c 'import matplotlib' 2>/dev/null ||
  python3 -m pip install --quiet matplotlib
python3 bench/plot_kv_transfer.py "$out/kv_transfer.png" \
  "$out/kv_transfer_allocated.json" "$out/kv_transfer_registered.json"
