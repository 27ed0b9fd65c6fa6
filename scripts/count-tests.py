#!/usr/bin/python3
"""Prints "N passed, N failed" for the meson tests in a build's meson-logs/testlog.json.

OK and EXPECTEDFAIL count as passed, SKIP as neither (reported on its own line when present),
anything else (FAIL, TIMEOUT, ERROR, UNEXPECTEDPASS) as failed. Exit status 1 when any failed.
"""
import json
import sys

passed = failed = skipped = 0
with open(sys.argv[1], encoding="utf-8") as log:
    for line in log:
        if not line.strip():
            continue
        result = json.loads(line)["result"]
        if result in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif result == "SKIP":
            skipped += 1
        else:
            failed += 1
if skipped:
    print(f"({skipped} skipped)")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
