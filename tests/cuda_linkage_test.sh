#!/usr/bin/env bash
# CPU-only binaries must not need CUDA libraries at run time; CUDA targets
# must link them. Checked with ldd on the built binaries.
# Usage: cuda_linkage_test.sh CUDA_BINARY CPU_BINARY...
set -u
status=0
cuda_binary=$1; shift
if ! ldd "$cuda_binary" | grep -q 'libcudart'; then
  echo "FAIL: $cuda_binary does not link libcudart"; status=1
fi
for binary in "$@"; do
  if ldd "$binary" | grep -E 'libcuda|libnccl'; then
    echo "FAIL: CPU binary $binary links CUDA libraries (above)"; status=1
  else
    echo "ok: $(basename "$binary") has no CUDA dependency"
  fi
done
exit $status
