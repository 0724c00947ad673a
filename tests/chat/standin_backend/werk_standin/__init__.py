"""TEST CODE: the ``standin`` backend (see ``pyproject.toml`` and :mod:`.plugin`)."""
