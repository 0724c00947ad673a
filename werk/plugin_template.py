"""``werk plugins new NAME``: a ready-to-install backend plugin, from the tutorial backend.

The template is the tutorial's ``echo`` plugin (``werk/_template/``, shipped in the wheel): one
``pyproject.toml``, one module, a README and a test that runs the conformance kit. Rendering
renames it — distribution ``werk-NAME``, module ``werk_NAME``, backend and entry point ``NAME``
— so ``werk plugins new echo`` writes the tutorial itself, byte for byte.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .protocol import Conflict, InvalidRequest

__all__ = ["TEMPLATE_FILES", "NewPlugin", "render_plugin", "validate_plugin_name", "write_plugin"]

TEMPLATE_NAME = "echo"
TEMPLATE_FILES = ("pyproject.toml", "README.md", "werk_echo.py", "tests/test_werk_echo.py")
"""The template's files, relative to ``werk/_template``; names containing ``echo`` are renamed."""

_NAME = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")
MAX_NAME = 40


@dataclass(frozen=True)
class NewPlugin:
    """What :func:`write_plugin` wrote."""

    name: str
    distribution: str
    module: str
    directory: Path
    files: tuple[Path, ...]


def validate_plugin_name(name: str) -> str:
    """``name`` if it can be a backend name, an entry point and (with ``-`` → ``_``) a module.

    :raises InvalidRequest: otherwise, saying what is allowed.
    """
    if not _NAME.match(name) or len(name) > MAX_NAME:
        raise InvalidRequest(
            f"plugin name {name!r} must be lowercase letters and digits, starting with a letter, "
            f"optionally separated by single '-' or '_' (at most {MAX_NAME} characters), "
            "e.g. 'acme' or 'my-backend'"
        )
    return name


def _rename(text: str, name: str) -> str:
    ident = name.replace("-", "_")
    for old, new in (
        ("werk_echo", f"werk_{ident}"),
        ("werk-echo", f"werk-{name}"),
        ("ECHO1", f"{ident.upper()}1"),
        ("_echo_", f"_{ident}_"),
        ("echo", name),
    ):
        text = text.replace(old, new)
    return text


def render_plugin(name: str) -> dict[str, str]:
    """``{relative path: text}`` of the plugin ``name`` (validated)."""
    validate_plugin_name(name)
    root = resources.files("werk") / "_template"
    out: dict[str, str] = {}
    for relative in TEMPLATE_FILES:
        source = root.joinpath(*relative.split("/"))
        out[_rename(relative, name)] = _rename(source.read_text(encoding="utf-8"), name)
    return out


def write_plugin(name: str, directory: Path) -> NewPlugin:
    """Write the plugin ``name`` into ``directory`` (created; it must not exist or be empty).
    On any failure nothing is left behind that was not there before.

    :raises InvalidRequest: a bad name. :raises Conflict: ``directory`` is not empty.
    """
    files = render_plugin(name)
    created = not directory.exists()
    if not created and (not directory.is_dir() or any(directory.iterdir())):
        raise Conflict(f"{directory} already exists and is not an empty directory")
    written: list[Path] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for relative, text in files.items():
            target = directory / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            written.append(target)
    except BaseException:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            for path in written:
                path.unlink(missing_ok=True)
        raise
    ident = name.replace("-", "_")
    return NewPlugin(
        name=name,
        distribution=f"werk-{name}",
        module=f"werk_{ident}",
        directory=directory,
        files=tuple(written),
    )
