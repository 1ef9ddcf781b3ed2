#!/usr/bin/env python3
"""Counts test cases from Bazel's build-event files and GoogleTest XML.

Usage: count_tests.py RESULTS_DIR
RESULTS_DIR holds LABEL.bep (Bazel --build_event_json_file output) files and
an optional `extra` file of "NAME passed|failed" lines (checks that are not
Bazel tests). Prints failures by name, then the closing line
"N passed, N failed, N skipped", and exits 1 if anything failed.
"""
import glob
import json
import os
import sys
import urllib.parse
import xml.etree.ElementTree as ET


def cases_from_xml(path):
    """Yields (name, outcome) for each <testcase> in a JUnit XML file."""
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}.{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            yield name, "failed"
        elif case.find("skipped") is not None or case.get("result") == "skipped" \
                or case.get("status") == "notrun":
            yield name, "skipped"
        else:
            yield name, "passed"


def results_from_bep(path, label):
    """Yields (name, outcome) for every test case a Bazel run reported."""
    with open(path) as f:
        events = [json.loads(line) for line in f if line.strip()]
    for event in events:
        test_id = event.get("id", {}).get("testResult")
        if not test_id:
            continue
        target = test_id["label"]
        result = event.get("testResult", {})
        status = result.get("status", "NO_STATUS")
        xml = None
        for output in result.get("testActionOutput", []):
            if output.get("name") == "test.xml":
                xml = urllib.parse.urlparse(output["uri"]).path
        cases = []
        if xml and os.path.exists(xml):
            try:
                cases = list(cases_from_xml(xml))
            except ET.ParseError:
                cases = []
        prefix = f"[{label}] {target}"
        if status != "PASSED" and not any(o == "failed" for _, o in cases):
            # Crashed, timed out or failed outside a test case.
            yield f"{prefix} ({status})", "failed"
        for name, outcome in cases:
            yield f"{prefix} {name}", outcome
        if not cases and status == "PASSED":
            yield prefix, "passed"


def main():
    folder = sys.argv[1]
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures = []
    for bep in sorted(glob.glob(os.path.join(folder, "*.bep"))):
        label = os.path.basename(bep)[: -len(".bep")]
        for name, outcome in results_from_bep(bep, label):
            counts[outcome] += 1
            if outcome == "failed":
                failures.append(name)
    extra = os.path.join(folder, "extra")
    if os.path.exists(extra):
        with open(extra) as f:
            for line in f:
                name, outcome = line.split()
                counts[outcome] += 1
                if outcome == "failed":
                    failures.append(name)
    for name in failures:
        print(f"FAILED: {name}")
    print(f"{counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped")
    return 1 if counts["failed"] or not counts["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())
