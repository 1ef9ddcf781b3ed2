# The Python environment the client checks in tests/clients/ run in: a venv
# at $PDSERVE_HOME/pyenv made from Debian's /usr/bin/python3 with
# --system-site-packages, so Debian's grpcio (python3-grpcio) and protobuf
# (python3-protobuf, the runtime that matches /usr/bin/protoc 3.21) are
# visible in it, plus the official `openai` client from PyPI (no Debian
# package), and kubernetes-validate (PyPI) for deploy/'s manifests test.
# Sourced, not run:
#
#   source scripts/python_env.sh   # exports PDSERVE_PYTHON (the venv's python)
#   ensure_python_env              # creates or completes the venv; quiet when done
#
# PDSERVE_PYTHON is exported at source time (the path is fixed), so a script
# that only needs the path (scripts/test.sh, for bazel's --test_env) can
# source this file without building anything.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PDSERVE_PYENV="$PDSERVE_HOME/pyenv"
PDSERVE_PYTHON="$PDSERVE_PYENV/bin/python"
export PDSERVE_PYTHON

# Pinned: the last 1.x release; stream_options needs >= 1.26.
PYENV_OPENAI_VERSION="1.109.1"
# Pinned: its newest schemas are Kubernetes 1.37's, what //deploy:manifests_test
# validates against.
PYENV_KUBERNETES_VALIDATE_VERSION="1.37.0"

# Exit 0 when the venv has everything the client checks import, at the
# expected versions (protobuf >= 3.20 is what protoc 3.21's generated code
# needs).
python_env_ok() {
  [ -x "$PDSERVE_PYTHON" ] || return 1
  "$PDSERVE_PYTHON" - "$PYENV_OPENAI_VERSION" "$PYENV_KUBERNETES_VALIDATE_VERSION" \
    >/dev/null 2>&1 <<'PY'
import sys
from importlib import metadata
import grpc, openai
import kubernetes_validate  # noqa: F401
from google import protobuf
from google.protobuf.internal import builder  # noqa: F401 (protobuf >= 3.20)
assert openai.__version__ == sys.argv[1], openai.__version__
assert metadata.version("kubernetes-validate") == sys.argv[2]
PY
}

ensure_python_env() {
  if python_env_ok; then
    info "Python env: $PDSERVE_PYENV (openai $PYENV_OPENAI_VERSION)"
    return
  fi
  step "Setting up the Python env for the client checks ($PDSERVE_PYENV)"
  [ -x /usr/bin/python3 ] || die "/usr/bin/python3 missing (Debian package python3)"
  /usr/bin/python3 -c 'import grpc; from google.protobuf.internal import builder' ||
    die "Debian's python3-grpcio / python3-protobuf are missing or too old"
  # A venv whose interpreter no longer runs (Python upgraded) is rebuilt.
  if [ -d "$PDSERVE_PYENV" ] && ! "$PDSERVE_PYTHON" -c '' 2>/dev/null; then
    rm -rf "$PDSERVE_PYENV"
  fi
  if [ ! -x "$PDSERVE_PYTHON" ]; then
    mkdir -p "$PDSERVE_HOME"
    /usr/bin/python3 -m venv --system-site-packages "$PDSERVE_PYENV" ||
      die "could not create the venv (Debian package python3-venv)"
  fi
  "$PDSERVE_PYTHON" -m pip install --quiet --disable-pip-version-check \
    --progress-bar off "openai==$PYENV_OPENAI_VERSION" \
    "kubernetes-validate==$PYENV_KUBERNETES_VALIDATE_VERSION" ||
    die "pip install openai==$PYENV_OPENAI_VERSION kubernetes-validate==$PYENV_KUBERNETES_VALIDATE_VERSION failed"
  python_env_ok || die "the venv at $PDSERVE_PYENV still lacks grpc, protobuf, openai or kubernetes-validate"
  info "Python env: $PDSERVE_PYENV ($("$PDSERVE_PYTHON" -c 'import grpc, openai
from google import protobuf
print("grpcio", grpc.__version__, "protobuf", protobuf.__version__, "openai", openai.__version__)'))"
}
