"""Managed Python environments for heavy backends (vLLM, media workers, Qwen-TTS).

A plugin describes what its worker needs with an :class:`EnvironmentSpec` (returned from
:func:`~werk.hookspecs.werk_backend_environments`); ``werk backends install NAME`` builds it
with :class:`ManagedEnvironment` under ``WERK_HOME/backends/<name>/`` (or
``$WERK_BACKENDS_DIR/<name>/`` when that is set: several homes, or a test suite, can share one
multi-gigabyte install)::

    venv/               the environment (python -m venv, then pip); run it as venv/bin/python
    environment.json    what was installed: the spec's digest, python, every distribution
    install.log         pip's full output of the last install
    lock                held (flock) while an install runs

**Nothing half-built is ever used.** The environment is built in a private temporary directory
next to ``venv/``, checked (the spec's imports must succeed in it), and only then published:
``venv/`` is replaced by one atomic rename, and ``environment.json`` is written last (fsync +
rename). A crash or a failed install leaves the previous environment, or none, never a broken
one; the next install removes the leftovers. An environment is *ready* only while its record
exists and names the same spec digest: a changed spec makes it *outdated*, never silently used.

Run programs in it as ``venv/bin/python -m <module>``: the directory was renamed after pip
wrote it, so console-script shebangs point at the temporary path.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

import msgspec

from ._fs import replace_private_file
from .config import backends_dir, werk_home
from .protocol import CapabilityId, Conflict, InvalidRequest, Unavailable
from .source_wheels import SourceWheel, build_source_wheel

__all__ = [
    "EnvironmentSpec",
    "EnvironmentState",
    "EnvironmentStatus",
    "FoundPython",
    "InstallStep",
    "ManagedEnvironment",
    "configured_python",
    "locate_python",
]

RECORD_SCHEMA = 1
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_")
_TMP_PREFIX = ".venv-building-"
PIP_TIMEOUT_SECONDS = 3600.0


class EnvironmentSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What one backend's worker needs installed.

    :ivar name: the environment's name (``werk backends install NAME``; lower-case).
    :ivar description: one line for ``werk backends list``.
    :ivar requirements: pip requirement strings, installed together in one ``pip install``.
    :ivar without_dependencies: requirements installed afterwards with ``pip install --no-deps``
        (a package whose declared dependencies would pull what must not be installed: list
        what it really needs in ``requirements``).
    :ivar remove: distributions to uninstall afterwards (e.g. GPU builds pip pulls in that break
        a CPU install).
    :ivar imports: modules that must import in the finished environment (the install fails
        otherwise).
    :ivar present: modules that must be found (``importlib.util.find_spec``) but are not
        imported by the check (a package whose import needs a shim its worker installs).
    :ivar environment: extra environment variables for pip and the import check.
    :ivar source_wheels: distributions built from source on this machine
        (:class:`werk.SourceWheel`; cached in the user cache, reused by later installs) and
        installed with the ``requirements``.
    """

    name: str
    description: str = ""
    requirements: tuple[str, ...]
    without_dependencies: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    present: tuple[str, ...] = ()
    environment: Mapping[str, str] = msgspec.field(default_factory=dict)
    source_wheels: tuple[SourceWheel, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not set(self.name) <= _NAME_CHARS:
            raise ValueError(f"environment name {self.name!r} must be lower-case [a-z0-9_-]")
        if not self.requirements and not self.source_wheels:
            raise ValueError(f"environment {self.name!r} needs at least one requirement")

    def digest(self) -> str:
        """Identifies what is asked for; a changed digest makes an installed environment
        outdated."""
        asked: dict[str, object] = {
            "requirements": list(self.requirements),
            "remove": list(self.remove),
            "imports": list(self.imports),
            "environment": dict(sorted(self.environment.items())),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        }
        # Members added later count only when used: existing installs keep their digest.
        if self.without_dependencies:
            asked["without_dependencies"] = list(self.without_dependencies)
        if self.present:
            asked["present"] = list(self.present)
        if self.source_wheels:
            asked["source_wheels"] = [wheel.key() for wheel in self.source_wheels]
        body = json.dumps(asked, sort_keys=True)
        return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


class EnvironmentState(enum.StrEnum):
    MISSING = "missing"
    READY = "ready"
    OUTDATED = "outdated"
    BROKEN = "broken"


class EnvironmentStatus(msgspec.Struct, frozen=True):
    """What ``werk backends list`` shows for one environment.

    :ivar name: the environment's name.
    :ivar state: ``missing``, ``ready``, ``outdated`` or ``broken`` (:class:`EnvironmentState`).
    :ivar path: its directory.
    :ivar detail: one line saying why (what is outdated or broken).
    :ivar installed_at: when it was installed (ISO 8601), if it was.
    :ivar distributions: installed distribution → version.
    """

    name: str
    state: EnvironmentState
    path: Path
    detail: str
    installed_at: str | None = None
    distributions: Mapping[str, str] = msgspec.field(default_factory=dict)


class InstallStep(msgspec.Struct, frozen=True):
    """Progress of an install.

    :ivar index: the step's number, from 1.
    :ivar total: how many steps there are.
    :ivar label: what the step does.
    :ivar line: the latest line of pip's output while the step runs (``None`` at its start).
    """

    index: int
    total: int
    label: str
    line: str | None = None


Progress = Callable[[InstallStep], None]


class ManagedEnvironment:
    """One managed environment under ``home/backends/<name>/``."""

    def __init__(self, home: Path, name: str) -> None:
        if not name or not set(name) <= _NAME_CHARS:
            raise InvalidRequest(f"environment name {name!r} must be lower-case [a-z0-9_-]")
        self.name = name
        self.root = backends_dir(home) / name
        self.venv = self.root / "venv"
        self.record_path = self.root / "environment.json"
        self.log_path = self.root / "install.log"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def _record(self) -> dict[str, object] | None:
        try:
            data = json.loads(self.record_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("schema") == RECORD_SCHEMA else None

    def status(self, spec: EnvironmentSpec | None = None) -> EnvironmentStatus:
        """Whether the environment is installed, and for ``spec``'s current digest."""
        record = self._record()
        if record is None:
            return EnvironmentStatus(
                self.name,
                EnvironmentState.MISSING,
                self.venv,
                f"run `werk backends install {self.name}`",
            )
        installed_at = record.get("installed_at")
        raw = record.get("distributions")
        dists = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        at = str(installed_at) if installed_at else None
        if not self.python.exists():
            return EnvironmentStatus(
                self.name,
                EnvironmentState.BROKEN,
                self.venv,
                f"its python is gone; run `werk backends install {self.name}` again",
                at,
                dists,
            )
        if spec is not None and record.get("spec_digest") != spec.digest():
            return EnvironmentStatus(
                self.name,
                EnvironmentState.OUTDATED,
                self.venv,
                f"installed for other requirements; run `werk backends install {self.name}`",
                at,
                dists,
            )
        return EnvironmentStatus(
            self.name, EnvironmentState.READY, self.venv, "installed", at, dists
        )

    def ready_python(self, spec: EnvironmentSpec | None = None) -> Path | None:
        """The environment's python when it is ready (for ``spec``), else ``None``."""
        return self.python if self.status(spec).state is EnvironmentState.READY else None

    # -- installing ------------------------------------------------------------------------------

    def install(
        self,
        spec: EnvironmentSpec,
        *,
        progress: Progress | None = None,
        base_python: Path | None = None,
    ) -> EnvironmentStatus:
        """Build, check and publish the environment (see the module docstring).

        :param base_python: the interpreter to make the venv from (default: the one running
            Werk, without its virtual environment).
        :raises werk.Conflict: another install of this environment is running.
        :raises werk.Unavailable: a step failed; the message names it and the log file.
        """
        if spec.name != self.name:
            raise InvalidRequest(f"spec {spec.name!r} is not environment {self.name!r}")
        report = progress or (lambda step: None)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise Conflict(f"an install of {self.name!r} is already running") from None
            self._remove_leftovers()
            building = self.root / (_TMP_PREFIX + secrets.token_hex(6))
            try:
                self._build(spec, building, report, base_python or _base_python())
                self._publish(spec, building, report)
            finally:
                shutil.rmtree(building, ignore_errors=True)
        finally:
            os.close(lock_fd)
        return self.status(spec)

    def _steps(self, spec: EnvironmentSpec) -> list[str]:
        steps = ["create the virtual environment"]
        steps += [f"build (or reuse) the {wheel.name} wheel" for wheel in spec.source_wheels]
        steps.append(
            f"pip install {len(spec.requirements) + len(spec.source_wheels)} requirement(s)"
        )
        if spec.without_dependencies:
            steps.append(f"pip install --no-deps {', '.join(spec.without_dependencies)}")
        if spec.remove:
            steps.append(f"remove {', '.join(spec.remove)}")
        steps += ["check the imports", "publish"]
        return steps

    def _build(self, spec: EnvironmentSpec, target: Path, report: Progress, base: Path) -> None:
        steps = self._steps(spec)
        total = len(steps)
        python = target / "bin" / "python"
        env = {**os.environ, **spec.environment, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        with self.log_path.open("w", encoding="utf-8") as log:
            index = 1
            self._run(
                index, total, steps[0], [str(base), "-m", "venv", str(target)], env, log, report
            )
            wheels: list[str] = []
            for wheel in spec.source_wheels:
                index += 1
                wheels.append(
                    self._source_wheel(index, total, steps[index - 1], wheel, python, log, report)
                )
            index += 1
            self._run(
                index,
                total,
                steps[index - 1],
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--progress-bar",
                    "off",
                    *spec.requirements,
                    *wheels,
                ],
                env,
                log,
                report,
            )
            if spec.without_dependencies:
                index += 1
                self._run(
                    index,
                    total,
                    steps[index - 1],
                    [
                        str(python), "-m", "pip", "install", "--progress-bar", "off",
                        "--no-deps", *spec.without_dependencies,
                    ],
                    env,
                    log,
                    report,
                )  # fmt: skip
            if spec.remove:
                index += 1
                self._run(
                    index,
                    total,
                    steps[index - 1],
                    [str(python), "-m", "pip", "uninstall", "-y", *spec.remove],
                    env,
                    log,
                    report,
                )
            index += 1
            check = "; ".join(
                [f"import {module}" for module in spec.imports]
                + [
                    f"assert importlib.util.find_spec({module!r}), '{module} is missing'"
                    for module in spec.present
                ]
            )
            if spec.present:
                check = "import importlib.util; " + check
            check = check or "pass"
            self._run(index, total, steps[index - 1], [str(python), "-c", check], env, log, report)

    def _source_wheel(
        self,
        index: int,
        total: int,
        label: str,
        wheel: SourceWheel,
        python: Path,
        log: TextIO,
        report: Progress,
    ) -> str:
        report(InstallStep(index, total, label))
        log.write(f"# {label}\n")
        log.flush()

        def line(text: str) -> None:
            report(InstallStep(index, total, label, text[:200]))

        return str(build_source_wheel(wheel, python=python, report=line, log_path=self.log_path))

    def _run(
        self,
        index: int,
        total: int,
        label: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: TextIO,
        report: Progress,
    ) -> None:
        report(InstallStep(index, total, label))
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        deadline = time.monotonic() + PIP_TIMEOUT_SECONDS
        with subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            text=True,
            errors="replace",
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                text = line.strip()
                if text and not text.startswith("WARNING:"):  # in the log, not the display
                    report(InstallStep(index, total, label, text[:200]))
                if time.monotonic() > deadline:
                    proc.kill()
                    break
            code = proc.wait()
        log.flush()
        if code != 0:
            raise Unavailable(
                f"installing environment {self.name!r} failed at '{label}' (exit {code}); "
                f"see {self.log_path}",
                retryable=False,
            )

    def _distributions(self, python: Path) -> dict[str, str]:
        code = (
            "import importlib.metadata as m, json; "
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
        )
        done = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=120, check=False
        )
        try:
            data = json.loads(done.stdout)
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in sorted(data.items())}

    def _publish(self, spec: EnvironmentSpec, building: Path, report: Progress) -> None:
        steps = self._steps(spec)
        report(InstallStep(len(steps), len(steps), steps[-1]))
        dists = self._distributions(building / "bin" / "python")
        # The old record goes first, the venv swap next, the new record last: a crash at any
        # point leaves no record (MISSING: install again) or a complete new environment.
        dir_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink("environment.json", dir_fd=dir_fd)
            old = self.root / (_TMP_PREFIX + "old-" + secrets.token_hex(6))
            if self.venv.exists():
                os.rename(self.venv, old)
            os.rename(building, self.venv)
            shutil.rmtree(old, ignore_errors=True)
            record = {
                "schema": RECORD_SCHEMA,
                "name": spec.name,
                "spec_digest": spec.digest(),
                "requirements": list(spec.requirements),
                "without_dependencies": list(spec.without_dependencies),
                "removed": list(spec.remove),
                "python": sys.version.split()[0],
                "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "distributions": dists,
            }
            data = (json.dumps(record, indent=1) + "\n").encode()
            replace_private_file(dir_fd, "environment.json", data)
        finally:
            os.close(dir_fd)

    def _remove_leftovers(self) -> None:
        for entry in self.root.iterdir():
            if entry.name.startswith(_TMP_PREFIX) and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)


