#!/usr/bin/env bash
# The dependency rules of docs/architecture.md, held: each argument pair is a
# genquery output (pd_forbidden_deps in bazel/dependency_rules.bzl: the rules
# some targets depend on and must not) and the rule in words. Every list
# must be empty. To see how a listed target is reached:
#   bazel query 'somepath(//PACKAGE/..., LISTED_LABEL)'
set -u

failed=0
checked=0
while [ $# -ge 2 ]; do
  facts=$1 rule=$2
  shift 2
  checked=$((checked + 1))
  if [ ! -f "$facts" ]; then
    echo "FAIL: $rule: no dependency facts at $facts"
    failed=1
  elif [ -s "$facts" ]; then
    echo "FAIL: $rule"
    echo "  forbidden dependencies ($facts):"
    sed 's/^/    /' "$facts"
    failed=1
  else
    echo "ok: $rule"
  fi
done
if [ $# -ne 0 ] || [ "$checked" -eq 0 ]; then
  echo "usage: $0 (FACTS RULE)..." >&2
  exit 2
fi
exit "$failed"
