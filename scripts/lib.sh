# Shared by the scripts in this folder: progress output and the locations
# every command agrees on. Sourced, not run.

# Where pdserve keeps what it downloads and builds outside the repository.
PDSERVE_HOME="${PDSERVE_HOME:-$HOME/.cache/pdserve}"
PDSERVE_MODELS="$PDSERVE_HOME/models"
PDSERVE_DEFAULT_MODEL="${PDSERVE_DEFAULT_MODEL:-$PDSERVE_MODELS/SmolLM2-135M-Instruct.Q4_1.gguf}"
export PDSERVE_HOME PDSERVE_DEFAULT_MODEL

step() { printf '\n==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd; }
