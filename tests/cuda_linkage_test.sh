#!/usr/bin/env bash
# CPU-only binaries must not need CUDA libraries at run time; CUDA targets
# must link them. Checked with ldd on the built binaries.
# Usage: cuda_linkage_test.sh CUDA_BINARY CPU_BINARY...
set -u
status=0
libraries_of() {  # ldd output of $1, or a failure if ldd cannot read it
  [ -x "$1" ] || { echo "FAIL: $1 is not an executable" >&2; return 1; }
  ldd "$1" || { echo "FAIL: ldd cannot read $1" >&2; return 1; }
}
cuda_binary=$1; shift
if ! deps=$(libraries_of "$cuda_binary"); then
  status=1
elif ! grep -q 'libcudart' <<<"$deps"; then
  echo "FAIL: $cuda_binary does not link libcudart"; status=1
else
  echo "ok: $(basename "$cuda_binary") links libcudart"
fi
for binary in "$@"; do
  if ! deps=$(libraries_of "$binary"); then
    status=1
  elif grep -E 'libcuda|libnccl' <<<"$deps"; then
    echo "FAIL: CPU binary $binary links CUDA libraries (above)"; status=1
  else
    echo "ok: $(basename "$binary") has no CUDA dependency"
  fi
done
exit $status
