"""Principals, prompt fingerprints and handoff hashes: everything keyed by the namespace key.

The namespace key is 32 random bytes in ``WERK_HOME/auth/runtime-namespace.key``. It is generated
once, written atomically with owner-only permissions, and never returned, logged or shown: a
:class:`NamespaceKey` prints as ``NamespaceKey(<redacted>)`` and refuses to be pickled.

Seed, "Principal and prompt isolation": *"When authentication is enabled, Werk derives a stable
opaque principal from the accepted API key with HMAC-SHA-256. The HMAC secret is generated inside
WERK_HOME/auth, committed atomically and kept out of protocol responses."* A present key that is
unreadable, malformed, a symbolic link or accessible to group/others is a startup error
(:class:`NamespaceKeyError`) and is **never** regenerated: a new key would orphan every stored
state, because every principal directory name is derived from it.

Every HMAC input goes through one encoder, :func:`hmac_input`: a length-prefixed domain tag
followed by length-prefixed fields (8-byte big-endian length, then the bytes). The encoding is
injective over ``(domain, fields)``, so ``"ab"+"c"`` never collides with ``"a"+"bc"`` and the
principal, prompt and handoff uses never share an input space.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ..protocol.errors import Unavailable

__all__ = [
    "DOMAIN_CACHE_SALT",
    "DOMAIN_HANDOFF",
    "DOMAIN_PRINCIPAL",
    "DOMAIN_PROMPT",
    "DOMAIN_PROMPT_KEY",
    "KEY_BYTES",
    "LOCAL_PRINCIPAL",
    "PRINCIPAL_PATTERN",
    "NamespaceKey",
    "NamespaceKeyError",
    "cache_salt",
    "handoff_hash",
    "hmac_input",
    "is_principal",
    "key_path",
    "principal_for_api_key",
    "prompt_fingerprint",
]

KEY_BYTES = 32
"""Length of the namespace key in bytes."""

LOCAL_PRINCIPAL = "local"
"""The one principal of unauthenticated local mode (not an isolation boundary)."""

PRINCIPAL_PATTERN = re.compile(r"^(?:local|p_[0-9a-f]{64})$")
"""What a principal id looks like: ``local`` or ``p_`` + 64 lower-case hex digits."""

DOMAIN_PRINCIPAL = b"werk/principal/v1"
DOMAIN_PROMPT_KEY = b"werk/prompt-key/v1"
DOMAIN_PROMPT = b"werk/prompt/v1"
DOMAIN_PROMPT_PREFIX = b"werk/prompt-prefix/v1"
DOMAIN_HANDOFF = b"werk/handoff/v1"
DOMAIN_CACHE_SALT = b"werk/cache-salt/v1"
DOMAIN_OUTPUT_LINKS = b"werk/output-links/v1"

_AUTH_DIR = "auth"
_KEY_FILE = "runtime-namespace.key"
_LENGTH_BYTES = 8
_NEVER_REGENERATED = (
    "Werk never regenerates a present key, because a new key would orphan every stored state"
)


class NamespaceKeyError(Unavailable):
    """The namespace key (or its ``auth`` directory) is present but unusable.

    A startup error: the message names the path and what to fix. Not retryable — a person has
    to repair the file first.
    """

    default_retryable = False


def key_path(home: Path) -> Path:
    """``WERK_HOME/auth/runtime-namespace.key``."""
    return home / _AUTH_DIR / _KEY_FILE


def hmac_input(domain: bytes, *fields: bytes) -> bytes:
    """The single encoder of every HMAC input.

    ``len(domain) || domain || len(f1) || f1 || …`` with 8-byte big-endian lengths. Because each
    piece carries its length, the byte string decodes back to exactly one ``(domain, fields)``:
    distinct inputs never collide, and distinct domains never share an input space.
    """
    parts = [len(domain).to_bytes(_LENGTH_BYTES, "big"), domain]
    for item in fields:
        parts.append(len(item).to_bytes(_LENGTH_BYTES, "big"))
        parts.append(item)
    return b"".join(parts)


class NamespaceKey:
    """The secret that keys principals, prompt fingerprints and handoff hashes.

    Obtain one with :meth:`load_or_create` (the server at startup), :meth:`load` (read-only
    callers, never creates anything) or :meth:`ephemeral` (an in-memory key for registries that
    never persist, and for tests). The bytes are never part of ``repr``/``str``.
    """

    __slots__ = ("__secret",)

    def __init__(self, secret: bytes) -> None:
        if len(secret) != KEY_BYTES:
            raise ValueError(f"a namespace key is exactly {KEY_BYTES} bytes")
        self.__secret = bytes(secret)

    def __repr__(self) -> str:
        return "NamespaceKey(<redacted>)"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a NamespaceKey cannot be pickled")

    @classmethod
    def ephemeral(cls) -> NamespaceKey:
        """A fresh random key that lives only in this process's memory."""
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def load(cls, home: Path) -> NamespaceKey | None:
        """The existing key, or ``None`` when none was ever created. Never creates anything.

        ``None`` means no principal was ever derived in this ``WERK_HOME``: a read-only caller
        can conclude that no authenticated principal owns any state here.

        :raises NamespaceKeyError: the key or its directory is present but unusable.
        """
        auth = home / _AUTH_DIR
        if not _check_auth_dir(auth):
            return None
        secret = _read_key(auth / _KEY_FILE)
        return None if secret is None else cls(secret)

    @classmethod
    def load_or_create(cls, home: Path) -> NamespaceKey:
        """The existing key, or a newly generated one if (and only if) none exists.

        Creation: ``WERK_HOME`` and ``auth/`` (0700) are created when missing; the key is written
        to a temporary file in ``auth/`` (0600, fsynced), published under its final name without
        replacing anything (a hard link, so two processes racing to create it agree on one key),
        and ``auth/`` is fsynced. The published file is then read back through the same checks
        as :meth:`load`.

        :raises NamespaceKeyError: the key or its directory is present but unusable.
        """
        auth = home / _AUTH_DIR
        path = auth / _KEY_FILE
        secret = _read_key(path) if _check_auth_dir(auth) else None
        if secret is None:
            try:
                _create_auth_dir(home, auth)
                _publish_new_key(auth, path)
            except OSError as exc:
                raise NamespaceKeyError(
                    f"cannot create namespace key {path}: {exc.strerror or exc}"
                ) from exc
            secret = _read_key(path)
            if secret is None:  # removed between publish and read: refuse to guess
                raise NamespaceKeyError(
                    f"namespace key {path} disappeared right after it was created; "
                    "check for another process deleting files under WERK_HOME/auth"
                )
        return cls(secret)

    def _mac(self, message: bytes) -> bytes:
        return hmac.new(self.__secret, message, hashlib.sha256).digest()

    def _derive(self, domain: bytes, *fields: bytes) -> bytes:
        return self._mac(hmac_input(domain, *fields))


