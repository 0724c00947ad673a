"""Inspecting a ``llama-server`` executable before the first spawn.

``--help`` and ``--version`` run once per executable *identity* (path, device, inode, size,
mtime and ctime), concurrently with a SHA-256 of the binary; all three finish before any model
process is spawned. The file's identity is checked before and after, so a binary replaced
mid-inspection is never trusted. Successful inspections are cached in-process by identity; a
failed one is retried on the next start.

The argument builder uses only the flags this help text advertises (:func:`advertised_flags`).
After the child reports ready, :func:`verify_unchanged` re-checks the identity *and* the full
hash: the process Werk fingerprinted must be the one that is running.

An inspection is *valid* when both commands succeed, the version is readable, the identity did
not change, and the state-related flags (``--slot-save-path``, ``-np``) are advertised. An invalid
inspection still lets a runtime start when the essential flags are present (``-m``, ``--host``,
``--port``, ``--api-key``: Werk never runs a child it cannot bind to loopback with a private key),
but it disables native persistence: the generation's state capabilities stay unavailable.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import anyio

from werk import CapabilityId, Unavailable

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
    "sha256_file",
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


@dataclass(frozen=True)
class FileIdentity:
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


@dataclass(frozen=True)
class Inspection:
    """What one inspection of one executable found.

    :ivar sha256: hex digest of the binary (``Runtime.executable`` is ``sha256:<hex>``).
    :ivar flags: every option spelling the help advertises (``-np`` and ``--parallel`` alike).
    :ivar problems: why the inspection is invalid (empty when valid).
    :ivar missing_essential: essential flags the help does not advertise (start refuses).
    """

    path: Path
    identity: FileIdentity
    sha256: str
    help_text: str
    version_text: str
    flags: frozenset[str]
    problems: tuple[str, ...]
    missing_essential: tuple[str, ...]

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


def child_environment() -> dict[str, str]:
    """The environment for every llama-server Werk runs.

    llama.cpp reads ``LLAMA_*`` variables as option values (``LLAMA_ARG_HOST``,
    ``LLAMA_API_KEY`` adds keys, ``LLAMA_ARG_API_KEY_FILE``, ``LLAMA_ARG_TOOLS``…) and a user
    config file; both are removed from the child's view so only Werk's argument list counts.
    """
    return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _safe_hash(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError:
        return ""


_cache: dict[FileIdentity, Inspection] = {}


def forget_inspections() -> None:
    """Drop the in-process cache (tests)."""
    _cache.clear()


def _decode(rc: int, stdout: bytes, stderr: bytes) -> tuple[int, str]:
    text = stdout[:MAX_OUTPUT_BYTES] + stderr[:MAX_OUTPUT_BYTES]
    return rc, text.decode("utf-8", "replace")


async def _run(path: Path, flag: str, out: dict[str, tuple[int, str]]) -> None:
    try:
        with anyio.fail_after(INSPECT_TIMEOUT_SECONDS):
            done = await anyio.run_process(
                [str(path), flag], check=False, stdin=subprocess.DEVNULL, env=child_environment()
            )
    except TimeoutError:
        out[flag] = (-1, f"{flag} timed out after {INSPECT_TIMEOUT_SECONDS:.0f}s")
    except OSError as exc:
        out[flag] = (-1, f"{flag} could not run ({exc.strerror})")
    else:
        out[flag] = _decode(done.returncode, done.stdout, done.stderr)


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


def _assemble(
    path: Path,
    before: FileIdentity,
    outputs: dict[str, tuple[int, str]],
    digest: str,
) -> Inspection:
    try:
        after: FileIdentity | None = FileIdentity.of(path)
    except OSError:
        after = None
    help_rc, help_text = outputs["--help"]
    version_rc, version_text = outputs["--version"]
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
    )
    if result.valid and not missing:
        _cache[before] = result
    return result


def cached_inspection(path: Path) -> Inspection | None:
    """The cached inspection of ``path`` as it is now, if there is one (never runs anything)."""
    try:
        return _cache.get(FileIdentity.of(path))
    except OSError:
        return None


async def inspect_executable(path: Path) -> Inspection:
    """Inspect ``path`` (cached per identity): ``--help``, ``--version`` and the SHA-256 run
    concurrently and all finish before this returns. A bad executable is described by the
    result's ``problems``; only an unreadable file raises :class:`werk.Unavailable`."""
    before = _identity(path)
    cached = _cache.get(before)
    if cached is not None:
        return cached
    outputs: dict[str, tuple[int, str]] = {}
    digest: list[str] = []

    async def hash_it() -> None:
        digest.append(await anyio.to_thread.run_sync(_safe_hash, path))

    async with anyio.create_task_group() as tg:
        tg.start_soon(_run, path, "--help", outputs)
        tg.start_soon(_run, path, "--version", outputs)
        tg.start_soon(hash_it)
    return _assemble(path, before, outputs, digest[0])


def inspect_executable_sync(path: Path) -> Inspection:
    """:func:`inspect_executable` for synchronous callers (capability discovery)."""
    before = _identity(path)
    cached = _cache.get(before)
    if cached is not None:
        return cached
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="werk-llama-inspect") as pool:
        help_job = pool.submit(_run_sync, path, "--help")
        version_job = pool.submit(_run_sync, path, "--version")
        hash_job = pool.submit(_safe_hash, path)
        outputs = {"--help": help_job.result(), "--version": version_job.result()}
        digest = hash_job.result()
    return _assemble(path, before, outputs, digest)


async def verify_unchanged(inspection: Inspection) -> None:
    """Re-stat and re-hash the executable after readiness.

    :raises ExecutableChanged: the file on disk is no longer what was inspected.
    """
    try:
        now = FileIdentity.of(inspection.path)
        digest = await anyio.to_thread.run_sync(sha256_file, inspection.path)
    except OSError:
        now, digest = None, ""
    if now != inspection.identity or digest != inspection.sha256:
        _cache.pop(inspection.identity, None)
        raise ExecutableChanged(
            "the llama-server executable changed while the model was starting; retry to "
            "start it again with the new executable",
            capability=CapabilityId.MODEL_RESIDENCY,
        )
