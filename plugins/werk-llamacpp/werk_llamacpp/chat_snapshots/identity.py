"""The identity of a running llama-server child: the :class:`~.records.Namespace` a snapshot
(and a receipt) is valid for.

Computed once per chat, after native readiness, in a worker thread: the executable's SHA-256
comes from the process layer's inspection (re-verified after readiness); here every shared
library the child has mapped is hashed, and the native-relevant environment, the effective
arguments and the cache layout are recorded.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

import msgspec

from werk import Runtime

from ..inspect import child_environment, sha256_file
from ..process import ManagedHandle
from .files import describe
from .records import HEX64, MAX_ARG_CHARS, MAX_ARGS, Namespace

__all__ = [
    "ENV_NAMES",
    "ENV_PREFIXES",
    "MAX_LIBRARIES",
    "MAX_MAPS_BYTES",
    "Disabled",
    "compute_namespace",
    "environment_digest",
    "mapped_libraries",
]

MAX_LIBRARIES = 512
MAX_MAPS_BYTES = 16 * 1024 * 1024

ENV_PREFIXES = (
    "GGML_",
    "CUDA_",
    "NVIDIA_",
    "HIP_",
    "ROCR_",
    "HSA_",
    "OMP_",
    "GOMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "BLIS_",
    "VK_",
    "SYCL_",
    "ONEAPI_",
    "ZE_",
)
ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD")
"""Environment of the child that can change native numerics or kernels (part of the namespace)."""


class Disabled(Exception):
    """Native snapshots cannot be trusted for this runtime (the reason is shown with ``-v``)."""


def mapped_libraries(pid: int, executable: Path) -> list[Path]:
    """The shared objects ``pid`` has mapped (from ``/proc/<pid>/maps``), without the
    executable itself, sorted.

    :raises Disabled: the map is unreadable, too large, names too many libraries, or shows a
        library that was replaced on disk after it was loaded (``(deleted)``).
    """
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            raw = f.read(MAX_MAPS_BYTES + 1)
    except OSError as exc:
        raise Disabled(f"the runtime's libraries cannot be listed ({describe(exc)})") from None
    if len(raw) > MAX_MAPS_BYTES:
        raise Disabled("the runtime's memory map is too large to list its libraries")
    exe = os.path.realpath(executable)
    found: set[str] = set()
    for line in raw.decode("utf-8", "replace").splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5].removesuffix(" (deleted)")
        is_exe = path == exe or os.path.realpath(path) == exe
        if not is_exe and ".so" not in os.path.basename(path):
            continue  # the model file, /dev/zero, memfd and other data mappings
        if path != fields[5]:
            raise Disabled("a runtime file was replaced on disk while the runtime uses it")
        if not is_exe:
            found.add(path)
    if len(found) > MAX_LIBRARIES:
        raise Disabled(f"the runtime maps more than {MAX_LIBRARIES} libraries")
    return sorted(Path(p) for p in found)


def environment_digest(environ: Mapping[str, str]) -> str:
    """SHA-256 of the variables (:data:`ENV_PREFIXES`, :data:`ENV_NAMES`) set in ``environ``."""
    relevant = sorted(
        (k, v) for k, v in environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES
    )
    return hashlib.sha256(msgspec.json.encode(relevant)).hexdigest()


def compute_namespace(runtime: Runtime, handle: ManagedHandle) -> tuple[Namespace, int]:
    """This runtime's namespace and how many libraries were hashed (blocking: run it in a
    worker thread, after native readiness).

    :raises Disabled: something cannot be identified, or the arguments exceed the bounds.
    """
    libraries = mapped_libraries(handle.pid, handle.inspection.path)
    lines = []
    for lib in libraries:
        try:
            lines.append([str(lib), sha256_file(lib)])
        except OSError as exc:
            raise Disabled(f"a runtime library is unreadable ({describe(exc)})") from None
    args = list(runtime.args)
    if len(args) > MAX_ARGS or any(len(a) > MAX_ARG_CHARS for a in args):
        raise Disabled("the effective arguments are too long to record")
    if not re.fullmatch(HEX64, handle.inspection.sha256):
        raise Disabled("the runtime executable has no SHA-256")
    namespace = Namespace(
        model_identity=runtime.model.identity[:256],
        runtime_sha256=handle.inspection.sha256,
        libraries_sha256=hashlib.sha256(msgspec.json.encode(lines)).hexdigest(),
        environment_sha256=environment_digest(child_environment()),
        args=args,
        cache_layout=runtime.cache_layout[:1024],
    )
    return namespace, len(libraries)
