"""Whether any installed plugin adds ``werk`` commands, remembered between runs.

Building the whole command tree (``werk``, ``werk --help``, ``werk models ...``) used to load
every plugin (importing each backend's modules, 50-90 ms) only to learn that none of them
implements ``werk_register_commands``. Whenever the plugins *are* loaded for their commands,
the answer is written to ``plugin-commands.json`` in the user cache directory
(``platformdirs.user_cache_dir("werk")``, or ``WERK_CACHE_DIR``), keyed by what decides it:
Werk's version, ``WERK_LOAD_PLUGINS``, and the import path (``sys.path``) with each directory's
modification time and inode. An install, removal or upgrade of any distribution changes the key
(its ``*.dist-info`` directory comes or goes), so the next command loads the plugins again. The
:data:`MAX_ENTRIES` most recent keys are kept (``werk`` and ``python -m ...`` see different
import paths).

What the index cannot see: an *editable* plugin whose source gains a ``werk_register_commands``
without a version change. Its commands still run (a command name Werk does not know always
loads the plugins, see :func:`werk.cli.main`, and refreshes the index), and they show in
``werk --help`` from then on, or at once after deleting the file. A plugin that failed to load
or to add its commands is never remembered as adding none (the next command loads it again and
warns).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from .._version import __version__

if TYPE_CHECKING:
    from ..plugins import WerkPluginManager

__all__ = ["INDEX_NAME", "index_path", "plugins_add_commands", "remember", "remember_loaded"]

INDEX_NAME = "plugin-commands.json"
CACHE_ENV = "WERK_CACHE_DIR"
MAX_INDEX_BYTES = 256 * 1024
MAX_ENTRIES = 8
LOAD_ENV = "WERK_LOAD_PLUGINS"  # werk.plugins.LOAD_ENV (not imported: it loads pluggy and more)


def index_path() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser().absolute() / INDEX_NAME
    import platformdirs

    return Path(platformdirs.user_cache_dir("werk", appauthor=False)) / INDEX_NAME


def _key() -> list[Any]:
    """Werk's version, ``WERK_LOAD_PLUGINS``, and each import path entry with its directory's
    modification time and inode: installing, removing or upgrading a distribution adds or
    removes its ``*.dist-info`` directory there (``importlib.metadata``'s scan of the entry
    points would cost 40-60 ms, as much as loading the plugins)."""
    paths: list[Any] = []
    for entry in sys.path:
        try:
            st = os.stat(entry or ".")
        except OSError:
            paths.append([entry, None, None])
        else:
            paths.append([entry, st.st_mtime_ns, st.st_ino])
    return [__version__, os.environ.get(LOAD_ENV), paths]


def _entries() -> list[dict[str, Any]]:
    try:
        with index_path().open("rb") as f:
            raw = f.read(MAX_INDEX_BYTES + 1)
        data = msgspec.json.decode(raw) if len(raw) <= MAX_INDEX_BYTES else None
    except (OSError, msgspec.DecodeError):
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("adds_commands"), bool)]


def plugins_add_commands() -> bool | None:
    """What the index says for the installed plugins now; ``None`` when it does not know
    (no index, no entry for this key, an unreadable file)."""
    key = _key()
    for entry in _entries():
        if entry.get("key") == key:
            return bool(entry["adds_commands"])
    return None


def remember(adds_commands: bool) -> None:
    """Record the answer for the installed plugins now, next to the :data:`MAX_ENTRIES` - 1
    most recent other keys (``werk`` and ``python -m werk`` see different import paths), written
    atomically; a cache that cannot be written is skipped silently (the plugins are loaded
    again next time)."""
    from .._fs import replace_private_file

    key = _key()
    known = _entries()
    if known and known[0].get("key") == key and known[0]["adds_commands"] is adds_commands:
        return  # already the newest entry: nothing to write
    entries = [{"key": key, "adds_commands": adds_commands}]
    entries += [e for e in known if e.get("key") != key][: MAX_ENTRIES - 1]
    path = index_path()
    data = msgspec.json.encode({"entries": entries})
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        replace_private_file(dir_fd, path.name, data)
    except OSError:
        return
    finally:
        os.close(dir_fd)


def remember_loaded(pm: WerkPluginManager) -> None:
    """:func:`remember` what ``pm`` (loaded from the entry points) shows: a plugin implements
    ``werk_register_commands``, or one failed (it is loaded again next time, and warns)."""
    from ..protocol import PluginStatus

    failed = any(r.status is PluginStatus.FAILED for r in pm.records.values())
    remember(failed or bool(pm.implementers("werk_register_commands")))
