"""Repository-wide pytest rules (every test path: tests/ and plugins/*/tests/).

``WERK_REQUIRE_LLAMA_SERVER=1`` (set by ``.ci/run``) turns every skip whose reason is a missing
``llama-server`` into a failure: CI has the executable built by ``make``, so a test that skips
for its absence there would hide a broken build instead of testing the real backend.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

REQUIRE_ENV = "WERK_REQUIRE_LLAMA_SERVER"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or os.environ.get(REQUIRE_ENV) != "1":
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
    if "llama-server" in reason:
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_ENV}=1, but this test would skip: {reason}"
