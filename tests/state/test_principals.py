"""Namespace key file, principal derivation, prompt fingerprints, HMAC framing."""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import pickle
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import werk
from werk.state.principals import (
    DOMAIN_HANDOFF,
    DOMAIN_PRINCIPAL,
    DOMAIN_PROMPT,
    KEY_BYTES,
    LOCAL_PRINCIPAL,
    NamespaceKey,
    NamespaceKeyError,
    handoff_hash,
    hmac_input,
    is_principal,
    key_path,
    principal_for_api_key,
    prompt_fingerprint,
)

ENV = "sha256:" + "0" * 64


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _write_key(home: Path, data: bytes, *, dir_mode: int = 0o700, mode: int = 0o600) -> Path:
    auth = home / "auth"
    auth.mkdir(mode=dir_mode, exist_ok=True)
    os.chmod(auth, dir_mode)
    path = key_path(home)
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


# --- HMAC framing -------------------------------------------------------------------------


def _decode_frame(data: bytes) -> tuple[bytes, list[bytes]]:
    """Parse hmac_input's output back: proves the encoding is uniquely decodable."""
    items: list[bytes] = []
    pos = 0
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 8], "big")
        items.append(data[pos + 8 : pos + 8 + n])
        pos += 8 + n
    assert pos == len(data)
    return items[0], items[1:]


def test_concatenation_collision_is_impossible() -> None:
    assert b"ab" + b"c" == b"a" + b"bc"  # the naive encoding collides ...
    assert hmac_input(DOMAIN_PROMPT, b"ab", b"c") != hmac_input(DOMAIN_PROMPT, b"a", b"bc")
    # ... and so would an unprefixed domain followed by a field.
    assert hmac_input(b"werk/x", b"y") != hmac_input(b"werk/", b"xy")
    assert hmac_input(b"d", b"", b"a") != hmac_input(b"d", b"a", b"")
    assert hmac_input(b"d", b"a") != hmac_input(b"d", b"a", b"")


def test_layout_is_length_prefixed_big_endian() -> None:
    assert hmac_input(b"D", b"xy") == (
        (1).to_bytes(8, "big") + b"D" + (2).to_bytes(8, "big") + b"xy"
    )


field_lists = st.tuples(st.binary(max_size=12), st.lists(st.binary(max_size=12), max_size=6))


@given(field_lists, field_lists)
def test_framing_is_injective(a: tuple[bytes, list[bytes]], b: tuple[bytes, list[bytes]]) -> None:
    ea, eb = hmac_input(a[0], *a[1]), hmac_input(b[0], *b[1])
    assert (ea == eb) == (a == b)
    assert _decode_frame(ea) == a


@given(st.lists(st.binary(max_size=8), max_size=4))
def test_domains_never_share_an_input_space(fields: list[bytes]) -> None:
    encodings = {hmac_input(d, *fields) for d in (DOMAIN_PRINCIPAL, DOMAIN_PROMPT, DOMAIN_HANDOFF)}
    assert len(encodings) == 3


def test_principal_is_hmac_of_the_framed_api_key(tmp_path: Path) -> None:
    secret = bytes(range(KEY_BYTES))
    key = NamespaceKey(secret)
    expected = hmac.new(secret, hmac_input(DOMAIN_PRINCIPAL, b"sk-test"), hashlib.sha256)
    assert principal_for_api_key(key, "sk-test") == "p_" + expected.hexdigest()
    # The same key used for a handoff hash lands in another input space.
    assert handoff_hash(key, "sk-test") != expected.hexdigest()


# --- principals and fingerprints ----------------------------------------------------------


