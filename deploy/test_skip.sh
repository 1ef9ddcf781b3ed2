# skip_test NAME REASON: ends a shell test as skipped. Bazel has no skipped
# status of its own; the JUnit XML it reads from $XML_OUTPUT_FILE carries
# one, which scripts/count_tests.py counts as skipped (like GTEST_SKIP).
skip_test() {
  echo "SKIPPED, NOT PASSED: $2"
  if [ -n "${XML_OUTPUT_FILE:-}" ]; then
    cat >"$XML_OUTPUT_FILE" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="$1" tests="1" skipped="1"><testcase classname="$1" name="$1"><skipped message="$2"/></testcase></testsuite></testsuites>
XML
  fi
  exit 0
}