def principal_for_api_key(key: NamespaceKey, api_key: str) -> str:
    """``p_`` + hex HMAC-SHA-256 of the API key under the namespace key.

    The raw key never becomes a directory name or a service-layer value; this id does.

    :raises ValueError: for an empty API key.
    """
    if not api_key:
        raise ValueError("an API key must not be empty")
    return "p_" + key._derive(DOMAIN_PRINCIPAL, api_key.encode("utf-8")).hex()


def is_principal(value: str) -> bool:
    """Whether ``value`` is ``local`` or a derived ``p_…`` principal id."""
    return PRINCIPAL_PATTERN.fullmatch(value) is not None


def prompt_fingerprint(
    key: NamespaceKey,
    principal: str,
    *,
    model: str,
    envelope_digest: str,
    prompt: str | None = None,
    messages: Sequence[tuple[str, str]] | None = None,
) -> str:
    """A principal-scoped keyed fingerprint of a prompt (``pf_`` + hex).

    Seed: *"Prompt fingerprints are also keyed and principal-scoped. Consequently, two API keys
    cannot discover or reuse one another's runtime states even if they submit identical
    prompts."* The HMAC key is itself derived per principal from the namespace key, so two
    principals' fingerprints of one prompt are unrelated values. Give exactly one of ``prompt``
    or ``messages`` (``(role, content)`` pairs); the two forms never share an input space.

    :raises ValueError: for a malformed principal or not exactly one prompt form.
    """
    if not is_principal(principal):
        raise ValueError("not a principal id")
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of 'prompt' or 'messages'")
    fields: list[bytes] = [model.encode("utf-8"), envelope_digest.encode("utf-8")]
    if prompt is not None:
        fields += [b"prompt", prompt.encode("utf-8")]
    else:
        assert messages is not None
        fields.append(b"messages")
        for role, content in messages:
            fields += [role.encode("utf-8"), content.encode("utf-8")]
    principal_key = key._derive(DOMAIN_PROMPT_KEY, principal.encode("utf-8"))
    digest = hmac.new(principal_key, hmac_input(DOMAIN_PROMPT, *fields), hashlib.sha256)
    return "pf_" + digest.hexdigest()


