#!/usr/bin/python3
"""Prints "N passed, N failed" for the meson tests in a build's meson-logs/testlog.json.

OK and EXPECTEDFAIL count as passed, SKIP as neither (reported on its own line when present),
anything else (FAIL, TIMEOUT, ERROR, UNEXPECTEDPASS) as failed, each named on a line of its own
(CI keeps only the tail of its output, so the names come just before the count). Exit status 1
when any failed.
"""
import json
import sys

passed = skipped = 0
failures = []
with open(sys.argv[1], encoding="utf-8") as log:
    for line in log:
        if not line.strip():
            continue
        test = json.loads(line)
        result = test["result"]
        if result in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif result == "SKIP":
            skipped += 1
        else:
            failures.append(f"{test['name']} ({result}, {test['duration']:.0f} s)")
for failure in failures:
    print(f"failed: {failure}")
if skipped:
    print(f"({skipped} skipped)")
print(f"{passed} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
