"""Meta-tests: every hook of the backend contract is documented, tested and fully described.

Adding a hookspec without a ``### werk_<name>`` section in docs/plugins.md, without a test that
*calls it through a plugin manager*, or without ``:param:``/``:returns:`` lines fails here.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from types import FunctionType, ModuleType

import pytest

import werk
from werk import hookimpl, hookspecs
from werk.testing.coverage import hookspec_names, record_hook_calls, unexercised

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
SPEC_ATTR = f"{hookspecs.PROJECT_NAME}_spec"  # set by pluggy's HookspecMarker


def _hookspecs() -> dict[str, FunctionType]:
    return {
        name: obj
        for name, obj in vars(hookspecs).items()
        if name.startswith("werk_")
        and isinstance(obj, FunctionType)
        and getattr(obj, SPEC_ATTR, None) is not None
    }


HOOKS = _hookspecs()
NAMES = sorted(HOOKS)


def test_hookspecs_are_discovered() -> None:
    assert {"werk_register_backends", "werk_capabilities", "werk_prefill"} <= set(HOOKS)
    # Every public werk_* function of the module is a hookspec (no unmarked look-alikes).
    public = {n for n in hookspecs.__all__ if n.startswith("werk_")}
    assert public == set(HOOKS)


@pytest.mark.parametrize("name", NAMES)
def test_hook_is_documented(name: str) -> None:
    doc = ROOT / "docs" / "plugins.md"
    assert doc.is_file(), "docs/plugins.md is missing"
    headings = re.findall(r"^###\s+`?(werk_\w+)`?\s*$", doc.read_text(), flags=re.MULTILINE)
    assert name in headings, f"docs/plugins.md has no '### {name}' section"


def test_every_hook_is_called_through_the_plugin_manager(hook_calls: set[str]) -> None:
    """Runs last on a complete run (conftest.py): every hookspec was dispatched to at least one
    implementation by some test."""
    assert unexercised(hookspec_names(), hook_calls) == []


def test_hook_coverage_fails_for_a_hookspec_no_test_calls() -> None:
    """The coverage check can fail: a fake hookspec that nothing calls is reported."""
    fake = ModuleType("fake_hookspecs")

    @hookspecs.hookspec
    def werk_fake_never_called(runtime: object) -> None:
        """Nobody calls this."""

    werk_fake_never_called.__module__ = fake.__name__
    fake.werk_fake_never_called = werk_fake_never_called  # type: ignore[attr-defined]
    sys.modules[fake.__name__] = fake
    try:
        assert hookspec_names(fake) == ["werk_fake_never_called"]
        called: set[str] = set()
        with record_hook_calls(called):
            pm = werk.get_plugin_manager(load_entrypoints=False)
            pm.add_hookspecs(fake)
            pm.register(_FakeImpl(), name="fake")
            assert unexercised(hookspec_names(fake), called) == ["werk_fake_never_called"]
            pm.hook.werk_fake_never_called(runtime=None)
        assert unexercised(hookspec_names(fake), called) == []
    finally:
        del sys.modules[fake.__name__]


class _FakeImpl:
    @hookimpl
    def werk_fake_never_called(self, runtime: object) -> None:
        return None


@pytest.mark.parametrize("name", NAMES)
def test_hook_docstring_describes_every_argument(name: str) -> None:
    func = HOOKS[name]
    doc = inspect.getdoc(func)
    assert doc, f"{name} has no docstring"
    for arg in inspect.signature(func).parameters:
        assert re.search(rf"^:param {arg}:", doc, flags=re.MULTILINE), f"{name}: no ':param {arg}:'"
    assert re.search(r"^:returns:", doc, flags=re.MULTILINE), f"{name}: no ':returns:' line"


@pytest.mark.parametrize("name", NAMES)
def test_hook_has_no_variadic_arguments(name: str) -> None:
    """pluggy passes hook arguments by name; *args/**kwargs would silently never be filled."""
    kinds = {p.kind for p in inspect.signature(HOOKS[name]).parameters.values()}
    assert not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}