def cache_salt(key: NamespaceKey, principal: str) -> str:
    """A per-principal salt for backend prefix caches shared between requests (hex, 32
    characters): the same principal always gets the same salt, and without the namespace key
    nobody can compute another principal's."""
    return key._derive(DOMAIN_CACHE_SALT, principal.encode("utf-8")).hex()[:32]


def output_link_secret(key: NamespaceKey) -> bytes:
    """The secret that signs output download links (:mod:`werk.http.links`): derived from the
    namespace key, so links outlive a restart and end with the key."""
    return key._derive(DOMAIN_OUTPUT_LINKS)


def handoff_hash(key: NamespaceKey, token: str) -> str:
    """The registry's lookup key for a handoff token (hex). The token itself is never stored."""
    return key._derive(DOMAIN_HANDOFF, token.encode("utf-8")).hex()


# --- the key file ---------------------------------------------------------------------------


def _check_auth_dir(auth: Path) -> bool:
    """``False`` when ``auth/`` is missing; ``True`` when it is a safe directory; else raise."""
    try:
        st = os.lstat(auth)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise NamespaceKeyError(f"cannot inspect {auth}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise NamespaceKeyError(
            f"{auth} is a symbolic link; replace it with the real directory it points to "
            "(mode 0700, owned by the user running Werk)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise NamespaceKeyError(f"{auth} is not a directory; move it aside and restore the key")
    _check_owner_only(auth, st, "directory", "700")
    return True


def _check_owner_only(path: Path, st: os.stat_result, what: str, fix_mode: str) -> None:
    if st.st_uid != os.geteuid():
        raise NamespaceKeyError(
            f"{what} {path} is owned by uid {st.st_uid}, not by the user running Werk "
            f"(uid {os.geteuid()}); fix its ownership. {_NEVER_REGENERATED}."
        )
    if st.st_mode & 0o077:
        raise NamespaceKeyError(
            f"{what} {path} is accessible to group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); run `chmod {fix_mode} {path}`"
            + (" and check that the key did not leak" if what == "namespace key" else "")
            + f". {_NEVER_REGENERATED}."
        )


def _read_key(path: Path) -> bytes | None:
    """The key bytes, ``None`` when the file is missing, or :class:`NamespaceKeyError`."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise NamespaceKeyError(f"cannot inspect namespace key {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        _symlink_error(path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            _symlink_error(path)
        raise NamespaceKeyError(
            f"namespace key {path} is unreadable ({exc.strerror}); make it a regular file "
            f"readable by the user running Werk (mode 0600). {_NEVER_REGENERATED}."
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NamespaceKeyError(
                f"namespace key {path} is not a regular file; restore the key file there. "
                f"{_NEVER_REGENERATED}."
            )
        _check_owner_only(path, st, "namespace key", "600")
        data = _read_at_most(fd, KEY_BYTES + 1, path)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        raise NamespaceKeyError(
            f"namespace key {path} is malformed: it must hold exactly {KEY_BYTES} bytes but "
            f"holds {len(data) if len(data) <= KEY_BYTES else f'more than {KEY_BYTES}'}; "
            f"restore it from a backup. {_NEVER_REGENERATED}."
        )
    return data


def _read_at_most(fd: int, limit: int, path: Path) -> bytes:
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        try:
            chunk = os.read(fd, remaining)
        except OSError as exc:
            raise NamespaceKeyError(
                f"namespace key {path} is unreadable ({exc.strerror}); check the file system. "
                f"{_NEVER_REGENERATED}."
            ) from None
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _symlink_error(path: Path) -> NoReturn:
    raise NamespaceKeyError(
        f"namespace key {path} is a symbolic link; replace it with the regular file it points "
        f"to (mode 0600). {_NEVER_REGENERATED}."
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_auth_dir(home: Path, auth: Path) -> None:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.mkdir(auth, 0o700)
    except FileExistsError:
        pass  # another process won the race; the check below judges what it made
    else:
        os.chmod(auth, 0o700, follow_symlinks=False)  # umask may have removed owner bits
        _fsync_dir(home)
    if not _check_auth_dir(auth):
        raise NamespaceKeyError(f"{auth} disappeared while it was being created")


def _publish_new_key(auth: Path, path: Path) -> None:
    """Write 32 random bytes to a temporary file and publish it without replacing anything."""
    tmp = auth / f".{_KEY_FILE}.tmp-{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(secrets.token_bytes(KEY_BYTES))
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            pass  # a concurrent creator published first: everyone uses its key
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            # No hard links on this file system: rename, but never over an existing key.
            if not os.path.lexists(path):
                os.rename(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(auth)
