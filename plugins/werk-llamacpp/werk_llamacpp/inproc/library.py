"""llama-cpp-python: which build, where it comes from, and importing it into ``werk serve``.

``werk backends install llamacpp-inproc`` builds the wheel from the sdist on the package index
(:data:`WHEEL`: CPU only, the same portable x86-64 ISA level as the llama-server build, no
multimodal library) once into the user cache (:class:`werk.SourceWheel`) and installs it into a
managed environment. ``werk serve`` then imports ``llama_cpp`` from Werk's own environment when it
is installed there (the user's own build wins), otherwise from that managed environment's
``site-packages`` (appended to ``sys.path``: Werk's own packages keep precedence; llama-cpp-python
needs numpy, jinja2, diskcache and typing-extensions, which resolve from either).

Checked against llama-cpp-python 0.3.36 (``llama_cpp/llama.py``: ``Llama.generate``'s prefix
reuse, ``input_ids``/``n_tokens``/``_requires_eval``; ``llama_cpp.py``: the
``llama_state_seq_*`` and ``llama_perf_context*`` bindings).
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
import threading
from pathlib import Path
from types import ModuleType

import msgspec

from werk import (
    CapabilityId,
    EnvironmentSpec,
    ManagedEnvironment,
    SourceWheel,
    Unavailable,
    werk_home,
)

from ..inspect import sha256_file

__all__ = ["ENVIRONMENT", "WHEEL", "LibraryFacts", "library_facts", "load_library"]

VERSION = "0.3.36"
_X86_FLAGS = (
    "-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
)
_COMMON_FLAGS = (
    "-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
    "-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF"
)


def _cmake_args() -> str:
    if platform.machine() in ("x86_64", "AMD64"):
        return f"{_COMMON_FLAGS} {_X86_FLAGS}"
    return _COMMON_FLAGS


WHEEL = SourceWheel(
    name="llama-cpp-python",
    version=VERSION,
    environment={"CMAKE_ARGS": _cmake_args(), "FORCE_CMAKE": "1"},
)
ENVIRONMENT = EnvironmentSpec(
    name="llamacpp-inproc",
    description=f"llama-cpp-python {VERSION} (built from source, CPU) for in-process llama.cpp",
    requirements=(),
    source_wheels=(WHEEL,),
    imports=("llama_cpp",),
)


class LibraryFacts(msgspec.Struct, frozen=True):
    """What identifies the loaded library (part of every state's compatibility envelope).

    :ivar version: llama-cpp-python's version.
    :ivar library: ``sha256:`` of the loaded ``libllama`` (the llama.cpp build).
    :ivar source: where it was imported from, for people.
    """

    version: str
    library: str
    source: str


_lock = threading.Lock()
_loaded: tuple[ModuleType, LibraryFacts] | None = None


def _site_packages(venv: Path) -> Path:
    return (
        venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    )


def _missing(reason: str) -> Unavailable:
    return Unavailable(
        f"{reason}; run `werk backends install llamacpp-inproc` (builds llama-cpp-python "
        f"{VERSION} from source once, about 10 minutes on 2 cores)",
        capability=CapabilityId.MODEL_RESIDENCY,
        retryable=False,
    )


def locate_library() -> str:
    """Where ``llama_cpp`` would be imported from (for capability reasons; imports nothing).

    :raises werk.Unavailable: it is installed nowhere Werk looks.
    """
    if _loaded is not None:
        return _loaded[1].source
    if importlib.util.find_spec("llama_cpp") is not None:
        return "Werk's own environment"
    venv = ManagedEnvironment(werk_home(), ENVIRONMENT.name).ready_python(ENVIRONMENT)
    if venv is None:
        raise _missing("llama-cpp-python is not installed")
    return "the managed llamacpp-inproc environment"


def load_library() -> tuple[ModuleType, LibraryFacts]:
    """Import ``llama_cpp`` (once per process) and identify it.

    :raises werk.Unavailable: not installed, or its native library does not load.
    """
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        source = "Werk's own environment"
        if importlib.util.find_spec("llama_cpp") is None:
            python = ManagedEnvironment(werk_home(), ENVIRONMENT.name).ready_python(ENVIRONMENT)
            if python is None:
                raise _missing("llama-cpp-python is not installed")
            site = _site_packages(python.parent.parent)
            if str(site) not in sys.path:
                sys.path.append(str(site))
            source = "the managed llamacpp-inproc environment"
        try:
            module = importlib.import_module("llama_cpp")
        except (ImportError, OSError) as exc:
            raise _missing(
                f"llama-cpp-python does not load ({type(exc).__name__}: {exc})"
            ) from None
        libs = sorted((Path(module.__file__).parent / "lib").glob("libllama*.so*"))  # type: ignore[arg-type]
        library = "sha256:" + sha256_file(libs[0]) if libs else "unknown"
        facts = LibraryFacts(version=str(module.__version__), library=library, source=source)
        _loaded = (module, facts)
        return _loaded


def library_facts() -> LibraryFacts | None:
    """The loaded library's facts, ``None`` before :func:`load_library` ran."""
    return _loaded[1] if _loaded is not None else None
