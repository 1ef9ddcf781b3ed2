#!/usr/bin/env bash
# //deploy:manifests_test: runs manifests_test.py (what it checks is there)
# with the venv interpreter of scripts/python_env.sh, which has
# kubernetes-validate. Without that venv ($PDSERVE_PYTHON unset, as for the
# other Python checks) the test reports itself skipped.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/test_skip.sh"
[ -n "${PDSERVE_PYTHON:-}" ] || skip_test manifests_test "PDSERVE_PYTHON unset (source scripts/python_env.sh)"
command -v kubectl >/dev/null || { echo "kubectl missing (scripts/setup.sh installs kubernetes-client)"; exit 1; }
"$PDSERVE_PYTHON" -c 'import kubernetes_validate' ||
  { echo "kubernetes-validate missing from $PDSERVE_PYTHON (run scripts/setup.sh)"; exit 1; }
exec "$PDSERVE_PYTHON" "$here/manifests_test.py"
