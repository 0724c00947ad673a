"""The conversation archive: private files, atomic saves, bounds, no-follow, locks, names."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from werk.chat import archive as archive_mod
from werk.chat.archive import (
    ArchiveError,
    Message,
    SessionStore,
    validate_session_name,
)
from werk.protocol import Conflict, InvalidRequest, NotFound, PayloadTooLarge

TURN = [Message(role="user", content="hi"), Message(role="assistant", content="hello")]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.parametrize(
    "name", ["", ".hidden", "../x", "a/b", "a..b", "/abs", "x" * 129, "sp ace", "ü"]
)
def test_session_names_are_never_paths(name: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest):
        validate_session_name(name)
    with pytest.raises(InvalidRequest):
        SessionStore(tmp_path).open(name, model="m")
    assert not (tmp_path / "chat-sessions").exists()


def test_new_session_is_private_and_saved_atomically(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = SessionStore(home)
    with store.open("s1", model="m", system="be brief") as arc:
        assert not arc.resumed
        assert mode(home / "chat-sessions") == 0o700
        assert mode(arc.path) == 0o700
        assert mode(arc.path / "messages.json") == 0o600
        assert mode(arc.path / "session.lock") == 0o600
        arc.save(TURN, system="be brief")
        assert sorted(os.listdir(arc.path)) == ["messages.json", "session.lock"]  # no temp left
    record = store.read("s1")
    assert record.messages == TURN and record.system == "be brief" and record.model == "m"
    with store.open("s1", model="m") as again:
        assert again.resumed and again.messages == TURN and not again.system_replaced
    with store.open("s1", model="m", system="other") as replaced:
        assert replaced.system_replaced and replaced.record.system == "other"


def test_a_live_holder_blocks_others_and_shows_as_active(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    assert store.holder("s1") is None
    with store.open("s1", model="m"):
        assert store.holder("s1") == f"pid {os.getpid()}"
        with pytest.raises(Conflict, match="in use by another live werk process"):
            store.open("s1", model="m")
        with pytest.raises(Conflict):
            store.remove("s1")
    assert store.holder("s1") is None
    assert store.remove("s1") is True
    assert store.names() == [] and store.remove("s1") is False


def test_model_mismatch_is_refused(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    store.open("s1", model="m").close()
    with pytest.raises(Conflict, match="belongs to model 'm'"):
        store.open("s1", model="other")


def test_links_are_refused_not_followed(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    store.open("real", model="m").close()
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (store.root / "linked").symlink_to(outside)
    with pytest.raises(ArchiveError):
        store.open("linked", model="m")
    assert list(outside.iterdir()) == []
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    real = store.root / "real"
    (real / "messages.json").unlink()
    (real / "messages.json").symlink_to(victim)
    with pytest.raises(ArchiveError, match="symbolic link"):
        store.read("real")
    assert store.remove("linked") is True  # only the link goes
    assert outside.is_dir()


def test_corrupt_loose_or_oversized_archives_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SessionStore(tmp_path)
    with store.open("s1", model="m") as arc:
        arc.save(TURN, system=None)
    path = store.root / "s1" / "messages.json"
    good = path.read_bytes()
    path.write_bytes(good.replace(b'"schema":1', b'"schema":1,"extra":true'))
    with pytest.raises(ArchiveError, match="corrupt archive"):
        store.open("s1", model="m")
    path.write_bytes(good)
    path.chmod(0o644)
    with pytest.raises(ArchiveError, match="not 0600"):
        store.read("s1")
    path.chmod(0o600)
    (store.root / "s1").chmod(0o755)
    with pytest.raises(ArchiveError, match="not 0700"):
        store.open("s1", model="m")
    (store.root / "s1").chmod(0o700)
    monkeypatch.setattr(archive_mod, "MAX_ARCHIVE_BYTES", len(good) + 10)
    with store.open("s1", model="m") as arc:
        with pytest.raises(PayloadTooLarge):
            arc.save([*TURN, Message(role="user", content="x" * 100)], system=None)
        assert arc.messages == TURN  # the previous archive is untouched
    assert path.read_bytes() == good


def test_leftover_temporary_files_are_removed_on_open(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    store.open("s1", model="m").close()
    leftover = store.root / "s1" / ".tmp-0123456789abcdef"
    leftover.write_text("half")
    with store.open("s1", model="m"):
        assert not leftover.exists()


def test_native_dir_is_private_and_removed_alone(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    with store.open("s1", model="m") as arc:
        assert arc.native_dir(create=False) is None
        native = arc.native_dir(create=True)
        assert native is not None and mode(native) == 0o700
        (native / "slot.bin").write_bytes(b"kv")
        arc.save(TURN, system=None)
    assert store.remove("s1", only_native=True) is True
    assert not (store.root / "s1" / "native").exists()
    assert store.read("s1").messages == TURN
    with pytest.raises(NotFound):
        store.read("missing")
