"""``werk._entry_points`` against ``importlib.metadata`` on real and crafted installations."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import msgspec
import pytest

from werk._entry_points import EntryPoint, entry_points

COMPARE = textwrap.dedent(
    """
    import json, sys
    from importlib import metadata
    from werk import _entry_points
    theirs = sorted(
        [e.name, e.value, e.dist.name if e.dist else None, e.dist.version if e.dist else None]
        for e in metadata.entry_points(group="werk")
    )
    ours = sorted(
        [e.name, e.value, e.dist_name, e.dist_version] for e in _entry_points.entry_points("werk")
    )
    print(json.dumps({"theirs": theirs, "ours": ours,
                      "fallback": _entry_points._needs_importlib(list(sys.path))}))
    """
)


def _compare(*path: Path) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, path)))
    done = subprocess.run(
        [sys.executable, "-c", COMPARE], capture_output=True, text=True, env=env, check=True
    )
    result: dict[str, object] = msgspec.json.decode(done.stdout)
    return result


def _dist(site: Path, dirname: str, entry_points_txt: str | None, metadata: str) -> None:
    info = site / dirname
    info.mkdir(parents=True)
    header = "PKG-INFO" if dirname.endswith(".egg-info") else "METADATA"
    (info / header).write_text(metadata)
    if entry_points_txt is not None:
        (info / "entry_points.txt").write_text(entry_points_txt)


def test_this_installation_gives_what_importlib_metadata_gives() -> None:
    found = _compare()
    assert found["theirs"] == found["ours"] and found["fallback"] is False
    assert ["llamacpp", "werk_llamacpp.plugin", "werk-llamacpp"] in [
        row[:3]
        for row in found["ours"]  # type: ignore[attr-defined]
    ]


def test_crafted_distributions_read_like_importlib_metadata(tmp_path: Path) -> None:
    """Comments, blank lines and other groups, values with attributes and extras, an egg-info,
    a distribution without entry points, a name found twice (the first on the path wins,
    whatever its spelling), a section name in another case, a description after the headers."""
    first, second = tmp_path / "a", tmp_path / "b"
    _dist(
        first,
        "Foo_Bar-1.0.dist-info",
        "# comment\n\n[console_scripts]\nfoo = foo:main\n\n[werk]\n"
        "  alpha =  foo_mod:obj.attr [x]\nbeta=foo_mod\n[WERK]\ngamma = no\n",
        "Metadata-Version: 2.1\nName: Foo_Bar\nVersion: 1.0\nSummary: x\n\nName: not-this\n",
    )
    _dist(
        second,
        "foo.bar-2.0.dist-info",
        "[werk]\nshadowed = nope\n",
        "Name: foo.bar\nVersion: 2.0\n",
    )
    _dist(second, "eggy-0.3.egg-info", "[werk]\neggy = eggy.plugin\n", "Name: eggy\nVersion: 0.3\n")
    _dist(second, "plain-1.0.dist-info", None, "Name: plain\nVersion: 1.0\n")
    found = _compare(first, second)
    assert found["fallback"] is False
    assert found["theirs"] == found["ours"]
    ours = found["ours"]
    assert ["alpha", "foo_mod:obj.attr [x]", "Foo_Bar", "1.0"] in ours  # type: ignore[operator]
    assert ["eggy", "eggy.plugin", "eggy", "0.3"] in ours  # type: ignore[operator]
    assert not any(row[0] in ("shadowed", "gamma") for row in ours)  # type: ignore[attr-defined]


def test_an_archive_on_the_path_is_read_by_importlib_metadata(tmp_path: Path) -> None:
    archive = tmp_path / "zipped.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped-1.0.dist-info/METADATA", "Name: zipped\nVersion: 1.0\n")
        z.writestr("zipped-1.0.dist-info/entry_points.txt", "[werk]\nzipped = zipped_mod\n")
    found = _compare(archive)
    assert found["fallback"] is True
    assert found["theirs"] == found["ours"]
    assert ["zipped", "zipped_mod", "zipped", "1.0"] in found["ours"]  # type: ignore[operator]


def test_load_follows_module_and_attributes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ep_target.py").write_text("class obj:\n    attr = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert EntryPoint("x", "ep_target:obj.attr [extra]", "werk", None, None).load() == 42
    assert EntryPoint("x", "ep_target", "werk", None, None).load().__name__ == "ep_target"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="invalid value"):
        EntryPoint("x", "not a module!", "werk", None, None).load()


def test_a_missing_path_entry_is_skipped(tmp_path: Path) -> None:
    assert entry_points("werk", [str(tmp_path / "absent")]) == []
