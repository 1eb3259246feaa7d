#!/usr/bin/env python3
"""Counts test cases (not targets) from a Bazel build-event JSON file.

Reads every test.xml named by the run's testResult events, so stale logs from
earlier runs are never counted. A test target without a test.xml (it crashed
before writing one, or failed to build) counts as one failed case.
Prints: passed failed skipped
"""
import json
import sys
import urllib.parse
import xml.etree.ElementTree as ET


def count_xml(path):
    passed = failed = skipped = 0
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("result") == "skipped" or case.find("skipped") is not None \
                or case.get("status") == "notrun":
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main(bep_path):
    passed = failed = skipped = 0
    seen = set()
    broken = 0
    with open(bep_path) as f:
        for line in f:
            event = json.loads(line)
            ident = event.get("id", {})
            if "testResult" in ident:
                label = ident["testResult"]["label"]
                key = (label, ident["testResult"].get("run"),
                       ident["testResult"].get("shard"),
                       ident["testResult"].get("attempt"))
                if key in seen:
                    continue
                seen.add(key)
                result = event.get("testResult", {})
                xml = None
                for out in result.get("testActionOutput", []):
                    if out.get("name") == "test.xml":
                        xml = urllib.parse.urlparse(out["uri"]).path
                counted = False
                if xml:
                    try:
                        p, fl, s = count_xml(xml)
                        passed, failed, skipped = passed + p, failed + fl, skipped + s
                        counted = p + fl + s > 0
                        if result.get("status") not in (None, "PASSED", "FLAKY") and fl == 0:
                            failed += 1  # Target failed outside any case (exit code).
                    except (OSError, ET.ParseError):
                        pass
                if not counted:
                    if result.get("status") == "PASSED":
                        passed += 1
                    else:
                        failed += 1
            elif "targetCompleted" in ident and event.get("completed", {}).get("success") is False:
                broken += 1
            elif "targetCompleted" in ident and "aborted" in event:
                broken += 1
    failed += broken
    print(passed, failed, skipped)


if __name__ == "__main__":
    main(sys.argv[1])