def test_same_api_key_same_principal_across_loads(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = principal_for_api_key(NamespaceKey.load_or_create(home), "sk-alpha")
    second = principal_for_api_key(NamespaceKey.load_or_create(home), "sk-alpha")
    loaded = NamespaceKey.load(home)
    assert loaded is not None
    assert first == second == principal_for_api_key(loaded, "sk-alpha")
    assert is_principal(first) and first.startswith("p_") and len(first) == 2 + 64


def test_different_api_keys_and_namespaces_differ(tmp_path: Path) -> None:
    key = NamespaceKey.load_or_create(tmp_path / "a")
    other_home = NamespaceKey.load_or_create(tmp_path / "b")
    assert principal_for_api_key(key, "sk-1") != principal_for_api_key(key, "sk-2")
    assert principal_for_api_key(key, "sk-1") != principal_for_api_key(other_home, "sk-1")
    with pytest.raises(ValueError):
        principal_for_api_key(key, "")


def test_identical_prompts_under_two_principals_differ() -> None:
    key = NamespaceKey.ephemeral()
    alice, bob = principal_for_api_key(key, "sk-alice"), principal_for_api_key(key, "sk-bob")
    fa = prompt_fingerprint(key, alice, model="demo", envelope_digest=ENV, prompt="hello")
    fb = prompt_fingerprint(key, bob, model="demo", envelope_digest=ENV, prompt="hello")
    fl = prompt_fingerprint(key, LOCAL_PRINCIPAL, model="demo", envelope_digest=ENV, prompt="hello")
    assert len({fa, fb, fl}) == 3
    # Deterministic for one principal (that is what makes reuse possible at all).
    assert fa == prompt_fingerprint(key, alice, model="demo", envelope_digest=ENV, prompt="hello")


def test_fingerprint_covers_every_input() -> None:
    key = NamespaceKey.ephemeral()
    p = principal_for_api_key(key, "sk")
    base = prompt_fingerprint(key, p, model="demo", envelope_digest=ENV, prompt="hi")
    variants = [
        prompt_fingerprint(key, p, model="demo2", envelope_digest=ENV, prompt="hi"),
        prompt_fingerprint(key, p, model="demo", envelope_digest=ENV + "1", prompt="hi"),
        prompt_fingerprint(key, p, model="demo", envelope_digest=ENV, prompt="hi!"),
        prompt_fingerprint(key, p, model="demo", envelope_digest=ENV, messages=[("user", "hi")]),
    ]
    assert base not in variants and len(set(variants)) == len(variants)
    # Message boundaries matter: one message "ab" is not two messages "a" + "b".
    one = prompt_fingerprint(key, p, model="m", envelope_digest=ENV, messages=[("user", "ab")])
    two = prompt_fingerprint(
        key, p, model="m", envelope_digest=ENV, messages=[("user", "a"), ("user", "b")]
    )
    assert one != two
    with pytest.raises(ValueError):
        prompt_fingerprint(key, p, model="m", envelope_digest=ENV)
    with pytest.raises(ValueError):
        prompt_fingerprint(key, "p_not-a-principal", model="m", envelope_digest=ENV, prompt="x")


def test_key_never_shown() -> None:
    secret = b"\xab" * KEY_BYTES
    key = NamespaceKey(secret)
    for text in (repr(key), str(key), f"{key}"):
        assert "ab" * 4 not in text and "redacted" in text
    with pytest.raises(TypeError):
        pickle.dumps(key)
    with pytest.raises(ValueError):
        NamespaceKey(b"short")


# --- the key file -------------------------------------------------------------------------


def test_created_with_owner_only_modes(tmp_path: Path) -> None:
    home = tmp_path / "new-home"
    old_umask = os.umask(0o022)  # a permissive umask must not leak into the key's modes
    try:
        NamespaceKey.load_or_create(home)
    finally:
        os.umask(old_umask)
    path = key_path(home)
    assert _mode(path.parent) == 0o700
    assert _mode(path) == 0o600
    assert stat.S_ISREG(os.lstat(path).st_mode)
    assert len(path.read_bytes()) == KEY_BYTES
    assert os.listdir(path.parent) == ["runtime-namespace.key"]  # no temp file left behind


def test_load_never_creates(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert NamespaceKey.load(home) is None
    assert not home.exists()
    home.mkdir()
    (home / "auth").mkdir(mode=0o700)
    assert NamespaceKey.load(home) is None
    assert os.listdir(home / "auth") == []


def test_existing_key_is_used_not_replaced(tmp_path: Path) -> None:
    secret = os.urandom(KEY_BYTES)
    path = _write_key(tmp_path, secret)
    key = NamespaceKey.load_or_create(tmp_path)
    assert path.read_bytes() == secret
    assert principal_for_api_key(key, "sk") == principal_for_api_key(NamespaceKey(secret), "sk")


def _assert_refused_and_untouched(home: Path, path: Path, match: str) -> None:
    before = path.read_bytes() if path.is_file() else None
    for loader in (NamespaceKey.load_or_create, NamespaceKey.load):
        with pytest.raises(NamespaceKeyError, match=match) as info:
            loader(home)
        assert isinstance(info.value, werk.Unavailable)
        assert info.value.retryable is False
        assert "never regenerates" in info.value.message
    if before is not None:
        assert path.read_bytes() == before  # never regenerated
    assert sorted(os.listdir(path.parent)) == ["runtime-namespace.key"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o666])
def test_group_or_world_accessible_key_is_refused(tmp_path: Path, mode: int) -> None:
    path = _write_key(tmp_path, os.urandom(KEY_BYTES), mode=mode)
    _assert_refused_and_untouched(tmp_path, path, "accessible to group or others.*chmod 600")
    assert _mode(path) == mode  # Werk reports; it does not silently "fix" the mode either


def test_group_accessible_auth_dir_is_refused(tmp_path: Path) -> None:
    path = _write_key(tmp_path, os.urandom(KEY_BYTES), dir_mode=0o750)
    _assert_refused_and_untouched(tmp_path, path, "accessible to group or others.*chmod 700")


@pytest.mark.parametrize("size", [0, 1, KEY_BYTES - 1, KEY_BYTES + 1, 4096])
def test_malformed_key_is_refused(tmp_path: Path, size: int) -> None:
    path = _write_key(tmp_path, b"\x01" * size)
    _assert_refused_and_untouched(tmp_path, path, "malformed")


def test_symlinked_key_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.key"
    target.write_bytes(os.urandom(KEY_BYTES))
    os.chmod(target, 0o600)
    auth = tmp_path / "auth"
    auth.mkdir(mode=0o700)
    path = key_path(tmp_path)
    path.symlink_to(target)
    before = target.read_bytes()
    for loader in (NamespaceKey.load_or_create, NamespaceKey.load):
        with pytest.raises(NamespaceKeyError, match="symbolic link"):
            loader(tmp_path)
    assert path.is_symlink() and target.read_bytes() == before


def test_symlink_swapped_in_after_the_check_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open itself refuses links (O_NOFOLLOW), not only the lstat before it: simulate a
    link that appears between the check and the open by making lstat report a regular file."""
    decoy = tmp_path / "decoy.key"
    decoy.write_bytes(os.urandom(KEY_BYTES))
    os.chmod(decoy, 0o600)
    (tmp_path / "auth").mkdir(mode=0o700)
    path = key_path(tmp_path)
    path.symlink_to(tmp_path / "elsewhere.key")
    (tmp_path / "elsewhere.key").write_bytes(os.urandom(KEY_BYTES))
    os.chmod(tmp_path / "elsewhere.key", 0o600)
    real_lstat = os.lstat

    def stale_lstat(p: str | Path, *args: object, **kwargs: object) -> os.stat_result:
        return real_lstat(decoy if Path(p) == path else p)

    monkeypatch.setattr(os, "lstat", stale_lstat)
    with pytest.raises(NamespaceKeyError, match="symbolic link"):
        NamespaceKey.load(tmp_path)


def test_symlinked_auth_dir_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real-auth"
    real.mkdir(mode=0o700)
    (real / "runtime-namespace.key").write_bytes(os.urandom(KEY_BYTES))
    os.chmod(real / "runtime-namespace.key", 0o600)
    home = tmp_path / "home"
    home.mkdir()
    (home / "auth").symlink_to(real)
    for loader in (NamespaceKey.load_or_create, NamespaceKey.load):
        with pytest.raises(NamespaceKeyError, match="symbolic link"):
            loader(home)


def test_directory_at_key_path_is_refused(tmp_path: Path) -> None:
    """Tests run as root, so a mode-0000 file would still be readable; a directory where the
    key file should be is a present key that cannot be read as one."""
    (tmp_path / "auth").mkdir(mode=0o700)
    key_path(tmp_path).mkdir(mode=0o700)
    for loader in (NamespaceKey.load_or_create, NamespaceKey.load):
        with pytest.raises(NamespaceKeyError, match="not a regular file"):
            loader(tmp_path)
    assert key_path(tmp_path).is_dir()


def test_read_error_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An I/O error while reading a present key (EIO, injected at os.read) is fatal too."""
    path = _write_key(tmp_path, os.urandom(KEY_BYTES))
    before = path.read_bytes()

    def failing_read(fd: int, n: int) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "read", failing_read)
    for loader in (NamespaceKey.load_or_create, NamespaceKey.load):
        with pytest.raises(NamespaceKeyError, match="unreadable"):
            loader(tmp_path)
    monkeypatch.undo()
    assert path.read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-0000 file anyway")
def test_permission_denied_key_is_refused(tmp_path: Path) -> None:
    _write_key(tmp_path, os.urandom(KEY_BYTES), mode=0o000)
    with pytest.raises(NamespaceKeyError, match="unreadable"):
        NamespaceKey.load_or_create(tmp_path)


def test_racing_creators_agree_on_one_key(tmp_path: Path) -> None:
    """Publication never replaces an existing key: a second creator adopts the first's key."""
    home = tmp_path / "home"
    real_link = os.link
    rivals: list[NamespaceKey] = []
    raced: list[bool] = []

    def link_after_a_rival(src: str, dst: str, **kwargs: bool) -> None:
        if not raced:  # the first publication attempt: let a rival create the key first
            raced.append(True)
            rivals.append(NamespaceKey.load_or_create(home))  # (its own link call is real)
        real_link(src, dst, **kwargs)

    with pytest.MonkeyPatch.context() as monkey:
        monkey.setattr(os, "link", link_after_a_rival)
        mine = NamespaceKey.load_or_create(home)
    assert principal_for_api_key(mine, "sk") == principal_for_api_key(rivals[0], "sk")
    assert os.listdir(home / "auth") == ["runtime-namespace.key"]
