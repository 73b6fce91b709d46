"""Where the test suite's time goes: per-area seconds from a pytest JUnit XML file, as a Markdown table.

    .venv/bin/python -m pytest -q tests -m "not heavy" -n 0 --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/suite_times.py /tmp/suite.xml

An area is a test file (`tests/modules/test_lora.py`), with the studies' tests (`tests/studies/`) as one area.
Seconds are each test's setup, call and teardown as pytest recorded them; under pytest-xdist they add up the workers'
time, not the wall clock.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path


def area_of(classname: str) -> str:
    """`tests.studies.test_brake_study` -> `tests/studies/`; `tests.modules.test_lora` (or a class in it,
    `tests.modules.test_lora.TestX`) -> `tests/modules/test_lora.py`."""
    parts = classname.split(".")
    if len(parts) > 2 and parts[1] == "studies":
        return "tests/studies/"
    module = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
    return "/".join(parts[: module + 1]) + ".py"


def area_times(xml_path: Path) -> tuple[dict[str, float], dict[str, int]]:
    """(seconds, test count) per area of the report's test cases."""
    seconds: dict[str, float] = collections.Counter()
    counts: dict[str, int] = collections.Counter()
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        area = area_of(case.get("classname", "?"))
        seconds[area] += float(case.get("time", 0.0))
        counts[area] += 1
    return seconds, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml", type=Path, help="pytest --junitxml output")
    parser.add_argument("--top", type=int, default=15, help="areas listed before the rest are summed")
    args = parser.parse_args()
    seconds, counts = area_times(args.junit_xml)
    total = sum(seconds.values())
    ranked = sorted(seconds, key=seconds.get, reverse=True)
    print("| area | tests | seconds | share |")
    print("|---|---|---|---|")
    for area in ranked[: args.top]:
        print(f"| `{area}` | {counts[area]} | {seconds[area]:.0f} | {seconds[area] / total:.0%} |")
    rest = ranked[args.top :]
    if rest:
        rest_s = sum(seconds[a] for a in rest)
        print(f"| {len(rest)} other files | {sum(counts[a] for a in rest)} | {rest_s:.0f} | {rest_s / total:.0%} |")
    print(f"| **all** | {sum(counts.values())} | {total:.0f} | 100% |")


if __name__ == "__main__":
    main()
