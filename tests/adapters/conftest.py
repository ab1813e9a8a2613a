"""Attach the log tails of the daemons a test module started (tests.adapters.monitoring)
to each of its failing tests."""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.adapters.monitoring import Monitoring


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, Monitoring):
                report.sections.append(("daemon logs", value.log_tails()))
    return report
