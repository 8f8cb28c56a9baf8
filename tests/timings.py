"""Per-test timings for bench/bench_tests.py: with PIVOT_TEST_TIMINGS=FILE set, every phase (setup, call, teardown)
of every test is appended to FILE as one JSON line: node id, phase, seconds, start and stop (epoch), outcome, the
worker that ran it, the test's fixtures and marks. Under pytest-xdist the controller writes the lines (one writer);
the workers attach the fixtures, marks and worker id to the report."""

from __future__ import annotations

import json
import os

import pytest

TIMINGS_ENV = "PIVOT_TEST_TIMINGS"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not os.environ.get(TIMINGS_ENV):
        return
    item.user_properties.append(("timing", {
        "fixtures": sorted(item.fixturenames),
        "marks": sorted({m.name for m in item.iter_markers()}),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
    }))


def pytest_runtest_logreport(report):
    path = os.environ.get(TIMINGS_ENV)
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's reports reach the controller
        return
    info = next((v for k, v in report.user_properties if k == "timing"), {})
    line = {"nodeid": report.nodeid, "when": report.when, "seconds": round(report.duration, 3),
            "start": getattr(report, "start", None), "stop": getattr(report, "stop", None),
            "outcome": report.outcome, **info}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
