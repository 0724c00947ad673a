"""Inspecting a ``llama-server`` executable before the first spawn.

``--help``, ``--version`` and ``--list-devices`` run once per executable *identity* (path,
device, inode, size, mtime and ctime), concurrently with a SHA-256 of the binary; all finish
before any model process is spawned. The file's identity is checked before and after, so a
binary replaced mid-inspection is never trusted. Successful inspections are cached by identity
in-process and on disk (``WERK_HOME/inspections/llamacpp/``, one private JSON file per
identity), so the next ``werk serve`` spawns its child without running the executable twice
first; a failed inspection is never cached and is retried on the next start. A cached entry is
used only when every field of the identity matches the file as it is now (any replacement, copy
or in-place write changes the inode, mtime or ctime); a corrupt or mismatching entry is ignored
and replaced.

The argument builder uses only the flags this help text advertises (:func:`advertised_flags`).
After the child reports ready, :func:`verify_unchanged` re-checks the identity *and* the full
hash (computed while the child loads): the process Werk fingerprinted must be the one that is
running.

An inspection is *valid* when both commands succeed, the version is readable, the identity did
not change, and the state-related flags (``--slot-save-path``, ``-np``) are advertised. An invalid
inspection still lets a runtime start when the essential flags are present (``-m``, ``--host``,
``--port``, ``--api-key``: Werk never runs a child it cannot bind to loopback with a private key),
but it disables native persistence: the generation's state capabilities stay unavailable.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import threading
from collections.abc import AsyncIterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import msgspec

from werk import CapabilityId, Unavailable, replace_private_file, werk_home

__all__ = [
    "ESSENTIAL_FLAGS",
    "STATE_FLAGS",
    "ExecutableChanged",
    "FileIdentity",
    "Inspection",
    "advertised_flags",
    "cached_inspection",
    "child_environment",
    "forget_inspections",
    "inspect_executable",
    "inspect_executable_sync",
    "inspection_dir",
    "listed_devices",
    "load_record",
    "sha256_file",
    "start_rehash",
    "store_record",
    "verify_unchanged",
]

INSPECT_TIMEOUT_SECONDS = 30.0
MAX_OUTPUT_BYTES = 4 * 1024 * 1024

ESSENTIAL_FLAGS = ("--model", "--host", "--port", "--api-key")
"""Without these Werk refuses to start the executable at all."""
STATE_FLAGS = ("--slot-save-path", "--parallel")
"""Without these the runtime starts, but native persistence is disabled."""

_OPTION_LINE = re.compile(r"^-")
_FLAG = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_-]*$")


class ExecutableChanged(Unavailable):
    """The executable changed between inspection and the running child (retry starts anew)."""


class FileIdentity(msgspec.Struct, frozen=True):
    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity:
        st = os.stat(path)
        return cls(str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Inspection(msgspec.Struct, frozen=True):
    """What one inspection of one executable found.

    :ivar sha256: hex digest of the binary (``Runtime.executable`` is ``sha256:<hex>``).
    :ivar flags: every option spelling the help advertises (``-np`` and ``--parallel`` alike).
    :ivar problems: why the inspection is invalid (empty when valid).
    :ivar missing_essential: essential flags the help does not advertise (start refuses).
    :ivar devices: the accelerator devices ``--list-devices`` names (``()``: a CPU-only build;
        ``None``: unknown, the command failed or printed no device list).
    """

    path: Path
    identity: FileIdentity
    sha256: str
    help_text: str
    version_text: str
    flags: frozenset[str]
    problems: tuple[str, ...]
    missing_essential: tuple[str, ...]
    devices: tuple[str, ...] | None = None

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def version(self) -> str:
        """The first ``version:`` line, or ``unknown``."""
        for line in self.version_text.splitlines():
            if line.strip().startswith("version:"):
                return line.split(":", 1)[1].strip()
        return "unknown"

    def advertises(self, *spellings: str) -> bool:
        return any(s in self.flags for s in spellings)


def advertised_flags(help_text: str) -> frozenset[str]:
    """Option spellings from llama.cpp's help layout.

    Option lines start in column 0 with ``-``; the spellings are comma-separated and end where
    the description (two or more spaces) begins, e.g.
    ``-cram, --cache-ram N                    set the maximum cache size...`` or
    ``--warmup, --no-warmup                   whether to perform warmup...``.
    """
    flags: set[str] = set()
    for line in help_text.splitlines():
        if not _OPTION_LINE.match(line):
            continue
        spec = re.split(r"(?<![,\s])\s{2,}", line.strip(), maxsplit=1)[0]
        for part in spec.split(","):
            words = part.split()
            if words and _FLAG.match(words[0]):
                flags.add(words[0])
    return frozenset(flags)


def listed_devices(rc: int, text: str) -> tuple[str, ...] | None:
    """The devices of ``llama-server --list-devices`` (one indented line each after
    ``Available devices:``; ``(none)`` on a CPU-only build); ``None`` when not listed."""
    if rc != 0:
        return None
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Available devices:")
    except StopIteration:
        return None
    devices = []
    for line in lines[start + 1 :]:
        if not line.startswith((" ", "\t")) or not line.strip():
            break
        if line.strip() != "(none)":
            devices.append(line.strip())
    return tuple(devices)


def child_environment() -> dict[str, str]:
    """The environment for every llama-server Werk runs.

    llama.cpp reads ``LLAMA_*`` variables as option values (``LLAMA_ARG_HOST``,
    ``LLAMA_API_KEY`` adds keys, ``LLAMA_ARG_API_KEY_FILE``, ``LLAMA_ARG_TOOLS``…) and a user
    config file; both are removed from the child's view so only Werk's argument list counts.
    """
    return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}


def sha256_file(path: Path) -> str:
    """The file's SHA-256 (``hashlib.file_digest``: one reused buffer; reading 1 MiB chunks
    into new objects had the kernel map and zero fresh pages for each chunk: 17 instead of 12 ms
    of CPU for the 15 MB llama-server executable, the first hash in a process)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _safe_hash(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError:
        return ""


_cache: dict[FileIdentity, Inspection] = {}
DISK_CACHE_VERSION = 2
MAX_CACHE_FILE_BYTES = 2 * MAX_OUTPUT_BYTES + 64 * 1024


def forget_inspections() -> None:
    """Drop the in-process cache (tests); the disk cache stays (see :func:`inspection_dir`)."""
    _cache.clear()


def inspection_dir() -> Path:
    return werk_home() / "inspections" / "llamacpp"


def _cache_file(identity: FileIdentity, prefix: str = "") -> Path:
    key = hashlib.sha256(repr(msgspec.structs.astuple(identity)).encode()).hexdigest()[:32]
    return inspection_dir() / f"{prefix}{key}.json"


def load_record(
    identity: FileIdentity, *, prefix: str = "", version: int, limit: int = MAX_CACHE_FILE_BYTES
) -> dict[str, Any] | None:
    """The JSON record cached on disk for exactly this file ``identity`` (path, device, inode,
    size, mtime, ctime) in this ``version``, or ``None`` (absent, foreign, corrupt or stale).
    The executable inspections and the GGUF header facts of :mod:`.requirement` use it."""
    try:
        fd = os.open(_cache_file(identity, prefix), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(limit + 1)
        record = json.loads(raw) if len(raw) <= limit else None
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != version:
        return None
    if record.get("identity") != list(msgspec.structs.astuple(identity)):
        return None
    return record


def store_record(
    identity: FileIdentity, record: dict[str, Any], *, prefix: str = "", version: int
) -> None:
    """Record ``record`` for exactly ``identity`` (best effort, atomic and private: a failure
    only costs time on the next start)."""
    record = {"version": version, "identity": list(msgspec.structs.astuple(identity)), **record}
    target = _cache_file(identity, prefix)
    with contextlib.suppress(OSError):
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            replace_private_file(dir_fd, target.name, json.dumps(record).encode())
        finally:
            os.close(dir_fd)


def _load_cached(path: Path, identity: FileIdentity) -> Inspection | None:
    """The inspection recorded on disk for exactly ``identity``, or ``None``."""
    record = load_record(identity, version=DISK_CACHE_VERSION)
    if record is None:
        return None
    outputs = record.get("outputs")
    digest = record.get("sha256")
    if not isinstance(outputs, dict) or not isinstance(digest, str):
        return None
    try:
        parsed = {flag: (int(outputs[flag][0]), str(outputs[flag][1])) for flag in _FLAGS}
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    result = _assemble(path, identity, parsed, digest, store=False)
    return result if result.valid and not result.missing_essential else None


def _store_cached(identity: FileIdentity, outputs: dict[str, tuple[int, str]], digest: str) -> None:
    """Record a valid inspection for the next process (best effort: a failure only costs time)."""
    record = {"sha256": digest, "outputs": {flag: list(outputs[flag]) for flag in _FLAGS}}
    store_record(identity, record, version=DISK_CACHE_VERSION)


def _decode(rc: int, stdout: bytes, stderr: bytes) -> tuple[int, str]:
    text = stdout[:MAX_OUTPUT_BYTES] + stderr[:MAX_OUTPUT_BYTES]
    return rc, text.decode("utf-8", "replace")


async def _run(path: Path, flag: str, out: dict[str, tuple[int, str]]) -> None:
    """Run ``path flag`` and record its status and output. The process never outlives this
    call: a timeout, a cancellation (Ctrl+C while the server starts a model) or any error kills
    it (SIGKILL, synchronously) before the exception goes on."""
    try:
        process = await anyio.open_process(
            [str(path), flag], stdin=subprocess.DEVNULL, env=child_environment()
        )
    except OSError as exc:
        out[flag] = (-1, f"{flag} could not run ({exc.strerror})")
        return
    captured = {"stdout": bytearray(), "stderr": bytearray()}

    async def drain(name: str, stream: AsyncIterable[bytes] | None) -> None:
        if stream is not None:
            async for chunk in stream:
                if len(captured[name]) < MAX_OUTPUT_BYTES:
                    captured[name] += chunk

    try:
        with anyio.fail_after(INSPECT_TIMEOUT_SECONDS):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain, "stdout", process.stdout)
                tg.start_soon(drain, "stderr", process.stderr)
                code = await process.wait()
    except TimeoutError:
        out[flag] = (-1, f"{flag} timed out after {INSPECT_TIMEOUT_SECONDS:.0f}s")
    else:
        out[flag] = _decode(code, bytes(captured["stdout"]), bytes(captured["stderr"]))
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        with anyio.CancelScope(shield=True):
            await process.aclose()


def _run_sync(path: Path, flag: str) -> tuple[int, str]:
    try:
        done = subprocess.run(
            [str(path), flag],
            check=False,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            env=child_environment(),
            timeout=INSPECT_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return -1, f"{flag} timed out after {INSPECT_TIMEOUT_SECONDS:.0f}s"
    except OSError as exc:
        return -1, f"{flag} could not run ({exc.strerror})"
    return _decode(done.returncode, done.stdout, done.stderr)


def _identity(path: Path) -> FileIdentity:
    try:
        return FileIdentity.of(path)
    except OSError as exc:
        raise Unavailable(
            f"llama-server executable is not readable ({exc.strerror})",
            capability=CapabilityId.MODEL_RESIDENCY,
        ) from None


_FLAGS = ("--help", "--version", "--list-devices")


def _assemble(
    path: Path,
    before: FileIdentity,
    outputs: dict[str, tuple[int, str]],
    digest: str,
    *,
    store: bool = True,
) -> Inspection:
    try:
        after: FileIdentity | None = FileIdentity.of(path)
    except OSError:
        after = None
    help_rc, help_text = outputs["--help"]
    version_rc, version_text = outputs["--version"]
    devices = listed_devices(*outputs["--list-devices"])
    flags = advertised_flags(help_text) if help_rc == 0 else frozenset()
    problems: list[str] = []
    if after != before or not digest:
        problems.append("the executable changed or became unreadable during inspection")
    if help_rc != 0 or not flags:
        problems.append("--help failed or advertised no options")
    if version_rc != 0 or "version:" not in version_text:
        problems.append("--version failed or printed no version")
    aliases = {"--model": ("-m", "--model"), "--parallel": ("-np", "--parallel")}
    missing = [f for f in ESSENTIAL_FLAGS if not flags & set(aliases.get(f, (f,)))]
    missing_state = [f for f in STATE_FLAGS if not flags & set(aliases.get(f, (f,)))]
    if flags and missing_state:
        problems.append(f"--help does not advertise {', '.join(missing_state)}")
    result = Inspection(
        path=path,
        identity=before,
        sha256=digest,
        help_text=help_text,
        version_text=version_text,
        flags=flags,
        problems=tuple(problems),
        missing_essential=tuple(missing),
        devices=devices,
    )
    if result.valid and not missing:
        _cache[before] = result
        if store:
            _store_cached(before, outputs, digest)
    return result


def cached_inspection(path: Path) -> Inspection | None:
    """The cached inspection of ``path`` as it is now, if there is one (never runs anything)."""
    try:
        return _cache.get(FileIdentity.of(path))
    except OSError:
        return None


async def inspect_executable(path: Path) -> Inspection:
    """Inspect ``path`` (cached per identity): ``--help``, ``--version``, ``--list-devices``
    and the SHA-256 run concurrently and all finish before this returns. A bad executable is
    described by the result's ``problems``; only an unreadable file raises
    :class:`werk.Unavailable`."""
    before = _identity(path)
    cached = _cache.get(before) or _load_cached(path, before)
    if cached is not None:
        return cached
    outputs: dict[str, tuple[int, str]] = {}
    digest: list[str] = []

    async def hash_it() -> None:
        digest.append(await anyio.to_thread.run_sync(_safe_hash, path))

    async with anyio.create_task_group() as tg:
        for flag in _FLAGS:
            tg.start_soon(_run, path, flag, outputs)
        tg.start_soon(hash_it)
    return _assemble(path, before, outputs, digest[0])


def inspect_executable_sync(path: Path) -> Inspection:
    """:func:`inspect_executable` for synchronous callers (capability discovery)."""
    before = _identity(path)
    cached = _cache.get(before) or _load_cached(path, before)
    if cached is not None:
        return cached
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="werk-llama-inspect") as pool:
        jobs = {flag: pool.submit(_run_sync, path, flag) for flag in _FLAGS}
        hash_job = pool.submit(_safe_hash, path)
        outputs = {flag: job.result() for flag, job in jobs.items()}
        digest = hash_job.result()
    return _assemble(path, before, outputs, digest)


def start_rehash(inspection: Inspection) -> Future[str]:
    """Hash the executable as it is now (``""`` if unreadable) in a thread of its own: start it
    before spawning the child and pass the result to :func:`verify_unchanged` after readiness,
    so the hash costs no time on the way to the first token."""
    future: Future[str] = Future()

    def run() -> None:
        future.set_result(_safe_hash(inspection.path))

    threading.Thread(target=run, name="werk-llama-rehash", daemon=True).start()
    return future


async def verify_unchanged(inspection: Inspection, digest: Future[str] | None = None) -> None:
    """Re-stat the executable after readiness and compare its hash (from :func:`start_rehash`,
    started after the inspection; computed here when not given).

    :raises ExecutableChanged: the file on disk is no longer what was inspected.
    """
    try:
        now: FileIdentity | None = FileIdentity.of(inspection.path)
    except OSError:
        now = None
    pending = digest if digest is not None else start_rehash(inspection)
    digest_now = await anyio.to_thread.run_sync(pending.result)
    if now != inspection.identity or digest_now != inspection.sha256:
        _cache.pop(inspection.identity, None)
        with contextlib.suppress(OSError):
            _cache_file(inspection.identity).unlink()
        raise ExecutableChanged(
            "the llama-server executable changed while the model was starting; retry to "
            "start it again with the new executable",
            capability=CapabilityId.MODEL_RESIDENCY,
        )