def _base_python() -> Path:
    """The interpreter without its virtual environment (a venv made from a venv's python
    would depend on that venv)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return Path(base)


def configured_python(variable: str) -> Path | None:
    """The interpreter the environment variable ``variable`` names (``WERK_VLLM_PYTHON``,
    ``WERK_MEDIA_PYTHON``: an explicit choice that wins over a managed environment), ``None``
    when it is unset or empty.

    :raises werk.Unavailable: (``runtime.model_residency``, not retryable) it names no
        executable file.
    """
    configured = os.environ.get(variable)
    if not configured:
        return None
    path = Path(configured)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise Unavailable(
            f"{variable}={configured} is not an executable",
            capability=CapabilityId.MODEL_RESIDENCY,
            retryable=False,
        )
    return path


class FoundPython(msgspec.Struct, frozen=True):
    """An interpreter a backend's worker or runner runs in, and where it came from.

    :ivar python: its path.
    :ivar source: where it came from, for reasons and logs (``WERK_MEDIA_PYTHON``, "the managed
        media environment", "Werk's own environment").
    """

    python: Path
    source: str


def locate_python(
    spec: EnvironmentSpec,
    *,
    setting: str,
    missing: str,
    own: Sequence[str] = (),
    own_first: bool = True,
    hint: str = "",
) -> FoundPython:
    """The interpreter for ``spec``'s worker: the one ``setting`` names (it always wins), then
    Werk's own when every module in ``own`` is found there, and the managed environment
    ``werk backends install NAME`` built — the managed one first when ``own_first`` is false
    (Werk's own environment lacks something only the managed one has).

    :param missing: what is missing, for the error (``"torch and Transformers are not
        installed"``); the install command is added, then ``hint`` (another way to get it).
    :raises werk.Unavailable: (``runtime.model_residency``, not retryable) none is found, or
        ``setting`` names no executable.
    """
    configured = configured_python(setting)
    if configured is not None:
        return FoundPython(configured, setting)
    here = bool(own) and all(importlib.util.find_spec(name) is not None for name in own)
    own_python = FoundPython(Path(sys.executable), "Werk's own environment") if here else None
    if own_first and own_python is not None:
        return own_python
    managed = ManagedEnvironment(werk_home(), spec.name).ready_python(spec)
    if managed is not None:
        return FoundPython(managed, f"the managed {spec.name} environment")
    if own_python is not None:
        return own_python
    raise Unavailable(
        f"{missing}; run `werk backends install {spec.name}`{hint}",
        capability=CapabilityId.MODEL_RESIDENCY,
        retryable=False,
    )
