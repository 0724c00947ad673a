"""The code in docs/plugins.md runs as written.

The hook reference's snippets together form one plugin module (``werk_toy/plugin.py``, as the
guide says); the "Calling your hooks without installing" script is run against it and must print
exactly what its comments say; and the toy passes the conformance kit, so the guide never shows a
backend that the kit would reject.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import werk
import werk.testing

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.M | re.S)


def _section(start: str, end: str) -> str:
    text = GUIDE.read_text(encoding="utf-8")
    return text[text.index(start) : text.index(end)]


def _expected_output(script: str) -> list[str]:
    """Each ``print(...)``'s expected line: its trailing comment, or the comment line below."""
    lines = script.splitlines()
    expected: list[str] = []
    for index, line in enumerate(lines):
        if "print(" not in line:
            continue
        inline = re.search(r"\)\s*(?:,\s*end=\"\")?\)?\s*#\s(.*)$", line)
        if inline:
            expected.append(inline.group(1))
            continue
        following = lines[index + 1].strip()
        assert following.startswith("# "), f"no expected output documented for: {line}"
        expected.append(following[2:])
    return expected


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``werk_toy/plugin.py`` from the hook reference's snippets; returns the site directory."""
    site = tmp_path_factory.mktemp("toy-site")
    package = site / "werk_toy"
    package.mkdir()
    snippets = BLOCK.findall(_section("## Hook reference", "## Calling your hooks"))
    assert len(snippets) >= 10, "the hook reference lost its examples"
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text("\n\n".join(snippets), encoding="utf-8")
    return site


def test_calling_your_hooks_prints_what_the_guide_says(toy: Path, tmp_path: Path) -> None:
    (script,) = BLOCK.findall(_section("## Calling your hooks", "## Running the toy"))
    path = tmp_path / "script.py"
    path.write_text(script, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(toy), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == _expected_output(script)


def test_the_guides_toy_passes_the_conformance_kit(toy: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(toy))
    try:
        from werk_toy import plugin  # type: ignore[import-not-found]

        pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("werk-toy", plugin)])
        report = werk.testing.conformance("toy", pm=pm, home=tmp_path)
    finally:
        sys.path.remove(str(toy))
        sys.modules.pop("werk_toy.plugin", None)
        sys.modules.pop("werk_toy", None)
    assert report.ok, report.summary()
    assert "claim runtime.state.restore supported" in {c.name for c in report.checks if c.passed}


def test_the_guide_lists_exactly_the_public_names() -> None:
    """docs/plugins.md says its table of public names is exactly ``werk.__all__``."""
    import re

    import werk

    text = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    start = text.index("| group | names |")
    table = text[start : text.index("\n\n", start)]
    quoted = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", table))
    hooks = {n for n in quoted if n.startswith("werk_") and n != "werk_home"}  # explanations
    assert quoted - hooks == set(werk.__all__)


def test_the_value_tables_are_the_classes_fields() -> None:
    """The guide's field tables equal what ``tests/_value_tables.py`` renders from the classes
    (every field, its declared type and default, its ``:ivar`` meaning); regenerate with
    ``python tests/_value_tables.py --write``."""
    import _value_tables

    text = GUIDE.read_text(encoding="utf-8")
    assert _value_tables.section_of(text) == _value_tables.render()
    for _group, names in _value_tables.VALUE_CLASSES:
        for name in names:
            assert name in werk.__all__, name
