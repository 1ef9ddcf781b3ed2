#!/usr/bin/env bash
# Runs kv_transfer_bench with UCX's default transports and with UCX_TLS=tcp,
# then plots both into one PNG. Results go to bench/results/ (or $1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-bench/results}
mkdir -p "$out"
bazel build --config=opt //bench:kv_transfer_bench
bin=$(bazel info --config=opt bazel-bin 2>/dev/null)/bench/kv_transfer_bench
echo "==> UCX default transports"
"$bin" --json="$out/kv_transfer_default.json"
echo "==> UCX_TLS=tcp"
UCX_TLS=tcp "$bin" --json="$out/kv_transfer_tcp.json"
python3 -c 'import matplotlib' 2>/dev/null ||
  python3 -m pip install --quiet matplotlib
python3 bench/plot_kv_transfer.py "$out/kv_transfer.png" \
  "$out/kv_transfer_default.json" "$out/kv_transfer_tcp.json"
