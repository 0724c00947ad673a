"""Repository-wide pytest rules (every test path: tests/ and plugins/*/tests/).

Every hook call dispatched by a Werk plugin manager during the run is recorded
(:func:`werk.testing.coverage.record_hook_calls`); ``tests/test_hookspecs_meta.py``'s
``test_every_hook_is_called_through_the_plugin_manager`` runs last and fails for a hookspec that
no test called. It only judges a complete run (no paths, ``-k``, ``-m`` or deselection);
otherwise it skips, saying so.

``WERK_REQUIRE_LLAMA_SERVER=1`` (set by ``.ci/run``) turns every skip whose reason is a missing
``llama-server`` into a failure: CI has the executable built by ``make``, so a test that skips
for its absence there would hide a broken build instead of testing the real backend.

A run started in the background by a script (``make test &``, ``nohup``) inherits SIGINT
*ignored*, and so would every process it starts: the tests that press Ctrl+C on ``werk chat``,
``werk run``, ``werk models pull`` or ``--watch`` would fail for a reason of the launcher. The
run gives SIGINT a handler again, which its child processes get back as the default action.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Generator
from typing import Any

import pytest

from werk.testing.coverage import record_hook_calls

REQUIRE_ENV = "WERK_REQUIRE_LLAMA_SERVER"
LAST = "test_every_hook_is_called_through_the_plugin_manager"
HOOK_CALLS: set[str] = set()
COMPLETE_RUN = pytest.StashKey[bool]()

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # see the module docstring
    signal.signal(signal.SIGINT, signal.default_int_handler)


_RECORDING = pytest.StashKey[contextlib.ExitStack]()


def pytest_configure(config: pytest.Config) -> None:
    """Start recording before collection: test modules may build managers at import time.

    A test that does not choose its own ``WERK_HOME`` still never writes into the user's (the
    llama.cpp plugin, for one, caches executable inspections there): the run gets a private
    default, removed at the end."""
    if "WERK_HOME" not in os.environ:
        home = tempfile.mkdtemp(prefix="werk-test-home-")
        os.environ["WERK_HOME"] = home
        config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
    stack = contextlib.ExitStack()
    stack.enter_context(record_hook_calls(HOOK_CALLS))
    config.stash[_RECORDING] = stack


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_RECORDING].close()


@pytest.fixture
def hook_calls(request: pytest.FixtureRequest) -> set[str]:
    """The hooks called through a plugin manager so far; skips unless the run is complete."""
    if not request.config.stash.get(COMPLETE_RUN, False):
        pytest.skip("hook coverage is judged only on a complete run (pytest without selection)")
    return HOOK_CALLS


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    last = [item for item in items if item.name == LAST]
    items[:] = [item for item in items if item.name != LAST] + last
    option = config.option
    config.stash[COMPLETE_RUN] = (
        not config.args or [str(a) for a in config.args] == list(config.getini("testpaths"))
    ) and not (option.keyword or option.markexpr or option.deselect or getattr(option, "lf", False))


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        items[0].config.stash[COMPLETE_RUN] = False


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
