"""``werk.state.state_names.StateNames``: a principal directory's sorted state ids, kept while
the directory is unchanged (its identity and modification time), never while freshly modified."""

from __future__ import annotations

import os
import time
from pathlib import Path

from werk.state.state_names import SETTLE_SECONDS, StateNames

IDS = ["st_0000000000aAAAAAAAAAAAAAAAAA", "st_0000000000bBBBBBBBBBBBBBBBBB"]


def _dir(path: Path, names: list[str], age: float) -> int:
    path.mkdir(exist_ok=True)
    for name in names:
        (path / name).mkdir(exist_ok=True)
    (path / ".staging-x").mkdir(exist_ok=True)  # never a state
    then = time.time() - age
    os.utime(path, (then, then))
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def test_names_are_kept_while_the_directory_is_unchanged(tmp_path: Path) -> None:
    cache = StateNames()
    fd = _dir(tmp_path / "p", IDS, age=10)
    try:
        first = cache.get("local", fd)
        assert first == IDS
        assert cache.get("local", fd) is first  # kept: not listed again
        (tmp_path / "p" / "st_0000000000cCCCCCCCCCCCCCCCCC").mkdir()  # a commit moves mtime
        again = cache.get("local", fd)
        assert again == [*IDS, "st_0000000000cCCCCCCCCCCCCCCCCC"] and again is not first
    finally:
        os.close(fd)


def test_a_freshly_modified_directory_is_listed_every_time(tmp_path: Path) -> None:
    cache = StateNames()
    fd = _dir(tmp_path / "p", IDS, age=SETTLE_SECONDS / 10)
    try:
        first = cache.get("local", fd)
        assert first == IDS and cache.get("local", fd) is not first
    finally:
        os.close(fd)
