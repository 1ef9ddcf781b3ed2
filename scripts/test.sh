#!/usr/bin/env bash
# The whole test suite (README command 2):
#   1. installs what is missing (scripts/setup.sh);
#   2. checks formatting (clang-format, Google style) of our sources;
#   3. bazel test //... (targets tagged "gpu" are left out: they run with
#      `bazel test --config=gpu //...` on a GPU machine);
#   4. the same tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#      (the cluster tests with the compute kernels uninstrumented, which the
#      kernel, model and engine tests cover instrumented; not the SLO test,
#      whose latency limits only hold unsanitized);
#   5. the kernel tests once more as the serving binaries are built
#      (--config=opt, -march=native): compilers vectorize differently there,
#      and the kernels must still equal their scalar references bit for bit;
# then prints one line "N passed, N failed, N skipped" counting test cases
# (GoogleTest cases from each target's XML, plus the format check).
# Exits non-zero when anything failed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Exports PDSERVE_PYTHON (the venv setup.sh makes), for the client checks.
source "$(dirname "${BASH_SOURCE[0]}")/python_env.sh"
cd "$(repo_root)"

bash scripts/setup.sh || die "setup failed"

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
start=$(date +%s)

step "Format check (clang-format --dry-run, Google style)"
mapfile -t sources < <(git ls-files '*.h' '*.cc' '*.cu' '*.proto')
if clang-format --dry-run --Werror "${sources[@]}" 2>"$results/format.log"; then
  info "${#sources[@]} files formatted"
  echo "format_check passed" >"$results/extra"
else
  head -40 "$results/format.log"
  info "run: clang-format -i \$(git ls-files '*.h' '*.cc' '*.cu' '*.proto')"
  echo "format_check failed" >"$results/extra"
fi

run_bazel_tests() {  # $1 = label, $2 = target patterns, rest = bazel flags
  local label=$1
  local -a patterns
  read -ra patterns <<<"$2"
  shift 2
  step "bazel test ${patterns[*]} $*"
  bazel test "$@" --keep_going --build_event_json_file="$results/$label.bep" \
    -- "${patterns[@]}"
  local rc=$?
  # 0: all passed; 3: some tests failed; 4: no tests. Anything else means the
  # build itself broke, which counts as a failure of its own.
  if [ $rc -ne 0 ] && [ $rc -ne 3 ] && [ $rc -ne 4 ]; then
    echo "bazel_${label}_build failed" >>"$results/extra"
  fi
}

run_bazel_tests default //...
# Sanitized: the kernels and the engine that drives them, fully instrumented;
# then everything else with the kernels uninstrumented (--config=asan_serving,
# see .bazelrc: instrumented kernels made the cluster tests tests of the CPU).
# The default pass built every target (benchmarks, CUDA code); the others
# build only the tests they run.
run_bazel_tests asan "//kernels/... //model/... //engine/..." --config=asan \
  --build_tests_only
# Not the SLO test: its latency limits do not hold under the sanitizers
# (docs/benchmarking.md), and the paths it runs are the serving tests'.
run_bazel_tests asan_serving \
  "//... -//kernels/... -//model/... -//engine/... -//tests/slo/..." \
  --config=asan_serving --build_tests_only
run_bazel_tests opt //kernels/... --config=opt --build_tests_only

step "Summary ($(( $(date +%s) - start ))s)"
python3 scripts/count_tests.py "$results"
