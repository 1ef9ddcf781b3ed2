#!/usr/bin/env bash
# Runs the fault-injection tests (Bazel tag "fault": tests/fault_test,
# transfer_fault_test, client_fault_test, drain_overload_test) N times in a
# row, one at a time, and prints the fault table from the rows the tests
# report ("FAULT-TABLE|..." lines): per fault, the requests sent, completed
# correctly, rejected with a clear error and lost (must be 0) over all runs,
# and the median recovery time.
#
#   scripts/fault_table.sh [RUNS] [JSON_OUT]      # default 10 runs
#
# Exits non-zero unless every run of every test passed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(repo_root)"

runs=${1:-10}
json_out=${2:-}
step "bazel test (tag fault) x $runs, one test at a time"
bazel test //tests/... --test_tag_filters=fault,-gpu --runs_per_test="$runs" \
  --local_test_jobs=1 --nocache_test_results --test_output=summary
rc=$?

step "Fault table ($runs runs)"
python3 - "$runs" "$json_out" <<'PY'
import glob, json, os, re, statistics, sys

runs, json_out = int(sys.argv[1]), sys.argv[2]
logs = glob.glob("bazel-testlogs/tests/*/run_*_of_*/test.log") or \
       glob.glob("bazel-testlogs/tests/*/test.log")
rows, passed = {}, {}
for log in sorted(logs):
    target = log.split("/")[2]
    text = open(log, errors="replace").read()
    if "FAULT-TABLE|" not in text:
        continue
    passed.setdefault(target, [0, 0])
    passed[target][1] += 1
    passed[target][0] += bool(re.search(r"^\[  PASSED  \] \d+ tests?\.$", text, re.M)) \
        and "[  FAILED  ]" not in text
    for line in text.splitlines():
        if not line.startswith("FAULT-TABLE|"):
            continue
        _, fault, sent, ok, rejected, lost, recovery_ms, what = line.split("|", 7)
        r = rows.setdefault(fault, {"fault": fault, "runs": 0, "sent": 0,
                                    "completed": 0, "rejected": 0, "lost": 0,
                                    "recovery_ms": [], "recovery": what})
        r["runs"] += 1
        for key, value in (("sent", sent), ("completed", ok),
                           ("rejected", rejected), ("lost", lost)):
            r[key] += int(value)
        r["recovery_ms"].append(float(recovery_ms))
print("| fault injected | runs | sent | completed correctly | rejected (clear error) | lost | recovery, median (min-max) | recovery measured as |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for r in rows.values():
    rec = r["recovery_ms"]
    print(f"| {r['fault']} | {r['runs']} | {r['sent']} | {r['completed']} | "
          f"{r['rejected']} | {r['lost']} | {statistics.median(rec):.0f} ms "
          f"({min(rec):.0f}-{max(rec):.0f}) | {r['recovery']} |")
print()
for target, (ok, total) in sorted(passed.items()):
    print(f"{target}: {ok}/{total} runs passed")
if json_out:
    with open(json_out, "w") as f:
        json.dump({"runs": runs, "rows": list(rows.values()),
                   "passed": passed}, f, indent=1)
    print(f"wrote {json_out}")
PY
exit $rc
