"""``ModelSpec.files``: paths given as ``str`` or in a list are converted to a tuple of
``Path``; anything else is refused at construction, naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from werk import ModelSpec

IDENTITY = "sha256:" + "a" * 64


def test_str_paths_and_lists_become_a_tuple_of_paths(tmp_path: Path) -> None:
    given = [str(tmp_path / "a.txt"), tmp_path / "b.txt"]
    spec = ModelSpec(id="m", backend="echo", identity=IDENTITY, files=given)  # type: ignore[arg-type]
    assert spec.files == (tmp_path / "a.txt", tmp_path / "b.txt")
    assert all(isinstance(p, Path) for p in spec.files)
    assert spec.files[0].is_absolute()
    same = ModelSpec(id="m", backend="echo", identity=IDENTITY, files=(tmp_path / "b.txt",))
    assert same.files == (tmp_path / "b.txt",)


@pytest.mark.parametrize(
    ("files", "fragment"),
    [
        ("/one/path.txt", "a sequence of paths, not one path"),
        ([b"/bytes/path"], "not bytes"),
        ([3], "not int"),
    ],
)
def test_anything_else_is_refused_naming_the_field(files: object, fragment: str) -> None:
    with pytest.raises(TypeError, match=r"ModelSpec\.files") as raised:
        ModelSpec(id="m", backend="echo", identity=IDENTITY, files=files)  # type: ignore[arg-type]
    assert fragment in str(raised.value)
