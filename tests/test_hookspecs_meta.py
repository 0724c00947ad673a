"""Meta-tests: every hook of the backend contract is documented, tested and fully described.

Adding a hookspec without a ``### werk_<name>`` section in docs/plugins.md, without a test that
names it, or without ``:param:``/``:returns:`` lines fails here.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import FunctionType

import pytest

from werk import hookspecs

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


def _test_sources() -> dict[Path, str]:
    this = Path(__file__).resolve()
    return {p: p.read_text() for p in sorted(TESTS.rglob("test_*.py")) if p.resolve() != this}


@pytest.mark.parametrize("name", NAMES)
def test_hook_is_exercised_by_a_test(name: str) -> None:
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    users = [p.name for p, text in _test_sources().items() if pattern.search(text)]
    assert users, f"no test file under tests/ mentions {name}"


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
