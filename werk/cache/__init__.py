"""``werk cache``: the inventory of on-disk caches under ``WERK_HOME`` and their cleanup.

* :mod:`.entry` — :class:`CacheEntry`, what plugins report through ``werk_cache_inventory``.
* :mod:`.inventory` — the three categories (chat sessions, plugin worker caches, managed disk
  states) as one list of :class:`~.inventory.CacheItem`.
* :mod:`.purge` — preview and execution of a purge.

Only :class:`CacheEntry` is imported here: :mod:`werk.hookspecs` needs it, and the inventory
imports the plugin machinery, which imports the hookspecs.
"""

from .entry import CacheEntry

__all__ = ["CacheEntry"]
